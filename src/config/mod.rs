//! Typed configuration: a TOML file, then `AIO_` variables (`__` between path segments:
//! `AIO_PROVIDERS__OPENAI__TIMEOUT=10s`), then `DATABASE_URL`; later sources win. Unknown keys
//! are refused; errors name the key and its source ([`load`]). Secrets never come from the
//! file: a provider names the variable holding its key (`api_key_env`), read into a [`Secret`].

pub mod agents;
mod approvals;
mod audit;
mod auth;
pub mod cluster;
mod console;
mod database;
pub mod guardrails;
mod http;
mod load;
mod provider;
mod secret;
pub mod tools;
pub mod triggers;
mod validate;

pub use provider::{
    BreakerConfig, BreakerMode, DEFAULT_MAX_RESPONSE_BYTES, HttpVersion, MockConfig, MockToolCall,
    ProbeConfig, ProviderConfig, ProviderKind,
};
pub use tools::{
    McpEndpointConfig, McpServerConfig, RoleConfig, ToolConfig, ToolKind, ToolRegistryConfig,
    ToolWorkerConfig,
};

pub use self::http::HttpConfig;
pub use approvals::{ApprovalSetting, ApprovalsConfig};
pub use audit::AuditConfig;
pub use auth::{ApiKeyConfig, AuthConfig};
pub use console::{ConsoleConfig, MIN_SECRET_BYTES as MIN_CONSOLE_SECRET_BYTES};
pub use database::{DatabaseConfig, SqliteDurability};
pub use secret::Secret;
pub use validate::{MAX_OUTPUT_TOKENS, tools::runtime_tool};

use serde::Deserialize;
use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

/// A configuration problem, naming its key and, from a file, where the value came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be parsed or a value has the wrong type/shape.
    #[error("{}", located(origin.as_deref(), path, message))]
    Parse {
        origin: Option<String>,
        path: String,
        message: String,
    },
    /// Values parse but do not make sense together.
    #[error("invalid configuration:\n{}", listed(.0))]
    Invalid(Vec<Invalid>),
}

/// Problems an error lists; the rest are counted (a generated config can hold thousands).
const MAX_SHOWN: usize = 100;

fn listed(problems: &[Invalid]) -> String {
    let mut lines: Vec<String> = problems
        .iter()
        .take(MAX_SHOWN)
        .map(|e| format!("  - {e}"))
        .collect();
    if problems.len() > MAX_SHOWN {
        lines.push(format!(
            "  … and {} more problems",
            problems.len() - MAX_SHOWN
        ));
    }
    lines.join("\n")
}

/// One semantic problem in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The config file or environment variable the value came from.
    pub origin: Option<String>,
    /// Dotted key path, e.g. `tasks.sms_classify.chain[1].provider`.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&located(self.origin.as_deref(), &self.path, &self.message))
    }
}

fn located(origin: Option<&str>, path: &str, message: &str) -> String {
    match origin {
        Some(origin) => format!("{origin}: {path}: {message}"),
        None => format!("{path}: {message}"),
    }
}

impl ConfigError {
    /// Key paths of every problem, for tests and tooling.
    pub fn paths(&self) -> Vec<String> {
        match self {
            ConfigError::Parse { path, .. } => vec![path.clone()],
            ConfigError::Invalid(all) => all.iter().map(|e| e.path.clone()).collect(),
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub database: DatabaseConfig,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskConfig>,
    /// By model or provider-qualified model (`"openai/gpt-4o-mini"`, which wins).
    #[serde(default)]
    pub pricing: BTreeMap<String, PriceConfig>,
    #[serde(default)]
    pub metering: MeteringConfig,
    #[serde(default)]
    pub retry: RetryConfig,
    /// API keys; off by default (the service then trusts its network).
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// By name; `"crm.add_note@2.0.0"` names a second version.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// The registry served as an MCP server; off when absent.
    #[serde(default)]
    pub mcp_endpoint: Option<McpEndpointConfig>,
    /// The HTTP edge (OpenAI-compatible API, agent turns over SSE); off when absent.
    #[serde(default)]
    pub http: Option<HttpConfig>,
    #[serde(default)]
    pub tool_worker: ToolWorkerConfig,
    #[serde(default)]
    pub tool_limits: tools::ToolLimitsConfig,
    /// The tools registered at run time (SPEC §16).
    #[serde(default)]
    pub tool_registry: ToolRegistryConfig,
    /// What the audit log records besides decisions (every model call, by default).
    #[serde(default)]
    pub audit: AuditConfig,
    /// Which tool calls wait for a person, and for how long (SPEC §14.1).
    #[serde(default)]
    pub approvals: ApprovalsConfig,
    /// The ops console on the metrics listener (SPEC §17).
    #[serde(default)]
    pub console: ConsoleConfig,
    /// Platform events that start a tool (SPEC §16).
    #[serde(default)]
    pub triggers: BTreeMap<String, triggers::TriggerConfig>,
    /// How the outbox of fired triggers is relayed.
    #[serde(default)]
    pub trigger_relay: triggers::RelayConfig,
    /// Screening rules tasks and agents list by name (SPEC §15).
    #[serde(default)]
    pub guardrails: BTreeMap<String, guardrails::GuardrailConfig>,
    /// What loading changed that an operator should know (a capped timeout), logged at start.
    #[serde(skip)]
    pub notes: Vec<String>,
    #[serde(default)]
    pub agents: BTreeMap<String, agents::AgentConfig>,
    /// The shared store of fleet-wide limits; absent, every limit is this replica's.
    #[serde(default)]
    pub cluster: Option<cluster::ClusterConfig>,
}

/// `[server.tls]`: gRPC over TLS; mTLS when `client_ca` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// PEM CA bundle; when set, clients must present a certificate it signed.
    #[serde(default)]
    pub client_ca: Option<std::path::PathBuf>,
}

/// `[telemetry]`: trace export, off without an endpoint (here or `OTEL_EXPORTER_OTLP_ENDPOINT`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector endpoint, e.g. `http://otel-collector:4317`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` resource attribute (`OTEL_SERVICE_NAME` wins).
    pub service_name: String,
    /// Share of new traces sampled (0–1); a caller's sampled `traceparent` is always followed.
    pub sample_ratio: f64,
    /// Teams with their own `team` label on usage metrics; the rest share `other` (bounded).
    pub team_labels: std::collections::BTreeSet<String>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "ai-orchestrator".into(),
            sample_ratio: 1.0,
            team_labels: Default::default(),
        }
    }
}

