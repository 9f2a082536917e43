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

/// Regression (attack on the release binary): these passed "at least 1" and the member
/// then aborted allocating for them (exit 134, no key named).
#[test]
fn pool_batch_and_concurrency_sizes_past_their_bounds_are_refused() {
    for (variable, key, value) in [
        (
            "REDRIVE__DATABASE__MAX_CONNECTIONS",
            "database.max_connections",
            "2147483647",
        ),
        (
            "REDRIVE__WORKER__BATCH_SIZE",
            "worker.batch_size",
            "2147483648",
        ),
        (
            "REDRIVE__WORKER__CONCURRENCY",
            "worker.concurrency",
            "4294967295",
        ),
    ] {
        assert_refused(load_env(&[(variable, value)]), key, "at most");
    }
    assert!(load_env(&[("REDRIVE__WORKER__BATCH_SIZE", "10000")]).is_ok());
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
        "at most half of worker.lease",
    );
}

/// A heartbeat just under the lease was accepted, and a beat a few milliseconds late
/// (the database some way off) let the lease lapse and stopped the call at its first
/// beat: the margin is half the lease, and the error names both keys.
#[test]
fn a_heartbeat_that_leaves_no_margin_before_the_lease_is_refused() {
    let refused = load_env(&[
        ("REDRIVE__WORKER__LEASE", "10s"),
        ("REDRIVE__WORKER__HEARTBEAT", "9s 990ms"),
    ])
    .unwrap_err()
    .to_string();
    assert!(refused.contains("worker.heartbeat"), "{refused}");
    assert!(refused.contains("worker.lease = 10s"), "{refused}");
    assert!(refused.contains("at most half"), "{refused}");
    for fine in ["5s", "1s"] {
        load_env(&[
            ("REDRIVE__WORKER__LEASE", "10s"),
            ("REDRIVE__WORKER__HEARTBEAT", fine),
        ])
        .unwrap_or_else(|e| panic!("{fine}: {e}"));
    }
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

/// A configuration file is TOML whatever its name: one without the `.toml` extension
/// was refused as "not of a supported file format", naming neither the format nor why.
#[test]
fn a_config_file_is_read_as_toml_whatever_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("config");
    std::fs::write(&plain, "[worker]\nconcurrency = 3\n").unwrap();
    let settings = Settings::load(Some(&plain), Some(HashMap::new())).unwrap();
    assert_eq!(settings.worker.concurrency, 3);

    let yaml = dir.path().join("redrive.yaml");
    std::fs::write(&yaml, "worker:\n  concurrency: 3\n").unwrap();
    let err = Settings::load(Some(&yaml), Some(HashMap::new())).unwrap_err();
    assert!(
        err.to_string().contains("TOML parse error at line 1"),
        "a file that is not TOML gets TOML's own error: {err}"
    );
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
        route_toml("topics = [\"a\"]\nmode = \"capture\"\nhandler = \"log\"\nbrake = {}"),
        "routes[0].brake",
        "only a process-mode route has a brake",
    );
    for (brake, key, reason) in [
        (
            "failure_ratio = 0",
            "routes[0].brake.failure_ratio",
            "above 0",
        ),
        (
            "failure_ratio = 1.5",
            "routes[0].brake.failure_ratio",
            "at most 1",
        ),
        (
            "min_messages = 0",
            "routes[0].brake.min_messages",
            "at least 1",
        ),
        ("cool_down = \"0s\"", "routes[0].brake.cool_down", ""),
        ("window = \"2days\"", "routes[0].brake.window", ""),
    ] {
        assert_refused(
            route_toml(&format!(
                "topics = [\"a\"]\nmode = \"process\"\nhandler = \"log\"\nbrake = {{ {brake} }}"
            )),
            key,
            reason,
        );
    }
    assert_refused(
        route_toml("topics = [\"a\"]\nmode = \"capture\"\nhandler = \"log\"\nordering = \"fifo\""),
        "routes[0].ordering",
        "expected \"none\" or \"key\"",
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
    // Found by an attack: a route's topics were not checked as Kafka checks names, and
    // a route could consume Kafka's offsets topic as failures.
    for (topic, reason) in [
        ("a b", "' ' is not allowed"),
        ("..", "not a topic name Kafka accepts"),
        (&"t".repeat(250), "longer than Kafka's 249 characters"),
        ("__consumer_offsets", "Kafka's internal topic"),
        ("^orders.*", "'^' is not allowed"),
    ] {
        assert_refused(
            route_toml(&format!(
                "topics = [\"ok\", {topic:?}]\nmode = \"capture\"\nhandler = \"log\""
            )),
            "routes[0].topics",
            reason,
        );
    }
}

