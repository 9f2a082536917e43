//! What broke: a failure's cause, an error class and the fingerprint of its message.
//!
//! The fingerprint is the message with its variable parts taken out (numbers, ids,
//! UUIDs, hex, quoted values, timestamps), so that "order 4711 not found" and "order 8
//! not found" are one cause. It reads only the message's first line and at most
//! [`READ_BYTES`] of it, so a megabyte of error costs what a line does.
//!
//! The class says what kind of failure it was:
//! - a dead letter's: the exception class its headers name (Spring's root cause class
//!   first, Connect's, redrive's own), or for a Kafka share group's, how the group gave
//!   it up (`share-group.rejected`, `share-group.delivery_count_exceeded`);
//! - an attempt's: how the handler answered ([`AttemptKind`]), or for an error that
//!   starts `HTTP <status>` (the webhook handler's), the status class (`http.4xx`,
//!   `http.5xx`).

use serde::{Deserialize, Serialize};

/// Bytes of a message the fingerprint reads (its first line, cut here).
pub const READ_BYTES: usize = 2048;
/// Longest fingerprint, in bytes.
pub const FINGERPRINT_MAX_BYTES: usize = 300;
/// Longest class, in bytes.
pub const CLASS_MAX_BYTES: usize = 200;
/// Longest example message kept with a cause, in bytes.
pub const EXAMPLE_MAX_BYTES: usize = 1000;

/// The class of a failure whose report named none.
pub const UNCLASSIFIED: &str = "unclassified";

/// A failure's cause: failures with equal causes are one group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cause {
    /// What kind of failure (an exception class, `handler.timeout`, `http.5xx`, ...).
    pub class: String,
    /// The message with its variable parts taken out.
    pub fingerprint: String,
    /// The message itself, cut to [`EXAMPLE_MAX_BYTES`] (kept as the cause's example
    /// when it is first seen).
    pub example: String,
}

/// How an attempt failed, as the one way to call a handler saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    /// The handler said retry ([`crate::HandlerError::Transient`]).
    Transient,
    /// The handler said stop ([`crate::HandlerError::Permanent`]).
    Permanent,
    /// The handler said retry later ([`crate::HandlerError::RetryAfter`]).
    RetryAfter,
    /// The handler ran past its timeout.
    Timeout,
    /// The handler panicked.
    Panic,
    /// The attempt's lease was lost and the call stopped.
    LeaseLost,
    /// No attempts were left; the handler was not called.
    NoAttemptsLeft,
}

impl AttemptKind {
    /// The class of an attempt of this kind.
    pub fn class(self) -> &'static str {
        match self {
            AttemptKind::Transient => "handler.transient",
            AttemptKind::Permanent => "handler.permanent",
            AttemptKind::RetryAfter => "handler.retry_after",
            AttemptKind::Timeout => "handler.timeout",
            AttemptKind::Panic => "handler.panic",
            AttemptKind::LeaseLost => "lease.lost",
            AttemptKind::NoAttemptsLeft => "attempts.exhausted",
        }
    }
}

impl Cause {
    /// The cause a failure was reported with: its dead letter's class (or a share
    /// group's disposition) and message.
    pub fn reported(
        class: Option<&str>,
        disposition: Option<&str>,
        message: Option<&str>,
    ) -> Cause {
        let class = match (class.map(str::trim).filter(|c| !c.is_empty()), disposition) {
            (Some(class), _) => clean_class(class),
            (None, Some(disposition)) => format!("share-group.{}", clean_class(disposition)),
            (None, None) => UNCLASSIFIED.to_owned(),
        };
        Cause::new(class, message.unwrap_or_default())
    }

    /// The cause of a failed attempt of `kind` whose handler said `message`.
    pub fn of_attempt(kind: AttemptKind, message: &str) -> Cause {
        let class = match kind {
            AttemptKind::Transient | AttemptKind::Permanent | AttemptKind::RetryAfter => {
                http_class(message).unwrap_or(kind.class()).to_owned()
            }
            _ => kind.class().to_owned(),
        };
        Cause::new(class, message)
    }

