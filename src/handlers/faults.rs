//! A handler wrapper that injects failures: for demos and game days.

use async_trait::async_trait;
use rand::Rng;

use super::{Handler, HandlerContext, HandlerError};
use crate::task::Task;

/// Fails a share of attempts before they reach the wrapped handler: `permanent` of them
/// permanently, `transient` of them transiently; the rest go through.
pub struct FaultInjecting<H> {
    inner: H,
    transient: f64,
    permanent: f64,
}

impl<H: Handler> FaultInjecting<H> {
    /// Wraps `inner`; the shares are clamped to [0, 1].
    pub fn new(inner: H, transient: f64, permanent: f64) -> Self {
        FaultInjecting {
            inner,
            transient: transient.clamp(0.0, 1.0),
            permanent: permanent.clamp(0.0, 1.0),
        }
    }
}

#[async_trait]
impl<H: Handler> Handler for FaultInjecting<H> {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let roll: f64 = rand::rng().random();
        if roll < self.permanent {
            return Err(HandlerError::permanent("injected permanent fault"));
        }
        if roll < self.permanent + self.transient {
            return Err(HandlerError::transient("injected transient fault"));
        }
        self.inner.handle(ctx, task).await
    }

    fn timeout(&self) -> Option<std::time::Duration> {
        self.inner.timeout()
    }

    fn max_attempts(&self) -> Option<u32> {
        self.inner.max_attempts()
    }

    fn backoff(&self) -> Option<crate::backoff::Backoff> {
        self.inner.backoff()
    }
}
