//! Upstream providers: one [`Provider`] implementation per wire format.
//!
//! Wire types (each provider's JSON) stay private to its module and are
//! converted to our own [`Completion`] / [`StreamEvent`] here. A provider
//! never retries, never sleeps and never decides about fallback: it makes one
//! HTTP call and classifies what happened as a [`ProviderError`]; the router
//! and `resilience` decide what to do with that.
//!
//! Nothing here may log message contents or API keys.

pub mod anthropic;
pub mod gemini;
pub mod http;
pub mod mock;
pub mod openai;
mod perplexity;
pub mod sse;
pub mod tool_calls;
mod turns;

pub use tool_calls::WireNames;

// The neutral types every adapter translates, in scope for the adapters
// (`super::Completion`).
use crate::{
    config::{Config, ProviderConfig, ProviderKind},
    domain::{
        ChatMessage, Citation, Completion, CompletionRequest, ConnectFailure, FinishReason,
        ProviderError, StreamEvent, TokenUsage, ToolCall, ToolOutcome, completion::Role,
    },
};
use futures::stream::BoxStream;
use std::{collections::BTreeMap, sync::Arc};
use tokio::time::Instant;

/// An active health check of one provider (SPEC §18): never metered, never
/// counted by the breaker.
#[derive(Debug, Clone)]
pub struct ProbeRequest {
    /// A model the config routes to this provider, for the kinds whose
    /// cheapest check is a one-token completion.
    pub model: Option<String>,
    /// A trace ID of the probe's own, sent as `x-trace-id`.
    pub trace_id: String,
    /// When the probe fails as a timeout.
    pub deadline: Instant,
}

/// A stream of answer events; ends after `Done` or an error.
pub type CompletionStream = BoxStream<'static, Result<StreamEvent, ProviderError>>;

/// One wire format.
#[async_trait::async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Makes one non-streaming call.
    async fn complete(&self, req: CompletionRequest) -> Result<Completion, ProviderError>;

    /// Makes one streaming call. Errors before the first event come back as
    /// `Err`; errors mid-stream as an `Err` item.
    async fn stream(&self, req: CompletionRequest) -> Result<CompletionStream, ProviderError>;

    /// Sends the kind's cheapest request that proves the provider answers
    /// (a model list where the API has one) and reads the answer.
    async fn probe(&self, req: ProbeRequest) -> Result<(), ProviderError>;
}

/// The system prompt with an instruction to answer in JSON matching the
/// request's schema appended, for wire formats without native structured
/// output (Anthropic, Gemini's schema subset, OpenAI-compatible servers).
pub fn system_with_schema(req: &CompletionRequest) -> Option<String> {
    match (&req.system, &req.response_format) {
        (system, None) => system.clone(),
        (system, Some(format)) => {
            let rule = format!(
                "Respond with a single JSON object only, no prose and no code fences, \
matching this JSON schema:\n{}",
                format.schema
            );
            Some(match system {
                Some(s) => format!("{s}\n\n{rule}"),
                None => rule,
            })
        }
    }
}

/// Every configured provider, by name, built once at start-up.
#[derive(Clone)]
pub struct Providers {
    by_name: Arc<BTreeMap<String, Arc<dyn Provider>>>,
}

impl Providers {
    /// Builds the implementation for every provider in the config.
    pub fn from_config(config: &Config) -> Result<Self, ProviderError> {
        let mut by_name = BTreeMap::new();
        for (name, p) in &config.providers {
            by_name.insert(name.clone(), build(name, p, config)?);
        }
        Ok(Self {
            by_name: Arc::new(by_name),
        })
    }

    /// The provider called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.by_name.get(name).cloned()
    }
}

fn build(
    name: &str,
    p: &ProviderConfig,
    config: &Config,
) -> Result<Arc<dyn Provider>, ProviderError> {
    // Every kind but `mock` has a default base URL, and validation requires
    // one for `openai_compatible`, so this only fails on a broken config.
    let base_url = || {
        config
            .base_url(name)
            .ok_or_else(|| ProviderError::Unsupported(format!("provider `{name}`: no base_url")))
    };
    match p.kind {
        ProviderKind::Mock => Ok(Arc::new(mock::MockProvider::new(p.mock.clone()))),
        ProviderKind::Openai | ProviderKind::OpenaiCompatible | ProviderKind::Perplexity => {
            Ok(Arc::new(openai::OpenAiProvider::new(name, p, config)?))
        }
        ProviderKind::Anthropic => Ok(Arc::new(anthropic::AnthropicProvider::new(
            p,
            &base_url()?,
        )?)),
        ProviderKind::Gemini => Ok(Arc::new(gemini::GeminiProvider::new(p, &base_url()?)?)),
    }
}
