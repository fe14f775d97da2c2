//! `ToolService` (SPEC §9.6): thin translations around the pipeline's one
//! entry point (`call::tool`).

use super::{
    auth, convert,
    error::{Failure, to_status},
    open,
    pb::{self, tool_service_server::ToolService},
    reply, request,
};
use crate::{
    auth::Authenticator,
    call::{
        Pipeline,
        tool::{InvokeTool, ToolRequest, ToolResult},
    },
    config::{Config, ServerConfig},
    tools::{
        Kind, Status as InvocationStatus, approvals,
        invocations::{self, Mode},
    },
};
use prost::Message;
use serde_json::{Map, Value};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `ToolService`.
#[derive(Clone)]
pub struct ToolServiceApi {
    config: Arc<Config>,
    pipeline: Pipeline,
    auth: Authenticator,
}

impl ToolServiceApi {
    /// A service over the call pipeline.
    pub fn new(config: Arc<Config>, pipeline: Pipeline, auth: Authenticator) -> Self {
        Self {
            config,
            pipeline,
            auth,
        }
    }

    /// An `InvokeTool` request as the entry point takes it: the tool named,
    /// the idempotency key a header value, the input within the limits.
    fn tool_request(&self, req: pb::InvokeToolRequest) -> Result<ToolRequest, Failure> {
        if req.tool.is_empty() {
            return Err(Failure::invalid("tool", "is required"));
        }
        check_idempotency_key(&req.idempotency_key)
            .map_err(|why| Failure::invalid("idempotency_key", why))?;
        if let Some(input) = &req.input {
            request::check_finite("input", input)?;
        }
        let input = Value::Object(req.input.map(convert::struct_to_json).unwrap_or_default());
        let other = [
            ("tool", req.tool.len()),
            ("idempotency_key", req.idempotency_key.len()),
            (
                "context",
                req.context.as_ref().map_or(0, Message::encoded_len),
            ),
            (
                "budget",
                req.budget.as_ref().map_or(0, Message::encoded_len),
            ),
        ];
        check_tool_input("input", &input, &other, &self.config.server)?;
        let mode = match pb::InvocationMode::try_from(req.mode) {
            Ok(pb::InvocationMode::Async) => Mode::Async,
            _ => Mode::Sync,
        };
        Ok(ToolRequest {
            tool: req.tool,
            input,
            mode,
            idempotency_key: (!req.idempotency_key.is_empty()).then_some(req.idempotency_key),
            agent: None,
            call_id: None,
            approved: None,
        })
    }
}

fn kind(k: &Kind) -> pb::ToolKind {
    match k {
        Kind::Builtin => pb::ToolKind::Builtin,
        Kind::Http(_) => pb::ToolKind::Http,
        Kind::Mcp { .. } => pb::ToolKind::Mcp,
        Kind::Task(_) => pb::ToolKind::Task,
    }
}

fn status(s: InvocationStatus) -> pb::InvocationStatus {
    match s {
        InvocationStatus::Pending => pb::InvocationStatus::Pending,
        InvocationStatus::Running | InvocationStatus::AwaitingCallback => {
            pb::InvocationStatus::Running
        }
        InvocationStatus::Succeeded => pb::InvocationStatus::Succeeded,
        InvocationStatus::Failed => pb::InvocationStatus::Failed,
        InvocationStatus::TimedOut => pb::InvocationStatus::TimedOut,
        InvocationStatus::AwaitingApproval => pb::InvocationStatus::AwaitingApproval,
        InvocationStatus::Rejected => pb::InvocationStatus::Rejected,
    }
}

/// The key a tool output that is not a JSON object is carried under.
pub const OUTPUT_KEY: &str = "result";

/// Most bytes of a caller's idempotency key.
const MAX_IDEMPOTENCY_KEY: usize = 255;

/// A caller's idempotency key becomes a webhook's `Idempotency-Key` header, so it must be
/// a header value: visible ASCII, no spaces (a header's edges would lose them).
fn check_idempotency_key(key: &str) -> Result<(), &'static str> {
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("may only contain visible ASCII characters, without spaces");
    }
    if key.len() > MAX_IDEMPOTENCY_KEY {
        return Err("must be at most 255 characters");
    }
    Ok(())
}

/// A tool's output as both edges carry it (docs/tools.md): an object as is, any other JSON
/// value (such as n8n's array) as `{"result": <value>}`, since neither a `Struct` nor MCP's
/// `structuredContent` holds anything else. Only the edges wrap: the stored invocation,
/// the audit digest, `output_schema` and the agent loop see the value as it came.
pub(super) fn output_object(output: Value) -> Map<String, Value> {
    match output {
        Value::Object(object) => object,
        other => {
            let mut wrapped = Map::new();
            wrapped.insert(OUTPUT_KEY.to_owned(), other);
            wrapped
        }
    }
}

