//! The end of a call: metrics, usage record, audit event and settlement,
//! from its log.

use super::{Call, CallMeta, audit, log::CallLog};
use crate::{
    audit::AuditEvent,
    router::{AttemptRecord, RouteError},
    tasks::TaskError,
    telemetry::metrics,
    tools::Denial,
    usage::{MeterError, UsageRecord, policy::Refusal, pricing::usd},
};
use futures::future::Either;
use std::time::Duration;

/// Why a call produced no answer (mapped to a status once, in `api::error`).
#[derive(Debug)]
pub enum CallError {
    /// The input is unusable; each entry is `(field, description)`.
    Invalid(Vec<(String, String)>),
    /// No `[tasks.<name>]`; `known` lists the configured ones.
    UnknownTask { task: String, known: Vec<String> },
    /// The prompt key the request named has no stored version, the team's or a global one.
    PromptNotFound(String),
    /// Every target failed, or the deadline passed; carries every attempt.
    Route(RouteError),
    /// A monthly cap would be exceeded.
    Quota(Refusal),
    /// The estimated cost exceeds the request budget.
    Budget {
        estimate_micros: i64,
        budget_usd: f64,
    },
    /// The ledger could not be read or written.
    Storage(String),
    /// Too many calls in flight on this replica.
    Overloaded,
    /// The tools' entry point refused an invocation.
    ToolDenied(Denial),
    /// An agent turn could not start.
    Agent(crate::agent::AgentError),
    /// A tool's estimated cost exceeds the request budget (SPEC §9.3).
    ToolBudget {
        estimate_micros: i64,
        budget_usd: f64,
    },
    /// A blocking guardrail detected something (SPEC §15).
    GuardrailBlocked {
        guardrail: String,
        stage: &'static str,
        /// After a provider answered: recorded and charged like any answer.
        answered: bool,
    },
}

impl CallError {
    /// A tool invocation's refused reservation.
    pub fn tool(err: MeterError) -> Self {
        match err {
            MeterError::Budget {
                estimate_micros,
                budget_usd,
            } => CallError::ToolBudget {
                estimate_micros,
                budget_usd,
            },
            other => other.into(),
        }
    }

    /// The stable reason of a refusal the audit log records; `None` otherwise.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            CallError::Quota(_) => Some("QUOTA_EXCEEDED"),
            CallError::Budget { .. } | CallError::ToolBudget { .. } => Some("BUDGET_EXCEEDED"),
            CallError::ToolDenied(d) => Some(d.reason()),
            _ => None,
        }
    }
}

impl From<MeterError> for CallError {
    fn from(err: MeterError) -> Self {
        match err {
            MeterError::Quota(refusal) => CallError::Quota(refusal),
            MeterError::Budget {
                estimate_micros,
                budget_usd,
            } => CallError::Budget {
                estimate_micros,
                budget_usd,
            },
            MeterError::Write(e) => CallError::Storage(e.to_string()),
        }
    }
}

impl From<crate::agent::AgentError> for CallError {
    fn from(err: crate::agent::AgentError) -> Self {
        CallError::Agent(err)
    }
}

impl From<TaskError> for CallError {
    fn from(err: TaskError) -> Self {
        match err {
            TaskError::Invalid(v) => CallError::Invalid(v),
            TaskError::Route(RouteError::UnknownTask(task)) => CallError::UnknownTask {
                task,
                known: Vec::new(),
            },
            TaskError::Route(e) => CallError::Route(e),
            TaskError::Meter(e) => e.into(),
            TaskError::PromptNotFound(key) => CallError::PromptNotFound(key),
            TaskError::PromptStore(e) | TaskError::Storage(e) => CallError::Storage(e),
            TaskError::GuardrailBlocked {
                guardrail,
                stage,
                answered,
            } => CallError::GuardrailBlocked {
                guardrail,
                stage,
                answered,
            },
        }
    }
}

