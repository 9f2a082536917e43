//! Settings: built-in defaults, then a TOML file, then `REDRIVE__SECTION__KEY`
//! environment variables. Everything is validated at start-up; an error names the key.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer};
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;
use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use crate::backoff::{Backoff, Jitter};
use checks::{at_most, attempts, within, ONE_DAY, ONE_HOUR, ONE_MINUTE, ONE_YEAR};

mod admin;
mod brake;
mod checks;
mod env;
mod kafka;
pub(crate) mod librdkafka;
mod log;
mod loops;
pub mod pattern;
pub mod redact;
mod resilience;
mod source_error;
mod strings;
mod targets;
mod webhook;

/// Claim loops per worker pool: two keep one claim's round trip overlapping the other's.
/// A fixed amount of a member's work in flight, as [`FLUSHES_IN_FLIGHT`] is: the checks
/// of the pool's sizes count with them.
pub const CLAIM_LOOPS: usize = 2;

/// Ingest batches written at once: enough to overlap one insert's commit with the next
/// batch's round trip. Ingest holds at most this many batches plus the one being filled.
pub const FLUSHES_IN_FLIGHT: usize = 3;

pub use admin::{
    AdminSettings, AdminToken, OperationsSettings, RetentionSettings, Role, MIN_TOKEN_CHARS,
};
pub use brake::BrakeSettings;
pub(crate) use checks::{is_internal_topic, target_problem, target_topic, topic_problem};
pub(crate) use kafka::validate_routes;
pub use kafka::{
    IngestSettings, KafkaSettings, Ordering, ParkingSettings, RepublishSettings, RouteMode,
    RouteSettings, DEFAULT_MAX_GENERATIONS, MAX_GENERATIONS,
};
/// Consumer group defaults used unless `kafka.properties` sets them.
pub use librdkafka::{ASSIGNMENT_STRATEGY, HEARTBEAT_INTERVAL, SESSION_TIMEOUT};
pub use log::{LogFormat, LogSettings};
pub use loops::replay_loop;
pub(crate) use loops::{capture_consumer, refuse_loops, republish_loop};
pub use resilience::{BreakerSettings, HandlerSettings};
pub use targets::{AppliedTargets, RepublishRefused, Target, Targets};
pub use webhook::{ResolvedTarget, WebhookBody, WebhookSettings, WebhookTarget};

/// A configuration problem, naming the key and the reason.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {key}: {reason}")]
pub struct ConfigError {
    /// Dotted key, e.g. `worker.batch_size`.
    pub key: String,
    /// Why the value was refused.
    pub reason: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// All settings of a redrive process.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// `[database]`
    pub database: DatabaseSettings,
    /// `[worker]`
    pub worker: WorkerSettings,
    /// `[retry]`: defaults for handlers that set no policy of their own.
    pub retry: RetrySettings,
    /// `[kafka]`
    pub kafka: KafkaSettings,
    /// `[ingest]`
    pub ingest: IngestSettings,
    /// `[[routes]]`: what to consume and how.
    pub routes: Vec<RouteSettings>,
    /// `[republish]`
    pub republish: RepublishSettings,
    /// `[parking]`
    pub parking: ParkingSettings,
    /// `[metrics]`
    pub metrics: MetricsSettings,
    /// `[admin]`
    pub admin: AdminSettings,
    /// `[retention]`
    pub retention: RetentionSettings,
    /// `[operations]`
    pub operations: OperationsSettings,
    /// `[log]`
    pub log: LogSettings,
    /// `[webhooks.NAME]`: a built-in webhook handler registered under each NAME.
    pub webhooks: std::collections::BTreeMap<String, WebhookSettings>,
    /// `[handlers.NAME]`: bulkhead, rate limit and circuit breaker of a handler.
    pub handlers: std::collections::BTreeMap<String, HandlerSettings>,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Address to serve `/metrics` on, e.g. `"0.0.0.0:9464"`; none turns it off.
    pub listen: Option<std::net::SocketAddr>,
}

/// Where `database.url` came from when nothing set it.
const DEFAULT_URL_ORIGIN: &str = "the default database.url";

/// `[database]`: where tasks are stored.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// PostgreSQL URL (may hold a password, hence secret).
    pub url: SecretString,
    /// Schema holding redrive's tables.
    pub schema: String,
    /// Connection pool size.
    pub max_connections: u32,
    /// How long to wait for a connection.
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// Apply migrations when `redrive run` starts.
    pub migrate_on_start: bool,
    /// Where `url` came from, for messages: the variable that set it, the file, or
    /// the default.
    #[serde(skip)]
    pub url_origin: String,
}

