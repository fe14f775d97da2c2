//! ai-orchestrator: the single gRPC entry point for every AI call.
//!
//! One driver: an edge (`api` for gRPC and MCP, `web` for the
//! OpenAI-compatible HTTP API, `console` for the ops pages, `cli` for the admin commands) parses a request into a call context and a feature, runs it
//! with `call::Pipeline::run` (or `stream`, `converse`), and maps the
//! answer back. The pipeline (`call`) owns every call's lifecycle: admit,
//! reserve, route, settle, record, audit. A feature (`tasks`, an agent turn,
//! a tool invocation) sees the pipeline only through its session (render,
//! complete, invoke a tool). `router` walks each model call's fallback
//! chain, guarded per provider by `resilience`; `providers` speak each wire
//! format, translating the neutral types of `domain` (the completion
//! request, its messages and tool calls, the answer, a provider's error).
//! `usage` (the ledger), `prompts`, `auth` and `tools` (the registry, policy
//! gate and executors of tool calls) are services the pipeline calls;
//! `audit` is the tamper-evident log they write to (through the ledger's
//! group commit); `store` is the database under them. docs/architecture.md
//! walks one request through these rooms.
//!
//! # Layers: who may import whom
//!
//! ```text
//! edge       api, cli, server        anything below
//!            web                     call, agent, auth, store, api (its error
//!                                    mapping, envelope checks, access log)
//!            console                 call, usage, audit, tools, auth, resilience,
//!                                    store (the ops pages: read, render, decide)
//! pipeline   call                    the features and everything below them
//! features   tasks                   router (errors), prompts, usage (types)
//!            agent                   store, the ground floor (the turn loop, over a session)
//! routing    router                  providers, resilience, cluster
//!            resilience              cluster, the ground floor
//!            providers               the ground floor
//! services   usage, prompts, auth    audit, store, the ground floor
//!            tools                   audit, store, cluster, the ground floor
//!            guardrails              the ground floor (screening, pure)
//!            audit                   store, the ground floor
//!            store                   the ground floor
//!            cluster                 the ground floor (the shared store of fleet-wide limits)
//! ground     telemetry, config, domain
//! ```
//!
//! Nothing imports upwards: `config` and `domain` import nothing else,
//! `usage` knows neither the router nor a provider, no feature knows an
//! edge or a provider, and the tasks reach the pipeline only through the
//! `tasks::Session` trait the call implements. `tests/layers.rs` fails on
//! an import that breaks this.

pub mod agent;
pub mod api;
pub mod audit;
pub mod auth;
pub mod call;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod console;
pub mod domain;
pub mod guardrails;
pub mod prompts;
pub mod providers;
pub mod resilience;
pub mod router;
pub mod server;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod tools;
pub mod usage;
pub mod web;

pub use server::serve;
