//! A fleet member in a process of its own: `redrive run` of the real binary, or this
//! test binary started again as a child member. A test kills it with SIGKILL, stops it
//! with SIGTERM and reads its log.

use redrive::Settings;
use secrecy::ExposeSecret;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The program a [`Spawn`] starts.
enum Program {
    /// `redrive [--config FILE] run`.
    Binary,
    /// This test binary running only the test `name` (a child member's entry point).
    TestChild { name: String },
    /// `NAME [--config FILE] run` of the example `name` (built by `cargo test`).
    Example { name: String },
}

/// How to start a [`MemberProcess`]: the program, its configuration file, environment
/// and log. Every member runs on the database and schema of the settings it was made
/// with, logs at info as plain text, and dies with the test thread that started it.
pub struct Spawn {
    program: Program,
    database_url: String,
    schema: String,
    config: Option<PathBuf>,
    env: Vec<(String, String)>,
    log: Option<PathBuf>,
}

impl Spawn {
    /// `redrive run` of the real binary on `settings`' database and schema.
    pub fn binary(settings: &Settings) -> Spawn {
        Spawn {
            program: Program::Binary,
            database_url: settings.database.url.expose_secret().to_owned(),
            schema: settings.database.schema.clone(),
            config: None,
            env: Vec::new(),
            log: None,
        }
    }

    /// This test binary running only the test `name` (say `process::child_fleet_member`),
    /// on `settings`' database and schema; the child reads its role from `env`.
    pub fn test_child(name: &str, settings: &Settings) -> Spawn {
        Spawn {
            program: Program::TestChild {
                name: name.to_owned(),
            },
            ..Spawn::binary(settings)
        }
    }

    /// `run` of the example `name` (say `checkout_saga`), which `cargo test` builds
    /// beside redrive's binary, on `settings`' database and schema.
    pub fn example(name: &str, settings: &Settings) -> Spawn {
        Spawn {
            program: Program::Example {
                name: name.to_owned(),
            },
            ..Spawn::binary(settings)
        }
    }

    /// Reads the configuration file `path` (`--config`; not for a test child).
    pub fn config(mut self, path: &Path) -> Spawn {
        self.config = Some(path.to_owned());
        self
    }

    /// Sets the environment variable `key` (a `REDRIVE__…` setting, say).
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Spawn {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Sets each of `pairs` in the environment.
    pub fn envs(self, pairs: &[(&str, &str)]) -> Spawn {
        pairs
            .iter()
            .fold(self, |spawn, (key, value)| spawn.env(key, *value))
    }

    /// Writes the log to `path`, kept when the member is dropped (by default it goes to a
    /// temporary file removed then).
    pub fn log_to(mut self, path: &Path) -> Spawn {
        self.log = Some(path.to_owned());
        self
    }

    /// Starts the member.
    pub fn start(self) -> MemberProcess {
        let (log, keep_log) = match self.log {
            Some(path) => (path, true),
            None => {
                let name = format!("redrive-member-{:016x}.log", rand::random::<u64>());
                (std::env::temp_dir().join(name), false)
            }
        };
        let mut command = match &self.program {
            Program::Binary | Program::Example { .. } => {
                let binary = Path::new(env!("CARGO_BIN_EXE_redrive"));
                let mut command = match &self.program {
                    Program::Example { name } => {
                        Command::new(binary.parent().unwrap().join("examples").join(name))
                    }
                    _ => Command::new(binary),
                };
                if let Some(config) = &self.config {
                    command.arg("--config").arg(config);
                }
                command.arg("run");
                command
            }
            Program::TestChild { name } => {
                assert!(self.config.is_none(), "a test child reads no config file");
                let mut command = Command::new(std::env::current_exe().unwrap());
                command.args([name, "--exact", "--nocapture", "--test-threads=1"]);
                command
            }
        };
        // SAFETY: prctl is async-signal-safe. The member dies with the thread that started
        // it should the test be killed.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        command
            .env("REDRIVE__DATABASE__URL", &self.database_url)
            .env("REDRIVE__DATABASE__SCHEMA", &self.schema)
            .env("RUST_LOG", "info")
            .env("REDRIVE__LOG__FORMAT", "text")
            .env("NO_COLOR", "1")
            .envs(self.env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = command.spawn().expect("spawn a member");
        MemberProcess {
            child,
            log,
            keep_log,
        }
    }
}

/// A fleet member process; killed (SIGKILL) when dropped if it still runs.
pub struct MemberProcess {
    child: Child,
    log: PathBuf,
    keep_log: bool,
}

impl MemberProcess {
    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` (say `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) {
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    /// SIGKILL, and waits until it is gone.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Its exit status, if it exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits until it exits; panics (with its log's tail) after `limit`.
    pub async fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "member {} did not exit within {limit:?}; log:\n{}",
                self.pid(),
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then waits; panics unless it stops cleanly within `limit`.
    pub async fn stop(&mut self, limit: Duration) {
        self.signal(libc::SIGTERM);
        self.stopped(limit).await;
    }

    /// Waits for a member already sent SIGTERM; panics unless it stops
    /// cleanly within `limit`. (A second SIGTERM would mean "stop now".)
    pub async fn stopped(&mut self, limit: Duration) {
        let status = self.wait(limit).await;
        assert!(
            status.success(),
            "member {} stopped: {status}; log:\n{}",
            self.pid(),
            self.log_tail()
        );
    }

    /// Every line of its log that contains `what`.
    pub fn log_lines(&self, what: &str) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|line| line.contains(what))
            .map(str::to_owned)
            .collect()
    }

    /// The last 30 lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for MemberProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.keep_log {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
