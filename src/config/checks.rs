//! Checks shared by the settings: upper bounds of durations and counts, schema names,
//! target topic names.

use std::time::Duration;

use super::ConfigError;

/// An upper bound of a duration key, with how it is written in messages and docs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound {
    max: Duration,
    text: &'static str,
}

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// `worker.lease`, `retry.timeout`, a route's `timeout`.
pub(crate) const ONE_DAY: Bound = Bound {
    max: Duration::from_secs(DAY),
    text: "1day",
};
/// Backoff base and cap, in `[retry]` and in routes.
pub(crate) const ONE_YEAR: Bound = Bound {
    max: Duration::from_secs(365 * DAY),
    text: "365days",
};
/// Retention ages.
pub(crate) const TEN_YEARS: Bound = Bound {
    max: Duration::from_secs(3652 * DAY),
    text: "10years",
};
/// `worker.poll_interval`, `worker.shutdown_timeout`, `database.connect_timeout`.
pub(crate) const ONE_HOUR: Bound = Bound {
    max: Duration::from_secs(HOUR),
    text: "1h",
};
/// `ingest.linger`.
pub(crate) const ONE_MINUTE: Bound = Bound {
    max: Duration::from_secs(MINUTE),
    text: "1min",
};
/// Largest `max_attempts`: the task column is a PostgreSQL `integer`.
pub(crate) const MAX_ATTEMPTS: u32 = i32::MAX as u32;

/// Refuses `value` above `bound`.
pub(crate) fn at_most(key: &str, value: Duration, bound: Bound) -> Result<(), ConfigError> {
    if value > bound.max {
        return Err(ConfigError::new(
            key,
            format!(
                "must be at most {} (got {})",
                bound.text,
                humantime::format_duration(value)
            ),
        ));
    }
    Ok(())
}

/// Refuses a zero duration or one above `bound`.
pub(crate) fn within(key: &str, value: Duration, bound: Bound) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::new(key, "must be longer than 0s"));
    }
    at_most(key, value, bound)
}

/// Refuses a `max_attempts` of 0 or one that does not fit the task column.
pub(crate) fn attempts(key: &str, value: u32) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::new(key, "must be at least 1"));
    }
    if value > MAX_ATTEMPTS {
        return Err(ConfigError::new(
            key,
            format!("must be at most {MAX_ATTEMPTS}"),
        ));
    }
    Ok(())
}

/// Words PostgreSQL reserves (its "reserved" and "reserved, can be function or type"
/// keywords, `pg_get_keywords()` categories R and T, PostgreSQL 15 plus 16's
/// `system_user`): none of them can name a schema unquoted.
const RESERVED: [&str; 101] = [
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "binary",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
];

/// Checks `database.schema`: a plain lower-case identifier PostgreSQL lets us create.
pub(crate) fn schema_name(schema: &str) -> Result<(), ConfigError> {
    let key = "database.schema";
    let plain = !schema.is_empty()
        && schema.len() <= 50
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain {
        return Err(ConfigError::new(
            key,
            "must be 1 to 50 characters of a-z, 0-9 and _, not starting with a digit",
        ));
    }
    if schema.starts_with("pg_") {
        return Err(ConfigError::new(
            key,
            format!("{schema:?}: the prefix pg_ is reserved by PostgreSQL for system schemas"),
        ));
    }
    if schema == "information_schema" {
        return Err(ConfigError::new(
            key,
            "\"information_schema\" is PostgreSQL's own schema",
        ));
    }
    if RESERVED.contains(&schema) {
        return Err(ConfigError::new(
            key,
            format!("{schema:?} is a reserved word in PostgreSQL; choose another name"),
        ));
    }
    Ok(())
}

/// Longest topic name Kafka accepts.
const MAX_TOPIC_CHARS: usize = 249;

/// Kafka's own topics: apache/kafka's `Topic.INTERNAL_TOPICS` (group offsets,
/// transactions, share-group state), the KRaft metadata log and tiered storage's
/// metadata. Brokers refuse clients' writes to most of them, and a message there is not
/// a failure anyone reads.
const INTERNAL_TOPICS: [&str; 5] = [
    "__consumer_offsets",
    "__transaction_state",
    "__share_group_state",
    "__cluster_metadata",
    "__remote_log_metadata",
];

/// Whether `topic` is one of Kafka's internal topics, or a name Kafka holds for the same
/// topic (its `.` and `_` collide: `__consumer.offsets` cannot exist beside
/// `__consumer_offsets`).
pub(crate) fn is_internal_topic(topic: &str) -> bool {
    let colliding = |internal: &&str| {
        topic.len() == internal.len()
            && (topic.bytes().zip(internal.bytes()))
                .all(|(a, b)| a == b || (a == b'.' && b == b'_'))
    };
    INTERNAL_TOPICS.iter().any(colliding)
}

