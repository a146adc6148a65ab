//! The service's one error shape, `{"error":{"code","message","details"}}`,
//! and the one place an engine error becomes an HTTP status.
//!
//! | status | code | when |
//! | --- | --- | --- |
//! | 400 | `malformed` | the request cannot be read (bad JSON, bad query, bad id) |
//! | 401 | `unauthenticated` | no token, or one the tokens file does not hold |
//! | 403 | `forbidden` | the token's role or task kinds do not allow it |
//! | 404 | `not_found` | an unknown id or route; a file the service may not serve |
//! | 405 | `method_not_allowed` | the route has no such method |
//! | 408 | `timeout` | the request was not sent in time |
//! | 409 | `conflict` | a stale claim, an illegal transition, a version conflict, a download attempt already taken |
//! | 410 | `gone` | an export's artifact expired, its job is gone or no longer succeeded, a download attempt expired |
//! | 413 | `too_large` | the body is over the limit (refused before it is parsed) |
//! | 414 | `uri_too_long` | the request's target is over the limit |
//! | 415 | `unsupported_media` | a file that is no raster image (PNG, JPEG, WebP, GIF, AVIF) |
//! | 422 | `invalid` | well-formed, but the rules refuse it |
//! | 500 | `internal` | a bug (a panic is caught and logged) |
//! | 503 | `unavailable` | the store cannot serve, or the service is not ready |

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use opledger_domain::DomainError;
use opledger_engine::EngineError;
use opledger_store::ErrorKind;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Value,
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// One of `malformed`, `unauthenticated`, `forbidden`, `not_found`,
    /// `method_not_allowed`, `timeout`, `conflict`, `gone`, `too_large`,
    /// `uri_too_long`, `unsupported_media`, `invalid`, `internal`,
    /// `unavailable`.
    pub code: String,
    pub message: String,
    /// More about the error where there is more to say; `{}` otherwise.
    #[schema(value_type = Object)]
    pub details: Value,
}

impl ErrorBody {
    /// The body of an error answer with `code` and `message`.
    pub fn of(code: &str, message: &str) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message: message.to_string(),
                details: Value::Object(Default::default()),
            },
        }
    }
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: Value::Object(Default::default()),
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "malformed", message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", message)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::REQUEST_TIMEOUT, "timeout", message)
    }

    pub fn uri_too_long(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::URI_TOO_LONG, "uri_too_long", message)
    }

    pub fn unsupported_media(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media", message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::GONE, "gone", message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let message = error.to_string();
        match &error {
            EngineError::Domain(DomainError::InvalidInput(_)) => ApiError::invalid(message),
            EngineError::Domain(DomainError::NotFound { .. }) => ApiError::not_found(message),
            EngineError::Domain(DomainError::Conflict(_) | DomainError::IllegalTransition(_)) => {
                ApiError::conflict(message)
            }
            EngineError::Store(store) => match store.kind {
                ErrorKind::Conflict => ApiError::conflict(message),
                ErrorKind::NotFound => ApiError::not_found(message),
                ErrorKind::Constraint => ApiError::invalid(message),
                ErrorKind::Unavailable => ApiError::unavailable(message),
                ErrorKind::Corrupt => {
                    tracing::error!(%message, "the store holds data it cannot read");
                    ApiError::unavailable(message)
                }
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                details: self.details,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

/// What every handler returns.
pub type ApiResult<T> = Result<T, ApiError>;
