//! The one list envelope (`items` + `next_cursor`) and the bounds of a page.

use serde::{Deserialize, Serialize};

use super::error::{OperationError, Result};
use crate::store::MAX_PAGE;

/// Items a page holds when the request does not say.
pub const DEFAULT_PAGE: i64 = 50;

/// One page of a list, in the list's order (newest first where it has one).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    /// What this page holds.
    pub items: Vec<T>,
    /// Pass as `after` to get the next page; absent on the last page (and on lists
    /// that are never paged: members, breakers, brakes).
    pub next_cursor: Option<i64>,
    /// What a search read to find this page (lists with `search` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub searched: Option<crate::store::Searched>,
}

impl<T> Page<T> {
    /// A list that is never paged: everything at once.
    pub fn whole(items: Vec<T>) -> Page<T> {
        Page {
            items,
            next_cursor: None,
            searched: None,
        }
    }

    /// A page read with `limit`: when full, the next one starts after the cursor of its
    /// last item.
    pub fn after(items: Vec<T>, limit: i64, cursor: impl Fn(&T) -> i64) -> Page<T> {
        let next_cursor = match items.last() {
            Some(last) if items.len() as i64 >= limit => Some(cursor(last)),
            _ => None,
        };
        Page {
            items,
            next_cursor,
            searched: None,
        }
    }
}

/// Which page of a list: its size and where it continues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageRequest {
    /// Items per page, 1 to 1000 (default 50).
    pub limit: Option<i64>,
    /// The previous page's `next_cursor`: continue after it.
    pub after: Option<i64>,
}

impl PageRequest {
    /// The page size, checked.
    pub fn limit(&self) -> Result<i64> {
        match self.limit {
            None => Ok(DEFAULT_PAGE),
            Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
            Some(n) => Err(OperationError::bad_request(format!(
                "limit must be between 1 and {MAX_PAGE} (got {n})"
            ))),
        }
    }

    /// The cursor, checked: an id, so a positive integer.
    pub fn after(&self) -> Result<Option<i64>> {
        match self.after {
            Some(after) if after <= 0 => Err(OperationError::bad_request(format!(
                "after must be a previous page's next_cursor (a positive integer; got {after})"
            ))),
            after => Ok(after),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_page_points_past_its_last_item() {
        let full = Page::after(vec![9, 7, 5], 3, |n| *n);
        assert_eq!(full.next_cursor, Some(5));
        assert_eq!(Page::after(vec![9, 7], 3, |n| *n).next_cursor, None);
        assert_eq!(Page::<i64>::after(vec![], 3, |n| *n).next_cursor, None);
        assert_eq!(Page::whole(vec![1]).next_cursor, None);
    }

    #[test]
    fn a_page_is_bounded() {
        let page = |limit, after| PageRequest { limit, after };
        assert_eq!(page(None, None).limit().unwrap(), DEFAULT_PAGE);
        assert_eq!(page(Some(1000), None).limit().unwrap(), 1000);
        for bad in [0, -1, 1001] {
            let error = page(Some(bad), None).limit().unwrap_err().to_string();
            assert!(error.contains("limit"), "{error}");
        }
        assert!(page(None, Some(-3))
            .after()
            .unwrap_err()
            .to_string()
            .contains("after"));
        assert_eq!(page(None, Some(3)).after().unwrap(), Some(3));
    }
}
