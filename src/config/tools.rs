//! `[tools]`, `[mcp_servers]`, `[mcp_endpoint]` and `[auth.roles]`: the tools of SPEC §9.

use serde::{Deserialize, Deserializer};
use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

/// `name` and version of a `[tools."<key>"]` key; the entry's version wins over `name@1.2.0`.
pub fn name_and_version(key: &str, version: Option<&str>) -> (String, Option<String>) {
    match key.split_once('@') {
        Some((name, v)) => (name.to_owned(), Some(version.unwrap_or(v).to_owned())),
        None => (key.to_owned(), version.map(str::to_owned)),
    }
}

/// `tool_limits.max_timeout` unless configured (SPEC §9.1: 60 s).
pub const DEFAULT_MAX_TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// `[tool_limits]`: bounds every tool shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolLimitsConfig {
    /// Longest a tool invocation may take; longer tool, MCP server and agent timeouts are capped.
    #[serde(with = "humantime_serde", default = "default_max_timeout")]
    pub max_timeout: Duration,
}

impl Default for ToolLimitsConfig {
    fn default() -> Self {
        Self {
            max_timeout: DEFAULT_MAX_TOOL_TIMEOUT,
        }
    }
}

fn default_max_timeout() -> Duration {
    DEFAULT_MAX_TOOL_TIMEOUT
}

impl ToolLimitsConfig {
    /// Caps timeouts at `max_timeout` with a note each; none while it is itself out of bounds.
    pub fn cap(config: &mut super::Config) {
        let max = config.tool_limits.max_timeout;
        if max.is_zero() || max > super::validate::bounds::MAX_WAIT {
            return;
        }
        let notes = &mut config.notes;
        let mut cap = |key: String, timeout: &mut Duration| {
            if *timeout > max {
                let show = humantime_serde::re::humantime::format_duration;
                notes.push(format!(
                    "{key} = {} is over tool_limits.max_timeout: capped to {}",
                    show(*timeout),
                    show(max)
                ));
                *timeout = max;
            }
        };
        for (key, t) in &mut config.tools {
            cap(format!("tools.\"{key}\".timeout"), &mut t.timeout);
        }
        for (name, s) in &mut config.mcp_servers {
            cap(format!("mcp_servers.{name}.timeout"), &mut s.timeout);
        }
        for (name, a) in &mut config.agents {
            cap(format!("agents.{name}.tool_timeout"), &mut a.tool_timeout);
        }
    }
}

/// How a configured tool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Built in (`system.echo`, ...): its section sets quota, cost and `enabled`, not its code.
    Builtin,
    /// A workflow webhook: the input POSTed as JSON to `url`.
    Http,
    /// A model call: the input becomes `task`'s variables, run through the call pipeline.
    Task,
}

impl ToolKind {
    /// Its spelling in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolKind::Builtin => "builtin",
            ToolKind::Http => "http",
            ToolKind::Task => "task",
        }
    }
}

