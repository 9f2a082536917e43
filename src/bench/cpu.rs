//! CPU time used by this process and by the machine's PostgreSQL processes, read from
//! `/proc` (Linux; elsewhere the figures are absent).

use std::fs;

/// CPU seconds (user and system) of this process and of every process named `postgres`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuTimes {
    pub this_process: f64,
    pub postgres: f64,
}

impl CpuTimes {
    /// The times now; `None` where `/proc` cannot be read.
    pub(crate) fn now() -> Option<CpuTimes> {
        let ticks = clock_ticks()?;
        let this_process = process_ticks(&fs::read_to_string("/proc/self/stat").ok()?)?.1;
        let mut postgres = 0;
        for entry in fs::read_dir("/proc").ok()?.flatten() {
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some(("postgres", used)) = process_ticks(&stat) {
                postgres += used;
            }
        }
        Some(CpuTimes {
            this_process: this_process as f64 / ticks,
            postgres: postgres as f64 / ticks,
        })
    }

    /// The CPU seconds used since `before`.
    pub(crate) fn since(self, before: CpuTimes) -> CpuTimes {
        CpuTimes {
            this_process: self.this_process - before.this_process,
            postgres: self.postgres - before.postgres,
        }
    }
}

/// CPU seconds (user and system) used so far by thread `tid` of this process.
pub(crate) fn thread_seconds(tid: i32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    Some(process_ticks(&stat)?.1 as f64 / clock_ticks()?)
}

/// The kernel's id of the calling thread, for [`thread_seconds`].
pub(crate) fn this_thread_id() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// Clock ticks per second of `/proc`'s counters.
fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// A process's name and its user plus system ticks, from its `/proc/PID/stat` line. The
/// name is in parentheses and may hold spaces or parentheses itself: the fields after
/// it start at the last `)`.
fn process_ticks(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let mut fields = stat.get(close + 1..)?.split_whitespace();
    // After the name: state (field 3) ... utime is field 14, stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::process_ticks;

    #[test]
    fn a_stat_line_gives_the_name_and_the_ticks_even_with_odd_names() {
        let line = "4242 (postgres) S 1 4242 4242 0 -1 4194560 1185 0 0 0 7 5 0 0 20 0 1 0 1 0 0";
        assert_eq!(process_ticks(line), Some(("postgres", 12)));
        let odd = "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 30 12 0 0 20 0 1 0 1 0 0";
        assert_eq!(process_ticks(odd), Some(("a) b (c)", 42)));
        assert_eq!(process_ticks("garbage"), None);
    }
}
