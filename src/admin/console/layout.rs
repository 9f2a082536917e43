//! The page shell (head, navigation, who is signed in) and the small pieces every page
//! renders the same way: times, ages, statuses, payloads.
//!
//! Everything interpolated goes through maud, which escapes it; nothing here writes
//! raw HTML, an inline script, an inline style or an event attribute.

use axum::response::Html;
use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};

use crate::config::Role;
use crate::operations::Actor;
use crate::readable::Readable;
use crate::task::Status;

/// The sections of the console, in navigation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Causes,
    Tasks,
    Replays,
    Approvals,
    Fleet,
    Audit,
}

const NAV: [(Nav, &str, &str); 7] = [
    (Nav::Overview, "/console/", "Overview"),
    (Nav::Causes, "/console/causes", "What broke"),
    (Nav::Tasks, "/console/tasks", "Tasks"),
    (Nav::Replays, "/console/replays", "Replays"),
    (Nav::Approvals, "/console/approvals", "Approvals"),
    (Nav::Fleet, "/console/fleet", "Members, breakers, brakes"),
    (Nav::Audit, "/console/audit", "Audit log"),
];

/// Payload bytes shown on a page at most; the API gives them whole.
const SHOWN_BYTES: usize = 64 * 1024;

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · redrive" }
            link rel="stylesheet" href="/console/static/console.css";
            script src="/console/static/console.js" defer {}
        }
    }
}

/// A page without navigation (sign-in, errors).
pub(crate) fn bare(title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head(title))
                body {
                    main #main {
                        h1 { (title) }
                        (body)
                    }
                }
            }
        }
        .into_string(),
    )
}

/// A console page for `caller`, with `current` marked in the navigation.
pub(crate) fn page(caller: &Actor, current: Nav, title: &str, body: Markup) -> Html<String> {
    let role = match caller.role {
        Role::Operate => "operate",
        Role::Read => "read only",
    };
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head(title))
                body {
                    a.skip href="#main" { "Skip to content" }
                    header.top {
                        span.brand { "redrive" }
                        nav aria-label="Console" {
                            ul {
                                @for (nav, href, label) in NAV {
                                    li {
                                        @if nav == current {
                                            a href=(href) aria-current="page" { (label) }
                                        } @else {
                                            a href=(href) { (label) }
                                        }
                                    }
                                }
                            }
                        }
                        span.keys-hint { "Keys: " kbd { "?" } }
                        div.who {
                            span { "Signed in as " b { (caller.name) } " (" span.role { (role) } ")" }
                            @if caller.name != "anonymous" {
                                form method="post" action="/console/logout" {
                                    button type="submit" { "Sign out" }
                                }
                            }
                        }
                    }
                    main #main tabindex="-1" {
                        h1 { (title) }
                        (body)
                    }
                    (keys_help())
                }
            }
        }
        .into_string(),
    )
}

/// The keyboard's help, shown by `?` and closed by Esc (the script).
fn keys_help() -> Markup {
    const KEYS: [(&str, &str); 6] = [
        ("/", "search the tasks"),
        ("j / k", "next / previous row: a task, a cause, a group"),
        ("Enter", "open the row marked"),
        ("x", "tick or clear the task marked"),
        ("?", "show or hide this help"),
        ("Esc", "close this help; leave a field"),
    ];
    html! {
        div #keys.keys role="dialog" aria-labelledby="keys-title" hidden {
            h2 #keys-title { "Keyboard" }
            dl {
                @for (key, does) in KEYS {
                    dt { kbd { (key) } }
                    dd { (does) }
                }
            }
        }
    }
}

/// Characters left as they are in a path segment (RFC 3986's unreserved ones).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `name` as one segment of a console address: a handler or route named `a/b?c` is
/// `a%2Fb%3Fc`, which the router reads back as the name.
pub(crate) fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, SEGMENT).to_string()
}

/// A time, in UTC, machine-readable too.
pub(crate) fn when(at: DateTime<Utc>) -> Markup {
    html! {
        time datetime=(at.to_rfc3339()) { (at.format("%Y-%m-%d %H:%M:%S UTC")) }
    }
}

/// A time relative to `now` as a person says it (`42 s ago`, `3 min ago`, `2 h ago`,
/// `3 d ago`), the exact UTC time in its title and machine-readable.
pub(crate) fn ago(at: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    let s = (now - at).num_seconds().max(0);
    let said = match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    };
    html! {
        time datetime=(at.to_rfc3339()) title=(at.format("%Y-%m-%d %H:%M:%S UTC")) { (said) }
    }
}