    /// The cause of an attempt stored before causes were (a backfill): its kind read
    /// from the texts the one way to call a handler writes, else transient (or
    /// permanent, for a task that `ended`), with the attempt counts those texts add cut.
    pub fn of_stored_attempt(error: &str, ended: bool) -> Cause {
        let kind = if error.starts_with("handler timed out after") {
            AttemptKind::Timeout
        } else if error.starts_with("handler panicked:") {
            AttemptKind::Panic
        } else if error.starts_with("the lease was lost") {
            AttemptKind::LeaseLost
        } else if error.starts_with("no attempts left:") {
            AttemptKind::NoAttemptsLeft
        } else if ended && !error.contains(" (gave up after ") {
            AttemptKind::Permanent
        } else {
            AttemptKind::Transient
        };
        let message =
            [" (gave up after ", " (retry after "]
                .iter()
                .fold(error, |message, suffix| {
                    message
                        .rsplit_once(suffix)
                        .map_or(message, |(kept, _)| kept)
                });
        Cause::of_attempt(kind, message)
    }

    fn new(class: String, message: &str) -> Cause {
        Cause {
            class,
            fingerprint: fingerprint(message),
            example: example(message),
        }
    }
}

/// `http.4xx` or `http.5xx` (`http.3xx`, ...) for a message that starts with
/// `HTTP <three digits>`.
fn http_class(message: &str) -> Option<&'static str> {
    let status = message.strip_prefix("HTTP ")?.as_bytes();
    let digits = status.get(..3)?;
    if !digits.iter().all(u8::is_ascii_digit) || status.get(3).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    Some(match digits[0] {
        b'1' => "http.1xx",
        b'2' => "http.2xx",
        b'3' => "http.3xx",
        b'4' => "http.4xx",
        b'5' => "http.5xx",
        _ => "http.other",
    })
}

/// A class as stored: trimmed, control characters out, cut to [`CLASS_MAX_BYTES`].
fn clean_class(class: &str) -> String {
    let clean: String = class
        .trim()
        .chars()
        .filter(|c| !c.is_control() && !is_invisible(*c))
        .collect();
    cut(&clean, CLASS_MAX_BYTES).to_owned()
}

/// `message` as an example: control characters as spaces, cut to [`EXAMPLE_MAX_BYTES`].
fn example(message: &str) -> String {
    let message = cut(message, EXAMPLE_MAX_BYTES);
    message
        .trim()
        .chars()
        .map(|c| {
            if c.is_control() || is_invisible(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The fingerprint of `message`: its first non-blank line (at most [`READ_BYTES`]),
/// each word that holds a digit replaced by `<n>` (a number: `42`, `-1.5e-20`) or
/// `<id>` (anything else: `ord_4711`, a UUID, hex, a host:port's port), each quoted
/// value by `<q>`, control characters and runs of blanks by one space, cut to
/// [`FINGERPRINT_MAX_BYTES`].
pub fn fingerprint(message: &str) -> String {
    let line = message
        .split(['\n', '\r'])
        .find(|line| !line.trim().is_empty())
        .unwrap_or_default();
    let line = cut(line, READ_BYTES);
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len().min(FINGERPRINT_MAX_BYTES + 8));
    let mut i = 0;
    while i < chars.len() && out.len() < FINGERPRINT_MAX_BYTES {
        let c = chars[i];
        if is_quote(c) && opens_quote(&chars, i) {
            if let Some(close) = closing_quote(&chars, i) {
                out.push_str("<q>");
                i = close + 1;
                continue;
            }
        }
        if is_word(c) {
            let start = i;
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word.chars().any(char::is_numeric) {
                out.push_str(if is_number(&word) { "<n>" } else { "<id>" });
            } else {
                out.push_str(&word);
            }
            continue;
        }
        if c.is_whitespace() || c.is_control() || is_invisible(c) {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
        i += 1;
    }
    cut(out.trim_end(), FINGERPRINT_MAX_BYTES).to_owned()
}

/// Characters a word is made of: letters, digits, `_`, `-`, `.`, `+` (so `1e-20`,
/// `customer-42` and `10.0.0.1` are one word each).
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '+')
}

/// Zero-width and direction-changing characters (a terminal or a page would reorder
/// the text around them).
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
    )
}

