//! The registry (SPEC §9.1): every tool by `name@version`, from the config,
//! the built-ins, the MCP servers and the runtime registry (SPEC §16,
//! `stored`), with its schemas compiled once.

mod sql;
pub mod stored;

use super::{Denial, Kind, mcp::McpTool};
use crate::config::{
    ApprovalSetting, Config, ToolConfig, ToolKind,
    tools::{CostConfig, QuotaConfig, ToolRetryConfig},
};
use semver::Version;
use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
    time::Duration,
};

/// One tool.
#[derive(Debug)]
pub struct Tool {
    /// `crm.add_note`; an MCP server's tools are `<server>.<tool>`.
    pub name: String,
    pub version: Version,
    pub description: String,
    pub kind: Kind,
    pub enabled: bool,
    /// Why it was disabled at run time (TOOL_DISABLED carries it); empty otherwise.
    pub disabled_reason: String,
    /// Still callable, but listed as deprecated: `name` alone prefers another version.
    pub deprecated: bool,
    /// What to use instead of a deprecated version (`name@version`), if said.
    pub replacement: String,
    /// Where it was declared.
    pub source: Source,
    /// Writes or sends something.
    pub side_effects: bool,
    /// Its own setting asks a person before each call (`approval = "always"`).
    pub approval: bool,
    /// The capability a caller needs.
    pub capability: String,
    /// Acts on a team's data (refused without one).
    pub tenant_scoped: bool,
    pub timeout: Duration,
    /// Its input's JSON Schema, as given.
    pub input_schema: serde_json::Value,
    /// Compiled.
    pub input: Arc<jsonschema::Validator>,
    /// Its output's JSON Schema, compiled, when checked.
    pub output: Option<Arc<jsonschema::Validator>>,
    pub cost: CostConfig,
    pub quota: QuotaConfig,
}

/// Where a tool was declared: only the runtime registry's may change at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Builtin,
    /// `[tools]` of the config file.
    Config,
    /// Listed by an MCP server of `[mcp_servers]`.
    Mcp,
    /// Registered over `ToolAdmin`, stored in the database.
    Registry,
}

impl Source {
    /// Its spelling in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Builtin => "builtin",
            Source::Config => "config",
            Source::Mcp => "mcp",
            Source::Registry => "registry",
        }
    }
}