impl DatabaseSettings {
    /// Whether the URL was given (a variable or the file), not the default's.
    pub fn url_given(&self) -> bool {
        self.url_origin != DEFAULT_URL_ORIGIN
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        DatabaseSettings {
            url: SecretString::from("postgres://postgres@127.0.0.1:5432/postgres"),
            schema: "redrive".into(),
            max_connections: 10,
            connect_timeout: Duration::from_secs(5),
            migrate_on_start: true,
            url_origin: DEFAULT_URL_ORIGIN.to_owned(),
        }
    }
}

/// `[worker]`: the pool that claims and runs due tasks.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// Run the worker pool in this process.
    pub enabled: bool,
    /// Tasks handled at once.
    pub concurrency: u32,
    /// Tasks claimed (and finished) per statement.
    pub batch_size: u32,
    /// How long a claim lasts without a heartbeat.
    #[serde(deserialize_with = "duration")]
    pub lease: Duration,
    /// How often leases of running tasks are extended.
    #[serde(deserialize_with = "duration")]
    pub heartbeat: Duration,
    /// Longest idle wait between looks for due work (notifications wake it sooner).
    #[serde(deserialize_with = "duration")]
    pub poll_interval: Duration,
    /// On SIGTERM, how long running handlers may take before their leases are released.
    #[serde(deserialize_with = "duration")]
    pub shutdown_timeout: Duration,
    /// Handlers this process serves; empty means every registered handler.
    #[serde(deserialize_with = "strings::strings")]
    pub handlers: Vec<String>,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            enabled: true,
            concurrency: 64,
            batch_size: 100,
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(30),
            handlers: Vec::new(),
        }
    }
}

/// `[retry]`: the policy of a handler that does not set its own.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySettings {
    /// Attempts before a task becomes a permanent failure.
    pub max_attempts: u32,
    /// Longest a single handler call may take.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Delay before the second attempt.
    #[serde(deserialize_with = "duration")]
    pub backoff_base: Duration,
    /// Growth of the delay per attempt.
    pub backoff_factor: f64,
    /// Longest delay.
    #[serde(deserialize_with = "duration")]
    pub backoff_cap: Duration,
    /// `full`, `equal` or `none`.
    pub jitter: Jitter,
}

impl Default for RetrySettings {
    fn default() -> Self {
        let b = Backoff::default();
        RetrySettings {
            max_attempts: 10,
            timeout: Duration::from_secs(30),
            backoff_base: b.base,
            backoff_factor: b.factor,
            backoff_cap: b.cap,
            jitter: b.jitter,
        }
    }
}

impl RetrySettings {
    /// The backoff these settings describe.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            base: self.backoff_base,
            factor: self.backoff_factor,
            cap: self.backoff_cap,
            jitter: self.jitter,
        }
    }
}

