//! Typed configuration: a TOML file, then environment overrides, then validation.
//!
//! Sources, later ones winning:
//! 1. the TOML file given on the command line;
//! 2. `AIO_`-prefixed environment variables, `__` separating path segments
//!    (`AIO_SERVER__LISTEN=0.0.0.0:50051`, `AIO_PROVIDERS__OPENAI__TIMEOUT=10s`);
//! 3. `DATABASE_URL`, which overrides `database.url` (the usual deployment knob).
//!
//! Unknown keys are rejected and every error names the key path and where
//! the value came from (see [`load`]). Secrets are
//! never read from the file: a provider names the environment variable that
//! holds its key (`api_key_env`) and the key is loaded into a [`Secret`].

pub mod agents;
mod auth;
pub mod cluster;
mod database;
mod load;
mod provider;
mod secret;
pub mod tools;
mod validate;

pub use provider::{
    BreakerConfig, BreakerMode, DEFAULT_MAX_RESPONSE_BYTES, HttpVersion, MockConfig, MockToolCall,
    ProbeConfig, ProviderConfig, ProviderKind,
};
pub use tools::{
    McpEndpointConfig, McpServerConfig, RoleConfig, ToolConfig, ToolKind, ToolWorkerConfig,
};

pub use auth::{ApiKeyConfig, AuthConfig};
pub use database::{DatabaseConfig, SqliteDurability};
pub use secret::Secret;
pub use validate::MAX_OUTPUT_TOKENS;

use serde::Deserialize;
use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

/// A configuration problem, always naming the key it is about and, when
/// loaded from a file, where the value came from: the file, or the
/// environment variable that set it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be parsed or a value has the wrong type/shape.
    #[error("{}", located(origin.as_deref(), path, message))]
    Parse {
        /// The config file or environment variable the value came from.
        origin: Option<String>,
        /// Dotted key path, e.g. `providers.openai.timeout`.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Values parse but do not make sense together.
    #[error("invalid configuration:\n{}", listed(.0))]
    Invalid(Vec<Invalid>),
}

/// Problems shown by a config error; the rest are counted. A generated
/// config can hold thousands of bad entries, and the first ones tell what
/// is wrong.
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
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&located(self.origin.as_deref(), &self.path, &self.message))
    }
}

/// `origin: path: message`, or `path: message` without an origin.
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
    /// gRPC server settings.
    #[serde(default)]
    pub server: ServerConfig,
    /// Usage and prompt storage.
    #[serde(default)]
    pub database: DatabaseConfig,
    /// Upstream providers by name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Tasks by name, each with its fallback chain.
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskConfig>,
    /// Prices by model (`"gpt-4o-mini"`) or provider-qualified model
    /// (`"openai/gpt-4o-mini"`, which wins).
    #[serde(default)]
    pub pricing: BTreeMap<String, PriceConfig>,
    /// Usage metering and monthly caps.
    #[serde(default)]
    pub metering: MeteringConfig,
    /// Retry policy applied at every target of every chain.
    #[serde(default)]
    pub retry: RetryConfig,
    /// API keys; off by default (the service then trusts its network).
    #[serde(default)]
    pub auth: AuthConfig,
    /// OpenTelemetry trace export.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Tools by name (`"crm.add_note"`, or `"crm.add_note@2.0.0"` for a
    /// second version).
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    /// MCP servers whose tools join the registry.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// The registry served as an MCP server; off when absent.
    #[serde(default)]
    pub mcp_endpoint: Option<McpEndpointConfig>,
    /// The runner of ASYNC tool invocations.
    #[serde(default)]
    pub tool_worker: ToolWorkerConfig,
    /// Bounds every tool shares.
    #[serde(default)]
    pub tool_limits: tools::ToolLimitsConfig,
    /// What loading changed and an operator should know (a timeout
    /// capped): logged as warnings at start, shown by `check-config`.
    #[serde(skip)]
    pub notes: Vec<String>,
    /// Conversation agents by name.
    #[serde(default)]
    pub agents: BTreeMap<String, agents::AgentConfig>,
    /// The shared store of fleet-wide limits; absent: every limit is this
    /// replica's.
    #[serde(default)]
    pub cluster: Option<cluster::ClusterConfig>,
}

