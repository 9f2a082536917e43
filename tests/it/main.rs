//! Integration tests against the real PostgreSQL on this machine and librdkafka's mock
//! Kafka cluster.

mod admin_api;
mod brake;
mod breakers;
mod broker;
mod chaos;
mod cli;
mod compensation;
mod config;
mod guarantees;
mod hardening;
mod hostile;
mod http_server;
mod ingest;
mod ingest_faults;
mod member_process;
mod model;
mod observability;
mod operator_cli;
mod operators;
mod ordering;
mod outage;
mod outcomes;
mod process;
mod recovery_points;
mod replay;
mod republish;
mod stopping;
mod store;
mod support;
mod webhook;
mod worker;
