//! Per-request metering: reserve before any provider call, settle after. A
//! session dropped unsettled settles at its estimates: over-counted, never lost.

use super::{
    UsageRecord,
    amount::Amount,
    bucket::{Limits, PeriodCaps, day_of},
    ledger::{Done, LedgerWriter, Op, Reservation, Reserve, Settle, WriteError},
    policy::{CapKind, Caps, Refusal},
    pricing::{Pricing, micros_floor},
    summary::month_of,
};
use crate::{
    audit::AuditEvent,
    config::{LimitsConfig, MeteringConfig},
};
use futures::{
    TryFutureExt,
    future::{self, Either},
};
use std::sync::{Arc, Mutex};

/// Outcome recorded for a request dropped before it finished.
pub const CANCELLED: &str = "CANCELLED";

/// Why metering refused or failed a call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MeterError {
    /// A team's or user's cap would be exceeded.
    #[error("the limit {} would be exceeded", .0.subject())]
    Quota(Refusal),
    /// The estimated cost exceeds the request's budget.
    #[error("estimated cost exceeds the request budget")]
    Budget {
        /// Estimated cost, micro-USD.
        estimate_micros: i64,
        /// The request's budget, USD, as the caller sent it.
        budget_usd: f64,
    },
    /// The ledger could not be written.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Metering for the whole server.
#[derive(Clone)]
pub struct Meter {
    writer: Option<LedgerWriter>,
    pricing: Arc<Pricing>,
    defaults: Limits,
}

/// The caps of teams and users without an override row.
pub fn default_limits(config: &MeteringConfig) -> Limits {
    Limits {
        team: period_caps(&config.default_limits),
        user: period_caps(&config.user_limits),
    }
}

/// A config table's caps per period.
fn period_caps(l: &LimitsConfig) -> PeriodCaps {
    let count = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
    PeriodCaps {
        month: Caps {
            tokens: count(l.max_tokens),
            requests: count(l.max_requests),
            cost_micros: l.max_cost_usd.map(micros_floor),
        },
        day: Caps {
            tokens: count(l.max_tokens_per_day),
            requests: count(l.max_requests_per_day),
            cost_micros: l.max_cost_usd_per_day.map(micros_floor),
        },
    }
}

impl Meter {
    /// Metering through `writer`; `None` turns metering off entirely.
    pub fn new(writer: Option<LedgerWriter>, pricing: Pricing, config: &MeteringConfig) -> Self {
        let defaults = default_limits(config);
        Self {
            writer,
            pricing: Arc::new(pricing),
            defaults,
        }
    }

    /// The pricing table.
    pub fn pricing(&self) -> &Pricing {
        &self.pricing
    }

    /// Caps for teams and users without an override.
    pub fn default_caps(&self) -> Limits {
        self.defaults
    }

    /// Whether calls are metered.
    pub fn enabled(&self) -> bool {
        self.writer.is_some()
    }

    /// A session for one request; a `budget_usd` not positive is no budget.
    pub fn session(&self, who: Who, started_at_ms: i64, budget_usd: Option<f64>) -> MeterSession {
        let at =
            chrono::DateTime::from_timestamp_millis(started_at_ms).unwrap_or_else(chrono::Utc::now);
        MeterSession {
            meter: self.clone(),
            who,
            started_at_ms,
            month_start_ms: month_of(at).0,
            day_start_ms: day_of(started_at_ms),
            budget: budget_usd
                .filter(|b| *b > 0.0)
                .map(|b| (b, micros_floor(b))),
            state: Mutex::new(State::default()),
        }
    }
}

/// What one model call is expected to use at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Input tokens.
    pub input_tokens: i64,
    /// Output tokens (the output cap).
    pub output_tokens: i64,
    /// Cost, micro-USD (0 when unpriced).
    pub cost_micros: i64,
}

/// Who a request is metered for (copied onto records and reservations).
#[derive(Debug, Clone, Default)]
pub struct Who {
    /// Team.
    pub team_id: String,
    /// User.
    pub user_id: String,
    /// Trace ID.
    pub trace_id: String,
    /// Channel name.
    pub channel: String,
    /// Priority name.
    pub priority: String,
    /// An agent turn's conversation and iteration (from 1), `("", 0)`
    /// outside a turn: a cancelled call's record carries them too.
    pub turn: (String, i64),
}

/// A reservation the session holds until it settles.
#[derive(Debug, Clone)]
struct Held {
    reservation: Reservation,
    /// Its estimate split as the record of a cancelled call shows it.
    input_tokens: i64,
    output_tokens: i64,
}