/// `[server.tls]`: serve gRPC over TLS, optionally requiring client
/// certificates (mTLS).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of the server.
    pub cert: std::path::PathBuf,
    /// PEM private key of the server.
    pub key: std::path::PathBuf,
    /// PEM CA bundle; when set, clients must present a certificate it signed.
    #[serde(default)]
    pub client_ca: Option<std::path::PathBuf>,
}

/// `[telemetry]`: OpenTelemetry trace export (off unless an endpoint is set
/// here or in `OTEL_EXPORTER_OTLP_ENDPOINT`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector endpoint, e.g. `http://otel-collector:4317`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` resource attribute (`OTEL_SERVICE_NAME` wins).
    pub service_name: String,
    /// Share of new traces sampled (0–1); a caller's sampled `traceparent`
    /// is always followed.
    pub sample_ratio: f64,
    /// Teams whose spend gets its own `team` label on the per-team usage
    /// metrics; every other team is counted as `other` (and, like all, by
    /// its `team_bucket` hash), so label cardinality stays bounded.
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
    /// Largest backoff cap.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// INTERACTIVE requests retry the same target only when the wait is at
    /// most this (else they fail over to the next target).
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

/// Longest wait an INTERACTIVE request accepts at the same target when another
/// target remains: a human is waiting, and a fresh provider usually answers
/// sooner than a struggling one recovers. Short enough to be invisible.
pub const DEFAULT_INTERACTIVE_MAX_WAIT: Duration = Duration::from_millis(250);

/// Price of one model in USD per 1M tokens, or explicitly unknown.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// USD per 1M input tokens.
    #[serde(default)]
    pub input_per_mtok: Option<f64>,
    /// USD per 1M output tokens.
    #[serde(default)]
    pub output_per_mtok: Option<f64>,
    /// `"unknown"`: the model has no price; its calls record a null cost
    /// (visible in GetUsage as unpriced) and do not count against cost caps.
    #[serde(default)]
    pub price: Option<String>,
}

/// Usage metering settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeteringConfig {
    /// Meter calls (reserve, settle, usage records). Off only for benchmarks
    /// that measure what metering costs.
    pub enabled: bool,
    /// Caps for teams without a row in `tenant_limits`; absent = unlimited.
    pub default_limits: LimitsConfig,
    /// Most ledger operations written in one transaction (group commit).
    pub batch_max: usize,
    /// PostgreSQL only: ledger writers, each committing its own batches on
    /// its own connection (a team always uses the same one); at most half of
    /// `database.max_connections`, so reads keep the rest. SQLite has one
    /// writer whatever this says.
    pub ledger_writers: usize,
    /// A reservation older than this belongs to a crashed process and is
    /// charged at its estimate. Must exceed `server.default_timeout`.
    #[serde(with = "humantime_serde")]
    pub sweep_after: Duration,
    /// How often the sweeper runs (it also runs at start-up).
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// SQLite file only: how long admission trusts a team's caps, as read
    /// from `tenant_limits`, before reading them again. Admission on a
    /// SQLite file is decided in memory (docs/metering.md), so a cap
    /// changed with `ai-orchestrator limits` applies within this.
    #[serde(with = "humantime_serde")]
    pub limits_refresh: Duration,
}

impl Default for MeteringConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            default_limits: LimitsConfig::default(),
            // Large enough to amortise one fsync over a burst, small enough
            // that one transaction never holds the SQLite lock for long.
            batch_max: 256,
            // Enough to overlap the round trips of a few batches; each
            // holds a pooled connection while it commits.
            ledger_writers: 4,
            sweep_after: Duration::from_secs(300),
            sweep_interval: Duration::from_secs(60),
            limits_refresh: Duration::from_secs(1),
        }
    }
}

/// Monthly caps of a team; `None` is unlimited.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Input + output tokens per month.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Requests per month.
    #[serde(default)]
    pub max_requests: Option<u64>,
    /// US dollars per month.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
}