impl Settings {
    /// Loads defaults, then `file` (if any), then `env` (the process environment when
    /// `None`), and validates the result.
    ///
    /// From the environment: `REDRIVE__SECTION__KEY`; `REDRIVE__KAFKA__PROPERTIES__NAME`
    /// sets the librdkafka property `name` lower-cased with `_` read as `.`
    /// (`..._SASL_PASSWORD` is `sasl.password`; `log_level` and `enabled_events` keep
    /// their `_`); `DATABASE_URL` stands in for `REDRIVE__DATABASE__URL` when that is unset.
    pub fn load(
        file: Option<&Path>,
        env: Option<HashMap<String, String>>,
    ) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::new(
                    "--config",
                    format!("file {} does not exist", path.display()),
                ));
            }
            // TOML whatever the file is called (`/etc/redrive/config`, `redrive.conf`).
            let toml = config::File::from(path).format(config::FileFormat::Toml);
            builder = builder.add_source(toml);
        }
        let env = env::EnvLayer::read(env)?;
        let database_url_var = env.database_url_var;
        let environment = config::Environment::with_prefix("REDRIVE")
            .prefix_separator("__")
            .separator("__")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("worker.handlers")
            .source(Some(env.vars));
        let mut settings: Settings = builder
            .add_source(environment)
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(source_error::from_config_error)?;
        settings.kafka.properties.extend(env.properties);
        settings.database.url_origin = match (database_url_var, file) {
            (Some(var), _) => var.to_owned(),
            (None, Some(path))
                if settings.database.url.expose_secret()
                    != DatabaseSettings::default().url.expose_secret() =>
            {
                format!("database.url in {}", path.display())
            }
            (None, _) => DEFAULT_URL_ORIGIN.to_owned(),
        };
        for handler in &mut settings.worker.handlers {
            *handler = handler.trim().to_owned();
        }
        validate_routes(&mut settings.routes, None)?;
        refuse_loops(&settings)?;
        settings.validate()?;
        Ok(settings)
    }

    /// This fleet's name to the systems its handlers call (part of the webhook's
    /// `Idempotency-Key`): `database.schema` and `kafka.group_id`. Two fleets that share
    /// a database differ in the schema; two that consume one cluster differ in the group.
    pub fn fleet_identity(&self) -> String {
        format!("{}/{}", self.database.schema, self.kafka.group_id)
    }

    /// Checks values that parse but make no sense, and the upper bounds of durations
    /// and counts (see redrive.example.toml).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.database.validate()?;
        self.worker.validate()?;
        self.retry.validate()?;
        positive("ingest.batch_size", self.ingest.batch_size)?;
        positive("ingest.max_message_bytes", self.ingest.max_message_bytes)?;
        positive(
            "ingest.process_concurrency",
            self.ingest.process_concurrency,
        )?;
        within("ingest.linger", self.ingest.linger, ONE_MINUTE)?;
        within(
            "ingest.release_partitions_after",
            self.ingest.release_partitions_after,
            ONE_HOUR,
        )?;
        within(
            "ingest.original_fetch_timeout",
            self.ingest.original_fetch_timeout,
            ONE_MINUTE,
        )?;
        positive("ingest.batch_bytes", self.ingest.batch_bytes)?;
        if self.ingest.max_message_bytes > MAX_MESSAGE_BYTES {
            return Err(ConfigError::new(
                "ingest.max_message_bytes",
                format!("must be at most {MAX_MESSAGE_BYTES} (PostgreSQL refuses larger rows)"),
            ));
        }
        if self.ingest.batch_bytes > MAX_BATCH_BYTES {
            return Err(ConfigError::new(
                "ingest.batch_bytes",
                format!(
                    "must be at most {MAX_BATCH_BYTES} (PostgreSQL refuses a statement over 1 GiB)"
                ),
            ));
        }
        nonzero("ingest.process_budget", self.ingest.process_budget)?;
        if self.ingest.process_budget > MAX_PROCESS_BUDGET {
            return Err(ConfigError::new(
                "ingest.process_budget",
                "must be at most 4m, well under librdkafka's max.poll.interval.ms (5m)",
            ));
        }
        self.admin.validate()?;
        self.retention.validate()?;
        self.operations.validate()?;
        self.log.validate()?;
        for (name, webhook) in &self.webhooks {
            webhook.validate(name)?;
        }
        for (name, handler) in &self.handlers {
            handler.validate(name)?;
        }
        if let Some(topic) = &self.republish.target_topic {
            target_topic("republish.target_topic", topic)?;
        }
        if let Some(topic) = &self.parking.topic {
            target_topic("parking.topic", topic)?;
        }
        if self.kafka.group_id.is_empty() {
            return Err(ConfigError::new("kafka.group_id", "must not be empty"));
        }
        self.kafka.validate()
    }
}

impl WorkerSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        count("worker.concurrency", self.concurrency, MAX_CONCURRENCY)?;
        count("worker.batch_size", self.batch_size, MAX_BATCH)?;
        within("worker.lease", self.lease, ONE_DAY)?;
        nonzero("worker.heartbeat", self.heartbeat)?;
        within("worker.poll_interval", self.poll_interval, ONE_HOUR)?;
        at_most("worker.shutdown_timeout", self.shutdown_timeout, ONE_HOUR)?;
        // A beat a few milliseconds late (a database some way off, a busy member) must
        // still land before the lease it extends runs out, or a call is stopped at its
        // first beat: half the lease is the margin.
        if self.heartbeat > self.lease / 2 {
            return Err(ConfigError::new(
                "worker.heartbeat",
                format!(
                    "must be at most half of worker.lease ({} here), or a late heartbeat \
                     lets the lease lapse and stops the call (worker.heartbeat = {}, \
                     worker.lease = {})",
                    humantime::format_duration(self.lease / 2),
                    humantime::format_duration(self.heartbeat),
                    humantime::format_duration(self.lease),
                ),
            ));
        }
        if self.handlers.iter().any(String::is_empty) {
            return Err(ConfigError::new(
                "worker.handlers",
                "empty handler name (in the environment, separate names with commas: \
                 REDRIVE__WORKER__HANDLERS=log,republish)",
            ));
        }
        Ok(())
    }
}

