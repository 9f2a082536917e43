//! A private, throwaway PostgreSQL server: for a benchmark that must control the
//! server's settings (autovacuum above all: the machine's shared server may run without
//! it), and for the demo on a machine where no server answers. `initdb` into a
//! temporary directory, started on a free loopback port with PostgreSQL's own
//! defaults (autovacuum on, fsync on) unless told otherwise, stopped and removed when
//! dropped. As root, the server runs as the `postgres` user (PostgreSQL refuses root).

use anyhow::{bail, Context};
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where Debian and Ubuntu put the server's programs (one folder per major version).
const DEBIAN_SERVERS: &str = "/usr/lib/postgresql";

/// A running private server.
pub(crate) struct PrivateCluster {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    run_as: Option<(u32, u32)>,
}

impl PrivateCluster {
    /// Creates and starts a server with `settings` (`name=value`, PostgreSQL's
    /// `-c`) on top of its defaults. `bin` is the folder of `initdb` and `pg_ctl`; by
    /// default [`PrivateCluster::programs`].
    pub(crate) fn start(bin: Option<&Path>, settings: &[String]) -> anyhow::Result<Self> {
        let bin = match bin {
            Some(bin) => bin.to_owned(),
            None => Self::programs().unwrap_or_default(),
        };
        let data = std::env::temp_dir().join(format!("redrive-pg-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&data).with_context(|| format!("creating {}", data.display()))?;
        let run_as = if unsafe { libc::geteuid() } == 0 {
            let ids = user_ids("postgres").context(
                "running as root, the private server needs the `postgres` user to run as",
            )?;
            std::os::unix::fs::chown(&data, Some(ids.0), Some(ids.1))?;
            Some(ids)
        } else {
            None
        };
        let port = free_port()?;
        let cluster = PrivateCluster {
            bin,
            data,
            port,
            run_as,
        };
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data_text(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            cluster.data_text()
        );
        for setting in settings {
            if !setting.contains('=') || setting.contains(char::is_whitespace) {
                bail!("a server setting is name=value without spaces (got {setting:?})");
            }
            options.push_str(&format!(" -c {setting}"));
        }
        let log = cluster.data.join("server.log");
        cluster.run(
            "pg_ctl",
            &[
                "-D",
                &cluster.data_text(),
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        )?;
        Ok(cluster)
    }

    /// Its URL, as the `postgres` user into database `postgres`.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn data_text(&self) -> String {
        self.data.to_string_lossy().into_owned()
    }

    fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<Output> {
        let path = self.bin.join(program);
        let mut command = Command::new(&path);
        command.args(args).current_dir(std::env::temp_dir());
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        let out = command
            .output()
            .with_context(|| format!("running {}", path.display()))?;
        if !out.status.success() {
            bail!(
                "{program} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(out)
    }
}

impl PrivateCluster {
    /// The folder of the server's programs (`initdb`, `pg_ctl`): the newest
    /// `/usr/lib/postgresql/<major>/bin`, else the `PATH`'s (an empty path); `None` when
    /// neither has `initdb`.
    pub(crate) fn programs() -> Option<PathBuf> {
        let majors = std::fs::read_dir(DEBIAN_SERVERS)
            .into_iter()
            .flatten()
            .flatten();
        let debian = majors
            .filter_map(|entry| {
                let major: u32 = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").exists().then_some((major, bin))
            })
            .max_by_key(|(major, _)| *major)
            .map(|(_, bin)| bin);
        debian.or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .any(|dir| dir.join("initdb").exists())
                .then(PathBuf::new)
        })
    }

    /// Where its programs are, for a person.
    pub(crate) fn programs_shown(&self) -> String {
        match self.bin.as_os_str().is_empty() {
            true => "the PATH".to_owned(),
            false => self.bin.display().to_string(),
        }
    }

    /// Its port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let data = self.data_text();
        if let Err(error) = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]) {
            tracing::warn!(%error, "stopping the private PostgreSQL server");
        }
        let _removed = std::fs::remove_dir_all(&self.data);
    }
}

/// The user and group id of `name`.
fn user_ids(name: &str) -> anyhow::Result<(u32, u32)> {
    let name = CString::new(name)?;
    // SAFETY: getpwnam reads a static record; it is copied out before anything else runs
    // on this thread.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        bail!("no such user");
    }
    // SAFETY: checked not null just above.
    let entry = unsafe { &*entry };
    Ok((entry.pw_uid, entry.pw_gid))
}

/// A loopback port nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
