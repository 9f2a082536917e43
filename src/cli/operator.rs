//! Asking before acting, as every acting verb does.

use anyhow::{bail, Context};
use std::io::{IsTerminal, Write};

use crate::output::err;

/// Asks `question` on the terminal; true to go on. Off a terminal (a script, a pipe)
/// there is no one to ask: refused unless `yes` (`--yes`).
pub fn confirm(question: &str, yes: bool) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "{} needs confirmation, and standard input is not a terminal to ask on: \
             pass --yes to act without asking; nothing was done",
            question.trim_end_matches('?')
        );
    }
    err!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("reading the answer")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}
