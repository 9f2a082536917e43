//! Topic patterns of routes: one anchoring and one dialect for librdkafka and redrive.
//!
//! librdkafka subscribes a topic that starts with `^` as a regular expression, matched
//! as a search (unanchored at the end) by the C library's POSIX extended regex (or, on
//! builds without it, its bundled engine). The route table matches with Rust's `regex`.
//! To make both read a pattern the same way, redrive subscribes and matches the very
//! same string, `^(PATTERN)$` (whole topic names, as Java clients do), and accepts only
//! the syntax that POSIX ERE and Rust treat alike: letters, digits, `.`, `_`, `-`, the
//! operators `* + ? |`, groups `( )`, classes `[...]` and `[^...]` of letters, digits,
//! `.`, `_` and `-`, `^`, `$`, and the escape `\.` outside classes.

/// The anchored form of `pattern` that is both subscribed and matched.
pub fn anchored(pattern: &str) -> String {
    let inner = pattern.strip_prefix('^').unwrap_or(pattern);
    let inner = match inner.strip_suffix('$') {
        Some(stripped) if !stripped.ends_with('\\') => stripped,
        _ => inner,
    };
    format!("^({inner})$")
}

/// Whether subscribing `pattern` delivers `topic` (and the route table claims it).
pub fn matches(pattern: &str, topic: &str) -> bool {
    regex::Regex::new(&anchored(pattern)).is_ok_and(|re| re.is_match(topic))
}

/// Why `pattern` could be read differently by the two engines, if it could.
pub fn check(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("must not be empty".into());
    }
    let mut in_class = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => {}
            '^' => {}
            ']' if in_class => in_class = false,
            '[' if !in_class => in_class = true,
            '(' if !in_class && chars.peek() == Some(&'?') => {
                return Err("(?...) groups and flags are not POSIX: use plain ( )".into())
            }
            '*' | '+' | '?' | '|' | '(' | ')' | '$' if !in_class => {}
            '\\' if !in_class => {
                if chars.next() != Some('.') {
                    return Err(
                        "only the escape \\. is allowed: other escapes (\\d, \\w, ...) \
                        are read differently by librdkafka's POSIX regex"
                            .into(),
                    );
                }
            }
            other => {
                return Err(format!(
                    "{other:?} is not allowed here: use letters, digits, . _ - and the \
                     operators * + ? | ( ) [ ] ^ $ (repetition counts {{n,m}}, (?...) groups \
                     and escapes are read differently by librdkafka's POSIX regex)"
                ))
            }
        }
    }
    if in_class {
        return Err("unclosed [ class".into());
    }
    regex::Regex::new(&anchored(pattern))
        .map(|_| ())
        .map_err(|e| format!("not a regular expression: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_engines_get_one_anchored_string() {
        assert_eq!(anchored("orders"), "^(orders)$");
        assert_eq!(anchored(r"^.*\.dlt$"), r"^(.*\.dlt)$");
        assert_eq!(anchored(r"a|b"), "^(a|b)$");
        let re = regex::Regex::new(&anchored("orders")).unwrap();
        assert!(re.is_match("orders"));
        assert!(!re.is_match("orders.dlt"), "whole names only");
        let re = regex::Regex::new(&anchored("a|b")).unwrap();
        assert!(!re.is_match("ab") && !re.is_match("xb") && re.is_match("b"));
    }

    #[test]
    fn syntax_the_engines_read_differently_is_refused() {
        for ok in [r".*\.dlt", "orders-[0-9]+", "(a|b)\\.dlt", "[^_].*", "x?y*"] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        for bad in [
            r"\d+",
            "(?i)orders",
            "a{2}",
            "(?:a|b)",
            r"\w",
            "",
            "(unclosed",
            "é",
            r"[\.]",
            "[a",
        ] {
            assert!(check(bad).is_err(), "{bad} should be refused");
        }
    }
}
