//! Heavy reads (`/stats` and `/check`, which count or read every task) run a few at a
//! time, in the process's heavy-read slots ([`Operations::heavy_reads`], shared with
//! the groupings' counts): one more is answered 429 with `Retry-After` at once, instead
//! of queueing more work on the database. Lighter requests are not limited here (the
//! API's own small connection pool and `admin.statement_timeout` bound them).
//!
//! [`Operations::heavy_reads`]: crate::operations::Operations::heavy_reads

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use tokio::sync::Semaphore;

use super::error::ApiError;
use crate::operations::OperationError;

/// Middleware: runs the request in a free slot, or answers 429.
pub async fn heavy(
    State(slots): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Ok(_slot) = slots.try_acquire() else {
        return Err(OperationError::busy().into());
    };
    Ok(next.run(request).await)
}
