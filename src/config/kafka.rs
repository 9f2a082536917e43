//! Settings for Kafka: the cluster, ingest routes, the republish handler and parking.

use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::time::Duration;

use super::checks::{at_most, attempts, target_topic, topic_problem, within, ONE_DAY, ONE_YEAR};
use super::{duration, optional_duration, BrakeSettings, ConfigError};
use crate::backoff::Jitter;

/// `[kafka]`: the cluster every client of this process talks to. Its `Debug` output shows
/// property names, never their values.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Consumer group shared by every route and every fleet member.
    pub group_id: String,
    /// Any librdkafka property, passed to every consumer and producer (SASL, TLS, tuning).
    pub properties: BTreeMap<String, String>,
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .keys()
            .map(|key| (key.as_str(), super::librdkafka::REDACTED))
            .collect();
        f.debug_struct("KafkaSettings")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("group_id", &self.group_id)
            .field("properties", &properties)
            .finish()
    }
}

impl KafkaSettings {
    /// Checks every pass-through property with librdkafka itself, without starting a
    /// client; the error names the property, never its value.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self
            .bootstrap_servers
            .split(',')
            .all(|broker| broker.trim().is_empty())
        {
            return Err(ConfigError::new(
                "kafka.bootstrap_servers",
                "must name at least one broker (host:port, comma-separated)",
            ));
        }
        for (key, value) in &self.properties {
            if let Some(instead) = owned_property(key) {
                return Err(ConfigError::new(
                    format!("kafka.properties.{key}"),
                    format!("redrive sets it: {instead}"),
                ));
            }
            super::librdkafka::check_property(key, value)
                .map_err(|reason| ConfigError::new(format!("kafka.properties.{key}"), reason))?;
        }
        Ok(())
    }
}

/// What to do instead of setting `key` in `kafka.properties`, when redrive sets that
/// property itself and would override it: the settings that name the cluster and the
/// group, and those ingest's and republish's guarantees rest on.
fn owned_property(key: &str) -> Option<&'static str> {
    // With librdkafka's other names for the same properties.
    Some(match key {
        "bootstrap.servers" | "metadata.broker.list" => "use kafka.bootstrap_servers",
        "group.id" => "use kafka.group_id",
        "enable.auto.commit" | "auto.commit.enable" | "enable.auto.offset.store" => {
            "offsets are committed only after their tasks are stored"
        }
        "enable.idempotence" | "acks" | "request.required.acks" => {
            "republish and parking produce idempotently, acknowledged by all in-sync replicas"
        }
        _ => return None,
    })
}

impl Default for KafkaSettings {
    fn default() -> Self {
        KafkaSettings {
            bootstrap_servers: "127.0.0.1:9092".into(),
            group_id: "redrive".into(),
            properties: BTreeMap::new(),
        }
    }
}

/// `[ingest]`: how consumed messages become tasks.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestSettings {
    /// Consume the routes' topics in this process (when any route is configured).
    pub enabled: bool,
    /// Messages per insert statement.
    pub batch_size: u32,
    /// Bytes (keys, values, headers) per insert statement: a batch closes at whichever
    /// of `batch_size` and `batch_bytes` comes first. Ingest holds at most four batches
    /// (three being written, one filling), which bounds its memory.
    pub batch_bytes: u32,
    /// Longest a partial batch waits for more messages.
    #[serde(deserialize_with = "duration")]
    pub linger: Duration,
    /// Larger messages (key + value + headers) are stored in a minimal form: coordinates,
    /// size and the reason, without the payload.
    pub max_message_bytes: u32,
    /// Stack traces from dead-letter headers are cut to this many bytes.
    pub stacktrace_max_bytes: u32,
    /// Process-mode handler calls run at once per batch.
    pub process_concurrency: u32,
    /// Longest a batch's process-mode handler calls may take together; messages not
    /// attempted by then are stored for the worker pool. Keeps a batch well under
    /// librdkafka's `max.poll.interval.ms` when the downstream hangs.
    #[serde(deserialize_with = "duration")]
    pub process_budget: Duration,
    /// Longest a batch's fetches of original records may take together: a dead letter
    /// that carries coordinates but no key and no value (a Kafka share group's, by
    /// default) is stored with the original record fetched from its topic.
    #[serde(deserialize_with = "duration")]
    pub original_fetch_timeout: Duration,
    /// How long ingest may fail to store what it consumed (the database unreachable)
    /// before this member gives its partitions to the group, for members that can
    /// store; it joins again once the database answers.
    #[serde(deserialize_with = "duration")]
    pub release_partitions_after: Duration,
}

