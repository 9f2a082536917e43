//! Errors of the admin API: a status and a JSON body `{"error": "..."}`. An operation's
//! refusal keeps its kind (bad request 400, not found 404, forbidden 403, conflict 409;
//! Kafka unreachable 503), and bad input says what is wrong. Of database errors, only a database that cannot be reached
//! is a 503 (with `Retry-After`); a statement cancelled by `admin.statement_timeout` is a
//! 504, and any other (bad data, a missing table) a 500 saying what PostgreSQL said.

use axum::http::header::RETRY_AFTER;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::operations::OperationError;
use crate::store::StoreError;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// Seconds after which trying again may work (`Retry-After`).
    retry_after: Option<u64>,
    /// The approval an action waits for (a 202).
    approval: Option<i64>,
}

/// `Retry-After` of a 503 for a database that cannot be reached.
const UNAVAILABLE_RETRY_AFTER: u64 = 5;

/// `Retry-After` of a heavy read refused because others run.
const BUSY_RETRY_AFTER: u64 = 5;

/// SQLSTATE of a statement PostgreSQL cancelled (`statement_timeout`, or an
/// administrator's `pg_cancel_backend`).
const QUERY_CANCELED: &str = "57014";

/// The body of every error answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong (or, with a 202, why nothing was done yet).
    pub error: String,
    /// With a 202: the approval the action waits for (`operations.approval_over`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<i64>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
            approval: None,
        }
    }

    /// 429: too many requests of this kind run now; try again after `retry_after`
    /// seconds.
    pub fn too_many(message: impl Into<String>, retry_after: u64) -> ApiError {
        ApiError {
            retry_after: Some(retry_after),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// 400: the request is wrong.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: no or an unknown token.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 403: the token may not do this.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, message)
    }

    /// 404: no such thing.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 405: the address takes other methods.
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message)
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        ApiError::from(&error)
    }
}

impl From<&StoreError> for ApiError {
    fn from(error: &StoreError) -> ApiError {
        match error {
            StoreError::Database(database) if cancelled(database) => {
                tracing::warn!(%error, "admin API: a statement was cancelled");
                ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the database did not finish this request within admin.statement_timeout \
                     (or it was cancelled); narrow it, or raise admin.statement_timeout",
                )
            }
            StoreError::SearchTimedOut { .. } => {
                ApiError::new(StatusCode::GATEWAY_TIMEOUT, error.to_string())
            }
            _ if error.is_unavailable() => {
                tracing::warn!(%error, "admin API: database unavailable");
                ApiError {
                    retry_after: Some(UNAVAILABLE_RETRY_AFTER),
                    ..ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the database cannot be reached (or all of the API's connections are \
                         busy); try again",
                    )
                }
            }
            StoreError::Database(_) | StoreError::Migrate(_) => {
                tracing::error!(%error, "admin API: the database refused a request");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the database refused the request: {error}"),
                )
            }
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

/// Whether PostgreSQL cancelled the statement.
fn cancelled(error: &sqlx::Error) -> bool {
    error.as_database_error().and_then(|e| e.code()).as_deref() == Some(QUERY_CANCELED)
}

impl From<OperationError> for ApiError {
    fn from(error: OperationError) -> ApiError {
        ApiError::from(&error)
    }
}

impl From<&OperationError> for ApiError {
    fn from(error: &OperationError) -> ApiError {
        match error {
            OperationError::BadRequest(message) => ApiError::bad_request(message.clone()),
            OperationError::NotFound(message) => ApiError::not_found(message.clone()),
            OperationError::Forbidden(message) => ApiError::forbidden(message.clone()),
            OperationError::Conflict(message) => {
                ApiError::new(StatusCode::CONFLICT, message.clone())
            }
            OperationError::Kafka(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
            }
            OperationError::Store(error) => error.into(),
            OperationError::NeedsApproval { approval, .. } => ApiError {
                approval: Some(approval.id),
                ..ApiError::new(StatusCode::ACCEPTED, error.to_string())
            },
            OperationError::Busy(message) => ApiError::too_many(message.clone(), BUSY_RETRY_AFTER),
            OperationError::Shared(error) => ApiError::from(&**error),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: self.message,
                approval: self.approval,
            }),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(RETRY_AFTER, seconds.into());
        }
        response
    }
}
