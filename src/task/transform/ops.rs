//! The four ops: their stored form, their checks, and what each does to a [`Node`] tree.
//!
//! Looking a path up walks its tokens from the root. A missing member, or an index past
//! the end of an array, means the value is absent (what each op then does is its own
//! rule). A value in the way that is not an object or an array, or an array addressed
//! with a token that is not an index (`x`, `01`), means the pointer does not fit the
//! payload's shape: that fails the op, and so the task, whichever the op.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::node::{Node, Text};
use super::pointer::{index, Pointer};
use super::write::preview;
use super::{Change, MAX_DEPTH};

/// An op as written in a transform (and as it is stored again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum Op {
    /// Replace the value at `path`, or add the member to its existing parent object.
    Set {
        /// Where.
        path: String,
        /// The new value.
        value: Node,
    },
    /// Remove the member or element at `path`, if present.
    Remove {
        /// Where.
        path: String,
    },
    /// Move the value at `from` to `path` (absent, with an existing parent object).
    Rename {
        /// The value's place now.
        from: String,
        /// Its new place.
        path: String,
    },
    /// Replace the value at `path` with `to` where it equals `from_value`.
    Map {
        /// Where.
        path: String,
        /// The value to replace (JSON equality).
        from_value: Node,
        /// Its replacement.
        to: Node,
    },
}

impl Op {
    /// The op's name as written (`"set"`).
    pub(super) fn name(&self) -> &'static str {
        match self {
            Op::Set { .. } => "set",
            Op::Remove { .. } => "remove",
            Op::Rename { .. } => "rename",
            Op::Map { .. } => "map",
        }
    }
}

/// An op with its pointers checked: what a transform runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Step {
    op: Op,
    path: Pointer,
    from: Option<Pointer>,
}

/// Which field of an op is wrong, and why.
pub(super) type Refusal = (&'static str, String);

impl Step {
    /// Checks `op`'s pointers.
    pub(super) fn new(op: Op) -> Result<Step, Refusal> {
        let (path, from) = match &op {
            Op::Set { path, .. } | Op::Remove { path } | Op::Map { path, .. } => (path, None),
            Op::Rename { from, path } => (path, Some(from)),
        };
        let from = match from {
            Some(from) => Some(Pointer::parse(from).map_err(|why| ("from", why))?),
            None => None,
        };
        let path = Pointer::parse(path).map_err(|why| ("path", why))?;
        if let Some(from) = &from {
            if path.starts_with(from) {
                return Err(("path", format!("{path} is {from} or lies inside it")));
            }
            if from.starts_with(&path) {
                return Err((
                    "path",
                    format!("{from} lies inside {path}: wherever {from} is, {path} is present"),
                ));
            }
        }
        Ok(Step { op, path, from })
    }

    /// The op as written.
    pub(super) fn op(&self) -> &Op {
        &self.op
    }

    /// The op and its places, for messages: `set /a`, `rename /a → /b`.
    pub(super) fn label(&self) -> String {
        match &self.from {
            Some(from) => format!("{} {from} → {}", self.op.name(), self.path),
            None => format!("{} {}", self.op.name(), self.path),
        }
    }

    /// Runs the op on `root`, adding what it changed to `changes`; the error says why it
    /// failed.
    pub(super) fn apply(&self, root: &mut Node, changes: &mut Vec<Change>) -> Result<(), String> {
        let path = &self.path;
        match (&self.op, &self.from) {
            (Op::Set { value, .. }, _) => set(root, path, value, changes),
            (Op::Remove { .. }, _) => {
                if let Some(old) = take(root, path)? {
                    changes.push(change(path, Some(&old), None));
                }
                Ok(())
            }
            (Op::Rename { .. }, Some(from)) => rename(root, from, path, changes),
            (Op::Rename { .. }, None) => Ok(()),
            (Op::Map { from_value, to, .. }, _) => {
                let Found::Here(slot) = walk(root, path, path.tokens().len())? else {
                    return Ok(());
                };
                if slot.same(from_value) {
                    fits(path, to)?;
                    replace(slot, to, path, changes);
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.op {
            Op::Set { value, .. } => write!(f, "set {} = {}", self.path, preview(value)),
            Op::Map { from_value, to, .. } => write!(
                f,
                "map {}: {} → {}",
                self.path,
                preview(from_value),
                preview(to)
            ),
            _ => f.write_str(&self.label()),
        }
    }
}

fn change(path: &Pointer, before: Option<&Node>, after: Option<&Node>) -> Change {
    Change {
        path: path.as_str().to_owned(),
        before: before.map(preview),
        after: after.map(preview),
    }
}

/// A place named for messages: its pointer, or "the root".
fn name(prefix: &str) -> &str {
    if prefix.is_empty() {
        "the root"
    } else {
        prefix
    }
}

/// Whether `value` placed at `path` keeps the document within [`MAX_DEPTH`].
fn fits(path: &Pointer, value: &Node) -> Result<(), String> {
    if path.tokens().len() + value.depth() > MAX_DEPTH {
        return Err(format!(
            "the payload would nest deeper than {MAX_DEPTH} levels"
        ));
    }
    Ok(())
}

/// What a walk found.
enum Found<'a> {
    /// The value.
    Here(&'a mut Node),
    /// Absent: the pointer's first `n` tokens name nothing.
    Missing(usize),
}

/// Walks the first `n` tokens of `pointer` from `node`.
fn walk<'a>(mut node: &'a mut Node, pointer: &Pointer, n: usize) -> Result<Found<'a>, String> {
    for (k, token) in pointer.tokens()[..n].iter().enumerate() {
        node = match child(node, token, pointer.prefix(k))? {
            Some(next) => next,
            None => return Ok(Found::Missing(k + 1)),
        };
    }
    Ok(Found::Here(node))
}

/// The member or element `token` of `node` (found at `at`).
fn child<'a>(node: &'a mut Node, token: &str, at: &str) -> Result<Option<&'a mut Node>, String> {
    match node {
        Node::Object(members) => Ok(members
            .iter_mut()
            .find(|(key, _)| key.is(token))
            .map(|(_, value)| value)),
        Node::Array(items) => {
            let i = index(token).map_err(|why| format!("{} is an array and {why}", name(at)))?;
            Ok(i.and_then(|i| items.get_mut(i)))
        }
        other => Err(not_a_container(at, other)),
    }
}

