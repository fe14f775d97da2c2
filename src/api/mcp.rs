//! The MCP endpoint (SPEC §9.5): the tools a key may use, served over Streamable HTTP
//! through the pipeline's one entry point (`call::tool`), audited and metered like gRPC.
//!
//! Authentication is the gRPC API's (`authorization: Bearer`, or `x-api-key`); a key for
//! several teams names one in `x-team-id`. Arguments obey every gRPC request's limits, and
//! sessions are capped (`sessions`).

mod sessions;
mod store;

use super::{
    auth::trace_of,
    error::{
        Failure,
        reason::{INTERNAL, INVALID_INPUT, MCP_SESSIONS_FULL},
    },
    request::check_id,
    tools::{check_tool_input, output_object},
};
use crate::{
    auth::{Authenticator, Principal},
    call::{
        CallContext, CallError, Pipeline,
        tool::{InvokeTool, ToolRequest},
    },
    config::McpEndpointConfig,
    domain::{Channel, Priority, instant_after},
    tools::{Denial, Status, invocations::Mode},
};
use axum::{
    extract::Request,
    http::StatusCode,
    middleware::Next,
    response::{IntoResponse, Response},
    serve::ListenerExt,
};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
        Tool as McpTool,
    },
    service::RequestContext,
    transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService},
};
use sessions::{Sessions, noting_refusals};
use std::sync::Arc;
use tokio::{net::TcpListener, sync::watch};

/// Who called, as the auth middleware found them.
#[derive(Debug, Clone)]
struct McpCaller {
    principal: Principal,
    team: String,
    trace_id: String,
}

/// The MCP server over the pipeline.
#[derive(Clone)]
struct Endpoint {
    pipeline: Pipeline,
    /// `tools/call`s under way: shutdown waits for them, not for idle sessions.
    calls: Arc<watch::Sender<usize>>,
}

/// One `tools/call` counted in [`Endpoint::calls`] while it lives.
struct Counted(Arc<watch::Sender<usize>>);