#[derive(Default)]
struct State {
    /// Every reservation made, with its estimate.
    reservations: Vec<Held>,
    task: String,
    settled: bool,
}

/// Metering of one request.
pub struct MeterSession {
    meter: Meter,
    who: Who,
    started_at_ms: i64,
    month_start_ms: i64,
    day_start_ms: i64,
    /// The request's budget: as sent (USD), and in micro-USD rounded down.
    budget: Option<(f64, i64)>,
    state: Mutex<State>,
}

impl std::fmt::Debug for MeterSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeterSession")
            .field("team", &self.who.team_id)
            .finish_non_exhaustive()
    }
}

impl MeterSession {
    /// Tags the session as iteration `iteration` of a turn in
    /// `conversation`.
    pub fn in_turn(&mut self, conversation: &str, iteration: u32) {
        self.who.turn = (conversation.to_owned(), i64::from(iteration));
    }

    /// When the request started (unix ms); its records carry this time.
    pub fn started_at_ms(&self) -> i64 {
        self.started_at_ms
    }

    /// Whether a refusal could go away with a tighter estimate (not a request cap).
    pub fn refusal_depends_on_size(err: &MeterError) -> bool {
        match err {
            MeterError::Quota(refusal) => refusal.cap != CapKind::Requests,
            MeterError::Budget { .. } => true,
            MeterError::Write(_) => false,
        }
    }

    /// Reserves `estimate` for a call of `task`; only the first counts a request.
    pub async fn reserve(&self, task: &str, estimate: Estimate) -> Result<(), MeterError> {
        let Some(writer) = &self.meter.writer else {
            return Ok(());
        };
        let Estimate {
            input_tokens: input,
            output_tokens: output,
            cost_micros: cost,
        } = estimate;
        // The budget bounds the whole request, redrafts included.
        let held: Amount = self
            .lock()
            .reservations
            .iter()
            .map(|h| h.reservation.amount)
            .sum();
        let total = held.cost_micros.saturating_add(cost);
        if let Some((budget_usd, budget)) = self.budget
            && total > budget
        {
            return Err(MeterError::Budget {
                estimate_micros: total,
                budget_usd,
            });
        }
        let requests = {
            let mut state = self.lock();
            state.task = task.to_owned();
            i64::from(state.reservations.is_empty())
        };
        let reserve = Reserve {
            id: uuid::Uuid::now_v7().simple().to_string(),
            team_id: self.who.team_id.clone(),
            month_start_ms: self.month_start_ms,
            day_start_ms: self.day_start_ms,
            input_tokens: input,
            output_tokens: output,
            requests,
            cost_micros: cost,
            default_caps: self.meter.defaults,
            task: task.to_owned(),
            user_id: self.who.user_id.clone(),
            trace_id: self.who.trace_id.clone(),
            channel: self.who.channel.clone(),
            priority: self.who.priority.clone(),
            created_at_ms: self.started_at_ms,
            admitted: false,
        };
        let held = Held {
            reservation: Reservation::from(&reserve),
            input_tokens: input,
            output_tokens: output,
        };
        match writer.submit(Op::Reserve(reserve)).await? {
            Done::Admitted => {
                self.lock().reservations.push(held);
                Ok(())
            }
            Done::Refused(refusal) => {
                writer.tell_refusal(&refusal, &self.who.trace_id).await;
                Err(MeterError::Quota(refusal))
            }
            Done::Settled | Done::Audited | Done::Written { .. } => Ok(()),
        }
    }

