//! Every child process a test runs ends within a bound: one that hangs is killed and
//! the test fails with what it printed, instead of stalling the run.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a one-shot command (a CLI verb, a bench at test sizes) may run.
pub const CHILD_LIMIT: Duration = Duration::from_secs(240);

/// [`Command::output`] and [`Child::wait`] with a bound.
pub trait Bounded {
    /// Runs the command to its end, its output captured and no standard input (as
    /// `output` does by default: any other standard input, output or error set on the
    /// command is replaced; spawn it and use [`wait_with_output_within`] to keep them);
    /// kills it and panics with what it printed if it runs longer than `limit`.
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output>;
}

impl Bounded for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output> {
        // As `output` does: no standard input.
        let child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(wait_with_output_within(child, limit, &format!("{self:?}")))
    }
}

/// Waits for `child` (its standard output and error piped) and collects its output;
/// kills it and panics with what it printed if it runs longer than `limit`.
pub fn wait_with_output_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = wait_within(&mut child, limit);
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    match status {
        Some(status) => Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "{what} did not end within {limit:?}; killed. stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Waits for `child` at most `limit`; kills it and answers `None` past it.
pub fn wait_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return Some(status);
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
