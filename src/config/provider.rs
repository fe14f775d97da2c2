//! `[providers.<name>]`: wire format, endpoint, key, timeouts, limits, breaker, mock.

use super::Secret;
use serde::Deserialize;
use std::time::Duration;

/// Wire format of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    /// Perplexity (OpenAI-style, with citations).
    Perplexity,
    Gemini,
    /// Any OpenAI-compatible server (DeepSeek, vLLM, Ollama, llama.cpp).
    OpenaiCompatible,
    /// Deterministic local fake, for local runs, demos and benchmarks.
    Mock,
}

impl ProviderKind {
    /// Lower-case name, as in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Perplexity => "perplexity",
            ProviderKind::Gemini => "gemini",
            ProviderKind::OpenaiCompatible => "openai_compatible",
            ProviderKind::Mock => "mock",
        }
    }

    /// The provider's public API base URL, when it has a canonical one.
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            ProviderKind::Openai => Some("https://api.openai.com/v1"),
            ProviderKind::Anthropic => Some("https://api.anthropic.com/v1"),
            ProviderKind::Perplexity => Some("https://api.perplexity.ai"),
            ProviderKind::Gemini => Some("https://generativelanguage.googleapis.com/v1beta"),
            ProviderKind::OpenaiCompatible | ProviderKind::Mock => None,
        }
    }
}

