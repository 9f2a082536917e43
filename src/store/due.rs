//! When an operator's retry makes tasks due: the one reading of `--at` (CLI) and `"at"`
//! (admin API).

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Furthest ahead a retry may be due.
pub const LATEST: Duration = Duration::from_secs(365 * 24 * 3600);

/// Furthest in the past a retry's time may be (such a task is due at once): room for
/// clocks that disagree, not for a mistyped year.
const EARLIEST: TimeDelta = TimeDelta::days(1);

/// When retried tasks are due: written as an RFC 3339 time, or as a duration meaning
/// that long from now ("1h": in an hour). Parsing refuses a time more than a year
/// ahead or more than a day in the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// At this time.
    At(DateTime<Utc>),
    /// This long after the action, by PostgreSQL's clock.
    In(Duration),
}

impl FromStr for Due {
    type Err = String;

    fn from_str(text: &str) -> Result<Due, String> {
        if let Ok(time) = DateTime::parse_from_rfc3339(text) {
            let time = time.with_timezone(&Utc);
            let now = Utc::now();
            if time > now + TimeDelta::from_std(LATEST).expect("a year fits") {
                return Err(format!("{text:?} is more than a year from now"));
            }
            if time < now - EARLIEST {
                return Err(format!("{text:?} is more than a day ago"));
            }
            return Ok(Due::At(time));
        }
        let text = text.trim();
        if text.starts_with('-') {
            return Err(format!(
                "{text:?} is negative: give a time, or how long from now"
            ));
        }
        let delay = humantime::parse_duration(text).map_err(|_| {
            format!("{text:?} is neither an RFC 3339 time nor a duration like \"1h\" (from now)")
        })?;
        if delay > LATEST {
            return Err(format!("{text:?} is more than a year from now"));
        }
        Ok(Due::In(delay))
    }
}

impl fmt::Display for Due {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Due::At(time) => f.write_str(&time.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            Due::In(delay) => write!(f, "{}", humantime::format_duration(*delay)),
        }
    }
}

impl Serialize for Due {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Due {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Due, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_from_now_and_times_are_bounded() {
        assert_eq!("1h".parse(), Ok(Due::In(Duration::from_secs(3600))));
        assert_eq!("0s".parse(), Ok(Due::In(Duration::ZERO)));
        let soon = Utc::now() + TimeDelta::minutes(5);
        assert_eq!(soon.to_rfc3339().parse(), Ok(Due::At(soon)));
        let an_hour_ago = (Utc::now() - TimeDelta::hours(1)).to_rfc3339();
        assert!(an_hour_ago.parse::<Due>().is_ok());
        for (text, says) in [
            ("2999-01-01T00:00:00Z", "more than a year from now"),
            ("1999-01-01T00:00:00Z", "more than a day ago"),
            ("366d", "more than a year from now"),
            ("100000000years", "more than a year from now"),
            ("-1h", "negative"),
            ("soon", "neither an RFC 3339 time nor a duration"),
        ] {
            let error = text.parse::<Due>().unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn it_reads_back_what_it_writes() {
        for due in [
            Due::In(Duration::from_secs(5400)),
            Due::At(Utc::now() + TimeDelta::hours(1)),
        ] {
            let json = serde_json::to_value(due).unwrap();
            assert_eq!(json, serde_json::Value::String(due.to_string()));
            assert_eq!(serde_json::from_value::<Due>(json).unwrap(), due);
        }
        assert_eq!(Due::In(Duration::from_secs(5400)).to_string(), "1h 30m");
    }
}
