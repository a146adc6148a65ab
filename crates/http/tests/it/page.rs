//! The dashboard's files: served to anyone with their content types and
//! the strict Content Security Policy; the page holds no inline script or
//! style, and the script inserts no HTML.

use crate::support;

use opledger_testkit::Backend;
use support::{assert_error, start, As};

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; \
    connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

async fn the_page_and_its_assets_are_served_with_their_types_and_a_strict_policy<B: Backend>(backend: &B) {
    let service = start(backend).await;
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/assets/app.js", "text/javascript; charset=utf-8"),
        ("/assets/app.css", "text/css; charset=utf-8"),
    ] {
        let answer = service.get(path, As::Anonymous).await;
        assert_eq!(answer.status, 200, "{path}");
        assert_eq!(answer.headers["content-type"], content_type, "{path}");
        assert_eq!(answer.headers["content-security-policy"], CSP, "{path}");
        assert_eq!(answer.headers["x-content-type-options"], "nosniff", "{path}");
    }
    assert_error(&service.get("/assets/other.js", As::Anonymous).await, 404, "not_found");
    service.shutdown().await;
}

async fn the_page_has_no_inline_code_and_the_script_inserts_no_html<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let page = String::from_utf8(service.get("/", As::Anonymous).await.bytes).unwrap();
    assert!(!page.contains("<script>"), "no inline script");
    assert!(!page.contains("style="), "no inline style");
    let handler = page.split(" on").skip(1).find(|rest| {
        let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
        !name.is_empty() && rest[name.len()..].starts_with('=')
    });
    assert!(handler.is_none(), "no inline handlers: {handler:?}");
    let script = String::from_utf8(service.get("/assets/app.js", As::Anonymous).await.bytes).unwrap();
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!script.contains(sink), "the script uses {sink}");
    }
    assert!(script.contains("sessionStorage"), "the token is kept per tab");
    assert!(
        !script.contains("localStorage"),
        "the token is not kept across sessions"
    );
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    the_page_and_its_assets_are_served_with_their_types_and_a_strict_policy,
    the_page_has_no_inline_code_and_the_script_inserts_no_html,
);
