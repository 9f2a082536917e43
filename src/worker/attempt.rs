//! One attempt of a claimed task: the handler invocation, as a result to write.

use tokio_util::sync::CancellationToken;

use crate::handlers::invoke::invoke;
use crate::handlers::{HandlerContext, RecoveryPoints, Registered};
use crate::store::{Finish, Store};
use crate::task::Task;
use crate::task::Verdict;

/// Runs one attempt of `task`: the result to write, and how the handler answered.
/// `lease_lost` is handed to the handler as its cancellation signal; the handler's
/// timeout bounds a handler that ignores it.
pub(crate) async fn run_attempt(
    store: &Store,
    registered: &Registered,
    task: &Task,
    worker_id: &str,
    lease_lost: CancellationToken,
) -> (Finish, Verdict) {
    let attempt = u32::try_from(task.attempts).unwrap_or(0);
    let ctx = HandlerContext::new(worker_id, attempt, lease_lost)
        .with_recovery(RecoveryPoints::Stored {
            store: store.clone(),
            lease: task.lease(),
        })
        .with_redrive_job(task.redrive_job);
    let attempted = invoke(registered, &ctx, task).await;
    let finish = Finish {
        lease: task.lease(),
        outcome: attempted.outcome,
        started_at: attempted.started_at,
        duration: attempted.duration,
        error: attempted.error,
        cause: attempted.cause,
        compensate: registered.handler.compensates(),
    };
    (finish, attempted.verdict)
}