/// One tool of the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// Semantic version; the key may carry it instead (`"crm.lookup@1.2.0"`).
    #[serde(default)]
    pub version: Option<String>,
    pub kind: ToolKind,
    #[serde(default)]
    pub description: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Writes or sends something (a `viewer` may never call it).
    #[serde(default)]
    pub side_effects: bool,
    /// `always`: each call waits for a person's decision (SPEC §14.1).
    #[serde(default)]
    pub approval: super::ApprovalSetting,
    /// Capability a caller's role needs; default `tool:<name>`.
    #[serde(default)]
    pub capability: Option<String>,
    /// Acts on the caller's team's data (refused without a team); default true, not for built-ins.
    #[serde(default)]
    pub tenant_scoped: Option<bool>,
    /// Capped by `tool_limits.max_timeout`.
    #[serde(with = "humantime_serde", default = "default_timeout")]
    pub timeout: Duration,
    /// JSON Schema (draft 2020-12) of the input: a TOML table or a JSON string.
    #[serde(default = "any_object", deserialize_with = "schema")]
    pub input_schema: serde_json::Value,
    /// JSON Schema of the output, when checked.
    #[serde(default, deserialize_with = "optional_schema")]
    pub output_schema: Option<serde_json::Value>,
    #[serde(default)]
    pub cost: CostConfig,
    #[serde(default)]
    pub quota: QuotaConfig,
    /// `task`: the task the input is run as (its variables).
    #[serde(default)]
    pub task: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    /// `http`: the header carrying the webhook's secret.
    #[serde(default)]
    pub auth_header: Option<String>,
    /// `http`: the environment variable holding that secret.
    #[serde(default)]
    pub auth_env: Option<String>,
    /// The secret itself, read from `auth_env` at load; never in the file.
    #[serde(skip)]
    pub auth_value: Option<super::Secret>,
    #[serde(default)]
    pub retry: ToolRetryConfig,
    /// `http`: invocations with the same idempotency key in this window reach the webhook once.
    #[serde(with = "humantime_serde", default = "default_idempotency_window")]
    pub idempotency_window: Duration,
    /// `http`: the response header naming the workflow's execution, kept with the invocation.
    #[serde(default = "default_execution_header")]
    pub execution_id_header: String,
    /// `http`: how the work ends, with the webhook's answer or with its callback (SPEC §16).
    #[serde(default)]
    pub completion: Completion,
    /// `http` with `callback`: the environment variable holding the callbacks' HMAC key.
    #[serde(default)]
    pub callback_secret_env: Option<String>,
    /// That key, read from `callback_secret_env` at load; never in the file.
    #[serde(skip)]
    pub callback_secret: Option<super::Secret>,
    /// `http` with `callback`: how long the workflow has to call back before the
    /// invocation ends TIMED_OUT.
    #[serde(with = "humantime_serde", default = "default_callback_timeout")]
    pub callback_timeout: Duration,
}

/// How a webhook's work ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    /// Its answer is the output.
    #[default]
    Response,
    /// Its 2xx only accepts the work; the workflow POSTs the result to
    /// `/v1/tool-invocations/{id}/complete`, signed.
    Callback,
}

pub(crate) fn default_callback_timeout() -> Duration {
    Duration::from_secs(3600)
}

fn yes() -> bool {
    true
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

pub(crate) fn default_idempotency_window() -> Duration {
    Duration::from_secs(300)
}

pub(crate) fn default_execution_header() -> String {
    "x-n8n-execution-id".into()
}

pub(crate) fn any_object() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}

/// A schema given as a TOML table, or as a JSON string.
fn schema<'de, D: Deserializer<'de>>(d: D) -> Result<serde_json::Value, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    match value {
        serde_json::Value::String(text) => {
            serde_json::from_str(&text).map_err(serde::de::Error::custom)
        }
        other => Ok(other),
    }
}

fn optional_schema<'de, D: Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    schema(d).map(Some)
}

/// How sure a cost model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostConfidence {
    Exact,
    #[default]
    Estimate,
    Unknown,
}

/// What a per-unit cost counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostUnit {
    /// Tokens of a text field (about four characters each).
    Token,
    Character,
    Record,
    Second,
}

/// A per-unit part of a tool's cost.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerUnitCost {
    pub unit: CostUnit,
    pub usd: f64,
    /// The input field counted (not for `second`).
    #[serde(default)]
    pub input_field: Option<String>,
}

/// `cost = { fixed_usd, per_unit, confidence }`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostConfig {
    #[serde(default)]
    pub fixed_usd: f64,
    #[serde(default)]
    pub per_unit: Option<PerUnitCost>,
    #[serde(default)]
    pub confidence: CostConfidence,
}

/// `quota = { max_per_hour, max_concurrent }`, per team.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Invocations per team per clock hour.
    #[serde(default)]
    pub max_per_hour: Option<u32>,
    #[serde(default)]
    pub max_concurrent: Option<u32>,
}

/// A webhook's `retry = { max_attempts, initial_backoff, max_backoff, attempt_timeout }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolRetryConfig {
    /// POSTs, the first included (1: no retry).
    pub max_attempts: u32,
    /// Backoff cap after the first failure; doubles per retry (full jitter).
    #[serde(with = "humantime_serde")]
    pub initial_backoff: Duration,
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// How long one POST may take before it is retried; unset, the rest of the tool's timeout
    /// (a workflow still working is not interrupted by a second POST).
    #[serde(with = "humantime_serde")]
    pub attempt_timeout: Option<Duration>,
}

