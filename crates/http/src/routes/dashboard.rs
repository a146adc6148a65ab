//! The dashboard: one page and its script and style, embedded in the
//! binary (no build step), served to anyone; the page asks for a token and
//! calls the API with it. Every answer carries a strict Content Security
//! Policy: scripts and styles only from these files, no inline code, no
//! framing, and connections only back to this service.

use crate::error::{ApiError, ErrorBody};
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use opledger_store::Store;

const INDEX: &str = include_str!("../../assets/index.html");
const SCRIPT: &str = include_str!("../../assets/app.js");
const STYLE: &str = include_str!("../../assets/app.css");

/// The policy of every dashboard file.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; \
    connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The dashboard page.
#[utoipa::path(get, path = "/", tag = "dashboard",
    responses((status = 200, description = "The dashboard page.", content_type = "text/html", body = String)))]
pub async fn index<S: Store>() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

/// The page's script and style (`app.js`, `app.css`).
#[utoipa::path(get, path = "/assets/{file}", tag = "dashboard",
    params(("file" = String, Path, description = "`app.js` or `app.css`")),
    responses((status = 200, description = "The file.", body = String), (status = 404, body = ErrorBody)))]
pub async fn asset<S: Store>(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => file("text/javascript; charset=utf-8", SCRIPT),
        "app.css" => file("text/css; charset=utf-8", STYLE),
        _ => ApiError::not_found("no such dashboard file").into_response(),
    }
}
