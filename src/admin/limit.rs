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

use super::error::ApiError;
use crate::operations::HeavyReads;

/// Middleware: runs the request in a free slot, to its end even when its client hangs
/// up (its statements would run on without a slot), or answers 429.
pub async fn heavy(
    State(slots): State<HeavyReads>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    Ok(slots.run(next.run(request)).await?)
}
