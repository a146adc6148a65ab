//! The route table: every route once, with the handler that serves it.
//! The same table builds the router and the OpenAPI document, so the
//! document cannot list a route the service lacks, nor miss one it has.
//!
//! One module per part of the API; each handler checks its caller's role
//! first ([`crate::extract::Caller::require`]) and then calls the engine
//! like the CLI does.

pub mod claims;
pub mod health;
pub mod read;
pub mod reports;
pub mod work;

use crate::app::App;
use axum::Router;
use opledger_store::Store;
use utoipa::OpenApi;

/// Builds [`api_routes`] and [`ApiDoc`] from one list of
/// `method "path" => module::handler`.
macro_rules! api {
    ($($method:ident $path:literal => $module:ident :: $handler:ident),* $(,)?) => {
        /// Every documented route, on its handler.
        pub fn api_routes<S: Store>() -> Router<App<S>> {
            let mut router = Router::new();
            $(
                router = router.route($path, axum::routing::$method($module::$handler::<S>));
            )*
            router
        }

        /// The OpenAPI document's paths.
        #[derive(OpenApi)]
        #[openapi(paths($($module::$handler),*))]
        pub struct ApiPaths;
    };
}

api! {
    get "/healthz" => health::healthz,
    get "/readyz" => health::readyz,
    get "/api/v1/status" => read::status,
    post "/api/v1/tasks" => work::request,
    post "/api/v1/task-requests" => work::request_many,
    post "/api/v1/operations/{id}/cancel" => work::cancel,
    post "/api/v1/claims" => claims::claim,
    post "/api/v1/claims/{token}/heartbeat" => claims::heartbeat,
    post "/api/v1/claims/{token}/progress" => claims::progress,
    post "/api/v1/claims/{token}/complete" => claims::complete,
    post "/api/v1/claims/{token}/fail" => claims::fail,
    post "/api/v1/claims/{token}/release" => claims::release,
    post "/api/v1/claims/{token}/ack-cancel" => claims::ack_cancel,
    post "/api/v1/reports" => reports::report_many,
}
