//! Times as a person reads them: UTC to the second, and how far they are from now.

use chrono::{DateTime, Utc};

/// `2026-11-25 14:02:03`: UTC, to the second.
pub fn at(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// How far `time` is from `now`: `in 3 m`, `5 m ago`, or `now` within a second.
pub fn from_now(time: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (time - now).num_seconds();
    match seconds {
        0 => "now".to_owned(),
        s if s > 0 => format!("in {}", span(s)),
        s => format!("{} ago", span(s.saturating_neg())),
    }
}

/// `2026-11-25 14:02:03 (in 3 m)`.
pub fn at_from_now(time: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ({})", at(time), from_now(time, now))
}

/// A length of time in its two largest units: `40 s`, `3 m 20 s`, `2 h 5 m`, `3 d 4 h`.
pub fn span(seconds: i64) -> String {
    const UNITS: [(i64, &str); 4] = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let seconds = seconds.max(0);
    let Some(first) = UNITS.iter().position(|&(size, _)| seconds >= size) else {
        return "0 s".to_owned();
    };
    let (size, unit) = UNITS[first];
    let mut text = format!("{} {unit}", seconds / size);
    if let Some(&(next, next_unit)) = UNITS.get(first + 1) {
        let rest = seconds % size / next;
        if rest > 0 {
            text.push_str(&format!(" {rest} {next_unit}"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn times_read_as_a_person_says_them() {
        let now = Utc.with_ymd_and_hms(2026, 11, 25, 14, 2, 3).unwrap();
        assert_eq!(at(now), "2026-11-25 14:02:03");
        let later = now + chrono::Duration::seconds(180);
        assert_eq!(at_from_now(later, now), "2026-11-25 14:05:03 (in 3 m)");
        assert_eq!(
            from_now(now - chrono::Duration::seconds(301), now),
            "5 m 1 s ago"
        );
        assert_eq!(from_now(now, now), "now");
        assert_eq!(span(40), "40 s");
        assert_eq!(span(7_500), "2 h 5 m");
        assert_eq!(span(3 * 86_400 + 4 * 3_600 + 59), "3 d 4 h");
        assert_eq!(span(-5), "0 s");
    }
}
