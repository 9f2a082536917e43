//! The JSON tree a transform works on: faithful to its source text.
//!
//! Objects are ordered lists of members; numbers and strings keep their text exactly as
//! written (a string's escapes included), so whatever a transform does not touch is
//! written back byte for byte (less insignificant whitespace). Values a transform brings
//! in (its literals) come from serde and are written as serde_json writes them.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// A JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number's text as written (checked against RFC 8259's grammar).
    Number(Box<str>),
    /// A string.
    String(Text),
    /// An array.
    Array(Vec<Node>),
    /// An object's members in their order (keys unique: see [`duplicate`]).
    Object(Vec<(Text, Node)>),
}

/// A string's text as written between its quotes (escapes and all), and whether it has
/// escapes (without any, the written text is the string itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Text {
    raw: Box<str>,
    escaped: bool,
}

impl Text {
    /// A string as the parser found it; `raw` is valid JSON string content.
    pub(super) fn from_raw(raw: &str) -> Text {
        Text {
            raw: raw.into(),
            escaped: raw.contains('\\'),
        }
    }

    /// A new string, escaped as serde_json escapes (`"`, `\` and control characters).
    pub(super) fn new(value: &str) -> Text {
        let quoted = serde_json::to_string(value).unwrap_or_else(|_| "\"\"".to_owned());
        Text::from_raw(&quoted[1..quoted.len() - 1])
    }

    /// The text as written, without the quotes.
    pub(super) fn raw(&self) -> &str {
        &self.raw
    }

    /// The string itself (escapes decoded).
    pub(super) fn decoded(&self) -> Cow<'_, str> {
        if self.escaped {
            Cow::Owned(decode(&self.raw))
        } else {
            Cow::Borrowed(&self.raw)
        }
    }

    /// Whether the string is `value`.
    pub(super) fn is(&self, value: &str) -> bool {
        if self.escaped {
            decode(&self.raw) == value
        } else {
            &*self.raw == value
        }
    }
}

/// Decodes valid JSON string content (the parser has checked every escape, surrogate
/// pairs included).
fn decode(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let escape = &rest[at + 1..];
        let (c, used) = match escape.as_bytes().first() {
            Some(b'b') => ('\u{8}', 1),
            Some(b'f') => ('\u{c}', 1),
            Some(b'n') => ('\n', 1),
            Some(b'r') => ('\r', 1),
            Some(b't') => ('\t', 1),
            Some(b'u') => {
                let high = hex4(&escape[1..]);
                if (0xD800..0xDC00).contains(&high) && escape.get(5..7) == Some("\\u") {
                    let low = hex4(&escape[7..]);
                    let code = 0x10000 + ((high - 0xD800) << 10) + (low.wrapping_sub(0xDC00));
                    (char::from_u32(code).unwrap_or('\u{FFFD}'), 11)
                } else {
                    (char::from_u32(high).unwrap_or('\u{FFFD}'), 5)
                }
            }
            Some(&other) => (char::from(other), 1),
            None => ('\\', 0),
        };
        out.push(c);
        rest = &escape[used..];
    }
    out.push_str(rest);
    out
}

