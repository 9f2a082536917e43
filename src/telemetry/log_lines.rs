//! Standard error for log lines, written by a thread of its own, so that logging never
//! stops or stalls the process.
//!
//! A log line is handed to a bounded queue and the caller goes on at once. When stderr
//! does not keep up (a paused pager, a pipe nobody reads), at most [`QUEUE_LINES`] lines
//! wait and later ones are dropped, counted in a note written once it catches up. When
//! stderr is closed (`redrive run 2>&1 | head -3`), lines are discarded. A write therefore
//! never fails, and tracing-subscriber never reports one with `eprintln!` (which panics
//! on a closed stderr).

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

/// Most log lines waiting to be written.
pub const QUEUE_LINES: usize = 8192;

/// Pause between tries to queue a flush request while the queue is full.
const FLUSH_RETRY: Duration = Duration::from_millis(5);

enum Message {
    Line(Vec<u8>),
    Flush(mpsc::Sender<()>),
}

/// The writer of log lines: a `MakeWriter` for tracing-subscriber. Clones share the
/// queue and its thread.
#[derive(Clone)]
pub struct LogLines {
    queue: SyncSender<Message>,
    dropped: std::sync::Arc<AtomicU64>,
}

impl LogLines {
    /// Starts the thread that writes to `out`; `json` makes its notes JSON lines.
    pub fn start(out: impl Write + Send + 'static, json: bool) -> LogLines {
        let (queue, lines) = mpsc::sync_channel(QUEUE_LINES);
        let dropped = std::sync::Arc::new(AtomicU64::new(0));
        let counted = dropped.clone();
        std::thread::Builder::new()
            .name("redrive-log".into())
            .spawn(move || write_out(lines, out, &counted, json))
            .expect("start the log writer thread");
        LogLines { queue, dropped }
    }

    /// Waits up to `within` for the lines queued so far to be written.
    pub fn flush(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let (done, written) = mpsc::channel();
        let mut message = Message::Flush(done);
        loop {
            match self.queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    message = back;
                    std::thread::sleep(FLUSH_RETRY);
                }
                Err(_) => return,
            }
        }
        let _ = written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

impl Write for &LogLines {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        if let Err(TrySendError::Full(_)) = self.queue.try_send(Message::Line(line.to_vec())) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogLines {
    type Writer = &'a LogLines;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

/// The writer thread: every queued line to `out`, write errors ignored.
fn write_out(lines: Receiver<Message>, mut out: impl Write, dropped: &AtomicU64, json: bool) {
    for message in lines {
        match message {
            Message::Line(line) => {
                let missed = dropped.swap(0, Ordering::Relaxed);
                if missed > 0 {
                    let _ = out.write_all(note(missed, json).as_bytes());
                }
                let _ = out.write_all(&line);
            }
            Message::Flush(done) => {
                let _ = out.flush();
                let _ = done.send(());
            }
        }
    }
}

/// The line that says `missed` lines were dropped.
fn note(missed: u64, json: bool) -> String {
    let message = format!("{missed} log line(s) dropped: standard error did not keep up");
    if json {
        let line = serde_json::json!({
            "timestamp": chrono::Utc::now(),
            "level": "WARN",
            "message": message,
            "target": module_path!(),
        });
        format!("{line}\n")
    } else {
        format!(
            "{}  WARN {}: {message}\n",
            chrono::Utc::now(),
            module_path!()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Fails every write, as a closed pipe does.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
    }

    /// Blocks every write until `open` is set, then keeps what it is given.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        kept: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let (open, changed) = &*self.open;
            let _open = changed
                .wait_while(open.lock().unwrap(), |open| !*open)
                .unwrap();
            self.kept.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_output_fails_no_write() {
        let lines = LogLines::start(Closed, false);
        for _ in 0..10 {
            assert_eq!((&lines).write(b"a line\n").unwrap(), 7);
        }
        lines.flush(Duration::from_secs(5));
    }

    #[test]
    fn a_stuck_output_blocks_no_writer_and_drops_are_counted() {
        let gate = Gate::default();
        let lines = LogLines::start(gate.clone(), true);
        // The thread takes one line and blocks on it; the queue then fills.
        for _ in 0..QUEUE_LINES + 101 {
            (&lines).write_all(b"{}\n").unwrap();
        }
        let (open, changed) = &*gate.open;
        *open.lock().unwrap() = true;
        changed.notify_all();
        lines.flush(Duration::from_secs(10));
        (&lines).write_all(b"{\"last\":1}\n").unwrap();
        lines.flush(Duration::from_secs(10));
        let kept = String::from_utf8(gate.kept.lock().unwrap().clone()).unwrap();
        let notes: Vec<serde_json::Value> = kept
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is JSON"))
            .filter(|v: &serde_json::Value| v["level"] == "WARN")
            .collect();
        let dropped: u64 = notes
            .iter()
            .map(|n| {
                let text = n["message"].as_str().unwrap();
                text.split(' ').next().unwrap().parse::<u64>().unwrap()
            })
            .sum();
        assert!(dropped >= 100, "{notes:?}");
        assert!(kept.ends_with("{\"last\":1}\n"), "the last line is written");
    }
}
