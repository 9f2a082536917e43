//! The `redrive` binary as an operator runs it, pointed at a test's database and Kafka.

use secrecy::ExposeSecret;
use std::process::{Command, Output, Stdio};

use super::{Bounded, CHILD_LIMIT};

/// The binary with the test's database settings.
pub fn redrive(settings: &redrive::Settings) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redrive"));
    command
        .env(
            "REDRIVE__DATABASE__URL",
            settings.database.url.expose_secret(),
        )
        .env("REDRIVE__DATABASE__SCHEMA", &settings.database.schema)
        .env(
            "REDRIVE__KAFKA__BOOTSTRAP_SERVERS",
            &settings.kafka.bootstrap_servers,
        )
        .env("RUST_LOG", "warn")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    command
}

/// Runs the binary with `args`; its output.
pub fn run(settings: &redrive::Settings, args: &[&str]) -> Output {
    redrive(settings)
        .args(args)
        .output_within(CHILD_LIMIT)
        .unwrap()
}
