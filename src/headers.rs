//! Message headers and their byte-exact storage encoding.
//!
//! Kafka headers are an ordered list of (name, optional value) pairs in which a name may
//! repeat. They are stored in one `bytea` column as a sequence of records:
//! `u32 name length | name bytes | i32 value length (-1 = no value) | value bytes`,
//! integers big-endian. The encoding keeps order, duplicates, absent values and
//! arbitrary bytes.

use serde::{Deserialize, Serialize};

/// One message header. Kafka header names are strings by convention only: the name is
/// kept as the bytes that came, like the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Header name, as raw bytes (normally UTF-8).
    pub name: Vec<u8>,
    /// Raw header value; `None` when the header carried no value.
    pub value: Option<Vec<u8>>,
}

impl Header {
    /// A header with a value.
    pub fn new(name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Header {
            name: name.into(),
            value: Some(value.into()),
        }
    }

    /// The name as text, when it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.name).ok()
    }

    /// Whether the name is exactly `name`.
    pub fn name_is(&self, name: &str) -> bool {
        self.name == name.as_bytes()
    }
}

/// Stored header bytes that do not follow the encoding.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed stored headers at byte {at}: {reason}")]
pub struct MalformedHeaders {
    /// Byte offset of the problem.
    pub at: usize,
    /// What was wrong.
    pub reason: &'static str,
}

/// Encodes headers for the `msg_headers` column.
pub fn encode(headers: &[Header]) -> Vec<u8> {
    let size = headers
        .iter()
        .map(|h| 8 + h.name.len() + h.value.as_ref().map_or(0, Vec::len))
        .sum();
    let mut out = Vec::with_capacity(size);
    for h in headers {
        out.extend_from_slice(&(h.name.len() as u32).to_be_bytes());
        out.extend_from_slice(&h.name);
        match &h.value {
            Some(v) => {
                out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                out.extend_from_slice(v);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    out
}

/// Decodes the `msg_headers` column.
pub fn decode(mut bytes: &[u8]) -> Result<Vec<Header>, MalformedHeaders> {
    let total = bytes.len();
    let mut headers = Vec::new();
    while !bytes.is_empty() {
        let at = total - bytes.len();
        let name_len = take_u32(&mut bytes, at)? as usize;
        let name = take(&mut bytes, name_len, at)?.to_vec();
        let value_len = take_u32(&mut bytes, at)? as i32;
        let value = match value_len {
            -1 => None,
            n if n < 0 => {
                return Err(MalformedHeaders {
                    at,
                    reason: "negative value length",
                })
            }
            n => Some(take(&mut bytes, n as usize, at)?.to_vec()),
        };
        headers.push(Header { name, value });
    }
    Ok(headers)
}

fn take<'a>(bytes: &mut &'a [u8], n: usize, at: usize) -> Result<&'a [u8], MalformedHeaders> {
    if bytes.len() < n {
        return Err(MalformedHeaders {
            at,
            reason: "truncated record",
        });
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn take_u32(bytes: &mut &[u8], at: usize) -> Result<u32, MalformedHeaders> {
    let raw = take(bytes, 4, at)?;
    Ok(u32::from_be_bytes(raw.try_into().expect("4 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_order_duplicates_absent_and_binary_values() {
        let headers = vec![
            Header::new("trace", b"abc".to_vec()),
            Header {
                name: "empty".into(),
                value: None,
            },
            Header::new("trace", vec![0xff, 0x00, 0xfe]),
            Header::new("zero-length", Vec::new()),
        ];
        let bytes = encode(&headers);
        assert_eq!(decode(&bytes).unwrap(), headers);
        assert_eq!(decode(&[]).unwrap(), Vec::<Header>::new());
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let bytes = encode(&[Header::new("name", b"value".to_vec())]);
        for cut in 1..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
