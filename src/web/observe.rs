//! Every HTTP edge request counted, timed and written to the access log as
//! gRPC's are (`api::access`): when its body ends, so a stream is measured
//! to its last event. Labels come from a fixed list, never from the path.

use crate::{api::access, telemetry::metrics};
use axum::{
    body::Body,
    extract::Request,
    http::{Method, header},
    middleware::Next,
    response::Response,
};
use futures::StreamExt;
use tokio::time::Instant;

/// The route of a request, from a fixed list (`other` for the rest).
fn route(method: &Method, path: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("POST", ["v1", "chat", "completions"]) => "POST /v1/chat/completions",
        ("GET", ["v1", "models"]) => "GET /v1/models",
        ("GET", ["v1", "models", ..]) => "GET /v1/models/{model}",
        ("POST", ["v1", "agents", _, "turns"]) => "POST /v1/agents/{agent}/turns",
        ("GET", ["v1", "conversations", _]) => "GET /v1/conversations/{id}",
        ("DELETE", ["v1", "conversations", _]) => "DELETE /v1/conversations/{id}",
        _ => "other",
    }
}

/// Writes the request's line and metrics once it is over.
struct End {
    route: &'static str,
    method: &'static str,
    status: u16,
    started: Instant,
    record: access::Record,
}

impl Drop for End {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        metrics::http_handled(self.route, self.method, self.status, took);
        self.record.log(self.route, itoa(self.status), took);
    }
}

/// A status code's text without allocating: the common ones, else `other`.
fn itoa(status: u16) -> &'static str {
    match status {
        200 => "200",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        409 => "409",
        413 => "413",
        429 => "429",
        500 => "500",
        503 => "503",
        504 => "504",
        _ => "other",
    }
}

/// The middleware.
pub(super) async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = match *request.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    };
    let route = route(request.method(), request.uri().path());
    let record = access::Record::default();
    let response = access::scope(record.clone(), next.run(request)).await;
    let end = End {
        route,
        method,
        status: response.status().as_u16(),
        started,
        record,
    };
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        drop(end);
        return response;
    }
    // The line waits for the stream's end, or the client leaving.
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _ = &end;
            chunk
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_labelled_from_a_fixed_list() {
        assert_eq!(
            route(&Method::POST, "/v1/agents/helper/turns"),
            "POST /v1/agents/{agent}/turns"
        );
        assert_eq!(
            route(&Method::GET, "/v1/models/agent/helper"),
            "GET /v1/models/{model}"
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/conversations/abc"),
            "DELETE /v1/conversations/{id}"
        );
        assert_eq!(route(&Method::GET, "/v1/chat/completions"), "other");
        assert_eq!(route(&Method::GET, "/wp-admin"), "other");
    }
}
