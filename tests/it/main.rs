//! Integration tests against the real PostgreSQL on this machine.

mod config;
mod store;
mod support;
mod worker;
