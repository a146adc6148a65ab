//! The route table: every route once, with the handler that serves it.
//! The same table builds the router and the OpenAPI document, so the
//! document cannot list a route the service lacks, nor miss one it has.
//!
//! One module per part of the API; each handler checks its caller's role
//! first ([`crate::extract::Caller::require`]) and then calls the engine
//! like the CLI does.

pub mod admin;
pub mod batches;
pub mod claims;
pub mod dashboard;
pub mod docs;
pub mod events;
pub mod export_file;
pub mod exports;
pub mod health;
pub mod kinds;
pub mod media;
pub mod metrics;
pub mod ops;
pub mod params;
pub mod read;
pub mod reports;
pub mod review;
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
    get "/openapi.json" => docs::openapi,
    get "/api/v1/operations" => ops::list,
    get "/api/v1/operations/{id}" => ops::describe,
    get "/api/v1/operations/{id}/timeline" => ops::timeline,
    get "/api/v1/media" => media::list,
    post "/api/v1/media" => media::register,
    get "/api/v1/media/by-path" => media::by_path,
    get "/api/v1/media/{id}" => media::show,
    get "/api/v1/media/{id}/capabilities" => media::capabilities,
    get "/api/v1/media/{id}/thumbnail" => media::thumbnail,
    get "/api/v1/batches" => batches::list,
    post "/api/v1/batches" => batches::create,
    get "/api/v1/batches/{id}" => batches::show,
    post "/api/v1/batches/{id}/cancel" => batches::cancel,
    post "/api/v1/batches/{id}/resume" => batches::resume,
    get "/api/v1/review" => review::list,
    post "/api/v1/review/resolve" => review::resolve_all,
    post "/api/v1/review/{entry}/resolve" => review::resolve,
    get "/api/v1/kinds" => kinds::list,
    post "/api/v1/kinds" => kinds::apply,
    get "/api/v1/kinds/{name}" => kinds::show,
    post "/api/v1/verify" => admin::verify,
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
    post "/api/v1/exports" => exports::create,
    get "/api/v1/exports/{token}" => exports::status,
    delete "/api/v1/exports/{token}" => exports::cancel,
    post "/api/v1/exports/{token}/downloads" => exports::downloads,
    get "/api/v1/exports/{token}/file" => export_file::file,
    get "/api/v1/events" => events::events,
    get "/metrics" => metrics::metrics,
    get "/" => dashboard::index,
    get "/assets/{file}" => dashboard::asset,
}
