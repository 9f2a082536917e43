//! The built-in `log` handler.

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{Handler, HandlerContext, HandlerError};
use crate::task::Task;

/// Logs the task and resolves it: for trying redrive out and for draining a topic
/// whose failures only need to be recorded. Payloads may hold personal data and be
/// megabytes long, so the line carries their sizes and a digest, never the bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogHandler;

#[async_trait]
impl Handler for LogHandler {
    async fn handle(&self, ctx: &HandlerContext, task: &Task) -> Result<(), HandlerError> {
        let value = task.failure.value.as_deref();
        tracing::info!(
            task = %task.id,
            attempt = ctx.attempt,
            event_type = task.failure.event_type.as_deref().unwrap_or(""),
            key_bytes = task.failure.key.as_ref().map_or(0, Vec::len),
            value_bytes = value.map_or(0, <[u8]>::len),
            value_sha256 = %value.map(digest).unwrap_or_default(),
            headers = task.failure.headers.len(),
            payload_stored = task.failure.payload_stored,
            "log handler resolved task"
        );
        Ok(())
    }
}

/// The first 16 bytes of the SHA-256 of `bytes`, in hex: enough to match a payload
/// against a copy without showing it.
fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Regression: the log handler wrote whole payloads (up to 16 MiB, personal data)
    /// to the log.
    #[tokio::test]
    async fn the_log_line_has_sizes_and_a_digest_never_the_payload() {
        let lines = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Capture(sink.clone()))
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let secret = b"card 4111 1111 1111 1111".to_vec();
        let task = crate::task::NewTask::new("log", secret.clone()).unsaved();
        let ctx = HandlerContext::new("w", 1, Default::default());
        LogHandler.handle(&ctx, &task).await.unwrap();
        let logged = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
        assert!(!logged.contains("4111"), "{logged}");
        assert!(
            logged.contains(&format!("value_bytes={}", secret.len())),
            "{logged}"
        );
        assert!(logged.contains(&digest(&secret)), "{logged}");
    }

    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