impl Counted {
    fn new(calls: &Arc<watch::Sender<usize>>) -> Self {
        calls.send_modify(|n| *n += 1);
        Self(Arc::clone(calls))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Endpoint {
    fn caller(ctx: &RequestContext<RoleServer>) -> Result<McpCaller, McpError> {
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<McpCaller>())
            .cloned()
            .ok_or_else(|| McpError::internal_error("no authenticated caller", None))
    }
}

/// A denial as the MCP client reads it.
fn denied(err: CallError) -> McpError {
    let reason = err.reason().unwrap_or("INTERNAL");
    match err {
        CallError::Invalid(v) => {
            let what: Vec<String> = v.iter().map(|(at, why)| format!("{at}: {why}")).collect();
            McpError::invalid_params(format!("{INVALID_INPUT}: {}", what.join("; ")), None)
        }
        CallError::ToolDenied(Denial::NotFound(name)) => {
            McpError::invalid_params(format!("{reason}: no tool `{name}`"), None)
        }
        CallError::ToolDenied(Denial::InputInvalid(v)) => {
            let what: Vec<String> = v.iter().map(|(at, why)| format!("{at}: {why}")).collect();
            McpError::invalid_params(format!("{reason}: {}", what.join("; ")), None)
        }
        CallError::ToolDenied(_) | CallError::Quota(_) | CallError::ToolBudget { .. } => {
            McpError::invalid_request(format!("{reason}: the invocation was refused"), None)
        }
        CallError::Overloaded => {
            McpError::internal_error("OVERLOADED: too many calls in flight; retry", None)
        }
        other => McpError::internal_error(format!("{other:?}"), None),
    }
}

/// Arguments refused by the request limits: INVALID_INPUT, as on gRPC.
fn refused(failure: Failure) -> McpError {
    match failure {
        Failure::Invalid(v) => denied(CallError::Invalid(v)),
        // The limits refuse nothing else.
        _ => McpError::internal_error(INTERNAL, None),
    }
}

impl ServerHandler for Endpoint {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("ai-orchestrator", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let who = Self::caller(&ctx)?;
        let mut seen = std::collections::BTreeSet::new();
        let tools = self
            .pipeline
            .tools_for(&who.principal, &who.team)
            .into_iter()
            // Newest version first: MCP names carry no version.
            .filter(|t| seen.insert(t.name.clone()))
            .map(|t| {
                let schema: JsonObject = t.input_schema.as_object().cloned().unwrap_or_default();
                McpTool::new(t.name.clone(), t.description.clone(), Arc::new(schema))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let _counted = Counted::new(&self.calls);
        let who = Self::caller(&ctx)?;
        let config = self.pipeline.config();
        let name = request.name.to_string();
        let input = serde_json::Value::Object(request.arguments.unwrap_or_default());
        // gRPC's limits, checked before the call opens: a refused input takes no slot
        // under `server.max_concurrent_requests`.
        check_tool_input("arguments", &input, &[("name", name.len())], &config.server)
            .map_err(refused)?;
        let started = tokio::time::Instant::now();
        let call_ctx = CallContext {
            team_id: who.team.clone(),
            user_id: String::new(),
            trace_id: who.trace_id.clone(),
            channel: Channel::System,
            priority: Priority::Interactive,
            started,
            started_at_ms: chrono::Utc::now().timestamp_millis(),
            deadline: instant_after(started, config.server.default_timeout),
            budget_usd: None,
            traceparent: None,
            principal: who.principal.name.clone(),
        };
        let invocation = InvokeTool {
            principal: who.principal,
            request: ToolRequest {
                tool: name,
                input,
                mode: Mode::Sync,
                idempotency_key: None,
                agent: None,
                call_id: None,
                approved: None,
            },
        };
        let (result, _meta) = self
            .pipeline
            .run(call_ctx, invocation)
            .await
            .map_err(denied)?;
        Ok(match (result.status, result.output, result.error) {
            // `structuredContent` must be an object: a non-object output is
            // wrapped as on gRPC, so both edges show the same shape.
            (Status::Succeeded, Some(output), _) => {
                let output = serde_json::Value::Object(output_object(output));
                CallToolResult::structured(output).into()
            }
            // Held for a person: MCP has no pending result, so the client is
            // told what to poll (GetToolInvocation) or decide (ApprovalService).
            (Status::AwaitingApproval, _, _) => {
                let text = format!(
                    "AWAITING_APPROVAL: held for a person's decision (approval {}, invocation {}); \
                     it runs once approved",
                    result.approval_id.unwrap_or_default(),
                    result.invocation_id
                );
                CallToolResult::error(vec![ContentBlock::text(text)]).into()
            }
            // A workflow that calls back took the work on: not an error.
            (Status::AwaitingCallback, _, _) => {
                let accepted = serde_json::json!({
                    "status": "ACCEPTED",
                    "invocation_id": result.invocation_id,
                    "note": "the workflow accepted the work and reports its result later",
                });
                CallToolResult::structured(accepted).into()
            }
            (_, _, error) => {
                let text = error.map_or_else(
                    || "the tool failed".to_owned(),
                    |e| format!("{}: {}", e.code, e.message),
                );
                CallToolResult::error(vec![ContentBlock::text(text)]).into()
            }
        })
    }
}

/// Whether rmcp would open a session for this request: a POST without a session ID
/// (as rmcp reads the header) whose JSON-RPC method is `initialize`.
fn opens_session(parts: &http::request::Parts, body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method {
        method: Option<String>,
    }
    let no_session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .is_none();
    parts.method == http::Method::POST
        && no_session
        && serde_json::from_slice::<Method>(body)
            .is_ok_and(|m| m.method.as_deref() == Some("initialize"))
}

/// The answer to an `initialize` past `mcp_endpoint.max_sessions`: 503,
/// to be retried once a session has closed or gone idle.
fn session_cap(max: usize) -> Response {
    // Counted, not logged at warning: a client retrying `initialize`
    // would fill the log.
    crate::telemetry::metrics::error_reason(MCP_SESSIONS_FULL);
    tracing::debug!(max, "MCP session refused: the endpoint holds its maximum");
    let message = format!(
        "{MCP_SESSIONS_FULL}: the MCP endpoint holds its maximum of {max} sessions; close one, or retry later"
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(http::header::RETRY_AFTER, "5")],
        message,
    )
        .into_response()
}

/// The team a key acts for: `x-team-id` when sent (400 unless a valid ID, 403 unless the
/// key may act for it), else the key's only team, else none (tenant tools refuse).
fn team_of(
    principal: &Principal,
    headers: &http::HeaderMap,
) -> Result<String, (StatusCode, String)> {
    let Some(value) = headers.get("x-team-id") else {
        return Ok(principal.teams.single().unwrap_or_default());
    };
    // The ID is checked first, as on gRPC: a `*` key would otherwise take any text as a
    // team, and team IDs reach logs, metric labels and SQL. Non-UTF-8 bytes become
    // U+FFFD, which the check refuses.
    let team = String::from_utf8_lossy(value.as_bytes()).into_owned();
    if let Err(why) = check_id(&team, true) {
        let message = format!("{INVALID_INPUT}: x-team-id: {why}");
        return Err((StatusCode::BAD_REQUEST, message));
    }
    if principal.may_act_for(&team) {
        Ok(team)
    } else {
        Err((StatusCode::FORBIDDEN, String::new()))
    }
}

/// Serves the endpoint on `listener` until `stop`; its sessions are the
/// fleet's when there is a `cluster`.
pub async fn serve(
    listener: TcpListener,
    config: McpEndpointConfig,
    pipeline: Pipeline,
    auth: Authenticator,
    cluster: Option<crate::cluster::Cluster>,
    draining: watch::Receiver<bool>,
) {
    let grace = pipeline.config().server.shutdown_grace;
    let max_body = pipeline.config().server.max_message_bytes;
    let cancel = tokio_util::sync::CancellationToken::new();
    // A body is bounded like a gRPC message (413 past it), before any of
    // it is parsed; the arguments then meet the input limits in call_tool.
    let mut server_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(cancel.child_token())
        .with_max_request_body_bytes(pipeline.config().server.max_message_bytes);
    server_config = if config.allowed_hosts.is_empty() {
        server_config
    } else {
        server_config.with_allowed_hosts(config.allowed_hosts.clone())
    };
    server_config.session_store = cluster.map(|cluster| {
        Arc::new(store::SharedSessions::new(cluster))
            as Arc<dyn rmcp::transport::streamable_http_server::session::SessionStore>
    });
    let calls = Arc::new(watch::Sender::new(0_usize));
    let endpoint = Endpoint {
        pipeline,
        calls: Arc::clone(&calls),
    };
    let max_sessions = config.max_sessions;
    let sessions = Arc::new(Sessions::new(max_sessions));
    let service = StreamableHttpService::new(
        move || Ok(endpoint.clone()),
        Arc::clone(&sessions),
        server_config,
    );
    let authenticate = move |mut req: Request, next: Next| {
        let auth = auth.clone();
        let sessions = Arc::clone(&sessions);
        async move {
            let metadata = tonic::metadata::MetadataMap::from_headers(req.headers().clone());
            let principal = auth
                .authenticate(&metadata)
                .map_err(|_| StatusCode::UNAUTHORIZED.into_response())?;
            let team = team_of(&principal, req.headers()).map_err(IntoResponse::into_response)?;
            let caller = McpCaller {
                principal,
                team,
                trace_id: trace_of(&metadata),
            };
            req.extensions_mut().insert(caller);
            // Only while the cap is reached is a body read here, to tell an
            // `initialize` (refused) from the rest (served).
            if sessions.full().await {
                let (req_parts, body) = req.into_parts();
                let Ok(body) = axum::body::to_bytes(body, max_body).await else {
                    return Err(StatusCode::PAYLOAD_TOO_LARGE.into_response());
                };
                if opens_session(&req_parts, &body) {
                    return Err(session_cap(max_sessions));
                }
                req = Request::from_parts(req_parts, axum::body::Body::from(body));
            }
            match noting_refusals(next.run(req)).await {
                (_, true) => Err(session_cap(max_sessions)),
                (answer, false) => Ok::<Response, Response>(answer),
            }
        }
    };
    let app = axum::Router::new()
        .nest_service(&config.path, service)
        .layer(axum::middleware::from_fn(authenticate));
    // On shutdown no connection is accepted; calls in flight get gRPC's grace, then every
    // session ends (its event stream would otherwise hold its connection open for ever).
    let mut stop_accepting = draining.clone();
    let mut end_sessions = draining;
    let ending = async move {
        let _ = end_sessions.wait_for(|d| *d).await;
        let mut under_way = calls.subscribe();
        let _ = tokio::time::timeout(grace, under_way.wait_for(|n| *n == 0)).await;
        cancel.cancel();
        std::future::pending::<()>().await;
    };
    // Nagle off, as on the gRPC listener: a small reply on a kept-alive
    // connection would wait for the client's delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on an MCP connection");
        }
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop_accepting.wait_for(|d| *d).await;
    });
    tokio::select! {
        served = server => if let Err(e) = served {
            tracing::error!(error = %e, "MCP endpoint failed");
        },
        () = ending => {}
    }
}
