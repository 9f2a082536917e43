//! The chaos suites' fleet: a fixed number of `redrive run` members (slots), killed with
//! SIGKILL and restarted, every start, kill and exit noted with its time.

use chrono::{DateTime, Utc};
use redrive::Settings;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{MemberProcess, Spawn};

/// Something the chaos did.
#[derive(Debug, Clone)]
pub enum Event {
    Started {
        pid: i32,
    },
    Killed {
        pid: i32,
    },
    Terminated {
        backends: i64,
    },
    /// A member exited by itself.
    Exited {
        pid: i32,
        status: String,
    },
}

/// The members, their logs and what happened to them.
pub struct Fleet {
    settings: Settings,
    config: PathBuf,
    /// Names the logs.
    tag: String,
    slots: Vec<Option<MemberProcess>>,
    restart_at: Vec<Option<Instant>>,
    /// One log per member started, in the order of the `Started` events.
    pub logs: Vec<PathBuf>,
    pub events: Vec<(DateTime<Utc>, Event)>,
}

impl Fleet {
    /// `size` members of `redrive --config config run` on `settings`' database, logging to
    /// `$TMPDIR/<tag>-<n>.log`.
    pub fn start(size: usize, settings: &Settings, config: &Path, tag: &str) -> Fleet {
        let mut fleet = Fleet {
            settings: settings.clone(),
            config: config.to_owned(),
            tag: tag.to_owned(),
            slots: (0..size).map(|_| None).collect(),
            restart_at: vec![None; size],
            logs: Vec::new(),
            events: Vec::new(),
        };
        for slot in 0..size {
            fleet.start_slot(slot);
        }
        fleet
    }

    fn start_slot(&mut self, slot: usize) {
        let log = std::env::temp_dir().join(format!("{}-{}.log", self.tag, self.logs.len()));
        let member = Spawn::binary(&self.settings)
            .config(&self.config)
            .log_to(&log)
            .start();
        let started = Event::Started { pid: member.pid() };
        self.events.push((Utc::now(), started));
        self.logs.push(log);
        self.slots[slot] = Some(member);
        self.restart_at[slot] = None;
    }

    /// SIGKILL, restarted after `restart_after`.
    pub fn kill(&mut self, slot: usize, restart_after: Duration) {
        if let Some(mut member) = self.slots[slot].take() {
            let at = Utc::now();
            member.kill();
            self.events.push((at, Event::Killed { pid: member.pid() }));
        }
        self.restart_at[slot] = Some(Instant::now() + restart_after);
    }

    /// The slots whose member runs.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .collect()
    }

    /// Restarts the members due back; notes (and restarts) any that exited by itself.
    pub fn tend(&mut self) {
        for slot in 0..self.slots.len() {
            if let Some(member) = &mut self.slots[slot] {
                if let Some(status) = member.exited() {
                    let (pid, status) = (member.pid(), status.to_string());
                    let exited = Event::Exited { pid, status };
                    self.events.push((Utc::now(), exited));
                    self.slots[slot] = None;
                    self.restart_at[slot] = Some(Instant::now());
                }
            }
            if self.restart_at[slot].is_some_and(|at| at <= Instant::now()) {
                self.start_slot(slot);
            }
        }
    }

    /// SIGTERM to every member (once it is up; one still due back is started now); each
    /// must stop cleanly within `limit`.
    pub async fn stop(&mut self, limit: Duration) {
        self.tend();
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_none() {
                self.start_slot(slot);
            }
        }
        let up_by = Instant::now() + limit;
        for member in self.slots.iter().flatten() {
            while member.log_lines("pool started").is_empty() {
                assert!(
                    Instant::now() < up_by,
                    "member {} never started",
                    member.pid()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            member.signal(libc::SIGTERM);
        }
        for slot in 0..self.slots.len() {
            let mut member = self.slots[slot].take().expect("every member started");
            member.stopped(limit).await;
        }
    }

    /// Events `what` between `from` and `to`.
    pub fn count(&self, what: fn(&Event) -> bool, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
        (self.events.iter())
            .filter(|(at, e)| *at >= from && *at <= to && what(e))
            .count()
    }

    /// The members killed.
    pub fn killed(&self) -> HashSet<i32> {
        (self.events.iter())
            .filter_map(|(_, e)| match e {
                Event::Killed { pid } => Some(*pid),
                _ => None,
            })
            .collect()
    }

    /// The log of member `pid`.
    pub fn log_of(&self, pid: i32) -> &Path {
        let started = (self.events.iter()).filter_map(|(_, e)| match e {
            Event::Started { pid } => Some(*pid),
            _ => None,
        });
        let index = started.into_iter().position(|p| p == pid).unwrap();
        &self.logs[index]
    }

    /// Lines of every member's log that contain `what`.
    pub fn log_lines(&self, what: &str) -> usize {
        (self.logs.iter())
            .map(|log| std::fs::read_to_string(log).unwrap_or_default())
            .map(|text| text.lines().filter(|l| l.contains(what)).count())
            .sum()
    }

    /// Fails, naming its log, if a member exited by itself.
    pub fn no_member_exited_by_itself(&self) {
        for (at, event) in &self.events {
            if let Event::Exited { pid, status } = event {
                panic!(
                    "{at}: member {pid} exited by itself ({status}); log {}",
                    self.log_of(*pid).display()
                );
            }
        }
    }

    /// Removes every member's log.
    pub fn remove_logs(&self) {
        for log in &self.logs {
            let _ = std::fs::remove_file(log);
        }
    }
}
