//! `[providers.<name>]`: each provider's wire format, endpoint, key,
//! timeouts, limits and breaker, and the mock's behaviour.

use super::Secret;
use serde::Deserialize;
use std::time::Duration;

/// Wire format of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI Chat Completions.
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// Perplexity (OpenAI-style, with citations).
    Perplexity,
    /// Google Gemini generateContent.
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
    /// Wire format.
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
    /// Bound on establishing the connection.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest silence allowed between two events of a stream.
    #[serde(default = "defaults::stream_idle_timeout", with = "humantime_serde")]
    pub stream_idle_timeout: Duration,
    /// Requests per minute: the account's with `[cluster]`, else this
    /// replica's; none means unlimited.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// Tokens (input + output) per minute, as `rpm`: a call's estimate is
    /// taken when it is sent and corrected by what the provider reports.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Requests in flight at once: this replica's, 64 when not set. With
    /// `[cluster]` a value set here is the account's, shared by every
    /// replica (the default stays a per-replica bound).
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// The HTTP version spoken to the provider: `"1.1"` (the default, over
    /// TLS too: it costs ~20 % less CPU per call than HTTP/2, ADR 0019) or
    /// `"2"` (negotiated by ALPN over `https://`, prior knowledge over
    /// `http://`; multiplexed).
    #[serde(default)]
    pub http_version: Option<HttpVersion>,
    /// The older spelling of `http_version = "2"` for a plaintext `http://`
    /// upstream that serves h2c (a sidecar, an internal gateway).
    #[serde(default)]
    pub http2_prior_knowledge: bool,
    /// A PEM file of CA certificates trusted for this provider besides the
    /// system's roots: a private gateway, or a test upstream with its own CA.
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Calls one HTTP/2 connection to this provider carries at once; more
    /// open another connection (up to `max_concurrency` calls in all). An
    /// HTTP/2 server caps the streams of a connection
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`, often 100–256), and the client
    /// never opens a second connection by itself: calls past the cap would
    /// wait unseen inside it.
    #[serde(default = "defaults::streams_per_connection")]
    pub streams_per_connection: usize,
    /// Most bytes one answer may hold: a whole body, one streamed line or
    /// event, and the text a stream accumulates. Past it the attempt fails
    /// with `RESPONSE_TOO_LARGE` and the chain moves on; it is what bounds
    /// the memory a call in flight holds (docs/operations.md).
    #[serde(default = "defaults::max_response_bytes")]
    pub max_response_bytes: usize,
    /// Circuit breaker numbers.
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

    /// Whether calls speak HTTP/2 (`http_version = "2"`, or the older
    /// `http2_prior_knowledge`).
    pub fn http2(&self) -> bool {
        self.http_version
            .map_or(self.http2_prior_knowledge, |v| v == HttpVersion::Http2)
    }
}

/// A provider's `max_concurrency` when not set: per replica, a bound on
/// memory and on one replica's share of a provider, not an account limit.
pub const DEFAULT_MAX_CONCURRENCY: usize = 64;

/// Default of a provider's `max_response_bytes`: a few MiB, far above any
/// chat answer (a 16k-token reply is ~64 KB of text, and a stream carries it
/// line by line), small enough that a hostile upstream cannot exhaust memory.
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
    /// SPEC §18's example: often enough to see an outage before callers
    /// do, rare enough to cost nothing at a provider.
    pub fn probe_interval() -> Duration {
        Duration::from_secs(30)
    }
    /// A model list answers in well under a second; five leaves room for a
    /// slow network without keeping a dead provider "unknown" for long.
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
    /// Time between two probes.
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
    /// A share of failures of at least `error_rate` among at least
    /// `min_requests` counted calls in the last `window`.
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
    /// What opens the breaker.
    pub mode: BreakerMode,
    /// Consecutive failures that open the breaker (`consecutive` mode).
    pub failure_threshold: u32,
    /// Share of failed calls that opens the breaker (`error_rate` mode).
    pub error_rate: f64,
    /// Fewest counted calls in the window before `error_rate` can open it:
    /// one failure out of one call is no evidence.
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
    /// Fixed latency of every call.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Share of calls that fail with a 503-like error, in [0, 1].
    pub failure_rate: f64,
    /// Fixed reply text. When absent, a request that asks for JSON gets a
    /// deterministic object matching its schema, and any other request gets
    /// a short echo of its size.
    pub reply: Option<String>,
    /// Seed of the failure draw, so runs are reproducible.
    pub seed: u64,
    /// Scripted tool calls, for agent tests and benchmarks: when tools are
    /// offered, the model's n-th answer of a turn (counted from the last
    /// user message) calls the tools of entry n; past the script it answers
    /// with text.
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
