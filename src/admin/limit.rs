//! Heavy reads (`/stats` and `/check`, which count or read every task) run a few at a
//! time: one more is answered 429 with `Retry-After` at once, instead of queueing more
//! work on the database. Lighter requests are not limited here (the API's own small
//! connection pool and `admin.statement_timeout` bound them).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use tokio::sync::Semaphore;

use super::error::ApiError;

/// Most heavy reads running at once, in one member.
pub const HEAVY_READS: usize = 2;

/// `Retry-After` of a heavy read refused because others run.
const RETRY_AFTER: u64 = 5;

/// The slots of heavy reads of one API.
pub fn heavy_slots() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(HEAVY_READS))
}

/// Middleware: runs the request in a free slot, or answers 429.
pub async fn heavy(
    State(slots): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Ok(_slot) = slots.try_acquire() else {
        return Err(ApiError::too_many(
            format!(
                "{HEAVY_READS} heavy reads (stats, check) are running already; try again in \
                 {RETRY_AFTER} s"
            ),
            RETRY_AFTER,
        ));
    };
    Ok(next.run(request).await)
}
