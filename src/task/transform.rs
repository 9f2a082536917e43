//! Declarative fixes of a stored payload before it is redriven ("the schema moved on:
//! rename /amount to /amount_cents"): a [`Transform`] is a short list of ops, written as
//! JSON, that [`Transform::apply`] runs on a payload, all or nothing.
//!
//! ```
//! use redrive::task::transform::{Applied, Transform};
//!
//! let transform = Transform::parse(
//!     r#"[{"op": "rename", "from": "/amount", "path": "/amount_cents"},
//!         {"op": "map", "path": "/currency", "from_value": "EUR", "to": "eur"}]"#,
//! )?;
//! let payload = br#"{"id": 12345678901234567890123, "amount": 1.50, "currency": "EUR"}"#;
//! let Applied::Changed { bytes, changes } = transform.apply(payload) else { panic!() };
//! assert_eq!(bytes, br#"{"id":12345678901234567890123,"amount_cents":1.50,"currency":"eur"}"#);
//! assert_eq!(changes[2].to_string(), r#"/currency: "EUR" → "eur""#);
//! # Ok::<(), redrive::task::transform::TransformError>(())
//! ```
//!
//! ## The ops
//!
//! Each op names its places with an RFC 6901 JSON Pointer (`/customer/tier`; `~1` for a
//! `/` in a key, `~0` for a `~`; array elements by index, `0` or digits without a
//! leading zero). The root pointer `""` and the token `-` are refused when the transform
//! is parsed. Keys are compared as decoded: a key written `"a\u0062"` is `/ab`.
//!
//! - `set {path, value}`: replaces the value at `path`, or adds the member (at the end of
//!   its object) if the parent object exists and lacks it. A missing parent, or an array
//!   index past the end (arrays are never extended), fails the task.
//! - `remove {path}`: removes the member or element; absent, the op changes nothing.
//! - `rename {from, path}`: moves the value at `from` to `path`, which must be absent and
//!   whose parent must be an existing object. `from` absent: nothing changes; `path`
//!   present: the task fails. Within one object the member keeps its place under its new
//!   key; elsewhere it is added at the end of the target object. `path` may not be `from`
//!   or lie inside it (or `from` inside `path`): refused when parsed.
//! - `map {path, from_value, to}`: where the value at `path` equals `from_value`, it is
//!   replaced by `to`; otherwise (or absent) nothing changes. Equality is JSON's:
//!   numbers by value (`1` = `1.0` = `1e0`, `-0` = `0`), strings decoded, objects in any
//!   key order.
//!
//! A path that does not fit the payload's shape fails the task whichever the op: a root
//! that is not an object or an array, a scalar in the way (`/a/b` where `/a` is a
//! string), an array addressed with a token that is no index (`/items/x`, `/items/01`).
//! A missing member or an index past the end is "absent" (each op's rule above).
//!
//! ## Fidelity
//!
//! Payloads are read by a parser of this module (see `read`), not serde_json, so that
//! what a transform does not touch comes out as it went in: keys in their order, every
//! number and string with exactly its text (`12345678901234567890123`, `1E+2`, `-0`,
//! `1.50`, `"\u00e9"` are all kept as written). The output is compact: no whitespace
//! between tokens. Values a transform brings in are written as serde_json writes them
//! (`"é"` unescaped, `1e2` as `100.0`); a literal number serde_json cannot keep exactly
//! (beyond an `i64`/`u64`, more digits than an `f64` holds) is refused when parsed.
//! Payloads with a key twice in one object are refused (which one a consumer takes is
//! undefined), and so are payloads nested deeper than [`MAX_DEPTH`].
//!
//! ## Pieces
//!
//! `pointer` (JSON Pointers), `node` (the tree, equality, literals' serde), `read` (the
//! parser), `write` (the compact writer), `ops` (the ops' form, checks and effects).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

mod node;
mod ops;
mod pointer;
mod read;
mod write;

#[cfg(test)]
mod tests;

use node::Node;
use ops::{Op, Step};

/// The most ops a transform may hold.
pub const MAX_OPS: usize = 100;

/// The largest transform text [`Transform::parse`] reads, in bytes (64 KiB).
pub const MAX_SPEC_BYTES: usize = 64 * 1024;

