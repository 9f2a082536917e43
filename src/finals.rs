//! "This task became a permanent failure": reported by the worker pool and by
//! process-mode ingest after the row says so, and handed to a sink (parking implements
//! it). The reports run in the background and are waited for at shutdown.

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;

use crate::task::Task;

/// Told about every task whose PERMANENT_FAILURE status was just committed.
#[async_trait]
pub trait FinalSink: Send + Sync + 'static {
    /// Handles `task`, which ended with `error`. Must not fail: a sink that cannot do its
    /// work logs and counts it; the task stays recorded in PostgreSQL either way.
    async fn permanent_failure(&self, task: &Task, error: Option<&str>);
}

/// The sinks of a fleet member, and their reports still running.
#[derive(Clone, Default)]
pub(crate) struct Finals {
    sinks: Arc<[Arc<dyn FinalSink>]>,
    running: TaskTracker,
}

impl Finals {
    /// Reports go to every sink; with none they are not made at all.
    pub(crate) fn new(sinks: Vec<Arc<dyn FinalSink>>) -> Finals {
        Finals {
            sinks: sinks.into(),
            running: TaskTracker::new(),
        }
    }

    /// Whether anyone listens: callers keep the task only then.
    pub(crate) fn wanted(&self) -> bool {
        !self.sinks.is_empty()
    }

    /// Reports `task` to every sink in the background.
    pub(crate) fn permanent_failure(&self, task: Arc<Task>, error: Option<String>) {
        for sink in self.sinks.iter() {
            let (sink, task, error) = (sink.clone(), task.clone(), error.clone());
            self.running.spawn(async move {
                sink.permanent_failure(&task, error.as_deref()).await;
            });
        }
    }

    /// Waits up to `deadline` for the reports still running (at shutdown).
    pub(crate) async fn drain(&self, deadline: Duration) {
        self.running.close();
        if tokio::time::timeout(deadline, self.running.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = self.running.len(),
                "shutdown deadline passed with permanent-failure reports (parking) unfinished"
            );
        }
    }
}
