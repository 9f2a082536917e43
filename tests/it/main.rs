//! Integration tests against the real PostgreSQL on this machine.

mod cli;
mod config;
mod process;
mod store;
mod support;
mod worker;
