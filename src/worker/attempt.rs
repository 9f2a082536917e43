//! One attempt of a claimed task: the handler invocation, as a result to write.

use tokio_util::sync::CancellationToken;

use crate::handlers::invoke::invoke;
use crate::handlers::{HandlerContext, Registered};
use crate::store::Finish;
use crate::task::Task;

/// Runs one attempt of `task`. `lease_lost` is handed to the handler as its
/// cancellation signal; the handler's timeout bounds a handler that ignores it.
pub(crate) async fn run_attempt(
    registered: &Registered,
    task: &Task,
    worker_id: &str,
    lease_lost: CancellationToken,
) -> Finish {
    let ctx = HandlerContext {
        worker_id: worker_id.to_owned(),
        attempt: u32::try_from(task.attempts).unwrap_or(0),
        cancellation: lease_lost,
    };
    let attempted = invoke(registered, &ctx, task).await;
    Finish {
        lease: task.lease(),
        outcome: attempted.outcome,
        started_at: attempted.started_at,
        duration: attempted.duration,
        error: attempted.error,
    }
}
