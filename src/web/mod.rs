//! The HTTP edge (SPEC §13): an OpenAI-compatible API and agent turns over
//! Server-Sent Events, a thin translation onto the same pipeline as gRPC.
//! A handler parses (its caller in [`caller`], its body within the limits
//! here), calls `Pipeline::run`, `stream_chat` or `converse`, and maps the
//! answer; every failure becomes a response in [`error`], from gRPC's own
//! mapping. Keys, teams, trace IDs, metering, caps, audit, spans, the access
//! log and metrics are therefore gRPC's.

mod agents;
mod callbacks;
mod caller;
mod chat;
mod error;
mod models;
mod observe;
mod streams;

use crate::{
    api::error::Failure,
    auth::Authenticator,
    call::Pipeline,
    config::HttpConfig,
    domain::json,
    telemetry::trace_id::{self, TRACE_ID_HEADER},
};
use axum::{
    Router,
    body::Body,
    extract::Request,
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::{get, post},
    serve::ListenerExt,
};
use error::HttpError;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::{net::TcpListener, sync::watch};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// What every handler shares.
#[derive(Clone)]
struct Edge {
    pipeline: Pipeline,
    auth: Authenticator,
    /// The SSE streams under way, cut at the end of the shutdown grace.
    streams: streams::Streams,
}

/// The routes, behind CORS and the access log.
fn app(edge: Edge, config: &HttpConfig) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*model}", get(models::one))
        .route("/v1/agents/{agent}/turns", post(agents::turn))
        .route(
            "/v1/tool-invocations/{id}/complete",
            post(callbacks::complete),
        )
        .route(
            "/v1/conversations/{id}",
            get(agents::get_conversation).delete(agents::delete_conversation),
        )
        .fallback(unknown_route)
        .method_not_allowed_fallback(unknown_method)
        .with_state(edge)
        .layer(axum::middleware::from_fn(observe::observe))
        .layer(cors(&config.cors_origins))
        .layer(axum::middleware::from_fn(stamp_trace))
}

/// The caller's trace ID when valid, else a new one (for answers given
/// before a handler resolved it: preflights, unknown routes).
fn trace_of(headers: &HeaderMap) -> String {
    trace_id::resolve("", headers).map_or_else(|_| trace_id::generate(), |(t, _)| t)
}

/// Every response carries `x-trace-id`: its handler's, else the caller's.
async fn stamp_trace(request: Request, next: Next) -> Response {
    let trace = trace_of(request.headers());
    let mut response = next.run(request).await;
    if !response.headers().contains_key(TRACE_ID_HEADER) {
        response = traced(response, &trace);
    }
    response
}

/// CORS for the configured origins: a preflight is answered here, the
/// headers a browser may read are the trace ID and the retry hints.
fn cors(origins: &[String]) -> CorsLayer {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        // Validated at load; an unparsable one would match nothing anyway.
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        // The SDKs send their own `x-stainless-*` headers; a bearer key in a
        // header (never a cookie) is what authorises, so any header may come.
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([
            HeaderName::from_static(TRACE_ID_HEADER),
            HeaderName::from_static("retry-after"),
            HeaderName::from_static("retry-after-ms"),
        ])
        .max_age(std::time::Duration::from_secs(600))
}

/// A path we do not serve: 404 in OpenAI's shape.
async fn unknown_route(request: Request) -> Response {
    let path: String = request.uri().path().chars().take(128).collect();
    let failure = Failure::NotFound(format!("no route {} {path}", request.method()));
    HttpError::new(failure, &trace_of(request.headers())).into_response()
}

/// A method a served path does not take: 405 in OpenAI's shape.
async fn unknown_method(request: Request) -> Response {
    let why = format!("{} is not served on this path", request.method());
    let err = HttpError::invalid("method", &why, &trace_of(request.headers()));
    error::with_status(err, StatusCode::METHOD_NOT_ALLOWED)
}

/// `response` with the request's `x-trace-id`.
fn traced(mut response: Response, trace_id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(trace_id) {
        response.headers_mut().insert(TRACE_ID_HEADER, value);
    }
    response
}