/// Retries per target (SPEC §4 seed values by default).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Calls per target, the first included (1 disables retries).
    pub max_attempts: u32,
    /// Backoff cap after the first failure; doubles per retry (full jitter).
    #[serde(with = "humantime_serde")]
    pub base_backoff: Duration,
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// INTERACTIVE requests retry a target only for a wait up to this, else fail over.
    #[serde(with = "humantime_serde")]
    pub interactive_max_wait: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base_backoff: DEFAULT_BASE_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            interactive_max_wait: DEFAULT_INTERACTIVE_MAX_WAIT,
        }
    }
}

/// Calls per target, the first included (SPEC §4: "up to 3 attempts").
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// Backoff cap after the first failed attempt; doubles after each further one.
pub const DEFAULT_BASE_BACKOFF: Duration = Duration::from_secs(1);

/// Upper bound of the backoff cap: the last step of the SPEC's 1 s, 2 s, 4 s
/// schedule, so raising `max_attempts` adds 4 s steps, not ever-longer ones.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Longest wait an INTERACTIVE request takes at a target while another remains: a fresh
/// provider usually answers sooner than a struggling one recovers.
pub const DEFAULT_INTERACTIVE_MAX_WAIT: Duration = Duration::from_millis(250);

/// Price of one model in USD per 1M tokens, or explicitly unknown.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    #[serde(default)]
    pub input_per_mtok: Option<f64>,
    #[serde(default)]
    pub output_per_mtok: Option<f64>,
    /// `"unknown"`: calls record a null cost (unpriced in GetUsage), outside cost caps.
    #[serde(default)]
    pub price: Option<String>,
}

/// Usage metering settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeteringConfig {
    /// Meter calls (reserve, settle, record); off only to benchmark what metering costs.
    pub enabled: bool,
    /// Caps for teams without a row in `tenant_limits`; absent = unlimited.
    pub default_limits: LimitsConfig,
    /// Caps of each user (`context.user_id`) without a `user_limits` row; absent = unlimited.
    pub user_limits: LimitsConfig,
    /// Most ledger operations written in one transaction (group commit).
    pub batch_max: usize,
    /// PostgreSQL only: ledger writers, each on its own connection (a team always on the same);
    /// at most half of `database.max_connections`, so reads keep the rest.
    pub ledger_writers: usize,
    /// A reservation older than this is a crashed process's, charged at its estimate.
    #[serde(with = "humantime_serde")]
    pub sweep_after: Duration,
    /// How often the sweeper runs (it also runs at start-up).
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// SQLite only: how long in-memory admission trusts a team's caps (docs/metering.md).
    #[serde(with = "humantime_serde")]
    pub limits_refresh: Duration,
}

impl Default for MeteringConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            default_limits: LimitsConfig::default(),
            user_limits: LimitsConfig::default(),
            // One fsync amortised over a burst, without holding the SQLite lock for long.
            batch_max: 256,
            // Overlaps a few batches' round trips; each holds a pooled connection.
            ledger_writers: 4,
            sweep_after: Duration::from_secs(300),
            sweep_interval: Duration::from_secs(60),
            limits_refresh: Duration::from_secs(1),
        }
    }
}