/// Found by an attack: an empty `kafka.bootstrap_servers` started a member that waited
/// for a broker for ever, and `kafka.properties` that redrive sets itself were taken and
/// silently overridden.
#[test]
fn kafka_settings_redrive_cannot_honour_are_refused_with_the_key() {
    for servers in [" ", ",", " , "] {
        assert_refused(
            load_env(&[("REDRIVE__KAFKA__BOOTSTRAP_SERVERS", servers)]),
            "kafka.bootstrap_servers",
            "must name at least one broker",
        );
    }
    for (property, key) in [
        ("\"group.id\" = \"other\"", "kafka.properties.group.id"),
        (
            "\"enable.auto.commit\" = \"true\"",
            "kafka.properties.enable.auto.commit",
        ),
        (
            "\"bootstrap.servers\" = \"elsewhere:9092\"",
            "kafka.properties.bootstrap.servers",
        ),
        // librdkafka's other names for the same properties (found by a second attack).
        (
            "\"metadata.broker.list\" = \"elsewhere:9092\"",
            "kafka.properties.metadata.broker.list",
        ),
        (
            "\"request.required.acks\" = \"0\"",
            "kafka.properties.request.required.acks",
        ),
        (
            "\"auto.commit.enable\" = \"true\"",
            "kafka.properties.auto.commit.enable",
        ),
    ] {
        assert_refused(
            load_toml(&format!("[kafka.properties]\n{property}")),
            key,
            "redrive sets it",
        );
    }
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

/// Panics if `text` holds `secret`.
fn assert_no_secret(text: &str, secret: &str) {
    assert!(!text.contains(secret), "the secret leaked: {text}");
}

/// The error of building a fleet with the built-in handlers.
fn builtin_build_error(settings: Settings) -> String {
    match Fleet::builder(settings).with_builtin_handlers().build() {
        Ok(_) => String::new(),
        Err(error) => format!("{error} / {error:?}"),
    }
}

#[test]
fn a_misspelt_kafka_property_is_refused_without_its_value() {
    let secret = "hunter2-misspelt";
    let err = load_toml(&format!(
        "[kafka.properties]\n\"sasl.pasword\" = \"{secret}\""
    ))
    .unwrap_err();
    let text = format!("{err} / {err:?}");
    assert_no_secret(&text, secret);
    assert_eq!(err.key, "kafka.properties.sasl.pasword", "{text}");
    assert!(text.contains("not a librdkafka property"), "{text}");
}

#[test]
fn an_invalid_kafka_property_value_is_refused_without_the_value() {
    let secret = "hunter2-invalid";
    let err = load_toml(&format!(
        "[kafka.properties]\n\"session.timeout.ms\" = \"{secret}\""
    ))
    .unwrap_err();
    let text = format!("{err} / {err:?}");
    assert_no_secret(&text, secret);
    assert_eq!(err.key, "kafka.properties.session.timeout.ms", "{text}");
    assert!(text.contains("nvalid value"), "{text}");
}

#[test]
fn a_wrong_password_with_an_invalid_mechanism_never_shows_the_password() {
    let secret = "hunter2-mechanism";
    let toml = format!(
        "[kafka.properties]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\
         \"sasl.mechanisms\" = \"BOGUS\"\n\"sasl.password\" = \"{secret}\""
    );
    let text = match load_toml(&toml) {
        Err(err) => format!("{err} / {err:?}"),
        Ok(settings) => {
            assert_no_secret(&format!("{settings:?}"), secret);
            builtin_build_error(settings)
        }
    };
    assert!(text.contains("kafka.properties"), "refused: {text}");
    assert_no_secret(&text, secret);
}

#[test]
fn settings_debug_output_hides_property_values() {
    let settings =
        load_env(&[("REDRIVE__KAFKA__PROPERTIES__SASL_PASSWORD", "hunter2-debug")]).unwrap();
    let text = format!("{settings:?}");
    assert_no_secret(&text, "hunter2-debug");
    assert!(text.contains("sasl.password"), "{text}");
}

#[test]
fn secrets_never_appear_in_configuration_errors() {
    let secret = "hunter2-db";
    // An unknown parameter: sqlx would log its value; refuse it first.
    let err = load_env(&[(
        "REDRIVE__DATABASE__URL",
        &format!("postgres://postgres@127.0.0.1/x?pasword={secret}"),
    )])
    .unwrap_err();
    assert_eq!(err.key, "database.url", "{err}");
    assert!(err.to_string().contains("\"pasword\""), "{err}");
    assert_no_secret(&format!("{err} / {err:?}"), secret);
    // The URL written where a table belongs.
    let err = load_toml(&format!("database = \"postgres://u:{secret}@h/db\"")).unwrap_err();
    assert_no_secret(&format!("{err} / {err:?}"), secret);
    assert!(err.to_string().contains("database"), "{err}");
    let err = load_toml(&format!("[kafka]\nproperties = \"sasl.password={secret}\"")).unwrap_err();
    assert_no_secret(&format!("{err} / {err:?}"), secret);
    // A syntax error: the TOML parser quotes the line, which holds the secret.
    let err = load_toml(&format!(
        "[kafka.properties]\n\"sasl.password\" = \"{secret}"
    ))
    .unwrap_err();
    let text = format!("{err} / {err:?}");
    assert_no_secret(&text, secret);
    assert!(text.contains("line 2"), "{text}");
}

#[tokio::test]
async fn a_database_password_is_not_in_the_connect_error() {
    let secret = "hunter2-connect";
    let settings = load_env(&[
        (
            "REDRIVE__DATABASE__URL",
            &format!("postgres://postgres:{secret}@no-such-host.invalid:5432/x"),
        ),
        ("REDRIVE__DATABASE__CONNECT_TIMEOUT", "2s"),
    ])
    .unwrap();
    assert_no_secret(&format!("{settings:?}"), secret);
    let err = redrive::Store::connect(&settings.database)
        .await
        .unwrap_err();
    assert_no_secret(&format!("{err} / {err:?}"), secret);
}

#[test]
fn kafka_properties_can_be_set_from_the_environment() {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(
        file,
        "[kafka.properties]\n\"sasl.password\" = \"from-file\"\n\"sasl.username\" = \"redrive\""
    )
    .unwrap();
    let env = HashMap::from([
        (
            "REDRIVE__KAFKA__PROPERTIES__SASL_PASSWORD".to_string(),
            "from-env".to_string(),
        ),
        (
            "REDRIVE__KAFKA__PROPERTIES__SECURITY_PROTOCOL".to_string(),
            "SASL_SSL".to_string(),
        ),
        (
            "redrive__kafka__properties__log_level".to_string(),
            "6".to_string(),
        ),
    ]);
    let settings = Settings::load(Some(file.path()), Some(env)).unwrap();
    let properties = &settings.kafka.properties;
    assert_eq!(
        properties["sasl.password"], "from-env",
        "env beats the file"
    );
    assert_eq!(properties["sasl.username"], "redrive");
    assert_eq!(properties["security.protocol"], "SASL_SSL");
    assert_eq!(properties["log_level"], "6", "names with _ are kept");
    assert_eq!(properties.len(), 4, "{properties:?}");

    assert_refused(
        load_env(&[("REDRIVE__KAFKA__PROPERTIES__SASL_PASWORD", "x")]),
        "kafka.properties.sasl.pasword",
        "not a librdkafka property",
    );
}

#[test]
fn database_url_follows_one_rule_for_every_verb() {
    let redrive_url = "postgres://a@redrive-var/db";
    let plain_url = "postgres://b@database-url/db";
    let url = |s: &Settings| {
        use secrecy::ExposeSecret;
        s.database.url.expose_secret().to_owned()
    };
    assert_eq!(
        url(&load_env(&[("DATABASE_URL", plain_url)]).unwrap()),
        plain_url
    );
    let both = load_env(&[
        ("DATABASE_URL", plain_url),
        ("REDRIVE__DATABASE__URL", redrive_url),
    ])
    .unwrap();
    assert_eq!(
        url(&both),
        redrive_url,
        "REDRIVE__DATABASE__URL beats DATABASE_URL"
    );
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(file, "[database]\nurl = \"postgres://c@file/db\"").unwrap();
    let env = HashMap::from([("DATABASE_URL".to_string(), plain_url.to_string())]);
    let from_file = Settings::load(Some(file.path()), Some(env)).unwrap();
    assert_eq!(url(&from_file), plain_url, "DATABASE_URL beats the file");
}

#[test]
fn lists_in_the_environment_are_comma_separated() {
    let settings = load_env(&[("REDRIVE__WORKER__HANDLERS", "log, republish")]).unwrap();
    assert_eq!(settings.worker.handlers, ["log", "republish"]);
    assert_refused(
        load_env(&[("REDRIVE__WORKER__HANDLERS", "log,,republish")]),
        "worker.handlers",
        "empty handler name",
    );
}

#[test]
fn durations_beyond_their_bound_are_refused() {
    let cases = [
        ("REDRIVE__WORKER__LEASE", "1000000y", "worker.lease", "1day"),
        (
            "REDRIVE__WORKER__POLL_INTERVAL",
            "2h",
            "worker.poll_interval",
            "1h",
        ),
        (
            "REDRIVE__WORKER__SHUTDOWN_TIMEOUT",
            "2h",
            "worker.shutdown_timeout",
            "1h",
        ),
        ("REDRIVE__RETRY__TIMEOUT", "2days", "retry.timeout", "1day"),
        (
            "REDRIVE__RETRY__BACKOFF_CAP",
            "1000y",
            "retry.backoff_cap",
            "365days",
        ),
        ("REDRIVE__INGEST__LINGER", "61s", "ingest.linger", "1min"),
        (
            "REDRIVE__DATABASE__CONNECT_TIMEOUT",
            "2h",
            "database.connect_timeout",
            "1h",
        ),
    ];
    for (var, value, key, bound) in cases {
        assert_refused(load_env(&[(var, value)]), key, &format!("at most {bound}"));
    }
    for (var, value) in [
        ("REDRIVE__WORKER__LEASE", "1day"),
        ("REDRIVE__RETRY__BACKOFF_CAP", "365days"),
        ("REDRIVE__INGEST__LINGER", "1m"),
    ] {
        load_env(&[(var, value)]).expect("the bound itself is accepted");
    }
    let route = "topics = [\"a\"]\nmode = \"capture\"\nhandler = \"log\"\n";
    for (field, value, bound) in [
        ("backoff_cap", "1000000y", "365days"),
        ("backoff_base", "400days", "365days"),
        ("timeout", "2days", "1day"),
    ] {
        assert_refused(
            route_toml(&format!("{route}{field} = \"{value}\"")),
            &format!("routes[0].{field}"),
            &format!("at most {bound}"),
        );
    }
}

#[test]
fn max_attempts_must_fit_the_task_column() {
    assert_refused(
        route_toml(
            "topics = [\"a\"]\nmode = \"capture\"\nhandler = \"log\"\nmax_attempts = 4294967295",
        ),
        "routes[0].max_attempts",
        "at most 2147483647",
    );
    assert_refused(
        load_env(&[("REDRIVE__RETRY__MAX_ATTEMPTS", "2147483648")]),
        "retry.max_attempts",
        "at most 2147483647",
    );
    load_env(&[("REDRIVE__RETRY__MAX_ATTEMPTS", "2147483647")]).unwrap();
}

#[test]
fn schema_names_postgresql_reserves_are_refused() {
    for word in ["select", "user", "table", "current_schema", "verbose"] {
        assert_refused(
            load_env(&[("REDRIVE__DATABASE__SCHEMA", word)]),
            "database.schema",
            "reserved word",
        );
    }
    assert_refused(
        load_env(&[("REDRIVE__DATABASE__SCHEMA", "pg_redrive")]),
        "database.schema",
        "pg_ is reserved",
    );
    load_env(&[("REDRIVE__DATABASE__SCHEMA", "users")]).expect("not a keyword");
}

#[test]
fn admin_tokens_come_from_the_environment_and_stay_hidden() {
    let secret = "s3cret-token-from-k8s-0123";
    let settings = load_env(&[
        ("REDRIVE__ADMIN__LISTEN", "0.0.0.0:9465"),
        ("REDRIVE__ADMIN__TOKENS__OPS__ROLE", "operate"),
        ("REDRIVE__ADMIN__TOKENS__OPS__TOKEN", secret),
    ])
    .unwrap();
    let token = &settings.admin.tokens["ops"];
    assert_eq!(token.role, redrive::config::Role::Operate);
    assert!(
        !format!("{settings:?}").contains(secret),
        "Debug shows the token"
    );
    // A short token is refused without printing it.
    let short = load_env(&[
        ("REDRIVE__ADMIN__TOKENS__OPS__ROLE", "read"),
        ("REDRIVE__ADMIN__TOKENS__OPS__TOKEN", "tiny-secret"),
    ])
    .unwrap_err();
    assert_eq!(short.key, "admin.tokens.ops.token");
    assert!(!short.to_string().contains("tiny-secret"), "{short}");
}

#[test]
fn an_open_admin_api_is_refused_off_loopback() {
    assert_refused(
        load_env(&[("REDRIVE__ADMIN__LISTEN", "0.0.0.0:9465")]),
        "admin.tokens",
        "not a loopback address",
    );
    assert!(load_env(&[("REDRIVE__ADMIN__LISTEN", "127.0.0.1:9465")]).is_ok());
    assert_refused(
        load_env(&[("REDRIVE__ADMIN__LISTEN", "localhost:port")]),
        "admin.listen",
        "",
    );
    assert_refused(
        load_toml("[admin.tokens.ops]\nrole = \"admin\"\ntoken = \"0123456789abcdefgh\""),
        "admin.tokens.ops.role",
        "admin",
    );
    assert_refused(
        load_toml(
            "[admin.tokens.a]\nrole = \"read\"\ntoken = \"0123456789abcdefgh\"\n\
             [admin.tokens.b]\nrole = \"operate\"\ntoken = \"0123456789abcdefgh\"",
        ),
        "admin.tokens.b.token",
        "same as another",
    );
}

#[test]
fn retention_ages_are_checked() {
    let settings = load_env(&[("REDRIVE__RETENTION__PERMANENT_FAILURE", "30days")]).unwrap();
    assert_eq!(
        settings.retention.permanent_failure,
        Some(std::time::Duration::from_secs(30 * 86_400))
    );
    assert_eq!(
        settings.retention.resolved,
        Some(std::time::Duration::from_secs(7 * 86_400))
    );
    assert_refused(
        load_env(&[("REDRIVE__RETENTION__RESOLVED", "0s")]),
        "retention.resolved",
        "longer than 0s",
    );
    assert_refused(
        load_env(&[("REDRIVE__RETENTION__DISCARDED", "soon")]),
        "retention.discarded",
        "not a duration",
    );
}

/// A republish target or a parking topic that a route consumes is an endless loop
/// (each task produced comes back as a new task): refused at start-up, naming both keys.
#[test]
fn producing_to_a_topic_a_route_consumes_is_refused_naming_both_keys() {
    let capture =
        "[[routes]]\ntopics = [\"orders.dlt\"]\nmode = \"capture\"\nhandler = \"republish\"\n";
    let by_pattern =
        "[[routes]]\npattern = \"^.*\\\\.dlt\"\nmode = \"capture\"\nhandler = \"log\"\n";
    let process = "[[routes]]\ntopics = [\"orders\"]\nmode = \"process\"\nhandler = \"log\"\n";
    let refused: &[(String, &str, &str)] = &[
        (
            format!("[republish]\ntarget_topic = \"orders.dlt\"\n{capture}"),
            "republish.target_topic",
            "routes[0].topics",
        ),
        (
            format!("[parking]\ntopic = \"orders.dlt\"\n{capture}"),
            "parking.topic",
            "routes[0].topics",
        ),
        // The pattern matches whole names, as librdkafka's subscription does.
        (
            format!("[parking]\ntopic = \"orders.parked.dlt\"\n{process}{by_pattern}"),
            "parking.topic",
            "routes[1].pattern",
        ),
        (
            format!("[republish]\ntarget_topic = \"payments.dlt\"\n{by_pattern}"),
            "republish.target_topic",
            "routes[0].pattern",
        ),
        // A parked message a process route runs again fails again, and is parked again.
        (
            format!("[parking]\ntopic = \"orders\"\n{process}"),
            "parking.topic",
            "routes[0].topics",
        ),
        // A process route that republishes to its own topic feeds itself.
        (
            "[republish]\ntarget_topic = \"orders\"\n[[routes]]\ntopics = [\"orders\"]\n\
             mode = \"process\"\nhandler = \"republish\"\n"
                .to_owned(),
            "republish.target_topic",
            "routes[0].topics",
        ),
    ];
    for (toml, key, route_key) in refused {
        assert_refused(load_toml(toml), key, route_key);
        assert_refused(load_toml(toml), key, "endless loop");
    }
    // Not loops: republishing into a topic a process route handles (the usual way back),
    // and a pattern that only matches when read unanchored at the end.
    for toml in [
        format!("[republish]\ntarget_topic = \"orders\"\n{process}{capture}"),
        format!("[parking]\ntopic = \"orders.dlt.parked\"\n{by_pattern}"),
    ] {
        let settings = load_toml(&toml).unwrap_or_else(|e| panic!("{toml}: {e}"));
        Fleet::builder(settings)
            .with_builtin_handlers()
            .build()
            .unwrap_or_else(|e| panic!("{toml}: {e}"));
    }
    // Settings built in code are checked when the fleet is built.
    let mut settings = load_env(&[]).unwrap();
    settings.routes.push(redrive::config::RouteSettings::new(
        &["orders.dlt"],
        redrive::config::RouteMode::Capture,
        "log",
    ));
    settings.parking.topic = Some("orders.dlt".into());
    let text = builtin_build_error(settings);
    assert!(
        text.contains("parking.topic") && text.contains("routes[0].topics"),
        "{text}"
    );
}

/// Credentials in a webhook URL (userinfo, query values) appear neither in the settings'
/// `Debug` output nor in any configuration error about it.
#[test]
fn credentials_in_webhook_urls_are_never_shown() {
    let secrets = ["s3cret-pass", "s3cret-key"];
    let url = |scheme: &str| {
        format!(
            "{scheme}://user:{}@hooks.example:8443/in?api_key={}",
            secrets[0], secrets[1]
        )
    };
    let settings = load_toml(&format!(
        "[webhooks.billing]\nurl = \"{}\"\n[webhooks.billing.routes.orders]\nurl = \"{}\"",
        url("https"),
        url("http")
    ))
    .unwrap();
    let shown = format!("{settings:?}");
    assert!(shown.contains("hooks.example:8443/in"), "{shown}");
    for secret in secrets {
        assert_no_secret(&shown, secret);
    }
    let errors = [
        load_toml(&format!("[webhooks.billing]\nurl = \"{}\"", url("ftp"))),
        load_toml(&format!(
            "[webhooks.billing]\nurl = \"{}\"",
            url("https").replace("hooks.example", "hooks example")
        )),
        load_toml(&format!(
            "[webhooks.billing]\nurl = \"https://a.example/\"\n\
             [webhooks.billing.routes.orders]\nurl = \"{}\"",
            url("mailto")
        )),
        load_toml(&format!(
            "[webhooks.billing]\nroutes = \"{}\"",
            url("https")
        )),
        load_env(&[("REDRIVE__WEBHOOKS__BILLING__URL", &url("ftp"))]),
    ];
    for error in errors {
        let error = error.expect_err("refused");
        let text = format!("{error} / {error:?}");
        assert!(text.contains("webhooks.billing"), "{text}");
        for secret in secrets {
            assert_no_secret(&text, secret);
        }
    }
}

/// A route's own republish and parking topics and its `max_generations` are checked like
/// the global keys, and a route's own targets cannot make a loop either.
#[test]
fn route_targets_and_max_generations_are_checked() {
    let republish = "topics = [\"orders.dlt\"]\nmode = \"capture\"\nhandler = \"republish\"\n";
    let settings = route_toml(&format!(
        "{republish}republish_topic = \"orders.retry\"\nparking_topic = \"orders.parking\""
    ))
    .unwrap();
    let route = &settings.routes[0];
    assert_eq!(route.republish_topic.as_deref(), Some("orders.retry"));
    assert_eq!(route.parking_topic.as_deref(), Some("orders.parking"));
    assert_eq!(route.max_generations, None);
    assert_eq!(route.generation_limit(), 3, "the default");
    for (extra, key, reason) in [
        (
            "republish_topic = \"\"",
            "routes[0].republish_topic",
            "must not be empty",
        ),
        (
            "parking_topic = \"\"",
            "routes[0].parking_topic",
            "must not be empty",
        ),
        (
            "parking_topic = \"orders parking\"",
            "routes[0].parking_topic",
            "' ' is not allowed",
        ),
        (
            "parking_topic = \"..\"",
            "routes[0].parking_topic",
            "not a topic name",
        ),
        (
            "max_generations = 0",
            "routes[0].max_generations",
            "must be 1 to 1000",
        ),
        (
            "max_generations = 1001",
            "routes[0].max_generations",
            "must be 1 to 1000",
        ),
        (
            "republish_topic = \"orders.dlt\"",
            "routes[0].republish_topic",
            "endless loop",
        ),
        (
            "parking_topic = \"orders.dlt\"",
            "routes[0].parking_topic",
            "endless loop",
        ),
    ] {
        assert_refused(route_toml(&format!("{republish}{extra}")), key, reason);
    }
    let long = "t".repeat(250);
    assert_refused(
        route_toml(&format!("{republish}parking_topic = \"{long}\"")),
        "routes[0].parking_topic",
        "longer than Kafka's 249",
    );
    assert_refused(
        route_toml(
            "topics = [\"orders.dlt\"]\nmode = \"capture\"\nhandler = \"log\"\n\
             republish_topic = \"orders.retry\"",
        ),
        "routes[0].republish_topic",
        "only the republish handler produces to it",
    );
    assert_refused(
        load_toml("[parking]\ntopic = \"\""),
        "parking.topic",
        "must not be empty",
    );
    assert_refused(
        load_toml("[republish]\ntarget_topic = \"a/b\""),
        "republish.target_topic",
        "not a topic name",
    );
}

/// Issue 17 follow-up: `max_generations` means something on a capture route only (a
/// process route follows no lineage); on a process route it is refused, not ignored.
#[test]
fn max_generations_on_a_process_route_is_refused() {
    assert_refused(
        route_toml(
            "topics = [\"orders\"]\nmode = \"process\"\nhandler = \"log\"\nmax_generations = 5",
        ),
        "routes[0].max_generations",
        "only a capture-mode route",
    );
    // The default is no setting: a process route without the key loads.
    let process = route_toml("topics = [\"orders\"]\nmode = \"process\"\nhandler = \"log\"");
    process.unwrap();
    // Settings built in code are checked when the fleet is built.
    let mut settings = load_env(&[]).unwrap();
    let mut route = redrive::config::RouteSettings::new(
        &["orders"],
        redrive::config::RouteMode::Process,
        "log",
    );
    route.max_generations = Some(2);
    settings.routes.push(route);
    let text = builtin_build_error(settings);
    assert!(
        text.contains("routes[0].max_generations") && text.contains("only a capture-mode route"),
        "{text}"
    );
}

/// Issue 17 follow-up: Kafka's internal topics (apache/kafka's `Topic.INTERNAL_TOPICS`,
/// and the KRaft metadata log) are no republish or parking target.
#[test]
fn kafka_internal_topics_are_refused_as_targets() {
    let republish = "topics = [\"orders.dlt\"]\nmode = \"capture\"\nhandler = \"republish\"\n";
    for internal in [
        "__consumer_offsets",
        "__transaction_state",
        "__share_group_state",
        "__cluster_metadata",
    ] {
        for (toml, key) in [
            (
                format!("[parking]\ntopic = \"{internal}\""),
                "parking.topic",
            ),
            (
                format!("[republish]\ntarget_topic = \"{internal}\""),
                "republish.target_topic",
            ),
            (
                format!("[[routes]]\n{republish}parking_topic = \"{internal}\""),
                "routes[0].parking_topic",
            ),
            (
                format!("[[routes]]\n{republish}republish_topic = \"{internal}\""),
                "routes[0].republish_topic",
            ),
        ] {
            assert_refused(load_toml(&toml), key, "Kafka's internal topic");
        }
        assert_refused(
            load_env(&[("REDRIVE__PARKING__TOPIC", internal)]),
            "parking.topic",
            internal,
        );
    }
    // A name that only starts like one is a topic of its own.
    load_toml("[parking]\ntopic = \"__consumer_offsets_parked\"").unwrap();
}

/// Issue 17 follow-up: a list of names holds strings; the `config` crate would turn
/// `5` into `"5"`, so an element of another type is refused by its key.
#[test]
fn a_list_of_names_refuses_an_element_that_is_not_a_string() {
    for (element, shown) in [
        ("5", "integer `5`"),
        ("true", "boolean `true`"),
        ("1.5", "floating point `1.5`"),
    ] {
        assert_refused(
            route_toml(&format!(
                "topics = [\"t\", {element}]\nmode = \"capture\"\nhandler = \"log\""
            )),
            "routes[0].topics[1]",
            &format!("invalid type: {shown}, expected a string"),
        );
        assert_refused(
            load_toml(&format!("[worker]\nhandlers = [{element}, \"log\"]")),
            "worker.handlers[0]",
            &format!("invalid type: {shown}, expected a string"),
        );
    }
    // Strings still load, from the file and from the environment (whose values are
    // all strings, a number among them too).
    let settings = route_toml("topics = [\"t\", \"5\"]\nmode = \"capture\"\nhandler = \"log\"");
    assert_eq!(settings.unwrap().routes[0].topics, ["t", "5"]);
    let settings = load_env(&[("REDRIVE__WORKER__HANDLERS", "log,5")]).unwrap();
    assert_eq!(settings.worker.handlers, ["log", "5"]);
    let settings = load_env(&[("REDRIVE__WORKER__HANDLERS", "log")]).unwrap();
    assert_eq!(settings.worker.handlers, ["log"]);
}

/// `fetch_originals_from` lists topic names Kafka accepts, at least one, and only on a
/// capture route (a process route fetches no originals).
#[test]
fn fetch_originals_from_is_checked() {
    let capture = "topics = [\"billing.dlq\"]\nmode = \"capture\"\nhandler = \"republish\"";
    let settings = route_toml(&format!(
        "{capture}\nfetch_originals_from = [\"billing\", \"invoices\"]"
    ))
    .unwrap();
    assert_eq!(
        settings.routes[0].fetch_originals_from,
        Some(vec!["billing".to_owned(), "invoices".to_owned()])
    );
    assert_eq!(
        route_toml(capture).unwrap().routes[0].fetch_originals_from,
        None
    );
    for (list, reason) in [
        ("[]", "must list at least one topic"),
        ("[\"bill ing\"]", "not a topic name"),
        ("[\"\"]", "must not be empty"),
    ] {
        assert_refused(
            route_toml(&format!("{capture}\nfetch_originals_from = {list}")),
            "routes[0].fetch_originals_from",
            reason,
        );
    }
    assert_refused(
        route_toml(
            "topics = [\"orders\"]\nmode = \"process\"\nhandler = \"log\"\n\
             fetch_originals_from = [\"billing\"]",
        ),
        "routes[0].fetch_originals_from",
        "only a capture-mode route",
    );
}