/// A time relative to `now`, past (`3 min ago`) or to come (`in 3 min`), the exact UTC
/// time in its title and machine-readable.
pub(crate) fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    if at <= now {
        return ago(at, now);
    }
    let s = (at - now).num_seconds();
    let said = match s {
        0..=59 => format!("in {s} s"),
        60..=3599 => format!("in {} min", s / 60),
        3600..=86_399 => format!("in {} h", s / 3600),
        _ => format!("in {} d", s / 86_400),
    };
    html! {
        time datetime=(at.to_rfc3339()) title=(at.format("%Y-%m-%d %H:%M:%S UTC")) { (said) }
    }
}

/// A time, or a dash.
pub(crate) fn when_opt(at: Option<DateTime<Utc>>) -> Markup {
    match at {
        Some(at) => when(at),
        None => dash(),
    }
}

/// "Nothing here".
pub(crate) fn dash() -> Markup {
    html! { span.none aria-label="none" { "—" } }
}

/// The store's and the layer's words (a waiting state, a warning): what they quote in
/// backticks (a handler, a command) as code, never a backtick shown.
pub(crate) fn words(text: &str) -> Markup {
    html! {
        @for (i, part) in text.split('`').enumerate() {
            @if i % 2 == 1 { code { (visible(part)) } } @else { (visible(part)) }
        }
    }
}

/// Text, or a dash.
pub(crate) fn text_opt(text: Option<&str>) -> Markup {
    match text {
        Some(text) => long_text(text),
        None => dash(),
    }
}

/// A duration in seconds as a person reads it: `42 s`, `3 min 5 s`, `2 h 10 min`,
/// `3 d 4 h`, `5 min`.
pub(crate) fn age(seconds: f64) -> String {
    let s = if seconds.is_finite() {
        seconds.max(0.0).round() as u64
    } else {
        0
    };
    // A unit and the next smaller, left out when zero ("15 min", not "15 min 0 s").
    let (big, big_unit, small, small_unit) = match s {
        0..=59 => return format!("{s} s"),
        60..=3599 => (s / 60, "min", s % 60, "s"),
        3600..=86_399 => (s / 3600, "h", s % 3600 / 60, "min"),
        _ => (s / 86_400, "d", s % 86_400 / 3600, "h"),
    };
    match small {
        0 => format!("{big} {big_unit}"),
        _ => format!("{big} {big_unit} {small} {small_unit}"),
    }
}

/// Text from a message or an operator as a person should see it (see
/// [`crate::readable::visible`]).
pub(crate) use crate::readable::visible;

/// A task's status as a badge.
pub(crate) fn status(status: Status) -> Markup {
    html! { span class={ "badge status-" (status.as_str()) } { (status.as_str()) } }
}

/// Stored bytes: the text when they are UTF-8 (a JSON object or array re-indented),
/// else hex in groups of two digits, with their size; at most [`SHOWN_BYTES`] of them.
pub(crate) fn payload(bytes: &Readable) -> Markup {
    let (shown, cut) = match (&bytes.pretty_json, bytes.encoding) {
        (Some(pretty), _) => cut_text(pretty, SHOWN_BYTES),
        (None, "utf8") => cut_text(&bytes.data, SHOWN_BYTES),
        _ => cut_text(&bytes.data, SHOWN_BYTES * 2),
    };
    let size = match bytes.size {
        1 => "1 byte".to_owned(),
        n => format!("{n} bytes"),
    };
    html! {
        div.payload {
            @if bytes.encoding == "utf8" {
                @let seen = visible(shown);
                p.meta {
                    (size) ", UTF-8 text"
                    @if bytes.pretty_json.is_some() { ", JSON re-indented" }
                    @if matches!(seen, std::borrow::Cow::Owned(_)) {
                        "; invisible and control characters are shown as " code { "\\u{…}" }
                    }
                }
                pre.text { (seen) }
            } @else {
                p.meta { (size) ", not UTF-8: shown as hex" }
                pre.hex { (spaced_hex(shown)) }
            }
            @if cut {
                p.meta { "Only the first " (SHOWN_BYTES / 1024) " KiB are shown; "
                    "the API and " code { "redrive tasks show" } " give them whole." }
            }
        }
    }
}