/// Caps of a team or user per UTC month and day; `None` is unlimited.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_requests: Option<u64>,
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    #[serde(default)]
    pub max_tokens_per_day: Option<u64>,
    #[serde(default)]
    pub max_requests_per_day: Option<u64>,
    #[serde(default)]
    pub max_cost_usd_per_day: Option<f64>,
}

/// gRPC server settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// The HTTP endpoint of `/metrics`, `/healthz` and `/readyz`; absent, none.
    pub metrics_listen: Option<SocketAddr>,
    /// Largest request in bytes: every field a caller sends, as encoded on the wire.
    pub max_input_bytes: usize,
    /// Most `history` entries one request may carry.
    pub max_history_entries: usize,
    /// Deepest nesting of objects and arrays in an `Execute` input.
    pub max_input_depth: usize,
    /// Largest rendered prompt in bytes: a template can repeat its input, and escaping grows it.
    pub max_prompt_bytes: usize,
    /// Largest gRPC message decoded, before any field is read: every RPC's but those below.
    pub max_message_bytes: usize,
    pub max_sms_message_bytes: usize,
    pub max_research_message_bytes: usize,
    /// AI requests in flight on this replica; more are refused at once (OVERLOADED), never
    /// queued. Health checks and reflection are never refused.
    pub max_concurrent_requests: usize,
    pub max_concurrent_streams: u32,
    /// HTTP/2 keepalive ping interval (dead connections are dropped).
    #[serde(with = "humantime_serde")]
    pub http2_keepalive_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub http2_keepalive_timeout: Duration,
    /// TLS for the gRPC port; plaintext when absent.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Deadline applied when the caller sends neither `grpc-timeout` nor a budget.
    #[serde(with = "humantime_serde")]
    pub default_timeout: Duration,
    /// How often the database is probed for the health service.
    #[serde(with = "humantime_serde")]
    pub health_probe_interval: Duration,
    /// How long graceful shutdown waits for in-flight calls before giving up.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: None,
            // Any SMS thread or research query many times over; more is a caller bug.
            max_input_bytes: 64 * 1024,
            // Months of texting; each entry is a prompt line, so counted apart from the bytes.
            max_history_entries: 100,
            // Payloads are a few levels deep; 32 keeps every recursive walk shallow.
            max_input_depth: 32,
            // Room for a template that repeats its input, and for escaping.
            max_prompt_bytes: 256 * 1024,
            // 4 MiB is tonic's default; inputs are capped far lower anyway.
            max_message_bytes: 4 * 1024 * 1024,
            // Room for framing; decoded, empty repeated entries grow many times, so it stays small.
            max_sms_message_bytes: 256 * 1024,
            max_research_message_bytes: 256 * 1024,
            // Calls mostly wait on a provider; 1024 bounds memory (~tens of MB), far above load.
            max_concurrent_requests: 1024,
            max_concurrent_streams: 256,
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(10),
            tls: None,
            // Above the slowest seed provider timeout (45 s) so one full attempt fits.
            default_timeout: Duration::from_secs(60),
            health_probe_interval: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// One task: its chain of targets and generation settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// Ordered targets: the first is primary, the rest are fallbacks.
    pub chain: Vec<TargetConfig>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Confidence below which a classification needs human review.
    #[serde(default = "default_review_threshold")]
    pub review_threshold: f64,
    /// `sms_generate`: swap typographic characters for GSM-7 ones when that keeps it GSM-7.
    #[serde(default = "default_smart_encoding")]
    pub smart_encoding: bool,
    /// JSON schema an `Execute` answer must match; one that does not is malformed (next target).
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
    /// `[guardrails.<name>]` screening its prompt and answer, in order.
    #[serde(default)]
    pub guardrails: Vec<String>,
    /// Personal data masked before a provider sees it (SPEC §15).
    #[serde(default)]
    pub pii: Option<guardrails::PiiConfig>,
}

fn default_max_tokens() -> u32 {
    512
}

fn default_review_threshold() -> f64 {
    0.70
}

fn default_smart_encoding() -> bool {
    true
}

/// One `(provider, model)` step of a chain.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Provider name (a key of `providers`).
    pub provider: String,
    pub model: String,
}

impl Config {
    /// The base URL a provider is called at (configured, else the kind's default).
    pub fn base_url(&self, provider: &str) -> Option<String> {
        let p = self.providers.get(provider)?;
        p.base_url
            .clone()
            .or_else(|| p.kind.default_base_url().map(str::to_owned))
    }

    /// Whether `[pricing]` prices `model` at `provider` (`price = "unknown"` counts).
    pub fn priced(&self, provider: &str, model: &str) -> bool {
        is_priced(&self.pricing, provider, model)
    }
}

/// Whether `pricing` prices `model` at `provider` (see [`Config::priced`]).
pub fn is_priced(pricing: &BTreeMap<String, PriceConfig>, provider: &str, model: &str) -> bool {
    pricing.contains_key(&format!("{provider}/{model}")) || pricing.contains_key(model)
}