impl Call {
    /// Ends the call: metrics, usage record and its `call.*` audit event (in
    /// one transaction), settlement; then the answer. Durable before it
    /// returns when a provider was called (SPEC §5), unless the call is a
    /// turn's (its reply waits on the turn's durable end). A refusal before
    /// any attempt waits for no disk and leaves no record nor event. The
    /// future does not hold the call's log (docs/benchmarks.md, *Sizing*).
    pub(super) fn finish<T>(
        self,
        result: Result<T, CallError>,
    ) -> impl Future<Output = Result<(T, CallMeta), CallError>> {
        let answer = match result {
            Ok(value) => Ok(value),
            Err(CallError::Route(err)) if !matches!(err, RouteError::UnknownTask(_)) => {
                Err(CallError::Route(err))
            }
            // Answered, then blocked: the tokens were spent, so it is recorded.
            Err(blocked @ CallError::GuardrailBlocked { answered: true, .. }) => Err(blocked),
            Err(other) => return Either::Left(self.unrouted::<T>(other)),
        };
        let outcome = match &answer {
            Ok(_) => "ok",
            Err(CallError::Route(err)) => err.reason(),
            Err(_) => "GUARDRAIL_BLOCKED",
        };
        let Ending {
            meta,
            record,
            prompt_owner,
            provider_time,
            reached,
            audit: events,
        } = self.ending(answer.is_ok(), outcome);
        let Call {
            pipeline,
            meter,
            ctx,
            queued_settlement: queued,
            _slot: slot,
            ..
        } = self;
        // With metering off no settlement carries the call's audit event.
        let (settled_events, unsettled) = if pipeline.meter().enabled() {
            (events, Vec::new())
        } else {
            (Vec::new(), events)
        };
        let durable = reached && !queued;
        Either::Right(async move {
            let settled = if durable {
                meter.settle(record, prompt_owner, settled_events).await
            } else {
                meter
                    .settle_refused(record, prompt_owner, settled_events)
                    .await
            };
            let ledger = pipeline.ledger();
            let audited = audit::append_unsettled(ledger, unsettled, durable).await;
            // Our overhead includes the settlement the response waits for.
            metrics::overhead(ctx.started.elapsed().saturating_sub(provider_time));
            drop(slot);
            settled?;
            audited?;
            match answer {
                Ok(value) => Ok((value, meta)),
                Err(CallError::Route(err)) => {
                    Err(CallError::Route(err.with_attempts(meta.attempts)))
                }
                Err(other) => Err(other),
            }
        })
    }

    /// A call that ended before it was routed: no record, no audit event.
    /// A refusal before anything ran gives back what it reserved; any other
    /// failure may have spent it (the session, dropped, charges it CANCELLED).
    fn unrouted<T>(self, err: CallError) -> impl Future<Output = Result<(T, CallMeta), CallError>> {
        let err = self.refused(err);
        let refused = matches!(
            err,
            CallError::Invalid(_)
                | CallError::UnknownTask { .. }
                | CallError::PromptNotFound(_)
                | CallError::Quota(_)
                | CallError::Budget { .. }
                | CallError::ToolBudget { .. }
                | CallError::ToolDenied(_)
                | CallError::Agent(_)
                | CallError::Overloaded
                | CallError::GuardrailBlocked { .. }
        ) && {
            // Once one of its own model calls was served, it spent what it reserved.
            let log = self.log();
            log.tools.is_empty() && !log.attempts.iter().any(AttemptRecord::reached_provider)
        };
        let Call {
            meter, _slot: slot, ..
        } = self;
        async move {
            if refused && let Err(e) = meter.release_refused().await {
                tracing::warn!(error = %e, "releasing a refused call's reservation failed; the sweeper will charge it");
            }
            drop(meter);
            drop(slot);
            Err(err)
        }
    }

    /// What the call leaves, read from its log once: its meta (metrics
    /// observed), usage record and audit event.
    fn ending(&self, ok: bool, outcome: &str) -> Ending {
        let mut log = self.log();
        if !ok {
            // A redraft's first draft may have been served; the call was not.
            log.served = None;
        }
        let meta = CallMeta::of(&log, &self.ctx.trace_id, self.ctx.started.elapsed());
        let provider_time = self.observe(&log, &meta);
        let reached = ok || log.attempts.iter().any(AttemptRecord::reached_provider);
        // Built-in prompts (version 0) keep no stats.
        let prompt_owner = log
            .prompt
            .as_ref()
            .filter(|(_, _, version)| *version > 0)
            .map(|(owner, _, _)| owner.clone());
        let record = self.record(&log, &meta, outcome);
        let audit = audit::event(&self.ctx, &log, &record).into_iter().collect();
        Ending {
            meta,
            record,
            prompt_owner,
            provider_time,
            reached,
            audit,
        }
    }