impl Tool {
    /// `name@version`.
    pub fn id(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// How its workflow calls back, when it does.
    pub fn callback(&self) -> Option<&Callback> {
        match &self.kind {
            Kind::Http(h) => h.callback.as_ref(),
            _ => None,
        }
    }
}

/// Settings of a webhook tool.
#[derive(Debug, Clone)]
pub struct HttpTool {
    /// Where the input is POSTed.
    pub url: String,
    /// The auth header and its value (read from the environment at load).
    pub auth: Option<(String, crate::config::Secret)>,
    pub retry: ToolRetryConfig,
    pub idempotency_window: Duration,
    /// The response header naming the workflow's execution.
    pub execution_id_header: String,
    /// Set when the workflow reports back by callback (`completion = "callback"`).
    pub callback: Option<Callback>,
}

/// How a workflow that calls back is checked and waited for.
#[derive(Debug, Clone)]
pub struct Callback {
    /// The HMAC-SHA256 key of its `X-Signature`; `None` only when the
    /// environment lacked it and the config was loaded without keys.
    pub secret: Option<crate::config::Secret>,
    /// How long it has to call back.
    pub timeout: Duration,
}

/// A compiled schema, or why not (only an MCP server's can fail here).
fn compile(schema: &serde_json::Value) -> Result<Arc<jsonschema::Validator>, String> {
    jsonschema::draft202012::options()
        .build(schema)
        .map(Arc::new)
        .map_err(|e| format!("{}: {}", e.instance_path(), e.kind().keyword()))
}

/// The built-ins' fixed parts: name, description, input and output schemas.
fn builtins() -> Vec<(
    &'static str,
    &'static str,
    serde_json::Value,
    serde_json::Value,
)> {
    use serde_json::json;
    vec![
        (
            "system.echo",
            "Returns its input text unchanged.",
            json!({"type": "object", "required": ["text"], "additionalProperties": false,
                   "properties": {"text": {"type": "string", "maxLength": 65536}}}),
            json!({"type": "object", "required": ["text"],
                   "properties": {"text": {"type": "string"}}}),
        ),
        (
            "system.health",
            "The service's status and each provider's breaker state.",
            json!({"type": "object", "additionalProperties": false}),
            json!({"type": "object", "required": ["status", "providers"],
                   "properties": {"status": {"type": "string"},
                                  "providers": {"type": "array"}}}),
        ),
        (
            "sms.segments",
            "Counts the SMS segments a text takes (GSM-7 or UCS-2).",
            json!({"type": "object", "required": ["text"], "additionalProperties": false,
                   "properties": {"text": {"type": "string", "maxLength": 65536}}}),
            json!({"type": "object", "required": ["segments", "encoding", "characters"],
                   "properties": {"segments": {"type": "integer"},
                                  "encoding": {"type": "string", "enum": ["GSM7", "UCS2"]},
                                  "characters": {"type": "integer"}}}),
        ),
    ]
}

/// Every tool, by name, newest version first.
#[derive(Debug, Default)]
struct Tools(BTreeMap<String, Vec<Arc<Tool>>>);

impl Tools {
    fn insert(&mut self, tool: Tool) {
        let versions = self.0.entry(tool.name.clone()).or_default();
        versions.retain(|t| t.version != tool.version);
        versions.push(Arc::new(tool));
        versions.sort_by(|a, b| b.version.cmp(&a.version));
    }
}

/// The registry: the config's tools and the built-ins, fixed at start; the
/// runtime registry's, replaced at each refresh; and each MCP server's,
/// replaced whenever it is listed again.
#[derive(Debug)]
pub struct Registry {
    fixed: Tools,
    stored: RwLock<Arc<Tools>>,
    mcp: RwLock<BTreeMap<String, Vec<Arc<Tool>>>>,
}

impl Registry {
    /// The built-ins and the tools of `config` (schemas validated at load); a
    /// built-in named in `[tools]` takes the settings given there.
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let mut fixed = Tools::default();
        let configured = |name: &str| {
            config.tools.iter().find(|(key, t)| {
                t.kind == ToolKind::Builtin
                    && crate::config::tools::name_and_version(key, t.version.as_deref()).0 == name
            })
        };
        for (name, description, input, output) in builtins() {
            let settings = configured(name).map(|(_, t)| t);
            let mut tool = Tool {
                name: name.to_owned(),
                version: Version::new(1, 0, 0),
                description: description.to_owned(),
                kind: Kind::Builtin,
                enabled: true,
                disabled_reason: String::new(),
                deprecated: false,
                replacement: String::new(),
                source: Source::Builtin,
                side_effects: false,
                approval: false,
                capability: format!("tool:{name}"),
                tenant_scoped: false,
                timeout: Duration::from_secs(30),
                input: compile(&input)?,
                input_schema: input,
                output: Some(compile(&output)?),
                cost: CostConfig::default(),
                quota: QuotaConfig::default(),
            };
            if let Some(t) = settings {
                tool.enabled = t.enabled;
                tool.timeout = t.timeout;
                tool.cost = t.cost.clone();
                tool.quota = t.quota;
                tool.approval = t.approval == ApprovalSetting::Always;
                if let Some(cap) = &t.capability {
                    tool.capability.clone_from(cap);
                }
                if !t.description.is_empty() {
                    tool.description.clone_from(&t.description);
                }
            }
            fixed.insert(tool);
        }
        for (key, t) in &config.tools {
            if t.kind == ToolKind::Builtin {
                continue;
            }
            fixed.insert(configured_tool(key, t)?);
        }
        Ok(Self {
            fixed,
            stored: RwLock::default(),
            mcp: RwLock::default(),
        })
    }

    /// Whether `name` is a built-in's or the config file's: read-only at run time.
    pub fn is_fixed(&self, name: &str) -> bool {
        self.fixed.0.contains_key(name)
    }

    /// Replaces the runtime registry's tools (after a refresh).
    pub fn set_stored(&self, tools: Vec<Arc<Tool>>) {
        let mut fresh = Tools::default();
        for tool in tools {
            // The config file took the name after it was registered: it wins.
            if self.is_fixed(&tool.name) {
                continue;
            }
            let versions = fresh.0.entry(tool.name.clone()).or_default();
            versions.push(tool);
            versions.sort_by(|a, b| b.version.cmp(&a.version));
        }
        *self.stored.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
    }

    /// The runtime registry's tools as last refreshed.
    pub fn stored(&self) -> Vec<Arc<Tool>> {
        let stored = self
            .stored
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        stored.0.values().flatten().cloned().collect()
    }

    /// Replaces the tools of MCP server `server` (after a listing).
    pub fn set_mcp_tools(&self, server: &str, tools: Vec<Tool>) {
        let mut by_server = self.mcp.write().unwrap_or_else(|e| e.into_inner());
        by_server.insert(server.to_owned(), tools.into_iter().map(Arc::new).collect());
    }

    /// The tool `wanted` names: `name@version`, or `name` for its highest
    /// enabled version that is not deprecated, else its highest enabled one,
    /// else its highest (which is disabled).
    pub fn lookup(&self, wanted: &str) -> Result<Arc<Tool>, Denial> {
        let (name, version) = match wanted.split_once('@') {
            Some((name, v)) => {
                let v = Version::parse(v).map_err(|_| Denial::NotFound(wanted.to_owned()))?;
                (name, Some(v))
            }
            None => (wanted, None),
        };
        let candidates = self.versions(name);
        let found = match version {
            Some(v) => candidates.into_iter().find(|t| t.version == v),
            None => {
                let current = candidates.iter().find(|t| t.enabled && !t.deprecated);
                let enabled = current.or_else(|| candidates.iter().find(|t| t.enabled));
                enabled.cloned().or_else(|| candidates.into_iter().next())
            }
        };
        found.ok_or_else(|| Denial::NotFound(wanted.to_owned()))
    }

