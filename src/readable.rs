//! Bytes as an operator reads them: UTF-8 text where they are, hex otherwise, and a JSON
//! object or array re-indented.

use serde::Serialize;

/// Stored bytes for a person or a script: the text when they are UTF-8, else hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Readable {
    /// `utf8` or `hex`.
    pub encoding: &'static str,
    /// The bytes as text, or as lowercase hex digits.
    pub data: String,
    /// How many bytes.
    pub size: usize,
    /// The text re-indented (two spaces a level), when it is a JSON object or array:
    /// its keys in their order, its numbers and strings as written. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pretty_json: Option<String>,
}

impl Readable {
    /// Reads `bytes` as UTF-8 if they are, as hex otherwise.
    pub fn new(bytes: &[u8]) -> Readable {
        match std::str::from_utf8(bytes) {
            Ok(text) => Readable {
                encoding: "utf8",
                data: text.to_owned(),
                size: bytes.len(),
                pretty_json: pretty_json(text),
            },
            Err(_) => Readable {
                encoding: "hex",
                data: hex(bytes),
                size: bytes.len(),
                pretty_json: None,
            },
        }
    }

    /// One line for a table: the text with line breaks and [`hidden`] characters
    /// escaped, or `hex:…`.
    pub fn line(&self) -> String {
        match self.encoding {
            "utf8" => visible(&self.data)
                .replace('\n', "\\n")
                .replace('\t', "\\t"),
            _ => format!("hex:{}", self.data),
        }
    }
}

/// Whether `c` would be invisible or would move the text around it: controls (a line
/// break and a tab aside), zero-width and direction marks, overrides and isolates, the
/// byte-order mark.
pub fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// Text from a message, a downstream or an operator as a person should see it, on a
/// page or a terminal: every [`hidden`] character written as `\u{…}`, so that a key
/// cannot pass for another (a right-to-left override, a NUL) and a terminal obeys no
/// escape sequence.
pub fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            shown.push_str(&format!("\\u{{{:04X}}}", c as u32));
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// Lowercase hex digits of `bytes` (by table: it runs for every webhook call).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// Deepest nesting re-indented; a deeper document is shown as it came.
const MAX_DEPTH: usize = 64;

/// Largest re-indented text; a document whose indentation would make it larger is shown
/// as it came (the work per byte of input is bounded by the depth, the total by this).
const MAX_OUTPUT: usize = 4 << 20;

/// `text` re-indented, two spaces a level, when it is a JSON object or array nested at
/// most [`MAX_DEPTH`] deep whose re-indented text stays within [`MAX_OUTPUT`] bytes; its
/// tokens exactly as written, so nothing is reordered or rounded. A message is hostile
/// input: without the bounds, 200 KB of nested brackets would take gigabytes.
pub fn pretty_json(text: &str) -> Option<String> {
    let text = text.trim();
    if !(text.starts_with('{') || text.starts_with('[')) || text.len() > MAX_OUTPUT {
        return None;
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0_usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                out.push(c);
                if let Some(close) = chars.next_if(|&next| next == '}' || next == ']') {
                    out.push(close);
                } else {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return None;
                    }
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
        if out.len() > MAX_OUTPUT {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_spells_every_byte_as_two_lowercase_digits() {
        let every: Vec<u8> = (0..=255).collect();
        let expected: String = every.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&every), expected);
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn text_stays_text_and_other_bytes_become_hex() {
        assert_eq!(Readable::new(b"k\n1").line(), "k\\n1");
        // Found by the second issue 16 attack: a downstream's error text carried
        // terminal escapes and a direction override to the operator's terminal.
        assert_eq!(
            visible("bad \u{1b}[2J\u{202E}gnp.exe\u{7}"),
            "bad \\u{001B}[2J\\u{202E}gnp.exe\\u{0007}"
        );
        assert!(matches!(
            visible("line\n\tnext é"),
            std::borrow::Cow::Borrowed(_)
        ));
        let binary = Readable::new(&[0xff, 0x00, 0x41]);
        assert_eq!((binary.encoding, binary.data.as_str()), ("hex", "ff0041"));
        assert_eq!(binary.line(), "hex:ff0041");
        assert_eq!(binary.size, 3);
        assert_eq!(binary.pretty_json, None);
    }

    #[test]
    fn json_is_reindented_as_written() {
        let text = r#" {"z": 1.50, "a":[ ], "s":"a,b:{\"c\"}", "n":{"x":[1,2]}} "#;
        let pretty = Readable::new(text.as_bytes()).pretty_json.unwrap();
        assert_eq!(
            pretty,
            "{\n  \"z\": 1.50,\n  \"a\": [],\n  \"s\": \"a,b:{\\\"c\\\"}\",\n  \"n\": {\n    \"x\": [\n      1,\n      2\n    ]\n  }\n}"
        );
        assert_eq!(Readable::new(b"[]").pretty_json.as_deref(), Some("[]"));
    }

    /// Regression (issue 16 attack): a 200 KB value of nested brackets made the
    /// re-indented text 2·depth² bytes (gigabytes), and showing the task killed the
    /// member. Past the depth or size bound the text is shown as it came.
    #[test]
    fn deep_or_bloated_json_is_not_reindented() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let started = std::time::Instant::now();
        assert_eq!(pretty_json(&deep), None);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let deepest = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(pretty_json(&deepest).is_some(), "as deep as allowed");
        let deeper = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(pretty_json(&deeper), None);
        // Many short values deep down: every one would get its own indented line.
        let wide = format!(
            "{}{}1{}",
            "[".repeat(40),
            "1,".repeat(200_000),
            "]".repeat(40)
        );
        let shown = pretty_json(&wide);
        assert!(shown.is_none_or(|s| s.len() <= MAX_OUTPUT), "bounded");
    }

    #[test]
    fn only_whole_json_objects_and_arrays_are_reindented() {
        for text in ["42", "\"s\"", "{\"a\": 1", "{} {}", "order-7", "[1,]"] {
            assert_eq!(Readable::new(text.as_bytes()).pretty_json, None, "{text}");
        }
    }
}