/// Refuses a topic redrive would produce to (a republish or parking target) for
/// [`target_problem`].
pub(crate) fn target_topic(key: &str, topic: &str) -> Result<(), ConfigError> {
    match target_problem(topic) {
        Some(reason) => Err(ConfigError::new(key, reason)),
        None => Ok(()),
    }
}

/// Why redrive never produces to `topic`, if it never does: Kafka would refuse it as a
/// topic name ([`topic_problem`]), or it is one of Kafka's internal topics.
pub(crate) fn target_problem(topic: &str) -> Option<String> {
    match topic_problem(topic) {
        None if is_internal_topic(topic) => Some(format!(
            "{topic:?} is Kafka's internal topic, not one to produce failures to"
        )),
        problem => problem,
    }
}

/// Why Kafka would refuse `topic` as a topic name, if it would: empty, longer than 249
/// characters, `.` or `..`, or a character other than ASCII letters, digits, `.`, `_`
/// and `-`.
pub(crate) fn topic_problem(topic: &str) -> Option<String> {
    let reason = if topic.is_empty() {
        "must not be empty (leave the key out to use the default)".to_owned()
    } else if topic.len() > MAX_TOPIC_CHARS {
        format!("is longer than Kafka's {MAX_TOPIC_CHARS} characters")
    } else if topic == "." || topic == ".." {
        format!("{topic:?} is not a topic name Kafka accepts")
    } else if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        format!(
            "{topic:?} is not a topic name: {c:?} is not allowed (only ASCII letters, digits, \
             '.', '_' and '-')"
        )
    } else {
        return None;
    };
    Some(reason)
}

/// Query parameters of a PostgreSQL URL that sqlx reads; it logs any other one with
/// its value (which may be a misspelt password), so those are refused first.
const URL_PARAMETERS: [&str; 19] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "options[NAME]",
];

/// Refuses a `database.url` query parameter sqlx does not know, naming it (never its value).
pub(crate) fn url_parameters(url: &str) -> Result<(), ConfigError> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    let query = query.split('#').next().unwrap_or_default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let name = percent_decode(pair.split('=').next().unwrap_or_default());
        let known = URL_PARAMETERS.contains(&name.as_str())
            || (name.starts_with("options[") && name.ends_with(']'));
        if !known {
            return Err(ConfigError::new(
                "database.url",
                format!(
                    "unknown parameter {name:?} (known: {})",
                    URL_PARAMETERS.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Decodes `%XX` escapes and `+` of a URL query part.
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (escaped, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, byte) => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_topics_and_the_names_that_collide_with_them_are_internal() {
        for topic in [
            "__consumer_offsets",
            "__consumer.offsets",
            "__transaction.state",
            "__remote_log_metadata",
        ] {
            assert!(is_internal_topic(topic), "{topic}");
        }
        for topic in [
            "__consumer_offset",
            "__Consumer_Offsets",
            "orders",
            "_consumer_offsets",
        ] {
            assert!(!is_internal_topic(topic), "{topic}");
        }
    }

    #[test]
    fn bounds_refuse_only_what_is_beyond_them() {
        assert!(at_most("k", Duration::from_secs(DAY), ONE_DAY).is_ok());
        let err = at_most("k", Duration::from_secs(DAY + 1), ONE_DAY).unwrap_err();
        assert_eq!(err.reason, "must be at most 1day (got 1day 1s)");
        assert!(within("k", Duration::ZERO, ONE_DAY).is_err());
        assert!(attempts("k", MAX_ATTEMPTS).is_ok());
        assert!(attempts("k", MAX_ATTEMPTS + 1).is_err());
    }

    #[test]
    fn bound_texts_parse_to_their_bounds() {
        for bound in [ONE_DAY, ONE_YEAR, ONE_HOUR, ONE_MINUTE] {
            assert_eq!(humantime::parse_duration(bound.text).unwrap(), bound.max);
        }
    }

    #[test]
    fn url_parameters_sqlx_reads_pass_and_others_are_named() {
        assert!(url_parameters("postgres://h/db").is_ok());
        assert!(
            url_parameters("postgres://h/db?sslmode=require&options%5Bsearch_path%5D=x").is_ok()
        );
        let err = url_parameters("postgres://h/db?sslmode=require&pasword=hunter2").unwrap_err();
        assert!(err.reason.contains("\"pasword\"") && !err.reason.contains("hunter2"));
    }
}