/// The deepest nesting of arrays and objects a payload may have (serde_json's limit,
/// too: it refuses the 128th level). A transform whose result would nest deeper fails.
pub const MAX_DEPTH: usize = 127;

/// A checked list of ops (1 to [`MAX_OPS`]): see the module doc for what each does.
///
/// It serializes as the JSON it was parsed from (less whitespace; literals as serde_json
/// writes them), one line per op in its [`Display`](fmt::Display) (`rename /amount →
/// /amount_cents`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transform {
    steps: Vec<Step>,
}

/// Why a transform's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// The text is over [`MAX_SPEC_BYTES`].
    #[error("the transform is {bytes} bytes, over the limit of {MAX_SPEC_BYTES}")]
    TooLarge {
        /// The text's length.
        bytes: usize,
    },
    /// The text is not (acceptable) JSON.
    #[error("the transform is not JSON: {0}")]
    NotJson(String),
    /// The JSON is not an array.
    #[error("the transform must be a JSON array of ops, not {0}")]
    NotAList(&'static str),
    /// The array is empty.
    #[error("the transform has no ops")]
    Empty,
    /// More than [`MAX_OPS`] ops.
    #[error("the transform has {count} ops, over the limit of {MAX_OPS}")]
    TooMany {
        /// How many.
        count: usize,
    },
    /// One op is wrong: "op 2 (rename): from: ...".
    #[error("op {index}{}: {detail}", .op.as_ref().map(|op| format!(" ({op})")).unwrap_or_default())]
    Op {
        /// Its index in the list, from 0.
        index: usize,
        /// Its name, where it has a known one.
        op: Option<String>,
        /// The field and what is wrong with it.
        detail: String,
    },
}

/// What [`Transform::apply`] made of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The transformed payload (compact JSON) and what changed, in the ops' order.
    Changed {
        /// The new payload.
        bytes: Vec<u8>,
        /// The structural diff a dry run shows.
        changes: Vec<Change>,
    },
    /// Every op left the payload alone: keep it as it is.
    Unchanged,
    /// The payload could not be transformed (and nothing of it was): why.
    Failed(String),
}

/// One place a transform changed: its value before and after, each as compact JSON text
/// cut after 200 characters with an ellipsis (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The JSON Pointer, as the op wrote it.
    pub path: String,
    /// The value before (`None`: it was added).
    pub before: Option<String>,
    /// The value after (`None`: it was removed or moved away).
    pub after: Option<String>,
}

impl fmt::Display for Change {
    /// `/currency: "EUR" → "eur"`, with `(absent)` for a side that has no value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |value: &Option<String>| value.clone().unwrap_or_else(|| "(absent)".into());
        write!(
            f,
            "{}: {} → {}",
            self.path,
            side(&self.before),
            side(&self.after)
        )
    }
}

