//! Errors of the admin API: a status and a JSON body `{"error": "..."}`. Bad input is a
//! 4xx naming what is wrong; a database that cannot be reached is a 503.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::replay::ReplayError;
use crate::store::StoreError;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

/// The body of every error answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
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

    /// 409: the thing is not in a state for this.
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        match error {
            StoreError::UnknownTasks(_) => ApiError::not_found(error.to_string()),
            StoreError::Replay(crate::store::ReplayRowError::Unknown(_)) => {
                ApiError::not_found(error.to_string())
            }
            StoreError::Replay(_) => ApiError::conflict(error.to_string()),
            StoreError::Database(_) | StoreError::Migrate(_) => {
                tracing::warn!(%error, "admin API: database error");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database cannot be reached or refused the request; try again",
                )
            }
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

impl From<ReplayError> for ApiError {
    fn from(error: ReplayError) -> ApiError {
        match error {
            ReplayError::Store(error) => error.into(),
            ReplayError::UnknownTopic(_) | ReplayError::Invalid(_) => {
                ApiError::bad_request(error.to_string())
            }
            ReplayError::Kafka(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response()
    }
}
