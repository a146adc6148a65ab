//! The route table: every route once, with the handler that serves it.
//! The same table builds the router and the OpenAPI document, so the
//! document cannot list a route the service lacks, nor miss one it has.
//!
//! One module per part of the API; each handler checks its caller's role
//! first ([`crate::extract::Caller::require`]) and then calls the engine
//! like the CLI does.

pub mod dashboard;
pub mod events;
pub mod health;
pub mod metrics;
pub mod read;

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
    get "/api/v1/events" => events::events,
    get "/metrics" => metrics::metrics,
    get "/" => dashboard::index,
    get "/assets/{file}" => dashboard::asset,
}
