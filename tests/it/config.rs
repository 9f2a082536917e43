//! Every configuration error names the key and the reason.

use redrive::{Fleet, LogHandler, Settings};
use std::collections::HashMap;
use std::io::Write;

fn load_env(pairs: &[(&str, &str)]) -> Result<Settings, redrive::ConfigError> {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::load(None, Some(env))
}

fn load_toml(text: &str) -> Result<Settings, redrive::ConfigError> {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    Settings::load(Some(file.path()), Some(HashMap::new()))
}

#[test]
fn defaults_are_valid() {
    let settings = load_env(&[]).unwrap();
    assert_eq!(settings.worker.batch_size, 100);
    assert_eq!(settings.database.schema, "redrive");
}

#[test]
fn file_then_environment_layers_apply_in_order() {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(
        file,
        "[worker]\nbatch_size = 7\nconcurrency = 9\nlease = \"2m\""
    )
    .unwrap();
    let env = HashMap::from([("REDRIVE__WORKER__BATCH_SIZE".to_string(), "11".to_string())]);
    let settings = Settings::load(Some(file.path()), Some(env)).unwrap();
    assert_eq!(settings.worker.batch_size, 11, "environment beats the file");
    assert_eq!(
        settings.worker.concurrency, 9,
        "the file beats the defaults"
    );
    assert_eq!(settings.worker.lease, std::time::Duration::from_secs(120));
}

fn assert_refused(result: Result<Settings, redrive::ConfigError>, key: &str, reason: &str) {
    let err = result.expect_err("configuration should be refused");
    assert_eq!(err.key, key, "{err}");
    let text = err.to_string();
    assert!(text.contains(key) && text.contains(reason), "{text}");
}

#[test]
fn batch_size_of_zero_is_refused() {
    assert_refused(
        load_env(&[("REDRIVE__WORKER__BATCH_SIZE", "0")]),
        "worker.batch_size",
        "at least 1",
    );
    assert_refused(
        load_toml("[worker]\nbatch_size = 0"),
        "worker.batch_size",
        "at least 1",
    );
}

#[test]
fn negative_duration_is_refused() {
    assert_refused(
        load_env(&[("REDRIVE__WORKER__LEASE", "-5s")]),
        "worker.lease",
        "negative",
    );
    assert_refused(
        load_toml("[retry]\ntimeout = \"-1m\""),
        "retry.timeout",
        "negative",
    );
}

#[test]
fn unparsable_duration_is_refused() {
    assert_refused(
        load_toml("[worker]\nheartbeat = \"soon\""),
        "worker.heartbeat",
        "not a duration",
    );
}

#[test]
fn unparsable_database_url_is_refused() {
    assert_refused(
        load_env(&[("REDRIVE__DATABASE__URL", "not a url")]),
        "database.url",
        "not a PostgreSQL URL",
    );
    assert_refused(
        load_env(&[("REDRIVE__DATABASE__URL", "mysql://x@y/z")]),
        "database.url",
        "not a PostgreSQL URL",
    );
}

/// The error of building a fleet with only the `log` handler.
fn build_error_with_log_handler(settings: Settings) -> String {
    let built = Fleet::builder(settings).handler("log", LogHandler).build();
    built
        .err()
        .expect("the fleet should be refused")
        .to_string()
}

#[test]
fn unknown_handler_name_is_refused() {
    let settings = load_env(&[("REDRIVE__WORKER__HANDLERS", "log,orders")]).unwrap();
    let text = build_error_with_log_handler(settings);
    assert!(
        text.contains("worker.handlers") && text.contains("unknown handler \"orders\""),
        "{text}"
    );
}

#[test]
fn duplicate_handler_name_is_refused() {
    let settings = load_env(&[]).unwrap();
    let err = Fleet::builder(settings)
        .handler("log", LogHandler)
        .handler("log", LogHandler)
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("registered twice"), "{err}");
}

#[test]
fn unknown_keys_and_wrong_types_are_refused() {
    let err = load_toml("[worker]\nbatchsize = 5").unwrap_err();
    assert!(err.to_string().contains("batchsize"), "{err}");
    assert_refused(
        load_toml("[worker]\nconcurrency = \"many\""),
        "worker.concurrency",
        "many",
    );
}

#[test]
fn heartbeat_must_be_shorter_than_the_lease() {
    assert_refused(
        load_env(&[
            ("REDRIVE__WORKER__LEASE", "10s"),
            ("REDRIVE__WORKER__HEARTBEAT", "10s"),
        ]),
        "worker.heartbeat",
        "shorter than worker.lease",
    );
}

#[test]
fn missing_config_file_is_refused() {
    let err = Settings::load(
        Some(std::path::Path::new("/nonexistent/redrive.toml")),
        Some(HashMap::new()),
    )
    .unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[test]
fn the_example_file_is_valid_and_matches_the_defaults() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("redrive.example.toml");
    let from_file = Settings::load(Some(&path), Some(HashMap::new())).unwrap();
    let defaults = load_env(&[]).unwrap();
    assert_eq!(format!("{from_file:?}"), format!("{defaults:?}"));
}

fn route_toml(body: &str) -> Result<Settings, redrive::ConfigError> {
    load_toml(&format!("[[routes]]\n{body}"))
}

#[test]
fn invalid_routes_are_refused_with_the_key() {
    assert_refused(
        route_toml("mode = \"capture\"\nhandler = \"log\""),
        "routes[0].topics",
        "topics or a pattern",
    );
    assert_refused(
        route_toml("topics = [\"a\"]\nmode = \"replay\"\nhandler = \"log\""),
        "routes[0].mode",
        "expected \"capture\" or \"process\"",
    );
    assert_refused(
        route_toml("topics = [\"a\"]\nmode = \"capture\"\nhandler = \"log\"\n[[routes]]\ntopics = [\"a\"]\nmode = \"process\"\nhandler = \"log\""),
        "routes[1].topics",
        "in two routes",
    );
    assert_refused(
        route_toml("pattern = \"(unclosed\"\nmode = \"capture\"\nhandler = \"log\""),
        "routes[0].pattern",
        "not a regular expression",
    );
}

#[test]
fn a_route_to_an_unknown_handler_refuses_to_start() {
    let settings =
        route_toml("topics = [\"orders.dlt\"]\nmode = \"capture\"\nhandler = \"sync\"").unwrap();
    let text = build_error_with_log_handler(settings);
    assert!(
        text.contains("routes[0].handler") && text.contains("unknown handler \"sync\""),
        "{text}"
    );
}