impl Default for IngestSettings {
    fn default() -> Self {
        IngestSettings {
            enabled: true,
            batch_size: 500,
            batch_bytes: 32 * 1024 * 1024,
            linger: Duration::from_millis(20),
            max_message_bytes: 16 * 1024 * 1024,
            stacktrace_max_bytes: 8 * 1024,
            process_concurrency: 32,
            process_budget: Duration::from_secs(60),
            original_fetch_timeout: Duration::from_secs(10),
            release_partitions_after: Duration::from_secs(15),
        }
    }
}

/// What a route does with a consumed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum RouteMode {
    /// Every message is a failure report (a dead-letter topic): each becomes a task.
    Capture,
    /// The handler runs on the message first; only failures become tasks.
    Process,
}

impl TryFrom<String> for RouteMode {
    type Error = String;

    fn try_from(mode: String) -> Result<Self, Self::Error> {
        match mode.as_str() {
            "capture" => Ok(RouteMode::Capture),
            "process" => Ok(RouteMode::Process),
            other => Err(format!(
                "unknown mode {other:?}: expected \"capture\" or \"process\""
            )),
        }
    }
}

/// `[[routes]]`: topics, a mode, a handler and optional policy overrides.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSettings {
    /// Stable name, recorded on each task; defaults to the first topic or the pattern.
    #[serde(default)]
    pub name: String,
    /// Topic names.
    #[serde(default, deserialize_with = "super::strings::strings")]
    pub topics: Vec<String>,
    /// A regular expression matching whole topic names (see [`super::pattern`]).
    pub pattern: Option<String>,
    /// `capture` or `process`.
    pub mode: RouteMode,
    /// Handler that retries the tasks (and, in process mode, handles messages first).
    pub handler: String,
    /// Event type recorded on the tasks.
    pub event_type: Option<String>,
    /// Overrides the handler's max attempts.
    pub max_attempts: Option<u32>,
    /// Overrides the handler's timeout.
    #[serde(default, deserialize_with = "optional_duration")]
    pub timeout: Option<Duration>,
    /// Overrides the backoff base delay.
    #[serde(default, deserialize_with = "optional_duration")]
    pub backoff_base: Option<Duration>,
    /// Overrides the backoff cap.
    #[serde(default, deserialize_with = "optional_duration")]
    pub backoff_cap: Option<Duration>,
    /// Overrides the backoff growth factor.
    pub backoff_factor: Option<f64>,
    /// Overrides the jitter mode.
    pub jitter: Option<Jitter>,
    /// `none` (the default) or `key`: a failure waits behind the open tasks of its key.
    #[serde(default)]
    pub ordering: Ordering,
    /// Process mode only: pause the route when most messages fail inline (a bad deploy).
    pub brake: Option<BrakeSettings>,
    /// Where the `republish` handler produces this route's tasks; overrides
    /// `republish.target_topic` (none: that key, else the task's original topic).
    pub republish_topic: Option<String>,
    /// Where this route's permanent failures are parked; overrides `parking.topic`.
    pub parking_topic: Option<String>,
    /// Capture mode only: most generations of one message this route retries (none:
    /// [`DEFAULT_MAX_GENERATIONS`]). A captured message that redrive produced and that
    /// failed again more often is stored PERMANENT_FAILURE and parked instead of being
    /// redriven once more (see [`crate::task::Failure::generation`]).
    pub max_generations: Option<u32>,
    /// Capture mode only: the only topics a dead letter that left its record out (a
    /// share group's) has its original fetched from; another topic ends its task
    /// PERMANENT_FAILURE. None: any topic but Kafka's internal ones and those the
    /// fleet's capture routes consume (see [`crate::ingest`]'s originals).
    #[serde(default, deserialize_with = "super::strings::optional_strings")]
    pub fetch_originals_from: Option<Vec<String>>,
}