    /// Settles durably with `record` and the call's `audit` events (in the
    /// same transaction); the future only waits for the writer. With
    /// metering off nothing is written: the caller appends `audit` itself.
    pub fn settle(
        &self,
        record: UsageRecord,
        prompt_owner: Option<String>,
        audit: Vec<AuditEvent>,
    ) -> impl Future<Output = Result<(), MeterError>> + Send + '_ {
        let (Some(writer), Some(settle)) = (
            &self.meter.writer,
            self.settlement(record, prompt_owner, audit),
        ) else {
            return Either::Left(future::ready(Ok(())));
        };
        // A combinator, not an `async` block: the submit future is held once.
        Either::Right(writer.submit(Op::Settle(settle)).map_ok(drop).err_into())
    }

    /// [`Self::settle`] for a call no provider saw: not waiting for the disk
    /// (docs/metering.md, *Fast failures*).
    pub fn settle_refused(
        &self,
        record: UsageRecord,
        prompt_owner: Option<String>,
        audit: Vec<AuditEvent>,
    ) -> impl Future<Output = Result<(), MeterError>> + Send + '_ {
        let (Some(writer), Some(settle)) = (
            &self.meter.writer,
            self.settlement(record, prompt_owner, audit),
        ) else {
            return Either::Left(future::ready(Ok(())));
        };
        Either::Right(writer.enqueue(Op::Settle(settle)).err_into())
    }

    /// Releases the reservations of a call refused after reserving; queued.
    pub fn release_refused(&self) -> impl Future<Output = Result<(), MeterError>> + Send + '_ {
        let reservations = {
            let mut state = self.lock();
            state.settled = true;
            std::mem::take(&mut state.reservations)
        };
        let writer = match &self.meter.writer {
            Some(writer) if !reservations.is_empty() => writer,
            _ => return Either::Left(future::ready(Ok(()))),
        };
        let settle = Settle {
            reservations: reservations.into_iter().map(|h| h.reservation).collect(),
            charge: false,
            recorded: false,
            record: UsageRecord {
                created_at_ms: self.started_at_ms,
                team_id: self.who.team_id.clone(),
                trace_id: self.who.trace_id.clone(),
                ..UsageRecord::default()
            },
            month_start_ms: self.month_start_ms,
            day_start_ms: self.day_start_ms,
            user_id: self.who.user_id.clone(),
            prompt_owner: None,
            audit: Vec::new(),
            outbox: Vec::new(),
            triggers: None,
        };
        Either::Right(writer.enqueue(Op::Settle(settle)).err_into())
    }

    /// The settlement with `record` and `audit` (`None`: metering off);
    /// marks it settled.
    fn settlement(
        &self,
        mut record: UsageRecord,
        prompt_owner: Option<String>,
        audit: Vec<AuditEvent>,
    ) -> Option<Settle> {
        self.meter.writer.as_ref()?;
        let reservations = {
            let mut state = self.lock();
            state.settled = true;
            std::mem::take(&mut state.reservations)
        };
        record.created_at_ms = self.started_at_ms;
        Some(Settle {
            charge: !reservations.is_empty(),
            recorded: true,
            reservations: reservations.into_iter().map(|h| h.reservation).collect(),
            record,
            month_start_ms: self.month_start_ms,
            day_start_ms: self.day_start_ms,
            user_id: self.who.user_id.clone(),
            prompt_owner,
            audit,
            outbox: Vec::new(),
            triggers: None,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Poisoned only by a panic mid-update of plain data: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for MeterSession {
    fn drop(&mut self) {
        let state = self.lock();
        if state.settled || state.reservations.is_empty() {
            return;
        }
        let (Some(writer), Ok(runtime)) = (
            self.meter.writer.clone(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let reservations = state.reservations.clone();
        let (input, output, cost) =
            reservations
                .iter()
                .fold((0_i64, 0_i64, 0_i64), |(i, o, c), h| {
                    (
                        i.saturating_add(h.input_tokens),
                        o.saturating_add(h.output_tokens),
                        c.saturating_add(h.reservation.amount.cost_micros),
                    )
                });
        let record = UsageRecord {
            created_at_ms: self.started_at_ms,
            team_id: self.who.team_id.clone(),
            user_id: self.who.user_id.clone(),
            task: state.task.clone(),
            trace_id: self.who.trace_id.clone(),
            input_tokens: input,
            output_tokens: output,
            cost_micros: Some(cost),
            latency_ms: chrono::Utc::now().timestamp_millis() - self.started_at_ms,
            outcome: CANCELLED.into(),
            attempts: "[]".into(),
            channel: self.who.channel.clone(),
            priority: self.who.priority.clone(),
            conversation_id: self.who.turn.0.clone(),
            iteration: self.who.turn.1,
            ..UsageRecord::default()
        };
        let op = Op::Settle(Settle {
            reservations: reservations.into_iter().map(|h| h.reservation).collect(),
            charge: true,
            recorded: true,
            record,
            month_start_ms: self.month_start_ms,
            day_start_ms: self.day_start_ms,
            user_id: self.who.user_id.clone(),
            prompt_owner: None,
            audit: Vec::new(),
            outbox: Vec::new(),
            triggers: None,
        });
        let trace_id = self.who.trace_id.clone();
        runtime.spawn(async move {
            if let Err(e) = writer.submit(op).await {
                tracing::error!(%trace_id, error = %e, "settling a cancelled request failed; the sweeper will charge it");
            }
        });
    }
}
