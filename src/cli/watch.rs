//! `--watch [INTERVAL]` of `tasks list`, `tasks groups` and `tasks stats`: the verb's output again every
//! interval until Ctrl-C. On a terminal each refresh clears the screen; elsewhere
//! refreshes follow one another, each after a blank line and a line with its time. A
//! closed standard output ends the watch quietly.

use clap::Args;
use std::future::Future;
use std::io::{self, IsTerminal, Write};
use std::time::Duration;

use crate::when::at;

/// The `--watch` option.
#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Print again every INTERVAL (seconds, or a duration such as `10s` or `1m`; 2 s when
    /// not given) until Ctrl-C.
    #[arg(
        long,
        value_name = "INTERVAL",
        num_args = 0..=1,
        default_missing_value = "2",
        value_parser = interval
    )]
    pub watch: Option<u64>,
}

/// Longest interval between refreshes, in seconds (a day).
const LONGEST: u64 = 86_400;

/// An interval as written: whole seconds (`10`) or a duration (`10s`, `1m`), from 1 s
/// to a day; answers seconds.
fn interval(text: &str) -> Result<u64, String> {
    let seconds = match text.parse::<u64>() {
        Ok(seconds) => seconds,
        Err(_) => {
            let duration = humantime::parse_duration(text)
                .map_err(|error| format!("{error}: give seconds (10) or a duration (10s, 1m)"))?;
            if duration.subsec_nanos() != 0 {
                return Err("give whole seconds".to_owned());
            }
            duration.as_secs()
        }
    };
    match seconds {
        1..=LONGEST => Ok(seconds),
        _ => Err(format!("from 1 s to a day ({LONGEST} s)")),
    }
}

/// Options of `tasks stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print again every interval.
    #[command(flatten)]
    pub watch: WatchArgs,
}

/// Runs `print` once, or, with `--watch`, every interval until Ctrl-C or until standard
/// output is closed.
pub async fn every<F, Fut>(watch: &WatchArgs, mut print: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let Some(seconds) = watch.watch else {
        return print().await;
    };
    let terminal = io::stdout().is_terminal();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    for refresh in 0_u64.. {
        let now = at(chrono::Utc::now());
        let heading = match (terminal, refresh) {
            (true, _) => format!("\x1b[H\x1b[2JEvery {seconds} s, {now} UTC (Ctrl-C to stop)\n\n"),
            (false, 0) => format!("-- {now} UTC\n"),
            (false, _) => format!("\n-- {now} UTC\n"),
        };
        let mut out = io::stdout().lock();
        match out.write_all(heading.as_bytes()).and_then(|()| out.flush()) {
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            written => written?,
        }
        drop(out);
        print().await?;
        tokio::select! {
            biased;
            _ = &mut interrupted => return Ok(()),
            () = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::interval;

    #[test]
    fn an_interval_is_seconds_or_a_duration_from_a_second_to_a_day() {
        for (text, seconds) in [
            ("10", 10),
            ("10s", 10),
            ("1m", 60),
            ("1day", 86_400),
            ("1", 1),
        ] {
            assert_eq!(interval(text), Ok(seconds), "{text}");
        }
        for text in [
            "0",
            "0s",
            "1500ms",
            "86401",
            "2days",
            "-1",
            "1e-20",
            "",
            "ten",
            "18446744073709551616",
        ] {
            assert!(interval(text).is_err(), "{text} is refused");
        }
    }
}
