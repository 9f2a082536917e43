//! The built-in `log` handler.

use async_trait::async_trait;

use super::{Handler, HandlerContext, HandlerError};
use crate::task::Task;

/// Logs the task and resolves it: for trying redrive out and for draining a topic
/// whose failures only need to be recorded.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogHandler;

#[async_trait]
impl Handler for LogHandler {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        tracing::info!(
            task = %task.id,
            attempt = ctx.attempt,
            event_type = task.event_type.as_deref().unwrap_or(""),
            value_bytes = task.value.as_ref().map_or(0, Vec::len),
            value = %String::from_utf8_lossy(task.value.as_deref().unwrap_or_default()),
            "log handler resolved task"
        );
        Ok(())
    }
}
