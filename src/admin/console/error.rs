//! Errors of the console's pages: a status and an HTML page that says what went wrong.
//! Database errors are told apart as the API tells them: unreachable (503, with
//! `Retry-After`), a statement cancelled by `admin.statement_timeout` (504), anything
//! else the database refused (500 with its message).

use axum::http::header::RETRY_AFTER;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout;
use crate::operations::OperationError;
use crate::store::StoreError;

/// A page that could not be served.
#[derive(Debug)]
pub(crate) struct PageError {
    status: StatusCode,
    message: String,
    retry_after: Option<u64>,
}

/// SQLSTATE of a statement PostgreSQL cancelled.
const QUERY_CANCELED: &str = "57014";

impl PageError {
    fn new(status: StatusCode, message: impl Into<String>) -> PageError {
        PageError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400: the request (a filter, an id) is wrong.
    pub(crate) fn bad_request(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: no session.
    pub(crate) fn unauthorized(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 404: no such thing.
    pub(crate) fn not_found(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::NOT_FOUND, message)
    }

    /// 429: too many of these now; try again after `seconds`.
    pub(crate) fn too_many(message: impl Into<String>, seconds: u64) -> PageError {
        PageError {
            retry_after: Some(seconds),
            ..PageError::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }
}

impl From<OperationError> for PageError {
    fn from(error: OperationError) -> PageError {
        PageError::from(&error)
    }
}

impl From<&OperationError> for PageError {
    fn from(error: &OperationError) -> PageError {
        match error {
            OperationError::BadRequest(m) => PageError::bad_request(m.clone()),
            OperationError::NotFound(m) => PageError::not_found(m.clone()),
            OperationError::Forbidden(m) => PageError::new(StatusCode::FORBIDDEN, m.clone()),
            OperationError::Conflict(m) => PageError::new(StatusCode::CONFLICT, m.clone()),
            OperationError::Kafka(m) => {
                PageError::new(StatusCode::BAD_GATEWAY, format!("kafka: {m}"))
            }
            OperationError::Store(e) => e.into(),
            OperationError::NeedsApproval { .. } => {
                PageError::new(StatusCode::ACCEPTED, error.to_string())
            }
            OperationError::Busy(m) => PageError::too_many(m.clone(), 5),
            OperationError::Shared(error) => PageError::from(&**error),
        }
    }
}

impl From<StoreError> for PageError {
    fn from(error: StoreError) -> PageError {
        PageError::from(&error)
    }
}

impl From<&StoreError> for PageError {
    fn from(error: &StoreError) -> PageError {
        let code = match error {
            StoreError::Database(database) => database.as_database_error().and_then(|e| e.code()),
            _ => None,
        };
        if let StoreError::SearchTimedOut { .. } = error {
            return PageError::new(StatusCode::GATEWAY_TIMEOUT, error.to_string());
        }
        if code.as_deref() == Some(QUERY_CANCELED) {
            tracing::warn!(%error, "console: a statement was cancelled");
            return PageError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "the database did not finish this page within admin.statement_timeout; \
                 narrow the filter, or raise admin.statement_timeout",
            );
        }
        if error.is_unavailable() {
            tracing::warn!(%error, "console: database unavailable");
            return PageError {
                retry_after: Some(5),
                ..PageError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database cannot be reached (or all of the admin listener's \
                     connections are busy); try again",
                )
            };
        }
        match error {
            StoreError::Database(_) | StoreError::Migrate(_) => {
                tracing::error!(%error, "console: the database refused a request");
                PageError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the database refused the request: {error}"),
                )
            }
            // A row that cannot be read, and the like: the database refused nothing.
            other => PageError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Error").to_owned();
        let body = html! {
            p.error role="alert" { (self.message) }
            p { a href="/console/" { "Back to the overview" } }
        };
        let mut response = (self.status, layout::bare(&title, body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// Any other path under `/console/`: 404.
pub(crate) async fn no_such_page(uri: Uri) -> PageError {
    PageError::not_found(format!("no console page at {}", uri.path()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by an attack: a row the console could not read was reported as "the
    /// database refused the request"; the database refused nothing.
    #[test]
    fn an_unreadable_row_is_not_called_a_refusal_by_the_database() {
        let page = PageError::from(StoreError::MalformedRow("task 5: status: x".into()));
        assert_eq!(page.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(page.message, "a stored row is malformed: task 5: status: x");
    }
}
