//! Integration tests against the real PostgreSQL on this machine.

mod config;
