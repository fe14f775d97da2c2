//! Upstream providers: one [`Provider`] per wire format. Wire types stay private to their module
//! and become our [`Completion`] / [`StreamEvent`]. A provider makes one HTTP call and classifies
//! the outcome as a [`ProviderError`]: it never retries, sleeps or falls back (the router and
//! `resilience` do), and never logs message contents or API keys.

pub mod anthropic;
pub mod gemini;
pub mod http;
pub mod mock;
pub mod openai;
mod perplexity;
pub mod sse;
pub mod tool_calls;
mod turns;

// The neutral types, in scope for the adapters as `super::Completion` and so on.
use crate::{
    config::{Config, ProviderConfig, ProviderKind},
    domain::{
        ChatMessage, Citation, Completion, CompletionRequest, ConnectFailure, FinishReason,
        ProviderError, StreamEvent, TokenUsage, ToolCall, ToolChoice, ToolOutcome, WireNames,
        completion::Role,
    },
};
use futures::stream::BoxStream;
use std::{collections::BTreeMap, sync::Arc};
use tokio::time::Instant;

/// An active health check of one provider (SPEC §18): never metered, never seen by the breaker.
#[derive(Debug, Clone)]
pub struct ProbeRequest {
    /// A model routed to this provider, for kinds whose cheapest check is a one-token completion.
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

    /// Makes one streaming call: errors before the first event as `Err`, later as `Err` items.
    async fn stream(&self, req: CompletionRequest) -> Result<CompletionStream, ProviderError>;

    /// Sends the kind's cheapest request that proves the provider answers (a model list if any).
    async fn probe(&self, req: ProbeRequest) -> Result<(), ProviderError>;
}

/// The system prompt plus an instruction to answer in JSON of the request's schema, for wire
/// formats without native structured output (Anthropic, Gemini's schema subset, compatibles).
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
    // Every kind but `mock` has a default base URL: this fails only on a broken config.
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
