//! Lists of names that hold strings only. The `config` crate turns a number or a
//! boolean into its text where a string is expected (`topics = ["t", 5]` would subscribe
//! to a topic `5`), so list elements are read as they were written.

use serde::de::{Deserialize, Deserializer, Visitor};
use std::fmt;

/// Deserializes a list of strings, refusing an element of another type (the error names
/// it by its index, e.g. `routes[0].topics[1]`). The environment's values are strings.
pub(super) fn strings<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let elements = Vec::<Written>::deserialize(deserializer)?;
    Ok(elements.into_iter().map(|Written(text)| text).collect())
}

/// [`strings`] for a list that may be left out: a list written empty is `Some` of none.
pub(super) fn optional_strings<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    strings(deserializer).map(Some)
}

/// A string as written: any other type is refused, not converted.
struct Written(String);

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(WrittenVisitor)
    }
}

struct WrittenVisitor;

impl Visitor<'_> for WrittenVisitor {
    type Value = Written;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a string (a name in quotes)")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Written, E> {
        Ok(Written(text.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Written, E> {
        Ok(Written(text))
    }
}
