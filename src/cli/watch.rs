//! `--watch [SECONDS]` of `tasks list` and `tasks stats`: the verb's output again every
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
    /// Print again every SECONDS (2 when not given) until Ctrl-C.
    #[arg(
        long,
        value_name = "SECONDS",
        num_args = 0..=1,
        default_missing_value = "2",
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub watch: Option<u64>,
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