    /// Every version of `name`, newest first.
    fn versions(&self, name: &str) -> Vec<Arc<Tool>> {
        if let Some(v) = self.fixed.0.get(name) {
            return v.clone();
        }
        let stored = self
            .stored
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(v) = stored.0.get(name) {
            return v.clone();
        }
        let by_server = self.mcp.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Arc<Tool>> = by_server
            .values()
            .flatten()
            .filter(|t| t.name == name)
            .cloned()
            .collect();
        out.sort_by(|a, b| b.version.cmp(&a.version));
        out
    }

    /// Every tool, by name then newest version.
    pub fn all(&self) -> Vec<Arc<Tool>> {
        let mut out: Vec<Arc<Tool>> = self.fixed.0.values().flatten().cloned().collect();
        out.extend(self.stored());
        let by_server = self.mcp.read().unwrap_or_else(|e| e.into_inner());
        out.extend(by_server.values().flatten().cloned());
        out.sort_by(|a, b| a.name.cmp(&b.name).then(b.version.cmp(&a.version)));
        out
    }
}

/// A `kind = "http"` or `kind = "task"` tool of the config (or of the
/// runtime registry, whose rows hold the same shape).
pub(crate) fn configured_tool(key: &str, t: &ToolConfig) -> Result<Tool, String> {
    let (name, version) = crate::config::tools::name_and_version(key, t.version.as_deref());
    let version = version
        .as_deref()
        .map_or(Ok(Version::new(1, 0, 0)), Version::parse)
        .map_err(|e| format!("tools.\"{key}\".version: {e}"))?;
    let kind = match t.kind {
        ToolKind::Task => Kind::Task(t.task.clone().unwrap_or_default()),
        _ => Kind::Http(HttpTool {
            url: t.url.clone().unwrap_or_default(),
            auth: t.auth_header.clone().zip(t.auth_value.clone()),
            retry: t.retry,
            idempotency_window: t.idempotency_window,
            execution_id_header: t.execution_id_header.clone(),
            callback: (t.completion == crate::config::tools::Completion::Callback).then(|| {
                Callback {
                    secret: t.callback_secret.clone(),
                    timeout: t.callback_timeout,
                }
            }),
        }),
    };
    Ok(Tool {
        capability: t
            .capability
            .clone()
            .unwrap_or_else(|| format!("tool:{name}")),
        name,
        version,
        description: t.description.clone(),
        kind,
        enabled: t.enabled,
        disabled_reason: String::new(),
        deprecated: false,
        replacement: String::new(),
        source: Source::Config,
        side_effects: t.side_effects,
        approval: t.approval == ApprovalSetting::Always,
        tenant_scoped: t.tenant_scoped.unwrap_or(true),
        timeout: t.timeout,
        input: compile(&t.input_schema)
            .map_err(|e| format!("tools.\"{key}\".input_schema: {e}"))?,
        input_schema: t.input_schema.clone(),
        output: t
            .output_schema
            .as_ref()
            .map(compile)
            .transpose()
            .map_err(|e| format!("tools.\"{key}\".output_schema: {e}"))?,
        cost: t.cost.clone(),
        quota: t.quota,
    })
}

/// A tool an MCP server listed; `None` (warned) when its input schema fails.
pub fn mcp_tool(
    server: &str,
    server_version: &Version,
    settings: &crate::config::McpServerConfig,
    remote: McpTool,
) -> Option<Tool> {
    let name = format!("{server}.{}", remote.name);
    let input = match compile(&remote.input_schema) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(server, tool = %remote.name, error = %e, "MCP tool skipped: its input schema does not compile");
            return None;
        }
    };
    let output = remote.output_schema.as_ref().and_then(|s| compile(s).ok());
    Some(Tool {
        capability: format!("tool:{name}"),
        version: server_version.clone(),
        description: remote.description.clone(),
        kind: Kind::Mcp {
            server: server.to_owned(),
            tool: remote.name.clone(),
        },
        enabled: true,
        disabled_reason: String::new(),
        deprecated: false,
        replacement: String::new(),
        source: Source::Mcp,
        side_effects: settings.side_effects,
        approval: settings.approval == ApprovalSetting::Always,
        tenant_scoped: settings.tenant_scoped,
        timeout: settings.timeout,
        input,
        input_schema: remote.input_schema,
        output,
        cost: settings.cost.clone(),
        quota: settings.quota,
        name,
    })
}