    /// A call refused before any provider work: unrecorded, a cap refusal counted.
    pub(super) fn refused(&self, err: impl Into<CallError>) -> CallError {
        match err.into() {
            CallError::Quota(refusal) => {
                metrics::quota_rejection(&self.ctx.team_id);
                CallError::Quota(refusal)
            }
            // An unknown task names the configured ones, whichever path found it.
            CallError::Route(RouteError::UnknownTask(task))
            | CallError::UnknownTask { task, .. } => CallError::UnknownTask {
                task,
                known: self.pipeline.config().tasks.keys().cloned().collect(),
            },
            err => err,
        }
    }

    /// Records a finished call's metrics; returns the time waited on others.
    fn observe(&self, log: &CallLog, meta: &CallMeta) -> Duration {
        let resilience = self.pipeline.router().resilience();
        let mut provider_time = Duration::ZERO;
        for (a, cost) in log.priced() {
            if let Some(guards) = resilience.get(&a.provider) {
                metrics::breaker_state(&a.provider, guards.breaker.state().metric_value());
            }
            let (input, output) = (a.usage.input_tokens, a.usage.output_tokens);
            metrics::usage(&a.provider, &a.model, input, output, cost.map(usd));
            // Backoff and limiter waits are waiting on providers too.
            provider_time += a.latency + a.waited;
        }
        provider_time += log.tool_time;
        if let (true, Some(first)) = (meta.degraded, meta.attempts.first()) {
            metrics::fallback(&self.task, &first.provider, &meta.provider);
        }
        let listed = &self.pipeline.inner.config.telemetry.team_labels;
        metrics::team_usage(&self.ctx.team_id, listed, log.cost_micros().map(usd));
        provider_time
    }

    fn record(&self, log: &CallLog, meta: &CallMeta, outcome: &str) -> UsageRecord {
        let ctx = &self.ctx;
        let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        UsageRecord {
            created_at_ms: ctx.started_at_ms,
            team_id: ctx.team_id.clone(),
            user_id: ctx.user_id.clone(),
            task: self.task.clone(),
            provider: meta.provider.clone(),
            model: meta.model.clone(),
            prompt_key: meta.prompt_key.clone(),
            prompt_version: i64::from(meta.prompt_version),
            trace_id: ctx.trace_id.clone(),
            input_tokens: tokens(meta.usage.input_tokens),
            output_tokens: tokens(meta.usage.output_tokens),
            cost_micros: log.cost_micros(),
            latency_ms: i64::try_from(meta.latency.as_millis()).unwrap_or(i64::MAX),
            outcome: outcome.to_owned(),
            attempts: attempts_json(&meta.attempts),
            degraded: meta.degraded,
            channel: ctx.channel.as_str().to_owned(),
            priority: ctx.priority.as_str().to_owned(),
            conversation_id: self.turn.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
            iteration: self.turn.as_ref().map_or(0, |t| i64::from(t.1)),
        }
    }
}

/// What a finished call leaves ([`Call::ending`]).
struct Ending {
    meta: CallMeta,
    record: UsageRecord,
    /// Owner of the stored prompt version used, for its stats.
    prompt_owner: Option<String>,
    /// Time spent waiting on providers and tools (not our overhead).
    provider_time: Duration,
    /// A provider was reached, or the call answered: the reply waits for the disk.
    reached: bool,
    /// Its `call.*` event, when the call is audited.
    audit: Vec<AuditEvent>,
}

fn attempts_json(attempts: &[AttemptRecord]) -> String {
    let list: Vec<serde_json::Value> = attempts
        .iter()
        .map(|a| {
            serde_json::json!({
                "provider": a.provider,
                "model": a.model,
                "outcome": format!("{:?}", a.outcome),
                "latency_ms": a.latency.as_millis() as u64,
                "error_code": a.error_code,
                "retry": a.retry,
                "input_tokens": a.usage.input_tokens,
                "output_tokens": a.usage.output_tokens,
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}
