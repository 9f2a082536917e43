//! Shared test set-up: a fresh schema per test in the `redrive_test` database, and the
//! running-member fixtures: [`Member`] in this process, [`MemberProcess`] in a process
//! of its own (started by a [`Spawn`]); and a headless [`Browser`] for the console.

pub mod api;
mod bounded;
pub mod broker;
mod browser;
pub mod cli;
pub mod console;
mod counting;
pub mod docs;
pub mod http_server;
mod member;
mod process;

pub use bounded::{wait_with_output_within, wait_within, Bounded, CHILD_LIMIT};
pub use browser::Browser;
pub use counting::Counting;
pub use member::Member;
pub use process::{MemberProcess, Spawn};

use redrive::{Fleet, Settings, Store, Task};
use sqlx::{Connection, PgConnection};
use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// Base URL of the test database (`REDRIVE_TEST_DATABASE_URL` overrides it).
pub fn database_url() -> String {
    std::env::var("REDRIVE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/redrive_test".to_owned())
}

/// Creates the test database if it does not exist yet (parallel tests may race).
async fn ensure_database() {
    let url = database_url();
    let (server, name) = url.rsplit_once('/').expect("URL has a database name");
    if PgConnection::connect(&url).await.is_ok() {
        return;
    }
    let mut admin = PgConnection::connect(&format!("{server}/postgres"))
        .await
        .expect("PostgreSQL is reachable");
    if let Err(error) = sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
    {
        let code = error
            .as_database_error()
            .and_then(|e| e.code())
            .unwrap_or_default();
        assert!(
            code == "42P04" || code == "23505",
            "cannot create test database: {error}"
        );
    }
}

/// Settings pointing at `schema` in the test database, with short timings for tests.
pub fn settings(schema: &str) -> Settings {
    let env = HashMap::from([
        ("REDRIVE__DATABASE__URL".to_owned(), database_url()),
        ("REDRIVE__DATABASE__SCHEMA".to_owned(), schema.to_owned()),
    ]);
    let mut settings = Settings::load(None, Some(env)).expect("test settings are valid");
    settings.worker.poll_interval = Duration::from_millis(200);
    settings
}

/// A unique schema name.
pub fn unique_schema() -> String {
    format!("t_{:016x}", rand::random::<u64>())
}

/// A migrated store in a schema of its own, and settings that point at it.
pub async fn fresh_store() -> (Store, Settings) {
    ensure_database().await;
    let settings = settings(&unique_schema());
    let store = Store::connect(&settings.database).await.expect("connect");
    store.migrate().await.expect("migrate");
    (store, settings)
}

/// A fleet on `settings` with the built-in handlers.
pub fn fleet(settings: &Settings) -> Fleet {
    Fleet::builder(settings.clone())
        .with_builtin_handlers()
        .build()
        .unwrap()
}

/// The task stored for the message at `topic`/`partition`/`offset`.
pub async fn task_at(store: &Store, topic: &str, partition: i32, offset: i64) -> Task {
    let id: i64 = sqlx::query_scalar(
        "SELECT id FROM recovery_task WHERE source_topic = $1 AND source_partition = $2 AND source_offset = $3",
    )
    .bind(topic)
    .bind(partition)
    .bind(offset)
    .fetch_one(store.pool())
    .await
    .unwrap();
    store.get(redrive::TaskId(id)).await.unwrap().unwrap()
}

/// Polls `check` every 20 ms until it returns true; panics after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `value` as the raw JSON text a request carries (a payload transform).
pub fn raw(value: serde_json::Value) -> Option<Box<serde_json::value::RawValue>> {
    Some(serde_json::value::to_raw_value(&value).unwrap())
}

/// A scalar from the store's schema.
pub async fn scalar(store: &Store, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(store.pool())
        .await
        .expect(sql)
}

/// A TCP proxy to PostgreSQL that a test can cut (an outage) and restore.
pub struct PgProxy {
    /// The port to connect to instead of 5432.
    pub port: u16,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    generation: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

impl PgProxy {
    /// Starts a proxy to 127.0.0.1:5432.
    pub async fn start() -> PgProxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = std::sync::Arc::new(AtomicBool::new(true));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let generation = std::sync::Arc::new(generation);
        let (accept_up, accept_generation) = (up.clone(), generation.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !accept_up.load(Ordering::SeqCst) {
                    continue; // refused: dropped at once
                }
                let mut cut = accept_generation.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect("127.0.0.1:5432").await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        PgProxy {
            port,
            up,
            generation,
        }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// `settings` with the database reached through this proxy.
    pub fn route(&self, settings: &Settings) -> Settings {
        let mut settings = settings.clone();
        let url = database_url().replace(":5432/", &format!(":{}/", self.port));
        settings.database.url = url.into();
        settings.database.connect_timeout = Duration::from_secs(1);
        settings
    }
}
