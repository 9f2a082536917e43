//! RFC 6901 JSON Pointers, as a transform's ops name their places.
//!
//! A pointer is `/`-separated reference tokens, each with `~1` for `/` and `~0` for `~`
//! (any other `~` is refused). Two refusals beyond the RFC: the root pointer `""` (an op
//! changes a part of a payload, never the whole of it) and the token `-` (the RFC's "past
//! the end of an array", which an op has no use for and which, as an object key, would
//! read as a mistake).

use std::fmt;

/// A checked pointer: its text as written and its decoded tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pointer {
    text: String,
    tokens: Vec<String>,
    /// Where in `text` each token's raw form ends (so a prefix can be named as written).
    ends: Vec<usize>,
}

impl Pointer {
    /// Checks `text`; the error says why it is not a pointer an op may use.
    pub(super) fn parse(text: &str) -> Result<Pointer, String> {
        if text.is_empty() {
            return Err(
                "the root pointer \"\" is not allowed: an op changes a part of the \
                        payload, never the whole"
                    .to_owned(),
            );
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "{text:?} is not a JSON Pointer: it must start with /"
            ));
        };
        let mut tokens = Vec::new();
        let mut ends = Vec::new();
        let mut at = 1;
        for raw in rest.split('/') {
            let token = unescape(raw).map_err(|why| {
                format!(
                    "{text:?} is not a JSON Pointer: token {} {why}",
                    tokens.len() + 1
                )
            })?;
            if token == "-" {
                return Err(format!(
                    "{text:?}: the token - (past the end of an array) is not allowed"
                ));
            }
            at += raw.len();
            ends.push(at);
            at += 1;
            tokens.push(token);
        }
        Ok(Pointer {
            text: text.to_owned(),
            tokens,
            ends,
        })
    }

    /// The pointer as written.
    pub(super) fn as_str(&self) -> &str {
        &self.text
    }

    /// The decoded tokens (never empty).
    pub(super) fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// The last token: the member or element the op acts on.
    pub(super) fn last(&self) -> &str {
        self.tokens.last().map(String::as_str).unwrap_or("")
    }

    /// The tokens of the parent (all but the last).
    pub(super) fn parent(&self) -> &[String] {
        &self.tokens[..self.tokens.len() - 1]
    }

    /// The text of the pointer's first `n` tokens, as written ("" for none: the root).
    pub(super) fn prefix(&self, n: usize) -> &str {
        match n {
            0 => "",
            n => &self.text[..self.ends[n.min(self.ends.len()) - 1]],
        }
    }

    /// Whether `self` names `other` or a place inside it.
    pub(super) fn starts_with(&self, other: &Pointer) -> bool {
        self.tokens.starts_with(&other.tokens)
    }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `~1` → `/`, `~0` → `~`; any other `~` is an error.
fn unescape(raw: &str) -> Result<String, String> {
    if !raw.contains('~') {
        return Ok(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('~'),
            Some('1') => out.push('/'),
            Some(other) => return Err(format!("has ~{other}: a ~ must be followed by 0 or 1")),
            None => return Err("ends in ~: a ~ must be followed by 0 or 1".to_owned()),
        }
    }
    Ok(out)
}

/// An array index token: `0` or digits without a leading zero. `Ok(None)`: digits too
/// many for a `usize` (so past the end of any array).
pub(super) fn index(token: &str) -> Result<Option<usize>, String> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{token:?} is not an array index"));
    }
    if token.len() > 1 && token.starts_with('0') {
        return Err(format!(
            "{token:?} is not an array index (an index has no leading zero)"
        ));
    }
    Ok(token.parse().ok())
}
