//! The MCP endpoint (SPEC §9.5): the registry served as an MCP server over
//! Streamable HTTP, so any MCP client can list and call the tools its key
//! may use, through the pipeline's one entry point (`call::tool`), audited
//! and metered like a gRPC `InvokeTool`.
//!
//! Authentication is the gRPC API's: `authorization: Bearer <key>` (or
//! `x-api-key`). The team is the key's when it has one; a key for several
//! teams names it in `x-team-id`.

use super::auth::trace_of;
use crate::{
    auth::{Authenticator, Principal},
    call::{CallContext, CallError, Pipeline, tool::ToolRequest},
    config::McpEndpointConfig,
    domain::{Channel, Priority, instant_after},
    tools::{Denial, Status, invocations::Mode},
};
use axum::{extract::Request, http::StatusCode, middleware::Next, response::Response};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
        Tool as McpTool,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
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
        CallError::ToolDenied(Denial::NotFound) => {
            McpError::invalid_params(format!("{reason}: no such tool"), None)
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
        let who = Self::caller(&ctx)?;
        let config = self.pipeline.config();
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
        let name = request.name.to_string();
        let call = self
            .pipeline
            .open(call_ctx, &format!("tool:{name}"))
            .map_err(denied)?;
        let input = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let invoked = call
            .invoke_tool(
                &who.principal,
                ToolRequest {
                    tool: name,
                    input,
                    mode: Mode::Sync,
                    idempotency_key: None,
                    agent: None,
                },
            )
            .await;
        let (result, _meta) = call.finish(invoked).await.map_err(denied)?;
        Ok(match (result.status, result.output, result.error) {
            (Status::Succeeded, Some(output), _) => CallToolResult::structured(output).into(),
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

/// The team a key acts for on the MCP endpoint: `x-team-id` when sent (and
/// allowed), else the key's only team, else none (tenant tools refuse).
fn team_of(principal: &Principal, headers: &http::HeaderMap) -> Result<String, StatusCode> {
    if let Some(team) = headers.get("x-team-id").and_then(|v| v.to_str().ok()) {
        return if principal.may_act_for(team) {
            Ok(team.to_owned())
        } else {
            Err(StatusCode::FORBIDDEN)
        };
    }
    Ok(principal.teams.single().unwrap_or_default())
}

/// Serves the endpoint on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    config: McpEndpointConfig,
    pipeline: Pipeline,
    auth: Authenticator,
    mut stop: watch::Receiver<bool>,
) {
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut server_config =
        StreamableHttpServerConfig::default().with_cancellation_token(cancel.child_token());
    server_config = if config.allowed_hosts.is_empty() {
        server_config
    } else {
        server_config.with_allowed_hosts(config.allowed_hosts.clone())
    };
    let endpoint = Endpoint { pipeline };
    let service = StreamableHttpService::new(
        move || Ok(endpoint.clone()),
        LocalSessionManager::default().into(),
        server_config,
    );
    let authenticate = move |mut req: Request, next: Next| {
        let auth = auth.clone();
        async move {
            let metadata = tonic::metadata::MetadataMap::from_headers(req.headers().clone());
            let principal = auth
                .authenticate(&metadata)
                .map_err(|_| StatusCode::UNAUTHORIZED)?;
            let team = team_of(&principal, req.headers())?;
            let caller = McpCaller {
                principal,
                team,
                trace_id: trace_of(&metadata),
            };
            req.extensions_mut().insert(caller);
            Ok::<Response, StatusCode>(next.run(req).await)
        }
    };
    let app = axum::Router::new()
        .nest_service(&config.path, service)
        .layer(axum::middleware::from_fn(authenticate));
    let stopping = async move {
        let _ = stop.wait_for(|s| *s).await;
        cancel.cancel();
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stopping)
        .await
    {
        tracing::error!(error = %e, "MCP endpoint failed");
    }
}
