//! The one per-call pipeline every RPC goes through: open (a slot under
//! `server.max_concurrent_requests`, shed past it, and a meter session),
//! run the feature (each model call reserved at its worst case, then
//! routed), finish (costs, metrics, usage record, settlement, and with
//! `[audit] calls` the call's audit event in the same transaction). Nothing
//! else enters `usage` for a call: it is recorded once, with all its model
//! calls.

pub mod approvals;
mod audit;
pub mod chat;
mod context;
mod estimate;
mod feature;
mod finish;
mod guard;
mod log;
mod model;
pub mod openings;
mod stream;
pub mod tool;
pub mod triggers;
pub mod turn;
pub mod worker;

pub use context::CallContext;
pub use feature::Feature;
pub use finish::CallError;
pub use log::CallMeta;
pub use stream::CallEvent;

use crate::{
    config::Config,
    guardrails::Guardrails,
    prompts::store::PromptStore,
    router::Router,
    store::Store,
    tasks::Tasks,
    tools::{Toolbox, builtin::Health},
    usage::{Meter, MeterSession, ledger::LedgerWriter, session::Who},
};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The services a call uses, shared by every call; cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<Config>,
    tasks: Tasks,
    router: Router,
    prompts: PromptStore,
    meter: Meter,
    /// The ledger's writer: the audit log goes through its group commit.
    ledger: LedgerWriter,
    store: Store,
    toolbox: Toolbox,
    guardrails: Guardrails,
    /// Calls in flight on this replica (`server.max_concurrent_requests`).
    inflight: Arc<Semaphore>,
}

/// What a pipeline is built from, besides its config.
pub struct Services {
    pub router: Router,
    pub prompts: PromptStore,
    pub meter: Meter,
    /// Runs with metering off too, for the audit log.
    pub ledger: LedgerWriter,
    pub store: Store,
    pub toolbox: Toolbox,
    /// The configured guardrails, compiled.
    pub guardrails: Guardrails,
}

impl Pipeline {
    /// A pipeline over the configured tasks and `services`.
    pub fn new(config: Arc<Config>, services: Services) -> Self {
        let inflight = Arc::new(Semaphore::new(config.server.max_concurrent_requests));
        let Services {
            router,
            prompts,
            meter,
            ledger,
            store,
            toolbox,
            guardrails,
        } = services;
        Self {
            inner: Arc::new(Inner {
                tasks: Tasks::new(config.clone()),
                config,
                router,
                prompts,
                meter,
                ledger,
                store,
                toolbox,
                guardrails,
                inflight,
            }),
        }
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Tools.
    pub fn toolbox(&self) -> &Toolbox {
        &self.inner.toolbox
    }

    /// The ledger's writer.
    pub fn ledger(&self) -> &LedgerWriter {
        &self.inner.ledger
    }

    /// The configured guardrails.
    pub fn guardrails(&self) -> &Guardrails {
        &self.inner.guardrails
    }

    /// The database.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// What `system.health` reports: serving, and each provider's breaker.
    pub fn health(&self) -> Health {
        let providers = self
            .inner
            .router
            .resilience()
            .iter()
            .map(|(name, guards)| {
                (
                    name.to_string(),
                    guards.breaker.state().as_str().to_ascii_uppercase(),
                )
            })
            .collect();
        Health {
            status: "SERVING".into(),
            providers,
        }
    }

    /// What tasks know at start-up.
    pub fn tasks(&self) -> &Tasks {
        &self.inner.tasks
    }

    /// The router (its per-provider guards feed the ops RPC).
    pub fn router(&self) -> &Router {
        &self.inner.router
    }

    /// The meter (pricing, caps, whether metering is on).
    pub fn meter(&self) -> &Meter {
        &self.inner.meter
    }

    /// A slot, or `Overloaded` at once: retrying elsewhere beats queueing.
    pub fn slot(&self) -> Result<OwnedSemaphorePermit, CallError> {
        self.inner
            .inflight
            .clone()
            .try_acquire_owned()
            .map_err(|_| CallError::Overloaded)
    }

    /// Opens a call of `task` for `ctx` with its slot and meter session.
    fn open(&self, ctx: CallContext, task: &str) -> Result<Call, CallError> {
        let slot = self.slot()?;
        Ok(self.open_with(ctx, task, Some(slot)))
    }

    /// Opens a call under a slot already held (a turn holds one), or none.
    fn open_with(&self, ctx: CallContext, task: &str, slot: Option<OwnedSemaphorePermit>) -> Call {
        let who = Who {
            team_id: ctx.team_id.clone(),
            user_id: ctx.user_id.clone(),
            trace_id: ctx.trace_id.clone(),
            channel: ctx.channel.as_str().to_owned(),
            priority: ctx.priority.as_str().to_owned(),
            turn: (String::new(), 0),
        };
        let meter = self
            .inner
            .meter
            .session(who, ctx.started_at_ms, ctx.budget_usd);
        Call {
            pipeline: self.clone(),
            task: task.to_owned(),
            ctx,
            meter,
            log: Mutex::default(),
            turn: None,
            queued_settlement: false,
            _slot: slot,
        }
    }
}

/// One request on its way through the pipeline. Dropping it unfinished (the
/// caller went away) settles its reservations at their estimate.
pub struct Call {
    pipeline: Pipeline,
    task: String,
    ctx: CallContext,
    meter: MeterSession,
    log: Mutex<log::CallLog>,
    /// The agent conversation and iteration (from 1) of a turn's model call.
    turn: Option<(String, u32)>,
    /// Settle without waiting for the disk: a turn's call, acknowledged by the
    /// turn's later durable end (a team's ledger operations keep their order).
    queued_settlement: bool,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Call {
    /// Who is asking, and until when.
    pub fn context(&self) -> &CallContext {
        &self.ctx
    }

    /// The pipeline this call runs in.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    fn log(&self) -> std::sync::MutexGuard<'_, log::CallLog> {
        // Plain data updated in single steps: still usable after a panic.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}
