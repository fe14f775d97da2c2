//! ai-orchestrator: the single gRPC entry point for every AI call.
//!
//! A request flows `api` (parse, validate) → `tasks` (prompt, parse the
//! answer) → `router` (walk the task's fallback chain) → `providers` (one
//! HTTP call in the provider's wire format), and its usage is written by
//! `usage` to `store` before the response leaves. `resilience` holds the
//! per-provider breaker, limits, retry policy and health the router consults.

pub mod api;
pub mod auth;
pub mod call;
pub mod cli;
pub mod config;
pub mod domain;
pub mod prompts;
pub mod providers;
pub mod resilience;
pub mod router;
pub mod server;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod usage;

pub use server::serve;
