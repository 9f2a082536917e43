//! A handler that counts its calls and succeeds.

use async_trait::async_trait;
use redrive::{Handler, HandlerContext, HandlerError, Task};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts its calls (the field, shared by its clones) and succeeds.
#[derive(Clone, Default)]
pub struct Counting(pub Arc<AtomicUsize>);

#[async_trait]
impl Handler for Counting {
    async fn handle(&self, _: &HandlerContext, _: &Task) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
