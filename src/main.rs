//! The `redrive` binary: the CLI with the built-in handlers.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    redrive::cli::main_with(|fleet| fleet.with_builtin_handlers()).await
}