/// The body as JSON within gRPC's limits: at most `server.max_message_bytes`
/// (413 past it, unread), received within `server.default_timeout` (408),
/// at most `server.max_input_bytes` before it is parsed, and nested at most
/// `server.max_input_depth`.
async fn read_json(edge: &Edge, body: Body, trace_id: &str) -> Result<Value, Response> {
    let server = &edge.pipeline.config().server;
    let invalid = |why: &str| HttpError::invalid("body", why, trace_id);
    let bytes = read_body(edge, body, trace_id).await?;
    // Parsed only once it fits: a JSON tree takes many times its text.
    if bytes.len() > server.max_input_bytes {
        let why = format!(
            "is {} bytes, over the {} byte input limit (server.max_input_bytes)",
            bytes.len(),
            server.max_input_bytes
        );
        return Err(invalid(&why).into_response());
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(&format!("is not JSON: {e}")).into_response())?;
    if json::depth(&value) > server.max_input_depth {
        let why = format!(
            "nests deeper than {} levels (server.max_input_depth)",
            server.max_input_depth
        );
        return Err(invalid(&why).into_response());
    }
    Ok(value)
}

/// The raw body: at most `server.max_message_bytes` (413 past it, unread),
/// received within `server.default_timeout` (408).
async fn read_body(edge: &Edge, body: Body, trace_id: &str) -> Result<bytes::Bytes, Response> {
    let server = &edge.pipeline.config().server;
    let limit = server.max_message_bytes;
    let invalid = |why: &str| HttpError::invalid("body", why, trace_id);
    let read = tokio::time::timeout(server.default_timeout, axum::body::to_bytes(body, limit));
    match read.await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if over_limit(&e) => {
            let why = format!("is over {limit} bytes (server.max_message_bytes)");
            Err(error::with_status(
                invalid(&why),
                StatusCode::PAYLOAD_TOO_LARGE,
            ))
        }
        Ok(Err(_)) => Err(invalid("broke off before its end").into_response()),
        Err(_) => {
            let why = "did not arrive within server.default_timeout";
            Err(error::with_status(
                invalid(why),
                StatusCode::REQUEST_TIMEOUT,
            ))
        }
    }
}

/// Whether reading a body failed on its length limit.
fn over_limit(err: &axum::Error) -> bool {
    std::error::Error::source(err).is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
}

/// `value` as `T`; a mismatch is a 400 naming the field (`messages[1].role`).
fn typed<T: DeserializeOwned>(value: Value, trace_id: &str) -> Result<T, HttpError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let why = e.into_inner().to_string();
        HttpError::invalid(&field_of(&path, &why), &why, trace_id)
    })
}

/// The field a serde error is about: its path, and for a missing field
/// the field itself (`messages[0].content`, not `messages[0]`).
fn field_of(path: &str, why: &str) -> String {
    let missing = why
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name);
    match (path, missing) {
        (".", Some(name)) => name.to_owned(),
        (".", None) => "body".to_owned(),
        (path, Some(name)) => format!("{path}.{name}"),
        (path, None) => path.to_owned(),
    }
}

/// Serves the edge on `listener` until `draining` turns true; streams under
/// way then get `server.shutdown_grace` to end, and are cut after it.
pub async fn serve(
    listener: TcpListener,
    config: HttpConfig,
    pipeline: Pipeline,
    auth: Authenticator,
    draining: watch::Receiver<bool>,
) {
    let grace = pipeline.config().server.shutdown_grace;
    let (streams, cutter) = streams::new();
    let app = app(
        Edge {
            pipeline,
            auth,
            streams,
        },
        &config,
    );
    // Nagle off, as on the gRPC listener: a small reply on a kept-alive
    // connection would wait for the client's delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on an HTTP connection");
        }
    });
    let mut stop_accepting = draining.clone();
    let mut give_up = draining;
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop_accepting.wait_for(|d| *d).await;
    });
    let deadline = async move {
        let _ = give_up.wait_for(|d| *d).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = server => if let Err(e) = served {
            tracing::error!(error = %e, "HTTP edge failed");
        },
        () = deadline => {
            tracing::warn!("HTTP edge: streams still open after the shutdown grace; cutting them");
            cutter.cut().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body shaped like the chat request's.
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)] // only deserialized
    struct Probe {
        model: String,
        messages: Vec<ProbeMessage>,
        #[serde(default)]
        temperature: Option<f32>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(tag = "role", rename_all = "lowercase")]
    #[allow(dead_code)] // only deserialized
    enum ProbeMessage {
        User { content: String },
    }

    #[test]
    fn a_serde_error_names_the_field() {
        let refused = |body: Value| {
            let err = typed::<Probe>(body, "t").unwrap_err();
            err.body()["error"]["param"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(refused(serde_json::json!({"messages": []})), "model");
        assert_eq!(
            refused(serde_json::json!({"model": "m", "messages": [{"role": "user"}]})),
            "messages[0].content"
        );
        assert_eq!(
            refused(serde_json::json!({"model": "m", "messages": [], "temperature": "hot"})),
            "temperature"
        );
        assert_eq!(refused(serde_json::json!("just text")), "body");
    }
}
