//! A strict RFC 8259 parser into [`Node`]s that keeps every number's and string's text.
//!
//! Accepted: one value with whitespace (space, tab, LF, CR) around it. Refused, each
//! with the byte where it was found: trailing commas, leading zeros (`01`, `-01`), a
//! number without digits where the grammar needs them (`1.`, `.5`, `1e`), escapes
//! other than `\" \\ \/ \b \f \n \r \t \uXXXX`, a `\u` escape of a lone surrogate
//! (as serde_json refuses it: the string would not be Unicode), raw control characters
//! (below U+0020) in a string, a byte-order mark, anything after the value, a key
//! written twice in one object (which one a consumer would take is undefined), and
//! nesting of more than [`MAX_DEPTH`] arrays and objects (serde_json's limit too). The
//! recursion is bounded by that limit, so no input can exhaust the stack.
//!
//! One difference from serde_json (without its `arbitrary_precision` feature): numbers
//! beyond an `f64`'s range (`1e400`) are valid JSON and accepted here, kept as written.

use std::fmt;

use super::node::{duplicate, hex4, Node, Text};
use super::MAX_DEPTH;

/// Why a text is not acceptable JSON, and the byte (from 0) where that was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParseError {
    /// The byte offset.
    pub(super) at: usize,
    /// What is wrong there.
    pub(super) what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

/// Parses one JSON document.
pub(super) fn parse(text: &str) -> Result<Node, ParseError> {
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
        depth: 0,
    };
    parser.whitespace();
    let node = parser.value()?;
    parser.whitespace();
    if parser.at < parser.bytes.len() {
        return Err(parser.error(format!("{} after the value", parser.found())));
    }
    Ok(node)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, what: impl Into<String>) -> ParseError {
        ParseError {
            at: self.at,
            what: what.into(),
        }
    }

    /// What is at the current byte, for messages: "found 'x'" or "found the end".
    fn found(&self) -> String {
        match self.text[self.at..].chars().next() {
            None => "found the end".to_owned(),
            Some(c) => format!("found {c:?}"),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn value(&mut self) -> Result<Node, ParseError> {
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Node::String(Text::from_raw(self.string()?))),
            Some(b't') => self.literal("true", Node::Bool(true)),
            Some(b'f') => self.literal("false", Node::Bool(false)),
            Some(b'n') => self.literal("null", Node::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.error(format!("expected a value, {}", self.found()))),
        }
    }

    fn literal(&mut self, word: &str, node: Node) -> Result<Node, ParseError> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(node)
        } else {
            Err(self.error(format!("expected {word}")))
        }
    }

    /// Enters an array or an object (the opening byte is at `at`).
    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(format!(
                "arrays and objects nested deeper than {MAX_DEPTH} levels"
            )));
        }
        self.at += 1;
        self.whitespace();
        Ok(())
    }

    fn array(&mut self) -> Result<Node, ParseError> {
        self.enter()?;
        let mut items = Vec::new();
        if self.peek() == Some(b']') {
            self.at += 1;
            self.depth -= 1;
            return Ok(Node::Array(items));
        }
        loop {
            items.push(self.value()?);
            self.whitespace();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    self.whitespace();
                    if self.peek() == Some(b']') {
                        return Err(self.error("a trailing comma before ]"));
                    }
                }
                Some(b']') => break,
                _ => return Err(self.error(format!("expected , or ], {}", self.found()))),
            }
        }
        self.at += 1;
        self.depth -= 1;
        Ok(Node::Array(items))
    }

    fn object(&mut self) -> Result<Node, ParseError> {
        let start = self.at;
        self.enter()?;
        let mut members = Vec::new();
        if self.peek() == Some(b'}') {
            self.at += 1;
            self.depth -= 1;
            return Ok(Node::Object(members));
        }
        loop {
            match self.peek() {
                Some(b'"') => {}
                Some(b'}') => return Err(self.error("a trailing comma before }")),
                _ => return Err(self.error(format!("expected a key, {}", self.found()))),
            }
            let key = Text::from_raw(self.string()?);
            self.whitespace();
            if self.peek() != Some(b':') {
                return Err(self.error(format!("expected : after a key, {}", self.found())));
            }
            self.at += 1;
            self.whitespace();
            let value = self.value()?;
            members.push((key, value));
            self.whitespace();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    self.whitespace();
                }
                Some(b'}') => break,
                _ => return Err(self.error(format!("expected , or }}, {}", self.found()))),
            }
        }
        self.at += 1;
        self.depth -= 1;
        if let Some(key) = duplicate(&members) {
            return Err(ParseError {
                at: start,
                what: format!("duplicate key {key:?} in the object"),
            });
        }
        Ok(Node::Object(members))
    }

    /// A string (the opening quote at `at`): its text between the quotes.
    fn string(&mut self) -> Result<&'a str, ParseError> {
        self.at += 1;
        let start = self.at;
        loop {
            match self.peek() {
                None => return Err(self.error("a string without its closing quote")),
                Some(b'"') => break,
                Some(b'\\') => self.escape()?,
                Some(b) if b < 0x20 => {
                    return Err(self.error(format!(
                        "a raw control character U+{b:04X} in a string (it must be escaped)"
                    )))
                }
                Some(_) => self.at += 1,
            }
        }
        let raw = &self.text[start..self.at];
        self.at += 1;
        Ok(raw)
    }

    /// An escape (the backslash at `at`).
    fn escape(&mut self) -> Result<(), ParseError> {
        match self.bytes.get(self.at + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.at += 2;
                Ok(())
            }
            Some(b'u') => {
                let code = self.hex()?;
                if (0xDC00..0xE000).contains(&code) {
                    return Err(self.error(format!("a lone surrogate \\u{code:04X} in a string")));
                }
                self.at += 6;
                if (0xD800..0xDC00).contains(&code) {
                    let low = match self.bytes[self.at..].starts_with(b"\\u") {
                        true => self.hex()?,
                        false => 0,
                    };
                    if !(0xDC00..0xE000).contains(&low) {
                        self.at -= 6;
                        return Err(
                            self.error(format!("a lone surrogate \\u{code:04X} in a string"))
                        );
                    }
                    self.at += 6;
                }
                Ok(())
            }
            _ => Err(self.error(format!(
                "an invalid escape \\{}",
                self.text[self.at + 1..]
                    .chars()
                    .next()
                    .map(String::from)
                    .unwrap_or_default()
            ))),
        }
    }

    /// The four hex digits after the `\u` at `at`.
    fn hex(&self) -> Result<u32, ParseError> {
        let digits = self.bytes.get(self.at + 2..self.at + 6);
        match digits {
            Some(d) if d.iter().all(u8::is_ascii_hexdigit) => {
                Ok(hex4(&self.text[self.at + 2..self.at + 6]))
            }
            _ => Err(self.error("a \\u escape without four hex digits")),
        }
    }

    fn number(&mut self) -> Result<Node, ParseError> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.at += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(self.error("a number with a leading zero"));
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error(format!("expected a digit, {}", self.found()))),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(self.error(format!(
                    "expected a digit after the decimal point, {}",
                    self.found()
                )));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(self.error(format!(
                    "expected a digit in the exponent, {}",
                    self.found()
                )));
            }
            self.digits();
        }
        Ok(Node::Number(self.text[start..self.at].into()))
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }
}