impl RetrySettings {
    fn validate(&self) -> Result<(), ConfigError> {
        attempts("retry.max_attempts", self.max_attempts)?;
        within("retry.timeout", self.timeout, ONE_DAY)?;
        at_most("retry.backoff_base", self.backoff_base, ONE_YEAR)?;
        at_most("retry.backoff_cap", self.backoff_cap, ONE_YEAR)?;
        let factor = self.backoff_factor;
        if !(factor.is_finite() && factor >= 1.0) {
            return Err(ConfigError::new(
                "retry.backoff_factor",
                format!("must be a number >= 1.0, got {factor}"),
            ));
        }
        if self.backoff_cap < self.backoff_base {
            return Err(ConfigError::new(
                "retry.backoff_cap",
                "must not be shorter than retry.backoff_base",
            ));
        }
        Ok(())
    }
}

impl DatabaseSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        self.connect_options()?;
        checks::schema_name(&self.schema)?;
        count("database.max_connections", self.max_connections, MAX_POOL)?;
        within("database.connect_timeout", self.connect_timeout, ONE_HOUR)
    }

    /// Parsed connection options with the schema as `search_path`.
    pub fn connect_options(&self) -> Result<PgConnectOptions, ConfigError> {
        let url = self.url.expose_secret();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError::new(
                "database.url",
                "not a PostgreSQL URL: it must start with postgres:// or postgresql://",
            ));
        }
        checks::url_parameters(url)?;
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| ConfigError::new("database.url", format!("not a PostgreSQL URL: {e}")))?;
        // JIT off: redrive's statements are short, and their plans for large tables
        // cross the JIT cost threshold, so PostgreSQL would compile each execution
        // (measured: 0.7 s per 500-task operator batch on a million tasks, against
        // milliseconds without).
        // The database library's own lines stay out of an SRE's way: a statement slower
        // than a second was logged at WARN with its whole SQL (kilobytes a line, many a
        // minute under load; redrive's metrics time each operation), and PostgreSQL's
        // notices ("schema ... already exists, skipping") at INFO on every start.
        Ok(options
            .options([
                ("search_path", self.schema.as_str()),
                ("jit", "off"),
                ("client_min_messages", "warning"),
            ])
            .log_slow_statements(::log::LevelFilter::Debug, Duration::from_secs(1))
            .application_name("redrive"))
    }
}

/// Largest message stored with its payload: a row must stay far below PostgreSQL's 1 GiB.
const MAX_MESSAGE_BYTES: u32 = 256 * 1024 * 1024;
/// Largest batch in bytes: one insert statement binds all of it.
const MAX_BATCH_BYTES: u32 = 512 * 1024 * 1024;
/// Longest process-mode budget per batch.
const MAX_PROCESS_BUDGET: Duration = Duration::from_secs(240);

fn positive(key: &str, value: u32) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::new(key, "must be at least 1"));
    }
    Ok(())
}

/// Refuses a count of 0 or above `max`: a member allocates for it at start.
fn count(key: &str, value: u32, max: u32) -> Result<(), ConfigError> {
    positive(key, value)?;
    if value > max {
        return Err(ConfigError::new(
            key,
            format!("must be at most {max} (got {value})"),
        ));
    }
    Ok(())
}

/// The largest database pool: far above any PostgreSQL's `max_connections`.
pub const MAX_POOL: u32 = 10_000;
/// The largest claim batch.
pub const MAX_BATCH: u32 = 10_000;
/// The most tasks in flight in one member.
pub const MAX_CONCURRENCY: u32 = 100_000;

fn nonzero(key: &str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::new(key, "must be longer than 0s"));
    }
    Ok(())
}

/// Deserializes a human duration (`"30s"`, `"5m"`, `"1h 30m"`), refusing negative ones.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

/// Like [`duration`], for optional keys.
fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    text.map(|t| parse_duration(&t).map_err(serde::de::Error::custom))
        .transpose()
}

/// Parses a human duration, refusing negative ones with a plain reason.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative; durations must be >= 0"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like \"30s\" or \"5m\" ({e})"))
}