/// Default of a route's `max_generations`: a first failure and two re-failures are
/// retried, the third re-failure is parked.
pub const DEFAULT_MAX_GENERATIONS: u32 = 3;
/// Largest `max_generations`: more redrives of one message are a loop, not a plan.
pub const MAX_GENERATIONS: u32 = 1000;

/// Whether a route keeps the failures of one key in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum Ordering {
    /// Tasks are attempted as they come due, whatever their key.
    #[default]
    None,
    /// While a task of a message key is open (not final), later failures with the same
    /// key wait behind it; messages without a key are never held.
    Key,
}

impl TryFrom<String> for Ordering {
    type Error = String;

    fn try_from(ordering: String) -> Result<Self, Self::Error> {
        match ordering.as_str() {
            "none" => Ok(Ordering::None),
            "key" => Ok(Ordering::Key),
            other => Err(format!(
                "unknown ordering {other:?}: expected \"none\" or \"key\""
            )),
        }
    }
}

/// `[republish]`: the built-in handler that produces a task back to Kafka.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepublishSettings {
    /// Produce here instead of the task's original topic.
    pub target_topic: Option<String>,
}

/// `[parking]`: where permanent failures are also produced, for teams that live in Kafka.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParkingSettings {
    /// Parking topic; none means permanent failures stay in PostgreSQL only.
    pub topic: Option<String>,
}