/// One upstream provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// API base URL; defaults to the kind's public endpoint.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Bound on one attempt, connection to last byte.
    #[serde(default = "defaults::timeout", with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest silence allowed between two events of a stream.
    #[serde(default = "defaults::stream_idle_timeout", with = "humantime_serde")]
    pub stream_idle_timeout: Duration,
    /// Requests per minute: the account's with `[cluster]`, else this replica's; none: no limit.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// Tokens per minute, as `rpm`: a call's estimate is taken at send, corrected by the report.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Requests in flight: this replica's (64 if unset), or with `[cluster]` the account's if set.
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// `"1.1"` (default, over TLS too: ~20 % less CPU per call than HTTP/2, ADR 0019) or `"2"`
    /// (ALPN over `https://`, prior knowledge over `http://`).
    #[serde(default)]
    pub http_version: Option<HttpVersion>,
    /// Older spelling of `http_version = "2"` for an `http://` upstream serving h2c.
    #[serde(default)]
    pub http2_prior_knowledge: bool,
    /// A PEM file of CA certificates trusted besides the system's roots.
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Calls one HTTP/2 connection carries before another opens: a server caps its streams
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`), and calls past the cap would wait unseen.
    #[serde(default = "defaults::streams_per_connection")]
    pub streams_per_connection: usize,
    /// Most bytes of an answer (a body, a streamed line or event, a stream's text); past it the
    /// attempt fails (`RESPONSE_TOO_LARGE`). It bounds a call's memory (docs/operations.md).
    #[serde(default = "defaults::max_response_bytes")]
    pub max_response_bytes: usize,
    #[serde(default)]
    pub breaker: BreakerConfig,
    /// An active health check of the provider (SPEC §18); none by default.
    #[serde(default)]
    pub probe: Option<ProbeConfig>,
    /// Settings of the `mock` kind (ignored by other kinds).
    #[serde(default)]
    pub mock: MockConfig,
    /// The API key, loaded from `api_key_env`; never from the file.
    #[serde(skip)]
    pub api_key: Option<Secret>,
}

/// The HTTP version of a provider's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum HttpVersion {
    /// HTTP/1.1: a pooled connection per call in flight.
    #[serde(rename = "1.1")]
    Http1,
    /// HTTP/2: calls multiplexed on few connections.
    #[serde(rename = "2")]
    Http2,
}

impl ProviderConfig {
    /// Calls in flight one replica may send: `max_concurrency`, or 64.
    pub fn concurrency(&self) -> usize {
        self.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY)
    }

    /// Whether calls speak HTTP/2 (`http_version = "2"`, or `http2_prior_knowledge`).
    pub fn http2(&self) -> bool {
        self.http_version
            .map_or(self.http2_prior_knowledge, |v| v == HttpVersion::Http2)
    }
}

/// Per replica: a bound on memory and on one replica's share of a provider, not an account's.
pub const DEFAULT_MAX_CONCURRENCY: usize = 64;

/// Far above any chat answer (a 16k-token reply is ~64 KB), far below exhausting memory.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

mod defaults {
    use std::time::Duration;
    // Seed numbers of SPEC §4; Perplexity's 45 s is set in its config entry.
    pub fn timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn connect_timeout() -> Duration {
        Duration::from_secs(5)
    }
    pub fn stream_idle_timeout() -> Duration {
        Duration::from_secs(20)
    }
    pub fn max_response_bytes() -> usize {
        super::DEFAULT_MAX_RESPONSE_BYTES
    }
    /// SPEC §18's example: sees an outage before callers do, costs nothing at a provider.
    pub fn probe_interval() -> Duration {
        Duration::from_secs(30)
    }
    /// A model list answers in well under a second; five allows a slow network.
    pub fn probe_timeout() -> Duration {
        Duration::from_secs(5)
    }
    /// RFC 9113 §6.5.2 recommends servers allow at least 100 streams.
    pub fn streams_per_connection() -> usize {
        100
    }
}

/// `probe = { interval, timeout }`: a cheap request sent on a timer, never
/// metered and never counted by the breaker (docs/routing.md, *Probes*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    #[serde(default = "defaults::probe_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Bound on one probe; a provider that hangs fails its probe here.
    #[serde(default = "defaults::probe_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

/// What opens a breaker (SPEC §18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerMode {
    /// `failure_threshold` counted failures in a row (the seed's rule).
    #[default]
    Consecutive,
    /// At least `error_rate` failures among at least `min_requests` calls in the last `window`.
    ErrorRate,
}

impl BreakerMode {
    /// The name as in the config.
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerMode::Consecutive => "consecutive",
            BreakerMode::ErrorRate => "error_rate",
        }
    }
}

/// Circuit breaker numbers (SPEC §4 seed values by default).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    pub mode: BreakerMode,
    /// Consecutive failures that open the breaker (`consecutive` mode).
    pub failure_threshold: u32,
    /// Share of failed calls that opens the breaker (`error_rate` mode).
    pub error_rate: f64,
    /// Fewest counted calls in the window before `error_rate` applies: 1 of 1 is no evidence.
    pub min_requests: u32,
    /// The sliding window `error_rate` is measured over.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// How long the breaker stays open before probing.
    #[serde(with = "humantime_serde")]
    pub open_for: Duration,
    /// Successful probes that close it again.
    pub success_threshold: u32,
    /// Probe calls admitted at once while half-open.
    pub half_open_max_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            mode: BreakerMode::Consecutive,
            failure_threshold: 5,
            error_rate: 0.5,
            min_requests: 10,
            window: Duration::from_secs(30),
            open_for: Duration::from_secs(30),
            success_threshold: 2,
            half_open_max_probes: 1,
        }
    }
}

/// Behaviour of a `mock` provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockConfig {
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Share of calls that fail with a 503-like error, in [0, 1].
    pub failure_rate: f64,
    /// Fixed reply text; absent, a JSON request gets an object matching its schema, else an echo.
    pub reply: Option<String>,
    /// Seed of the failure draw, so runs are reproducible.
    pub seed: u64,
    /// Scripted tool calls: with tools offered, a turn's n-th answer (from the last user
    /// message) calls entry n's tools; past the script it answers with text.
    pub tool_script: Vec<Vec<MockToolCall>>,
}

/// One scripted tool call of the mock.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockToolCall {
    /// The tool, by our name (`system.echo`).
    pub tool: String,
    /// Its arguments as JSON text (malformed on purpose, if a test wants).
    #[serde(default = "empty_object")]
    pub arguments: String,
}

fn empty_object() -> String {
    "{}".into()
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            latency: Duration::from_millis(0),
            failure_rate: 0.0,
            reply: None,
            seed: 42,
            tool_script: Vec::new(),
        }
    }
}