impl Transform {
    /// Reads and checks a transform's text: at most [`MAX_SPEC_BYTES`], strict JSON (no
    /// key twice), an array of 1 to [`MAX_OPS`] ops with known fields only, every
    /// pointer valid and not the root, every literal number one serde_json keeps exactly.
    /// An error about one op names its index, its name and the field.
    pub fn parse(spec: &str) -> Result<Transform, TransformError> {
        if spec.len() > MAX_SPEC_BYTES {
            return Err(TransformError::TooLarge { bytes: spec.len() });
        }
        let tree = read::parse(spec).map_err(|e| TransformError::NotJson(e.to_string()))?;
        let Node::Array(items) = &tree else {
            return Err(TransformError::NotAList(tree.kind()));
        };
        count(items.len())?;
        let mut steps = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let refuse = |op: Option<&str>, detail: String| TransformError::Op {
                index,
                op: op.map(str::to_owned),
                detail,
            };
            let Node::Object(members) = item else {
                return Err(refuse(
                    None,
                    format!("an op is an object, not {}", item.kind()),
                ));
            };
            let op: Op = serde_json::from_str(&write::compact(item))
                .map_err(|e| refuse(known_name(members), bare(&e)))?;
            for (field, value) in members {
                if let Some((text, kept)) = value.inexact() {
                    return Err(refuse(
                        Some(op.name()),
                        format!(
                            "{}: the number {text} cannot be kept exactly (it would be \
                             written {kept}); a literal number must fit an i64, a u64 or an \
                             f64",
                            field.decoded()
                        ),
                    ));
                }
            }
            let name = op.name();
            let step = Step::new(op)
                .map_err(|(field, why)| refuse(Some(name), format!("{field}: {why}")))?;
            steps.push(step);
        }
        Ok(Transform { steps })
    }

    /// Runs the ops in order on `payload`, all or nothing: the first op that fails fails
    /// the whole payload. The payload must be UTF-8 JSON (see the module doc for what is
    /// refused) whose root is an object or an array.
    pub fn apply(&self, payload: &[u8]) -> Applied {
        let text = match std::str::from_utf8(payload) {
            Ok(text) => text,
            Err(e) => {
                return Applied::Failed(format!(
                    "the payload is not UTF-8: an invalid byte at byte {}",
                    e.valid_up_to()
                ))
            }
        };
        let mut root = match read::parse(text) {
            Ok(root) => root,
            Err(e) => return Applied::Failed(format!("the payload is not JSON: {e}")),
        };
        if !matches!(root, Node::Object(_) | Node::Array(_)) {
            return Applied::Failed(format!(
                "the payload's root is {}, not an object or an array",
                root.kind()
            ));
        }
        let mut changes = Vec::new();
        for (index, step) in self.steps.iter().enumerate() {
            if let Err(why) = step.apply(&mut root, &mut changes) {
                return Applied::Failed(format!("op {index} ({}): {why}", step.label()));
            }
        }
        if changes.is_empty() {
            return Applied::Unchanged;
        }
        Applied::Changed {
            bytes: write::compact(&root).into_bytes(),
            changes,
        }
    }

    /// The checks of [`Transform::parse`] that need no text (count, pointers), for ops
    /// read by serde.
    fn from_ops(ops: Vec<Op>) -> Result<Transform, TransformError> {
        count(ops.len())?;
        let steps = ops
            .into_iter()
            .enumerate()
            .map(|(index, op)| {
                let name = op.name();
                Step::new(op).map_err(|(field, why)| TransformError::Op {
                    index,
                    op: Some(name.to_owned()),
                    detail: format!("{field}: {why}"),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Transform { steps })
    }
}

/// Refuses an empty list or one of more than [`MAX_OPS`].
fn count(count: usize) -> Result<(), TransformError> {
    match count {
        0 => Err(TransformError::Empty),
        count if count > MAX_OPS => Err(TransformError::TooMany { count }),
        _ => Ok(()),
    }
}

/// The `op` member of an op's object, where it names a known op.
fn known_name(members: &[(node::Text, Node)]) -> Option<&'static str> {
    members.iter().find_map(|(key, value)| match value {
        Node::String(name) if key.is("op") => ["set", "remove", "rename", "map"]
            .into_iter()
            .find(|known| name.is(known)),
        _ => None,
    })
}

/// serde_json's message without its " at line 1 column N" (the text it read was one op,
/// rewritten).
fn bare(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    message
        .strip_suffix(&suffix)
        .map(str::to_owned)
        .unwrap_or(message)
}

impl FromStr for Transform {
    type Err = TransformError;

    /// [`Transform::parse`].
    fn from_str(spec: &str) -> Result<Transform, TransformError> {
        Transform::parse(spec)
    }
}

impl fmt::Display for Transform {
    /// One line per op: `set /customer/tier = "gold"`, `remove /legacy`,
    /// `rename /amount → /amount_cents`, `map /currency: "EUR" → "eur"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{step}")?;
        }
        Ok(())
    }
}

impl Serialize for Transform {
    /// The list of ops, as parsed.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.steps.iter().map(Step::op))
    }
}

impl<'de> Deserialize<'de> for Transform {
    /// A stored transform (as [`Serialize`] wrote it): the checks of [`Transform::parse`]
    /// less those of the text itself (its size, a key twice, inexact literal numbers).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Transform, D::Error> {
        let ops = Vec::<Op>::deserialize(deserializer)?;
        Transform::from_ops(ops).map_err(serde::de::Error::custom)
    }
}