/// gRPC server settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the gRPC server binds.
    pub listen: SocketAddr,
    /// Address of the HTTP endpoint with `/metrics` (Prometheus), `/healthz`
    /// and `/readyz`; absent = no metrics endpoint.
    pub metrics_listen: Option<SocketAddr>,
    /// Largest accepted request, in bytes: every field a caller sends
    /// (message, history, lead, goal, query, JSON input, context), as
    /// encoded on the wire.
    pub max_input_bytes: usize,
    /// Most `history` entries one request may carry.
    pub max_history_entries: usize,
    /// Deepest nesting of objects and arrays in an `Execute` input.
    pub max_input_depth: usize,
    /// Largest rendered prompt (system + user text) sent to a provider, in
    /// bytes: a template can repeat its input, and escaping grows it.
    pub max_prompt_bytes: usize,
    /// Largest gRPC message decoded, in bytes (protects memory before any
    /// field is looked at): the limit of every RPC but those below.
    pub max_message_bytes: usize,
    /// Largest `ClassifySms` / `GenerateSms` message decoded, in bytes.
    pub max_sms_message_bytes: usize,
    /// Largest `Research` message decoded, in bytes.
    pub max_research_message_bytes: usize,
    /// AI requests in flight at once on this replica; more are refused at
    /// once with RESOURCE_EXHAUSTED (OVERLOADED) instead of queueing.
    /// Health checks and reflection are never refused.
    pub max_concurrent_requests: usize,
    /// HTTP/2 streams one connection may have open.
    pub max_concurrent_streams: u32,
    /// HTTP/2 keepalive ping interval (dead connections are dropped).
    #[serde(with = "humantime_serde")]
    pub http2_keepalive_interval: Duration,
    /// How long to wait for a keepalive ping answer.
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
            // 64 KiB holds any SMS thread or research query many times over;
            // bigger inputs are almost always a caller bug.
            max_input_bytes: 64 * 1024,
            // An SMS thread of 100 messages is already months of texting;
            // each entry becomes a prompt line, so the count is bounded
            // apart from the bytes.
            max_history_entries: 100,
            // Business payloads are a few levels deep; 32 leaves room while
            // keeping every recursive walk over the input shallow.
            max_input_depth: 32,
            // Four times the input limit: room for a template that repeats
            // its input and for escaping, no more.
            max_prompt_bytes: 256 * 1024,
            // 4 MiB is tonic's default; inputs are capped far lower anyway.
            max_message_bytes: 4 * 1024 * 1024,
            // An SMS thread at its 100-entry cap is a few KiB, a research
            // query less; four times max_input_bytes leaves room for
            // framing. Decoded, a message of empty repeated entries takes
            // many times its wire size, so the bound stays small.
            max_sms_message_bytes: 256 * 1024,
            max_research_message_bytes: 256 * 1024,
            // Each in-flight call mostly waits on a provider; 1024 keeps
            // memory bounded (~tens of MB) while far above normal load.
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
    /// Output token cap sent to the provider.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Confidence below which a classification needs human review.
    #[serde(default = "default_review_threshold")]
    pub review_threshold: f64,
    /// `sms_generate`: replace typographic characters (curly quotes, dashes,
    /// the ellipsis, non-breaking spaces) with GSM-7 equivalents when that
    /// keeps the reply GSM-7, before its segments are counted ("smart
    /// encoding"; on by default).
    #[serde(default = "default_smart_encoding")]
    pub smart_encoding: bool,
    /// JSON schema the answer of a generic (`Execute`) task must match; the
    /// model is asked for JSON of this shape and a non-matching answer counts
    /// as a malformed response (the chain moves on).
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
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
    /// Model name sent to the provider.
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

    /// Whether `[pricing]` prices `model` at `provider`: its
    /// provider-qualified entry or its own (`price = "unknown"` counts, as
    /// a price written down).
    pub fn priced(&self, provider: &str, model: &str) -> bool {
        is_priced(&self.pricing, provider, model)
    }
}

/// Whether `pricing` prices `model` at `provider` (see [`Config::priced`]).
pub fn is_priced(pricing: &BTreeMap<String, PriceConfig>, provider: &str, model: &str) -> bool {
    pricing.contains_key(&format!("{provider}/{model}")) || pricing.contains_key(model)
}