/// The request limits every RPC obeys (`server.max_input_depth`, `server.max_input_bytes`)
/// for a tool input `field` and the request's `other` fields. The input counts as compact
/// JSON, one measure whichever transport (gRPC `Struct`, MCP `arguments`) brought it.
pub(super) fn check_tool_input(
    field: &str,
    input: &Value,
    other: &[(&str, usize)],
    server: &ServerConfig,
) -> Result<(), Failure> {
    // Depth first: it is walked without recursion, and it bounds the
    // recursion of the serializer that measures the size.
    request::check_depth(field, request::json_depth(input), server)?;
    let mut fields = vec![(field, request::json_bytes(input))];
    fields.extend_from_slice(other);
    let total = fields
        .iter()
        .fold(0_usize, |sum, (_, bytes)| sum.saturating_add(*bytes));
    request::check_input(total, &fields, server)
}

/// An invocation in proto terms.
pub fn invocation(r: &ToolResult) -> pb::ToolInvocation {
    pb::ToolInvocation {
        invocation_id: r.invocation_id.clone(),
        tool: r.tool.clone(),
        version: r.version.clone(),
        status: status(r.status) as i32,
        output: r
            .output
            .clone()
            .map(output_object)
            .map(convert::json_to_struct),
        error: r.error.as_ref().map(|e| pb::ToolError {
            code: e.code.clone(),
            message: e.message.clone(),
        }),
        cost_usd: crate::usage::pricing::usd(r.cost_micros),
        duration_ms: u64::try_from(r.duration_ms).unwrap_or(0),
        deduplicated: r.deduplicated,
        execution_id: r.execution_id.clone().unwrap_or_default(),
        attempts: u32::try_from(r.attempts).unwrap_or(0),
        approval_id: r.approval_id.clone().unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl ToolService for ToolServiceApi {
    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let ctx = request::call_context(req.context.as_ref(), None, &metadata, &self.config.server)
            .map_err(|(trace_id, failure)| to_status(failure, &trace_id))?;
        super::access::note(|f| f.team.clone_from(&ctx.team_id));
        let fail = |f: Failure| to_status(f, &ctx.trace_id);
        let principal = auth::principal(&extensions, &self.auth)
            .and_then(|p| auth::check_team(&p, "context.team_id", &ctx.team_id).map(|()| p))
            .map_err(fail)?;
        let tools = self
            .pipeline
            .tools_for(&principal, &ctx.team_id)
            .into_iter()
            .map(|t| pb::Tool {
                name: t.name.clone(),
                version: t.version.to_string(),
                description: t.description.clone(),
                kind: kind(&t.kind) as i32,
                side_effects: t.side_effects,
                input_schema: t.input_schema.to_string(),
                deprecated: t.deprecated,
                replacement: t.replacement.clone(),
            })
            .collect();
        Ok(reply(
            &ctx.trace_id,
            pb::ListToolsResponse {
                tools,
                meta: Some(pb::ResponseMeta {
                    trace_id: ctx.trace_id.clone(),
                    ..Default::default()
                }),
            },
        ))
    }

    async fn invoke_tool(
        &self,
        request: Request<pb::InvokeToolRequest>,
    ) -> Result<Response<pb::InvokeToolResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let caller = open::caller(
            &self.config,
            &self.auth,
            (pb::tool_service_server::SERVICE_NAME, "InvokeTool"),
            (req.context.as_ref(), req.budget.as_ref()),
            &metadata,
            &extensions,
        )?;
        let request = self.tool_request(req).map_err(|f| caller.fail(f))?;
        let feature = InvokeTool {
            principal: caller.principal.clone(),
            request,
        };
        open::unary(&self.pipeline, Ok((caller, feature)), |result, meta| {
            pb::InvokeToolResponse {
                invocation: Some(invocation(&result)),
                meta: Some(convert::meta(meta)),
            }
        })
        .await
    }

    async fn get_tool_invocation(
        &self,
        request: Request<pb::GetToolInvocationRequest>,
    ) -> Result<Response<pb::ToolInvocation>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let ctx = request::call_context(req.context.as_ref(), None, &metadata, &self.config.server)
            .map_err(|(trace_id, failure)| to_status(failure, &trace_id))?;
        super::access::note(|f| f.team.clone_from(&ctx.team_id));
        let fail = |f: Failure| to_status(f, &ctx.trace_id);
        auth::principal(&extensions, &self.auth)
            .and_then(|p| auth::check_team(&p, "context.team_id", &ctx.team_id))
            .map_err(fail)?;
        let found = invocations::get(self.pipeline.store(), &ctx.team_id, &req.invocation_id)
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        match found {
            Some(inv) => {
                let mut result = ToolResult::from_stored(&inv, false);
                // Held or not, the approval it went through (an indexed read).
                result.approval_id =
                    approvals::for_invocation(self.pipeline.store(), &ctx.team_id, &inv.id)
                        .await
                        .map_err(|e| fail(Failure::Storage(e.to_string())))?
                        .map(|a| a.id);
                Ok(reply(&ctx.trace_id, invocation(&result)))
            }
            None => Err(fail(Failure::NotFound(format!(
                "tool invocation `{}`",
                req.invocation_id
            )))),
        }
    }
}
