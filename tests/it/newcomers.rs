//! A newcomer's first steps through the binary: the demo's next commands work as printed,
//! a missing database is named with the variable that named it, config errors name keys
//! as written, a member without routes says it only works tasks, and the configuration
//! docs/deploying.md shows loads.

use secrecy::ExposeSecret;
use std::io::Write;
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::docs::block;
use crate::support::{eventually, fresh_store, settings, unique_schema, Spawn};
use crate::support::{Bounded, CHILD_LIMIT};

/// The binary with no database variable inherited.
fn redrive() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redrive"));
    command
        .env_remove("DATABASE_URL")
        .env_remove("REDRIVE__DATABASE__URL")
        .env("REDRIVE__DATABASE__SCHEMA", unique_schema())
        .env("RUST_LOG", "warn");
    command
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn config_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

/// The test database's URL with another database name.
fn url_of_missing_database(name: &str) -> String {
    let url = settings("unused").database.url.expose_secret().to_owned();
    let (server, _) = url.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

#[test]
fn a_missing_database_is_named_with_the_variable_or_file_that_named_it() {
    let url = url_of_missing_database("no_such_db_here");
    let file = config_file(&format!("[database]\nurl = \"{url}\"\n"));
    let path = file.path().display().to_string();
    let cases = [
        (
            "DATABASE_URL",
            redrive()
                .env("DATABASE_URL", &url)
                .arg("migrate")
                .output_within(CHILD_LIMIT),
        ),
        (
            "REDRIVE__DATABASE__URL",
            (redrive().env("REDRIVE__DATABASE__URL", &url))
                .env("DATABASE_URL", url_of_missing_database("not_this_one"))
                .arg("migrate")
                .output_within(CHILD_LIMIT),
        ),
        (
            "database.url in",
            redrive()
                .arg("--config")
                .arg(file.path())
                .arg("migrate")
                .output_within(CHILD_LIMIT),
        ),
    ];
    for (origin, out) in cases {
        let out = out.unwrap();
        let text = stderr(&out);
        assert!(!out.status.success(), "{text}");
        assert!(
            text.contains(&format!(
                "database \"no_such_db_here\" does not exist (named by the URL from {origin}"
            )),
            "{origin}: {text}"
        );
        assert!(!text.contains("not_this_one"), "{text}");
    }
    let out = redrive()
        .arg("--config")
        .arg(file.path())
        .arg("migrate")
        .output_within(CHILD_LIMIT);
    assert!(stderr(&out.unwrap()).contains(&format!("change database.url in {path}")));
}

#[test]
fn config_errors_name_array_keys_as_written_and_once() {
    for (route, key, reason) in [
        (
            "mode = \"bogus\"",
            "routes[0].mode",
            "unknown mode \"bogus\"",
        ),
        (
            "mode = \"capture\"\nmax_attempts = \"many\"",
            "routes[0].max_attempts",
            "expected an integer",
        ),
    ] {
        let file = config_file(&format!(
            "[[routes]]\ntopics = [\"orders.dlt\"]\nhandler = \"log\"\n{route}\n"
        ));
        let out = redrive()
            .arg("--config")
            .arg(file.path())
            .args(["tasks", "list"])
            .output_within(CHILD_LIMIT)
            .unwrap();
        let text = stderr(&out);
        assert!(!out.status.success(), "{text}");
        assert!(
            text.contains(&format!("invalid configuration: {key}: ")) && text.contains(reason),
            "{text}"
        );
        let unwritten = key.replace("].", "]");
        assert!(!text.contains(&unwritten), "{unwritten} in {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_routes_says_it_only_works_tasks() {
    let (_store, settings) = fresh_store().await;
    let mut member = Spawn::binary(&settings).start();
    eventually(Duration::from_secs(30), "the member says it", || async {
        !(member.log_lines("no [[routes]] are configured: this member consumes no Kafka topic and only works tasks")).is_empty()
    })
    .await;
    member.stop(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_summary_ends_with_three_commands_that_work_as_printed() {
    let (_store, settings) = fresh_store().await;
    let url = settings.database.url.expose_secret().to_owned();
    let out = redrive()
        .env("DATABASE_URL", &url)
        .env("REDRIVE__DATABASE__SCHEMA", &settings.database.schema)
        .args([
            "demo",
            "--messages",
            "30",
            "--rate",
            "500",
            "--permanent",
            "0.2",
        ])
        .output_within(CHILD_LIMIT)
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    let next = stdout
        .split("\nnext (")
        .nth(1)
        .unwrap_or_else(|| panic!("no next commands in {stdout}"));
    let demo_schema = format!("{}_demo", settings.database.schema);
    assert!(
        next.contains(&format!("in schema {demo_schema:?}")),
        "{next}"
    );
    let commands: Vec<&str> = next.lines().skip(1).map(str::trim).collect();
    assert_eq!(commands.len(), 3, "{next}");
    for command in commands {
        assert!(command.contains(&format!("REDRIVE__DATABASE__SCHEMA={demo_schema} ")));
        let out = Command::new("sh")
            .args(["-c", command])
            .env_remove("REDRIVE__DATABASE__URL")
            .env("DATABASE_URL", &url)
            .output_within(CHILD_LIMIT)
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !printed.trim().is_empty(),
            "{command}: {printed}\n{}",
            stderr(&out)
        );
    }
}

#[test]
fn the_deploying_pages_configuration_loads_with_its_secrets_from_the_environment() {
    let (page, title) = ("docs/deploying.md", "A fleet's configuration");
    let file = config_file(&block(page, title, "toml"));
    let mut env = std::collections::HashMap::new();
    for line in block(page, title, "bash").lines() {
        let (name, _) = line.split_once('=').expect("NAME=value");
        let value = match name {
            "DATABASE_URL" => settings("unused").database.url.expose_secret().to_owned(),
            "REDRIVE__ADMIN__TOKENS__OPS__ROLE" => "operate".into(),
            other => format!("secret-of-{other}"),
        };
        env.insert(name.to_owned(), value);
    }
    let loaded = redrive::Settings::load(Some(file.path()), Some(env)).unwrap();
    assert_eq!(loaded.routes.len(), 2);
    assert_eq!(loaded.database.url_origin, "DATABASE_URL");
    assert!(loaded.kafka.properties.contains_key("sasl.password"));
    assert!(loaded.webhooks["billing"]
        .headers
        .contains_key("authorization"));
    let fleet = redrive::Fleet::builder(loaded)
        .with_builtin_handlers()
        .build()
        .unwrap();
    assert_eq!(fleet.handler_names(), ["billing", "log", "republish"]);
}
