//! The compact writer: no insignificant whitespace, every number and string as its
//! [`Node`] holds it (so as written in the source, for the parts a transform keeps).

use super::node::Node;

/// The document as compact JSON text.
pub(super) fn compact(node: &Node) -> String {
    let mut out = String::new();
    write(node, &mut out, usize::MAX);
    out
}

/// How many characters of a value a [`super::Change`] shows.
pub(super) const PREVIEW_CHARS: usize = 200;

/// The value as compact JSON text, cut after [`PREVIEW_CHARS`] characters with an
/// ellipsis (without writing much more than that of a large value).
pub(super) fn preview(node: &Node) -> String {
    let mut out = String::new();
    write(node, &mut out, PREVIEW_CHARS * 4 + 4);
    cut(out)
}

/// `text` cut after [`PREVIEW_CHARS`] characters, with an ellipsis when it was longer.
pub(super) fn cut(mut text: String) -> String {
    if let Some((at, _)) = text.char_indices().nth(PREVIEW_CHARS) {
        text.truncate(at);
        text.push('…');
    }
    text
}

/// Writes `node` to `out`; stops early (returning false) once `out` is over `limit`
/// bytes.
fn write(node: &Node, out: &mut String, limit: usize) -> bool {
    if out.len() > limit {
        return false;
    }
    match node {
        Node::Null => out.push_str("null"),
        Node::Bool(true) => out.push_str("true"),
        Node::Bool(false) => out.push_str("false"),
        Node::Number(text) => push(out, text, limit),
        Node::String(text) => {
            out.push('"');
            push(out, text.raw(), limit);
            out.push('"');
        }
        Node::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if !write(item, out, limit) {
                    return false;
                }
            }
            out.push(']');
        }
        Node::Object(members) => {
            out.push('{');
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('"');
                push(out, key.raw(), limit);
                out.push_str("\":");
                if !write(value, out, limit) {
                    return false;
                }
            }
            out.push('}');
        }
    }
    true
}

/// Appends `text`, or as much of it as takes `out` just past `limit` bytes.
fn push(out: &mut String, text: &str, limit: usize) {
    let room = limit.saturating_sub(out.len()).saturating_add(1);
    if text.len() <= room {
        out.push_str(text);
    } else {
        let mut end = room;
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push_str(&text[..end]);
    }
}
