//! Bytes as an operator reads them: UTF-8 text where they are, hex otherwise.

use serde::Serialize;
use std::fmt::Write;

/// Stored bytes for a person or a script: the text when they are UTF-8, else hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Readable {
    /// `utf8` or `hex`.
    pub encoding: &'static str,
    /// The bytes as text, or as lowercase hex digits.
    pub data: String,
    /// How many bytes.
    pub size: usize,
}

impl Readable {
    /// Reads `bytes` as UTF-8 if they are, as hex otherwise.
    pub fn new(bytes: &[u8]) -> Readable {
        match std::str::from_utf8(bytes) {
            Ok(text) => Readable {
                encoding: "utf8",
                data: text.to_owned(),
                size: bytes.len(),
            },
            Err(_) => Readable {
                encoding: "hex",
                data: hex(bytes),
                size: bytes.len(),
            },
        }
    }

    /// One line for a table: the text with control characters escaped, or `hex:…`.
    pub fn line(&self) -> String {
        match self.encoding {
            "utf8" => self.data.escape_debug().to_string(),
            _ => format!("hex:{}", self.data),
        }
    }
}

/// Lowercase hex digits of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stays_text_and_other_bytes_become_hex() {
        assert_eq!(Readable::new(b"k\n1").line(), "k\\n1");
        let binary = Readable::new(&[0xff, 0x00, 0x41]);
        assert_eq!((binary.encoding, binary.data.as_str()), ("hex", "ff0041"));
        assert_eq!(binary.line(), "hex:ff0041");
        assert_eq!(binary.size, 3);
    }
}