impl RouteSettings {
    /// A route of `topics` in `mode` to `handler`, with no policy overrides; the name is
    /// filled in at validation.
    pub fn new(topics: &[&str], mode: RouteMode, handler: &str) -> RouteSettings {
        RouteSettings {
            name: String::new(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            pattern: None,
            mode,
            handler: handler.to_owned(),
            event_type: None,
            max_attempts: None,
            timeout: None,
            backoff_base: None,
            backoff_cap: None,
            backoff_factor: None,
            jitter: None,
            ordering: Ordering::None,
            brake: None,
            republish_topic: None,
            parking_topic: None,
            max_generations: None,
            fetch_originals_from: None,
        }
    }

    /// Checks the policy overrides; `key` turns a field into its dotted key.
    fn check_policy(&self, key: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        if let Some(max) = self.max_attempts {
            attempts(&key("max_attempts"), max)?;
        }
        if let Some(timeout) = self.timeout {
            within(&key("timeout"), timeout, ONE_DAY)?;
        }
        if let Some(base) = self.backoff_base {
            at_most(&key("backoff_base"), base, ONE_YEAR)?;
        }
        if let Some(cap) = self.backoff_cap {
            at_most(&key("backoff_cap"), cap, ONE_YEAR)?;
            if self.backoff_base.is_some_and(|base| cap < base) {
                return Err(ConfigError::new(
                    key("backoff_cap"),
                    "must not be shorter than backoff_base",
                ));
            }
        }
        if let Some(factor) = self.backoff_factor {
            if !(factor.is_finite() && factor >= 1.0) {
                return Err(ConfigError::new(
                    key("backoff_factor"),
                    "must be a number >= 1.0",
                ));
            }
        }
        Ok(())
    }

    /// Its name: `name`, else its first topic, else its pattern (what validation fills
    /// in, and what its tasks record).
    pub fn effective_name(&self) -> String {
        if !self.name.is_empty() {
            return self.name.clone();
        }
        self.topics
            .first()
            .cloned()
            .or_else(|| self.pattern.clone())
            .unwrap_or_default()
    }

    /// Checks the route's own targets and its `max_generations`.
    fn check_targets(&self, key: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        if let Some(topic) = &self.republish_topic {
            target_topic(&key("republish_topic"), topic)?;
            if self.handler != "republish" {
                return Err(ConfigError::new(
                    key("republish_topic"),
                    format!(
                        "only the republish handler produces to it, and this route's handler \
                         is {:?}",
                        self.handler
                    ),
                ));
            }
        }
        if let Some(topic) = &self.parking_topic {
            target_topic(&key("parking_topic"), topic)?;
        }
        self.check_fetch_originals_from(key)?;
        let Some(max) = self.max_generations else {
            return Ok(());
        };
        if self.mode != RouteMode::Capture {
            return Err(ConfigError::new(
                key("max_generations"),
                "only a capture-mode route follows re-failures of the messages redrive \
                 produced (a process route links no generations); remove the key",
            ));
        }
        if !(1..=MAX_GENERATIONS).contains(&max) {
            return Err(ConfigError::new(
                key("max_generations"),
                format!("must be 1 to {MAX_GENERATIONS} (got {max}); 1 parks every re-failure"),
            ));
        }
        Ok(())
    }

    /// Checks `fetch_originals_from`: a capture route's, at least one topic, each a name
    /// Kafka accepts.
    fn check_fetch_originals_from(&self, key: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        let Some(topics) = &self.fetch_originals_from else {
            return Ok(());
        };
        let key = key("fetch_originals_from");
        if self.mode != RouteMode::Capture {
            return Err(ConfigError::new(
                key,
                "only a capture-mode route fetches the originals of dead letters; remove the key",
            ));
        }
        if topics.is_empty() {
            return Err(ConfigError::new(
                key,
                "must list at least one topic (leave the key out to fetch from any topic but \
                 Kafka's internal ones and the captured dead-letter topics)",
            ));
        }
        for topic in topics {
            if let Some(reason) = topic_problem(topic) {
                return Err(ConfigError::new(key, reason));
            }
        }
        Ok(())
    }

    /// The most generations of one message this route retries: `max_generations`, else
    /// [`DEFAULT_MAX_GENERATIONS`].
    pub fn generation_limit(&self) -> u32 {
        self.max_generations.unwrap_or(DEFAULT_MAX_GENERATIONS)
    }

    /// The subscription strings of this route: its topics, and its pattern in the
    /// anchored form (`^(PATTERN)$`) that the route table matches too.
    pub fn subscriptions(&self) -> Vec<String> {
        let mut subs = self.topics.clone();
        subs.extend(self.pattern.as_deref().map(super::pattern::anchored));
        subs
    }
}

/// Fills in route names and checks every route; `handlers` are the registered names.
pub(crate) fn validate_routes(
    routes: &mut [RouteSettings],
    handlers: Option<&[String]>,
) -> Result<(), ConfigError> {
    let mut names = HashSet::new();
    let mut topics = HashSet::new();
    for (i, route) in routes.iter_mut().enumerate() {
        let key = |field: &str| format!("routes[{i}].{field}");
        if route.topics.is_empty() && route.pattern.is_none() {
            return Err(ConfigError::new(
                key("topics"),
                "a route needs topics or a pattern",
            ));
        }
        if let Some(pattern) = &route.pattern {
            super::pattern::check(pattern).map_err(|e| ConfigError::new(key("pattern"), e))?;
        }
        for topic in &route.topics {
            // A pattern (`^...`) belongs in `pattern`; `topic_problem` names the `^`.
            let problem = match super::topic_problem(topic) {
                Some(problem) => Some(problem),
                None if super::is_internal_topic(topic) => Some(format!(
                    "{topic:?} is Kafka's internal topic, not one that carries failures"
                )),
                None => None,
            };
            if let Some(problem) = problem {
                return Err(ConfigError::new(key("topics"), problem));
            }
            if !topics.insert(topic.clone()) {
                return Err(ConfigError::new(
                    key("topics"),
                    format!("topic {topic:?} is in two routes"),
                ));
            }
        }
        route.name = route.effective_name();
        if !names.insert(route.name.clone()) {
            return Err(ConfigError::new(
                key("name"),
                format!("route name {:?} is used twice", route.name),
            ));
        }
        route.check_policy(&key)?;
        route.check_targets(&key)?;
        if let Some(brake) = &route.brake {
            if route.mode != RouteMode::Process {
                return Err(ConfigError::new(
                    key("brake"),
                    "only a process-mode route has a brake (capture mode runs no handler inline)",
                ));
            }
            brake.validate(&key)?;
        }
        if let Some(handlers) = handlers {
            if !handlers.contains(&route.handler) {
                return Err(ConfigError::new(
                    key("handler"),
                    format!(
                        "unknown handler {:?} (registered: {})",
                        route.handler,
                        handlers.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}