impl Default for ToolRetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            attempt_timeout: None,
        }
    }
}

/// `[mcp_servers.<name>]`: an MCP server whose tools join the registry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Streamable HTTP endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// Or a local command speaking MCP over stdio: program and arguments.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Environment variable holding a bearer token for `url`.
    #[serde(default)]
    pub auth_env: Option<String>,
    /// Tools are listed again this often (and on `tools/list_changed`).
    #[serde(with = "humantime_serde", default = "default_refresh")]
    pub refresh_interval: Duration,
    /// Timeout of its tools' calls (capped by `tool_limits.max_timeout`).
    #[serde(with = "humantime_serde", default = "default_timeout")]
    pub timeout: Duration,
    /// Its tools write or send (a `viewer` may never call them).
    #[serde(default = "yes")]
    pub side_effects: bool,
    /// `always`: each call of its tools waits for a person's decision.
    #[serde(default)]
    pub approval: super::ApprovalSetting,
    #[serde(default)]
    pub tenant_scoped: bool,
    #[serde(default)]
    pub cost: CostConfig,
    #[serde(default)]
    pub quota: QuotaConfig,
}

fn default_refresh() -> Duration {
    Duration::from_secs(300)
}

/// `[mcp_endpoint]`: the registry served as an MCP server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpEndpointConfig {
    /// Where to listen (Streamable HTTP).
    pub listen: SocketAddr,
    #[serde(default = "default_mcp_path")]
    pub path: String,
    /// `Host` values accepted (DNS-rebinding protection); default the loopback names.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Sessions open at once; past it `initialize` gets 503 until one closes or idles 5 minutes.
    #[serde(default = "default_mcp_max_sessions")]
    pub max_sessions: usize,
}

fn default_mcp_path() -> String {
    "/mcp".into()
}

fn default_mcp_max_sessions() -> usize {
    1000
}

/// `[tool_worker]`: the ASYNC runner, and leases so a process dying mid-run loses nothing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolWorkerConfig {
    /// How often the worker looks for work, unless a run ends first.
    #[serde(with = "humantime_serde", default = "default_poll")]
    pub poll_interval: Duration,
    /// How long past the tool's timeout the running process holds an invocation; then it is
    /// taken for dead: an ASYNC one runs again (same idempotency key), a SYNC one FAILED.
    #[serde(with = "humantime_serde", default = "default_lease_slack")]
    pub lease_slack: Duration,
}

impl Default for ToolWorkerConfig {
    fn default() -> Self {
        Self {
            poll_interval: default_poll(),
            lease_slack: default_lease_slack(),
        }
    }
}

fn default_poll() -> Duration {
    Duration::from_millis(500)
}

fn default_lease_slack() -> Duration {
    Duration::from_secs(60)
}

/// `[tool_registry]`: the tools registered at run time (SPEC §16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRegistryConfig {
    /// How often each replica reloads the registered tools: another
    /// replica's change is seen within it (this replica's at once).
    #[serde(with = "humantime_serde", default = "default_registry_refresh")]
    pub refresh_interval: Duration,
}

impl Default for ToolRegistryConfig {
    fn default() -> Self {
        Self {
            refresh_interval: default_registry_refresh(),
        }
    }
}

fn default_registry_refresh() -> Duration {
    Duration::from_secs(5)
}

/// `[auth.roles.<role>]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    /// Capabilities (`tool:crm.*`, `tool:*`): `*` matches any rest.
    #[serde(default)]
    pub capabilities: Vec<String>,
}

/// Unconfigured roles' capabilities: `viewer` the read-only built-ins, the others every tool.
pub fn default_roles() -> BTreeMap<String, RoleConfig> {
    let role = |caps: &[&str]| RoleConfig {
        capabilities: caps.iter().map(|c| (*c).to_owned()).collect(),
    };
    BTreeMap::from([
        ("viewer".to_owned(), role(&["tool:system.*", "tool:sms.*"])),
        ("caller".to_owned(), role(&["tool:*"])),
        ("admin".to_owned(), role(&["tool:*", "workflow:manage"])),
    ])
}
