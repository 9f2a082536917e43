//! The `redrive` binary: the CLI with the built-in handlers.

use redrive::LogHandler;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    redrive::cli::main_with(|fleet| fleet.handler("log", LogHandler)).await
}
