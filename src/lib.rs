//! ai-orchestrator: the single gRPC entry point for every AI call.
//!
//! A request enters at the edge (`api`, or `cli` for the admin commands),
//! which turns proto into domain types and opens a call in `call`, the one
//! pipeline every RPC goes through (open → run the task → finish: reserve,
//! route, settle, record). The task (`tasks`) builds its prompt and makes its
//! model calls through the call; an agent's turn (`call::turn`) runs its
//! model and tool calls through the call too, over `agent` (conversations,
//! the layered prompt, memory suggestions); `router` walks each call's fallback chain,
//! guarded per provider by `resilience`, and `providers` speak each wire
//! format. `usage` (the ledger), `prompts`, `auth` and `tools` (the
//! registry, policy gate and executors of tool calls) are services the
//! pipeline and the edge call; `audit` is the tamper-evident log they write
//! to (through the ledger's group commit); `store` is the database under
//! them.
//!
//! # Layers: who may import whom
//!
//! ```text
//! edge       api, cli, server        anything below
//! pipeline   call                    tasks and everything below them
//! tasks      tasks                   router, providers, prompts, usage (types)
//!            agent                   providers, store, the ground floor
//! routing    router                  providers, resilience, cluster
//!            resilience              providers (error classification), cluster
//!            providers               the ground floor
//! services   usage, prompts, auth    audit, store, the ground floor
//!            tools                   audit, store, cluster, the ground floor
//!            audit                   store, the ground floor
//!            store                   the ground floor
//!            cluster                 the ground floor (the shared store of fleet-wide limits)
//! ground     telemetry, config, domain
//! ```
//!
//! Nothing imports upwards: `config` and `domain` import nothing else,
//! `usage` knows neither the router nor a provider, and the tasks reach the
//! pipeline only through the `tasks::Session` trait the call implements.
//! `tests/layers.rs` fails on an import that breaks this.

pub mod agent;
pub mod api;
pub mod audit;
pub mod auth;
pub mod call;
pub mod cli;
pub mod cluster;
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
pub mod tools;
pub mod usage;

pub use server::serve;
