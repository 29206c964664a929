//! The dashboard: one page (`/`) and its script and style, compiled into the binary, which
//! reads everything it shows from the REST API with the token the user signs in with (the
//! assets themselves hold no data and need none). Views: the plan (nodes × time), the queue,
//! the nodes, the replicas, and a job with its steps and a live tail of its output.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// What a browser may do with the dashboard's pages: load their own script and style only, no
/// inline script, and not be framed by another site.
const POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", include_str!("dashboard/index.html")) }))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", include_str!("dashboard/app.js")) }),
        )
        .route("/ui/style.css", get(|| async { asset("text/css; charset=utf-8", include_str!("dashboard/style.css")) }))
}