fn not_a_container(at: &str, node: &Node) -> String {
    format!("{} is {}, not an object or an array", name(at), node.kind())
}

/// Replaces `slot` with `new`, noting the change if the text differs.
fn replace(slot: &mut Node, new: &Node, path: &Pointer, changes: &mut Vec<Change>) {
    if slot != new {
        changes.push(change(path, Some(slot), Some(new)));
        *slot = new.clone();
    }
}

fn set(
    root: &mut Node,
    path: &Pointer,
    value: &Node,
    changes: &mut Vec<Change>,
) -> Result<(), String> {
    let n = path.tokens().len();
    let parent = match walk(root, path, n - 1)? {
        Found::Here(parent) => parent,
        Found::Missing(k) => return Err(format!("{} is missing", path.prefix(k))),
    };
    fits(path, value)?;
    let at = path.prefix(n - 1);
    let last = path.last();
    match parent {
        Node::Object(members) => match members.iter_mut().find(|(key, _)| key.is(last)) {
            Some((_, slot)) => replace(slot, value, path, changes),
            None => {
                members.push((Text::new(last), value.clone()));
                changes.push(change(path, None, Some(value)));
            }
        },
        Node::Array(items) => {
            let i = index(last).map_err(|why| format!("{} is an array and {why}", name(at)))?;
            let len = items.len();
            match i.and_then(|i| items.get_mut(i)) {
                Some(slot) => replace(slot, value, path, changes),
                None => {
                    return Err(format!(
                        "index {last} is past the end of {} (length {len})",
                        name(at)
                    ))
                }
            }
        }
        other => return Err(not_a_container(at, other)),
    }
    Ok(())
}

/// Removes and returns the value at `path` (`None`: absent).
fn take(root: &mut Node, path: &Pointer) -> Result<Option<Node>, String> {
    let n = path.tokens().len();
    let Found::Here(parent) = walk(root, path, n - 1)? else {
        return Ok(None);
    };
    let last = path.last();
    match parent {
        Node::Object(members) => Ok(members
            .iter()
            .position(|(key, _)| key.is(last))
            .map(|i| members.remove(i).1)),
        Node::Array(items) => {
            let at = path.prefix(n - 1);
            let i = index(last).map_err(|why| format!("{} is an array and {why}", name(at)))?;
            Ok(i.filter(|&i| i < items.len()).map(|i| items.remove(i)))
        }
        other => Err(not_a_container(path.prefix(n - 1), other)),
    }
}

fn rename(
    root: &mut Node,
    from: &Pointer,
    path: &Pointer,
    changes: &mut Vec<Change>,
) -> Result<(), String> {
    if let Found::Missing(_) = walk(root, from, from.tokens().len())? {
        return Ok(());
    }
    if let Found::Here(_) = walk(root, path, path.tokens().len())? {
        return Err(format!("{path} is already present"));
    }
    if from.parent() == path.parent() {
        // One object: the member keeps its place, under its new key.
        if let Found::Here(Node::Object(members)) = walk(root, from, from.tokens().len() - 1)? {
            if let Some(member) = members.iter_mut().find(|(key, _)| key.is(from.last())) {
                member.0 = Text::new(path.last());
                changes.push(change(from, Some(&member.1), None));
                changes.push(change(path, None, Some(&member.1)));
                return Ok(());
            }
        }
    }
    let Some(value) = take(root, from)? else {
        return Ok(());
    };
    fits(path, &value)?;
    let n = path.tokens().len();
    let parent = match walk(root, path, n - 1)? {
        Found::Here(parent) => parent,
        Found::Missing(k) => return Err(format!("{} is missing", path.prefix(k))),
    };
    let Node::Object(members) = parent else {
        return Err(format!(
            "{} is {}: rename adds a member to an object",
            name(path.prefix(n - 1)),
            parent.kind()
        ));
    };
    if members.iter().any(|(key, _)| key.is(path.last())) {
        return Err(format!("{path} is already present"));
    }
    changes.push(change(from, Some(&value), None));
    changes.push(change(path, None, Some(&value)));
    members.push((Text::new(path.last()), value));
    Ok(())
}
