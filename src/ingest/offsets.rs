//! The offsets ingest may commit, as the flushes report them and the consumer commits
//! them: a batch's only once its messages are stored.

use std::collections::BTreeMap;

/// Next offset to commit per (topic, partition): one past the last message stored.
pub(crate) type Offsets = BTreeMap<(String, i32), i64>;
