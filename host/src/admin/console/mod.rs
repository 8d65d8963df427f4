//! The operator console: one HTML page, a script and a style sheet, compiled
//! into the binary and served at `/` of the admin listener.
//!
//! The files are public; everything they show comes from the `/v1` API with
//! the bearer token the operator types in, which the page keeps in
//! `sessionStorage` (this tab only). The Content-Security-Policy allows
//! nothing but this host: no CDN, no inline script, no framing, so the page
//! works offline and an injected string cannot run as code.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("index.html");

/// The page's files under `/console/`: ES modules (no build step) and one style sheet.
const ASSETS: &[(&str, &str)] = &[
    ("app.js", include_str!("app.js")),
    ("api.js", include_str!("api.js")),
    ("dom.js", include_str!("dom.js")),
    ("ui.js", include_str!("ui.js")),
    ("chart.js", include_str!("chart.js")),
    ("overview.js", include_str!("overview.js")),
    ("handler.js", include_str!("handler.js")),
    ("dead_letters.js", include_str!("dead_letters.js")),
    ("app.css", include_str!("app.css")),
];

/// Only this origin, for every kind of request the page makes.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn served(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // A new binary serves new files: never keep an old script next to a new API.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub async fn page() -> Response {
    served("text/html; charset=utf-8", INDEX)
}

pub async fn asset(Path(name): Path<String>) -> Response {
    let Some((_, body)) = ASSETS.iter().find(|(file, _)| *file == name) else {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    };
    let content_type = if name.ends_with(".css") {
        "text/css; charset=utf-8"
    } else {
        "text/javascript; charset=utf-8"
    };
    served(content_type, body)
}
