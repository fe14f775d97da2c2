//! `ToolAdmin` (SPEC §16): thin translations around the pipeline's runtime
//! tool registry (`call::tool::admin`).

use super::{
    auth::principal,
    convert::{json_to_struct, struct_to_json},
    error::{Failure, to_status},
    pb::{self, tool_admin_server::ToolAdmin},
    reply,
    request::{self, metadata_trace},
};
use crate::{
    auth::{Authenticator, Principal},
    call::{
        Pipeline,
        tool::admin::{Registration, ToolAdminError, ToolVersion},
    },
    config::Config,
    tools::registry::Source,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `ToolAdmin` service.
#[derive(Clone)]
pub struct ToolAdminApi {
    config: Arc<Config>,
    pipeline: Pipeline,
    auth: Authenticator,
}

impl ToolAdminApi {
    /// A service over the call pipeline.
    pub fn new(config: Arc<Config>, pipeline: Pipeline, auth: Authenticator) -> Self {
        Self {
            config,
            pipeline,
            auth,
        }
    }

    /// The request's trace ID and principal.
    fn open<T>(&self, request: Request<T>) -> Result<(String, Principal, T), Status> {
        let trace_id = metadata_trace(request.metadata())?;
        let (_, extensions, req) = request.into_parts();
        let principal = principal(&extensions, &self.auth).map_err(|f| to_status(f, &trace_id))?;
        Ok((trace_id, principal, req))
    }
}

fn kind(k: &str) -> pb::ToolKind {
    match k {
        "builtin" => pb::ToolKind::Builtin,
        "http" => pb::ToolKind::Http,
        "mcp" => pb::ToolKind::Mcp,
        "task" => pb::ToolKind::Task,
        _ => pb::ToolKind::Unspecified,
    }
}

fn source(s: Source) -> pb::ToolSource {
    match s {
        Source::Builtin => pb::ToolSource::Builtin,
        Source::Config => pb::ToolSource::Config,
        Source::Mcp => pb::ToolSource::Mcp,
        Source::Registry => pb::ToolSource::Registry,
    }
}

fn version(v: ToolVersion) -> pb::ToolVersion {
    let stored = v.stored;
    let config = stored
        .as_ref()
        .and_then(|r| r.config.as_object().cloned())
        .map(json_to_struct);
    pb::ToolVersion {
        kind: kind(&v.kind) as i32,
        source: source(v.source) as i32,
        name: v.name,
        version: v.version,
        enabled: v.enabled,
        disabled_reason: v.disabled_reason,
        deprecated: v.deprecated,
        replacement: v.replacement,
        config,
        registered_by: stored
            .as_ref()
            .map(|r| r.registered_by.clone())
            .unwrap_or_default(),
        changed_by: stored
            .as_ref()
            .map(|r| r.changed_by.clone())
            .unwrap_or_default(),
        created_at_ms: stored.as_ref().map_or(0, |r| r.created_at_ms),
        updated_at_ms: stored.as_ref().map_or(0, |r| r.updated_at_ms),
        loaded: v.loaded,
    }
}

fn versions(v: Vec<ToolVersion>) -> pb::ToolVersions {
    pb::ToolVersions {
        versions: v.into_iter().map(version).collect(),
    }
}

/// Bounds a name, a version or a replacement before it reaches the store.
fn check_text(field: &str, value: &str) -> Result<(), Failure> {
    if value.len() > 200 {
        return Err(Failure::invalid(field, "is over 200 bytes"));
    }
    Ok(())
}

#[tonic::async_trait]
impl ToolAdmin for ToolAdminApi {
    async fn register_tool(
        &self,
        request: Request<pb::RegisterToolRequest>,
    ) -> Result<Response<pb::ToolVersion>, Status> {
        let (trace_id, principal, req) = self.open(request)?;
        let fail = |f: Failure| to_status(f, &trace_id);
        check_text("name", &req.name).map_err(fail)?;
        check_text("version", &req.version).map_err(fail)?;
        let Some(config) = req.config else {
            return Err(fail(Failure::invalid("config", "is required")));
        };
        let server = &self.config.server;
        request::check_finite("config", &config).map_err(fail)?;
        request::check_depth("config", request::struct_depth(&config), server).map_err(fail)?;
        let config = serde_json::Value::Object(struct_to_json(config));
        let size = config.to_string().len();
        request::check_input(size, &[("config", size)], server).map_err(fail)?;
        let registration = Registration {
            name: req.name,
            version: req.version,
            config,
        };
        let registered = self
            .pipeline
            .register_tool(&principal, &trace_id, registration)
            .await
            .map_err(|e| fail(Failure::ToolAdmin(e)))?;
        Ok(reply(&trace_id, version(registered)))
    }

    async fn disable_tool(
        &self,
        request: Request<pb::DisableToolRequest>,
    ) -> Result<Response<pb::ToolVersions>, Status> {
        let (trace_id, principal, req) = self.open(request)?;
        let fail = |f: Failure| to_status(f, &trace_id);
        check_text("name", &req.name).map_err(fail)?;
        check_text("version", &req.version).map_err(fail)?;
        let changed = self
            .pipeline
            .disable_tool(&principal, &trace_id, &req.name, &req.version, &req.reason)
            .await
            .map_err(|e| fail(Failure::ToolAdmin(e)))?;
        Ok(reply(&trace_id, versions(changed)))
    }

    async fn enable_tool(
        &self,
        request: Request<pb::EnableToolRequest>,
    ) -> Result<Response<pb::ToolVersions>, Status> {
        let (trace_id, principal, req) = self.open(request)?;
        let fail = |f: Failure| to_status(f, &trace_id);
        check_text("name", &req.name).map_err(fail)?;
        check_text("version", &req.version).map_err(fail)?;
        let changed = self
            .pipeline
            .enable_tool(&principal, &trace_id, &req.name, &req.version)
            .await
            .map_err(|e| fail(Failure::ToolAdmin(e)))?;
        Ok(reply(&trace_id, versions(changed)))
    }

    async fn deprecate_tool(
        &self,
        request: Request<pb::DeprecateToolRequest>,
    ) -> Result<Response<pb::ToolVersion>, Status> {
        let (trace_id, principal, req) = self.open(request)?;
        let fail = |f: Failure| to_status(f, &trace_id);
        check_text("name", &req.name).map_err(fail)?;
        check_text("version", &req.version).map_err(fail)?;
        check_text("replacement", &req.replacement).map_err(fail)?;
        let changed = self
            .pipeline
            .deprecate_tool(
                &principal,
                &trace_id,
                &req.name,
                &req.version,
                &req.replacement,
            )
            .await
            .map_err(|e| fail(Failure::ToolAdmin(e)))?;
        Ok(reply(&trace_id, version(changed)))
    }

    async fn list_tool_versions(
        &self,
        request: Request<pb::ListToolVersionsRequest>,
    ) -> Result<Response<pb::ToolVersions>, Status> {
        let (trace_id, principal, req) = self.open(request)?;
        let fail = |f: Failure| to_status(f, &trace_id);
        check_text("name", &req.name).map_err(fail)?;
        let found = self
            .pipeline
            .tool_versions(&principal, &req.name)
            .await
            .map_err(|e: ToolAdminError| fail(Failure::ToolAdmin(e)))?;
        Ok(reply(&trace_id, versions(found)))
    }
}
