//! What every request meets before its handler: credentials are looked at
//! first (a request without them gets 401 before anything of its body or
//! query is read), an over-long target is 414, and every error answer —
//! the framework's own rejections included (405, a path that is not
//! UTF-8) — leaves in the one error shape. It must not know the routes.

use crate::app::App;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use opledger_store::Store;

/// The longest request target (path and query) read, in bytes.
pub const MAX_TARGET_BYTES: usize = 8 * 1024;

/// An API request without credentials is 401 at once, unless it only reads
/// and anonymous reading is allowed; a request with them goes on (the
/// handler's [`crate::extract::Caller`] checks the token and the role).
pub async fn authenticate_first<S: Store>(State(app): State<App<S>>, request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let reads = request.method() == Method::GET || request.method() == Method::HEAD;
    let anonymous = !request.headers().contains_key(header::AUTHORIZATION);
    if api && anonymous && !(reads && app.config().allow_anonymous_read) {
        return ApiError::unauthenticated("this needs a bearer token (Authorization: Bearer TOKEN)").into_response();
    }
    next.run(request).await
}

/// A request target over [`MAX_TARGET_BYTES`] is 414 before routing.
pub async fn bounded_target(request: Request, next: Next) -> Response {
    let length = request.uri().path_and_query().map_or(0, |target| target.as_str().len());
    if length > MAX_TARGET_BYTES {
        return ApiError::uri_too_long(format!(
            "the request target is {length} bytes, more than the {MAX_TARGET_BYTES} read"
        ))
        .into_response();
    }
    next.run(request).await
}

/// 405 in the error shape (the router's method fallback).
pub async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::method_not_allowed(format!("this route does not answer {method}"))
}

/// Rewrites an error answer that is not in the error shape — one the
/// framework made before a handler ran — into it. Its text is not echoed:
/// it may quote the request.
pub async fn error_shape(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&response) {
        return response;
    }
    let message = match status {
        StatusCode::BAD_REQUEST => "the request cannot be read: its path, query or body is malformed",
        StatusCode::METHOD_NOT_ALLOWED => "this route does not answer this method",
        StatusCode::NOT_FOUND => "no such route",
        StatusCode::PAYLOAD_TOO_LARGE => "the request body is over the limit",
        StatusCode::URI_TOO_LONG => "the request target is over the limit",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "the request's content type is not one this route reads",
        StatusCode::REQUEST_TIMEOUT => "the request was not sent in time",
        _ => status.canonical_reason().unwrap_or("the request failed"),
    };
    let code = match status {
        StatusCode::BAD_REQUEST => "malformed",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::URI_TOO_LONG => "uri_too_long",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        status if status.is_server_error() => "internal",
        _ => "malformed",
    };
    let mut shaped = ApiError::new(status, code, message).into_response();
    // Headers the framework set for this status (Allow on a 405) stay.
    for (name, value) in response.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            shaped.headers_mut().insert(name.clone(), value.clone());
        }
    }
    shaped
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}
