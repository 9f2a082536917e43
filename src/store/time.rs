//! Reading stored times. sqlx's own decoding of a `timestamptz` panics on a time chrono
//! cannot hold (`infinity`, `-infinity`, a year past 262142), which only a row written
//! by hand can have; these read it into an error naming the column instead, so that no
//! row can stop a member or a command.

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgRow, PgValueFormat};
use sqlx::{Row, ValueRef};

use super::{Result, StoreError};

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Why a stored time cannot be read.
pub(crate) const OUT_OF_RANGE: &str =
    "the time is out of range (infinity, -infinity, or a year past 262142)";

/// `column` of `row` (`None` when NULL), or [`OUT_OF_RANGE`] as the inner error when
/// it holds a time chrono cannot; the outer error is sqlx's (no such column, ...).
pub(crate) fn decode(
    row: &PgRow,
    column: &str,
) -> Result<std::result::Result<Option<DateTime<Utc>>, &'static str>> {
    let raw = row.try_get_raw(column)?;
    if raw.is_null() {
        return Ok(Ok(None));
    }
    if raw.format() == PgValueFormat::Text {
        // sqlx parses the text form without panicking.
        return Ok(Ok(Some(row.try_get(column)?)));
    }
    Ok(raw
        .as_bytes()
        .ok()
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
        .map(i64::from_be_bytes)
        .and_then(|micros| micros.checked_add(POSTGRES_EPOCH_MICROS))
        .and_then(DateTime::from_timestamp_micros)
        .map(Some)
        .ok_or(OUT_OF_RANGE))
}

/// `column` of `row`, `None` when NULL; a time out of range is an error naming it.
pub(crate) fn optional(row: &PgRow, column: &str) -> Result<Option<DateTime<Utc>>> {
    decode(row, column)?.map_err(|why| StoreError::UnreadableTime(format!("{column}: {why}")))
}

/// [`optional`] of a column that is never NULL.
pub(crate) fn required(row: &PgRow, column: &str) -> Result<DateTime<Utc>> {
    optional(row, column)?.ok_or_else(|| StoreError::UnreadableTime(format!("{column}: NULL")))
}