fn is_quote(c: char) -> bool {
    matches!(c, '\'' | '"' | '`')
}

/// Whether the quote at `i` opens a quoted value: not inside a word (`can't` is no
/// quote).
fn opens_quote(chars: &[char], i: usize) -> bool {
    i == 0 || !chars[i - 1].is_alphanumeric()
}

/// The position of the quote that closes the one at `open`, within 256 characters.
fn closing_quote(chars: &[char], open: usize) -> Option<usize> {
    let quote = chars[open];
    chars
        .iter()
        .enumerate()
        .skip(open + 1)
        .take(256)
        .find(|(_, c)| **c == quote)
        .map(|(at, _)| at)
}

/// Whether `word` reads as a number: a sign, digits with at most one point, and an
/// exponent (`42`, `-7`, `3.14`, `1e-20`, `+6.02E23`), trailing points aside.
fn is_number(word: &str) -> bool {
    let word = word.trim_end_matches('.');
    let word = word.strip_prefix(['-', '+']).unwrap_or(word);
    let (mantissa, exponent) = match word.find(['e', 'E']) {
        Some(at) => (&word[..at], Some(&word[at + 1..])),
        None => (word, None),
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_numeric());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => {
            (digits(whole) || whole.is_empty()) && digits(fraction)
                || digits(whole) && fraction.is_empty()
        }
        None => digits(mantissa),
    };
    let exponent_ok = exponent.map_or(true, |e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_parts_are_taken_out_so_that_one_cause_is_one_fingerprint() {
        let same = [
            ("order 4711 not found", "order 8 not found"),
            (
                "customer-4242:order-17 rejected",
                "customer-1:order-99999 rejected",
            ),
            (
                "no row for id 3f2b1c9e-8a7d-4e1f-9b2c-0d1e2f3a4b5c",
                "no row for id 00000000-0000-0000-0000-000000000000",
            ),
            ("token 0xdeadbeef expired", "token 0x1f expired"),
            ("hash a94a8fe5cc expired", "hash 7c4a8d09ca expired"),
            (
                "field 'customer_id' missing",
                "field \"shipping.address\" missing",
            ),
            (
                "at 2026-11-27T22:53:10.123Z the lock timed out",
                "at 2025-01-01T00:00:00Z the lock timed out",
            ),
            (
                "connect to 10.0.0.1:5432 refused",
                "connect to 192.168.1.20:6543 refused",
            ),
            ("value 1e-20 below -3.5E+7", "value 42 below 7"),
            ("amount ١٢٣ invalid", "amount 7 invalid"),
            (
                "HTTP 503 Service Unavailable: {\"retry\":12}",
                "HTTP 503 Service Unavailable: {\"retry\":999}",
            ),
            (
                "order 1 failed\nat com.acme.Orders.load(Orders.java:42)",
                "order 2 failed",
            ),
            ("  order   9\tfailed ", "order 10 failed"),
        ];
        for (a, b) in same {
            assert_eq!(fingerprint(a), fingerprint(b), "{a:?} and {b:?}");
        }
        let different = [
            ("order 1 not found", "customer 1 not found"),
            ("connection refused", "connection reset"),
        ];
        for (a, b) in different {
            assert_ne!(fingerprint(a), fingerprint(b), "{a:?} and {b:?}");
        }
    }

    #[test]
    fn fingerprints_read_as_the_message_with_placeholders() {
        let cases = [
            ("order 4711 not found", "order <n> not found"),
            ("user42 can't pay 'EUR 12.50'", "<id> can't pay <q>"),
            (
                "java.net.ConnectException: Connection refused",
                "java.net.ConnectException: Connection refused",
            ),
            (
                "connect to warehouse-db:5432 refused",
                "connect to warehouse-db:<n> refused",
            ),
            ("", ""),
            ("\n\n  \n", ""),
            ("unclosed 'quote 7", "unclosed 'quote <n>"),
        ];
        for (message, expected) in cases {
            assert_eq!(fingerprint(message), expected, "{message:?}");
        }
    }

    #[test]
    fn hostile_messages_cost_a_line_and_keep_no_control_characters() {
        let huge = format!(
            "order {} failed {}",
            "9".repeat(1000),
            "x".repeat(1_000_000)
        );
        let print = fingerprint(&huge);
        assert!(print.len() <= FINGERPRINT_MAX_BYTES, "{}", print.len());
        assert!(print.starts_with("order <n> failed"), "{print}");

        let controls =
            "bad\u{1b}[31m red\u{0}nul\u{7f} and \u{202e}rtl \u{61c}\u{180e}\u{2060}\u{ad}x";
        let print = fingerprint(controls);
        assert!(
            !print.chars().any(|c| c.is_control() || is_invisible(c)),
            "{print:?}"
        );

        let multibyte = "é".repeat(5000);
        let print = fingerprint(&multibyte);
        assert!(print.len() <= FINGERPRINT_MAX_BYTES);
        let example = Cause::reported(None, None, Some(&multibyte)).example;
        assert!(example.len() <= EXAMPLE_MAX_BYTES);

        let many_quotes = "'".repeat(100_000);
        assert!(fingerprint(&many_quotes).len() <= FINGERPRINT_MAX_BYTES);
    }

    #[test]
    fn classes_come_from_the_report_or_from_how_the_attempt_failed() {
        let connect = Cause::reported(
            Some("org.apache.kafka.connect.errors.ConnectException"),
            None,
            Some("JDBC sink: connection to warehouse-db refused"),
        );
        assert_eq!(
            connect.class,
            "org.apache.kafka.connect.errors.ConnectException"
        );
        assert_eq!(
            connect.fingerprint,
            "JDBC sink: connection to warehouse-db refused"
        );

        let share = Cause::reported(None, Some("delivery_count_exceeded"), Some("x"));
        assert_eq!(share.class, "share-group.delivery_count_exceeded");
        assert_eq!(Cause::reported(Some("  "), None, None).class, UNCLASSIFIED);
        let control = Cause::reported(Some("Bad\u{1b}[2JClass"), None, None);
        assert_eq!(control.class, "Bad[2JClass");

        let cases = [
            (
                AttemptKind::Transient,
                "HTTP 503 Service Unavailable: down",
                "http.5xx",
            ),
            (
                AttemptKind::RetryAfter,
                "HTTP 429 Too Many Requests: slow",
                "http.4xx",
            ),
            (AttemptKind::Permanent, "HTTP 404 Not Found: ", "http.4xx"),
            (
                AttemptKind::Permanent,
                "HTTP 4040 what",
                "handler.permanent",
            ),
            (AttemptKind::Transient, "HTTPS 503", "handler.transient"),
            (AttemptKind::Timeout, "HTTP 503 but slow", "handler.timeout"),
            (
                AttemptKind::Panic,
                "handler panicked: boom",
                "handler.panic",
            ),
            (AttemptKind::LeaseLost, "the lease was lost", "lease.lost"),
            (
                AttemptKind::NoAttemptsLeft,
                "no attempts left",
                "attempts.exhausted",
            ),
        ];
        for (kind, message, class) in cases {
            assert_eq!(Cause::of_attempt(kind, message).class, class, "{message}");
        }
    }

    #[test]
    fn every_kind_of_number_is_one_placeholder() {
        for number in [
            "0",
            "-1",
            "+2",
            "3.14",
            ".5",
            "7.",
            "1e-20",
            "6.02E23",
            "-1.5e+300",
        ] {
            assert!(is_number(number), "{number}");
            assert_eq!(
                fingerprint(&format!("took {number} s")),
                "took <n> s",
                "{number}"
            );
        }
        for word in ["1e", "e5", "1.2.3", "v2", "1-2", "--", "1e-"] {
            assert!(!is_number(word), "{word}");
        }
    }
}