/// `n` with a comma every three digits: `100,000`.
pub(crate) fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `n` things with thousands separators and the noun that fits: `1 task`, `1,234 tasks`.
pub(crate) fn counted(n: i64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// Text that may be long (an error of any size, a stack trace), as [`visible`], its
/// first [`SHOWN_BYTES`] only, and a note when cut: a page stays light whatever a
/// downstream answered.
pub(crate) fn long_text(text: &str) -> Markup {
    let (shown, cut) = cut_text(text, SHOWN_BYTES);
    html! {
        (visible(shown))
        @if cut {
            span.meta.cut {
                " … (" (thousands(text.len() as i64)) " bytes in all; the first "
                (SHOWN_BYTES / 1024) " KiB are shown: the API and " code { "redrive tasks show" }
                " give it whole)"
            }
        }
    }
}

/// `text` cut to at most `limit` bytes on a character boundary, and whether it was cut.
fn cut_text(text: &str, limit: usize) -> (&str, bool) {
    if text.len() <= limit {
        return (text, false);
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

/// Hex digits in groups of two, 32 bytes a line.
fn spaced_hex(digits: &str) -> String {
    let mut out = String::with_capacity(digits.len() * 3 / 2);
    for (i, pair) in digits.as_bytes().chunks(2).enumerate() {
        if i > 0 {
            out.push(if i % 32 == 0 { '\n' } else { ' ' });
        }
        out.extend(pair.iter().map(|&b| b as char));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the issue 16 attack: a key with a right-to-left override and a NUL was
    /// written raw into the page, where it could pass for another key.
    #[test]
    fn invisible_and_control_characters_are_shown_as_escapes() {
        assert_eq!(visible("order-1\u{202E}gnp.exe"), "order-1\\u{202E}gnp.exe");
        assert_eq!(
            visible("a\0b\u{200B}c\u{FEFF}"),
            "a\\u{0000}b\\u{200B}c\\u{FEFF}"
        );
        assert!(matches!(
            visible("line\n\tnext é 日本"),
            std::borrow::Cow::Borrowed(_)
        ));
        let page = payload(&Readable::new("k\u{202E}1".as_bytes())).into_string();
        assert!(
            page.contains("k\\u{202E}1") && !page.contains('\u{202E}'),
            "{page}"
        );
        assert!(page.contains("shown as"), "{page}");
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(42.4), "42 s");
        assert_eq!(age(185.0), "3 min 5 s");
        assert_eq!(age(7_800.0), "2 h 10 min");
        assert_eq!(age(273_600.0), "3 d 4 h");
        assert_eq!(age(-3.0), "0 s");
        assert_eq!(age(f64::NAN), "0 s");
        // Found by an attack: a whole unit read "per 5 min 0 s".
        assert_eq!(age(300.0), "5 min");
        assert_eq!(age(3_600.0), "1 h");
        assert_eq!(age(172_800.0), "2 d");
    }

    #[test]
    fn binary_payloads_are_hex_with_their_size_and_text_is_escaped() {
        let binary = payload(&Readable::new(&[0xff, 0x00, b'v'])).into_string();
        assert!(
            binary.contains("3 bytes, not UTF-8: shown as hex"),
            "{binary}"
        );
        assert!(binary.contains("ff 00 76"), "{binary}");
        let hostile = payload(&Readable::new(b"<script>alert(1)</script>")).into_string();
        assert!(
            hostile.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{hostile}"
        );
        assert!(!hostile.contains("<script>"), "{hostile}");
    }

    /// Found by the third issue 16 attack: the console showed JSON on one line.
    #[test]
    fn json_payloads_are_shown_re_indented() {
        let page = payload(&Readable::new(br#"{"a":[1,"<b>"]}"#)).into_string();
        assert!(page.contains("JSON re-indented"), "{page}");
        assert!(
            page.contains("{\n  &quot;a&quot;: [\n    1,\n    &quot;&lt;b&gt;&quot;\n  ]\n}"),
            "{page}"
        );
    }

    #[test]
    fn long_payloads_are_cut_on_a_character_boundary() {
        let long = "é".repeat(SHOWN_BYTES);
        let shown = payload(&Readable::new(long.as_bytes())).into_string();
        assert!(shown.contains("Only the first 64 KiB"), "cut");
        assert_eq!(cut_text("aé", 2), ("a", true));
        assert_eq!(spaced_hex(&"ab".repeat(33)).lines().count(), 2);
    }

    /// Found by an attack: a task with a 1 MB error made a 2 MB page.
    #[test]
    fn a_long_error_is_cut_and_says_so() {
        let long = format!("<b>{}", "x".repeat(1 << 20));
        let shown = long_text(&long).into_string();
        assert!(shown.len() < SHOWN_BYTES + 1024, "{} bytes", shown.len());
        assert!(shown.starts_with("&lt;b&gt;x"), "escaped");
        assert!(shown.contains("1,048,579 bytes in all"), "said");
        assert_eq!(long_text("short").into_string(), "short");
    }
}