/// The value of four hex digits at the start of `s` (0 where there are none).
pub(super) fn hex4(s: &str) -> u32 {
    s.get(..4)
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

/// The first key of `members` that appears twice, decoded.
pub(super) fn duplicate(members: &[(Text, Node)]) -> Option<String> {
    if members.len() <= 16 {
        for (i, (key, _)) in members.iter().enumerate() {
            let decoded = key.decoded();
            if members[..i].iter().any(|(k, _)| k.is(&decoded)) {
                return Some(decoded.into_owned());
            }
        }
        return None;
    }
    let mut seen = HashSet::with_capacity(members.len());
    members
        .iter()
        .map(|(key, _)| key.decoded())
        .find(|key| !seen.insert(key.clone()))
        .map(Cow::into_owned)
}

impl Node {
    /// What kind of value this is, for messages ("a string").
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Number(_) => "a number",
            Node::String(_) => "a string",
            Node::Array(_) => "an array",
            Node::Object(_) => "an object",
        }
    }

    /// Nesting depth: 0 for a scalar, one more than its deepest child for a container.
    pub(super) fn depth(&self) -> usize {
        match self {
            Node::Array(items) => 1 + items.iter().map(Node::depth).max().unwrap_or(0),
            Node::Object(members) => 1 + members.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// The first number in `self` whose value serde_json cannot keep (its text, and
    /// serde_json's): a literal of a transform goes through serde_json's `i64`, `u64`
    /// or `f64`, so `12345678901234567890123` would become `1.2345678901234568e+22`.
    pub(super) fn inexact(&self) -> Option<(String, String)> {
        match self {
            Node::Number(text) => {
                let kept = text
                    .parse::<serde_json::Number>()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "nothing (out of range)".to_owned());
                (!same_number(text, &kept)).then(|| (text.to_string(), kept))
            }
            Node::Array(items) => items.iter().find_map(Node::inexact),
            Node::Object(members) => members.iter().find_map(|(_, v)| v.inexact()),
            _ => None,
        }
    }

    /// JSON equality: numbers by value (`1`, `1.0`, `1e0` and `10E-1` are equal, and so
    /// are `0` and `-0`), strings by their decoded text, arrays element by element,
    /// objects by the same keys with equal values, in any order.
    pub(super) fn same(&self, other: &Node) -> bool {
        match (self, other) {
            (Node::Null, Node::Null) => true,
            (Node::Bool(a), Node::Bool(b)) => a == b,
            (Node::Number(a), Node::Number(b)) => same_number(a, b),
            (Node::String(a), Node::String(b)) => a.decoded() == b.decoded(),
            (Node::Array(a), Node::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
            }
            (Node::Object(a), Node::Object(b)) => {
                if a.len() != b.len() {
                    return false;
                }
                if a.len() <= 8 {
                    return a.iter().all(|(key, x)| {
                        let key = key.decoded();
                        b.iter().any(|(k, y)| k.is(&key) && x.same(y))
                    });
                }
                let theirs: HashMap<Cow<'_, str>, &Node> =
                    b.iter().map(|(k, v)| (k.decoded(), v)).collect();
                a.iter()
                    .all(|(key, x)| theirs.get(&key.decoded()).is_some_and(|y| x.same(y)))
            }
            _ => false,
        }
    }
}

/// A number's value in a comparable form: `0.digits × 10^exponent`, the digits without
/// leading or trailing zeros (none at all for zero, whose sign is dropped).
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: String,
    exponent: i128,
}

/// The value of a number's text (RFC 8259 grammar); `None` for an exponent of more
/// than 30 digits, which only the text itself can stand for.
fn decimal(text: &str) -> Option<Decimal> {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], &text[at + 1..]),
        None => (text, "0"),
    };
    let exponent = exponent.strip_prefix('+').unwrap_or(exponent);
    let (exp_negative, exp_digits) = match exponent.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, exponent),
    };
    let exp_digits = exp_digits.trim_start_matches('0');
    if exp_digits.len() > 30 {
        return None;
    }
    let exp: i128 = if exp_digits.is_empty() {
        0
    } else {
        exp_digits.parse().ok()?
    };
    let exp = if exp_negative { -exp } else { exp };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = [int, frac].concat();
    let leading = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_start_matches('0').trim_end_matches('0').to_owned();
    if digits.is_empty() {
        return Some(Decimal {
            negative: false,
            digits,
            exponent: 0,
        });
    }
    Some(Decimal {
        negative,
        digits,
        exponent: int.len() as i128 - leading as i128 + exp,
    })
}

/// Whether two number texts stand for the same value.
pub(super) fn same_number(a: &str, b: &str) -> bool {
    match (decimal(a), decimal(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => serializer.serialize_unit(),
            Node::Bool(b) => serializer.serialize_bool(*b),
            Node::Number(text) => match text.parse::<serde_json::Number>() {
                Ok(number) => number.serialize(serializer),
                Err(_) => Err(serde::ser::Error::custom(format_args!(
                    "the number {text} is out of range"
                ))),
            },
            Node::String(text) => serializer.serialize_str(&text.decoded()),
            Node::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (key, value) in members {
                    map.serialize_entry(&*key.decoded(), value)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

/// Builds a [`Node`] from serde's data model (a transform's literals).
struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        Node::deserialize(deserializer)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string().into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string().into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        match serde_json::Number::from_f64(v) {
            Some(number) => Ok(Node::Number(number.to_string().into())),
            None => Err(E::custom(format_args!("{v} is not a JSON number"))),
        }
    }

    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::String(Text::new(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut members = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Node>()? {
            members.push((Text::new(&key), value));
        }
        match duplicate(&members) {
            Some(key) => Err(de::Error::custom(format_args!("duplicate key {key:?}"))),
            None => Ok(Node::Object(members)),
        }
    }
}
