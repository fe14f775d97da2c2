//! Per-request metering: reserve the estimated usage before any provider
//! call, settle the actual usage (and write the usage record) after.
//!
//! A [`MeterSession`] lives as long as the request. If the request is dropped
//! before it settles (the client cancelled, the stream was abandoned), the
//! session settles itself from `Drop` on a detached task, charging its
//! reservations at their estimate: usage may be over-estimated, never lost.

use super::{
    UsageRecord,
    estimate::{self, Precision},
    ledger::{CapKind, Caps, Done, Op, Refusal, Reserve, Settle},
    pricing::{Pricing, micros_floor},
    summary::month_of,
    writer::{LedgerWriter, WriteError},
};
use crate::{
    config::{MeteringConfig, TargetConfig},
    providers::CompletionRequest,
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
    /// A monthly cap would be exceeded.
    #[error("monthly cap {} would be exceeded", .0.cap.as_str())]
    Quota(Refusal),
    /// The estimated cost exceeds the request's budget.
    #[error("estimated cost exceeds the request budget")]
    Budget {
        /// Estimated cost, micro-USD.
        estimate_micros: i64,
        /// Budget, micro-USD.
        budget_micros: i64,
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
    defaults: Caps,
}

impl Meter {
    /// Metering through `writer`; `None` turns metering off entirely.
    pub fn new(writer: Option<LedgerWriter>, pricing: Pricing, config: &MeteringConfig) -> Self {
        let d = &config.default_limits;
        let defaults = Caps {
            tokens: d.max_tokens.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            requests: d.max_requests.map(|r| i64::try_from(r).unwrap_or(i64::MAX)),
            cost_micros: d.max_cost_usd.map(micros_floor),
        };
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

    /// Caps for teams without an override.
    pub fn default_caps(&self) -> Caps {
        self.defaults
    }

    /// Whether calls are metered.
    pub fn enabled(&self) -> bool {
        self.writer.is_some()
    }

    /// A session for one request.
    pub fn session(&self, who: Who, started_at_ms: i64, budget_usd: Option<f64>) -> MeterSession {
        let at =
            chrono::DateTime::from_timestamp_millis(started_at_ms).unwrap_or_else(chrono::Utc::now);
        MeterSession {
            meter: self.clone(),
            who,
            started_at_ms,
            month_start_ms: month_of(at).0,
            budget_micros: budget_usd.filter(|b| *b > 0.0).map(micros_floor),
            state: Mutex::new(State::default()),
        }
    }
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
}

#[derive(Default)]
struct State {
    /// `(id, input, output, requests, cost)` of every reservation made.
    reservations: Vec<(String, i64, i64, i64, i64)>,
    task: String,
    settled: bool,
    /// `(owner team, key, version)` of the stored prompt the task used.
    prompt: Option<(String, String, u32)>,
}

/// Metering of one request.
pub struct MeterSession {
    meter: Meter,
    who: Who,
    started_at_ms: i64,
    month_start_ms: i64,
    budget_micros: Option<i64>,
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
    /// When the request started (unix ms); its records carry this time.
    pub fn started_at_ms(&self) -> i64 {
        self.started_at_ms
    }

    /// Reserves the worst case over `chain` for `req`: the largest input
    /// estimate plus the output cap, and the largest cost. Refuses when the
    /// team's caps or the request budget do not allow it.
    ///
    /// The input is first estimated with [`Precision::Bound`] (free, never
    /// low); only if that is refused, and a model of the chain has a real
    /// tokenizer, is it counted exactly and tried once more, so the bound's
    /// slack never refuses a call that fits.
    pub async fn reserve(
        &self,
        task: &str,
        chain: &[TargetConfig],
        req: &CompletionRequest,
    ) -> Result<(), MeterError> {
        if self.meter.writer.is_none() {
            return Ok(());
        }
        let bound = self.estimate(chain, req, Precision::Bound);
        let slack_matters = |e: &MeterError| match e {
            MeterError::Quota(refusal) => refusal.cap != CapKind::Requests,
            MeterError::Budget { .. } => true,
            MeterError::Write(_) => false,
        };
        match self.reserve_estimate(task, bound).await {
            Err(e)
                if slack_matters(&e) && chain.iter().any(|t| estimate::has_tokenizer(&t.model)) =>
            {
                let (meter, chain, req) = (self.meter.clone(), chain.to_vec(), req.clone());
                let exact = tokio::task::spawn_blocking(move || {
                    Self::estimate_with(&meter, &chain, &req, Precision::Exact)
                })
                .await
                .unwrap_or(bound);
                self.reserve_estimate(task, exact).await
            }
            other => other,
        }
    }

    /// `(input tokens, output tokens, cost)`: the worst case over `chain`.
    fn estimate(
        &self,
        chain: &[TargetConfig],
        req: &CompletionRequest,
        precision: Precision,
    ) -> (i64, i64, i64) {
        Self::estimate_with(&self.meter, chain, req, precision)
    }

    fn estimate_with(
        meter: &Meter,
        chain: &[TargetConfig],
        req: &CompletionRequest,
        precision: Precision,
    ) -> (i64, i64, i64) {
        let output = i64::from(req.max_tokens);
        let (mut input, mut cost) = (0_i64, 0_i64);
        for target in chain {
            let est = i64::try_from(estimate::input_tokens(&target.model, req, precision))
                .unwrap_or(i64::MAX);
            input = input.max(est);
            let c = meter
                .pricing
                .cost_micros(&target.provider, &target.model, est as u64, output as u64)
                .unwrap_or(0);
            cost = cost.max(c);
        }
        (input, output, cost)
    }

    async fn reserve_estimate(
        &self,
        task: &str,
        (input, output, cost): (i64, i64, i64),
    ) -> Result<(), MeterError> {
        let Some(writer) = &self.meter.writer else {
            return Ok(());
        };
        // The budget bounds the whole request: a second reservation (a
        // redrafted SMS reply) adds to what the first one already holds.
        let held = self
            .lock()
            .reservations
            .iter()
            .fold(0_i64, |sum, r| sum.saturating_add(r.4));
        if let Some(budget) = self.budget_micros
            && held.saturating_add(cost) > budget
        {
            return Err(MeterError::Budget {
                estimate_micros: held.saturating_add(cost),
                budget_micros: budget,
            });
        }
        let requests = {
            let mut state = self.lock();
            state.task = task.to_owned();
            i64::from(state.reservations.is_empty())
        };
        let id = uuid::Uuid::now_v7().simple().to_string();
        let op = Op::Reserve(Reserve {
            id: id.clone(),
            team_id: self.who.team_id.clone(),
            month_start_ms: self.month_start_ms,
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
        });
        match writer.submit(op).await? {
            Done::Admitted => {
                self.lock()
                    .reservations
                    .push((id, input, output, requests, cost));
                Ok(())
            }
            Done::Refused(refusal) => Err(MeterError::Quota(refusal)),
            Done::Settled => Ok(()),
        }
    }

    /// Settles: releases the reservations, charges `record`'s actuals (when
    /// a provider was involved) and writes `record`, durably.
    /// The stored prompt version the call used (see [`Self::note_prompt`])
    /// gets this call folded into its stats, success or not.
    ///
    /// The state is taken and the operation built when this is called; the
    /// returned future only waits for the writer (see
    /// [`super::writer::LedgerWriter::submit`] for why it is kept small).
    pub fn settle(
        &self,
        record: UsageRecord,
    ) -> impl Future<Output = Result<(), MeterError>> + Send + '_ {
        let (Some(writer), Some(settle)) = (&self.meter.writer, self.settlement(record)) else {
            return Either::Left(future::ready(Ok(())));
        };
        // A combinator, not an `async` block, so the submit future is held
        // once, inline.
        Either::Right(writer.submit(Op::Settle(settle)).map_ok(drop).err_into())
    }

    /// Like [`Self::settle`], for a call refused before any provider was
    /// called (every target skipped: breaker open, cooldown, saturated):
    /// its record is queued, and the reply does not wait for the disk. No
    /// provider spent anything, and the promise that an acknowledged call
    /// is recorded before its reply is about calls that reached one
    /// (docs/metering.md, *Fast failures*).
    pub fn settle_refused(
        &self,
        record: UsageRecord,
    ) -> impl Future<Output = Result<(), MeterError>> + Send + '_ {
        let (Some(writer), Some(settle)) = (&self.meter.writer, self.settlement(record)) else {
            return Either::Left(future::ready(Ok(())));
        };
        Either::Right(writer.enqueue(settle).err_into())
    }

    /// The settlement of this session with `record`; `None` when metering
    /// is off. Marks the session settled.
    fn settlement(&self, mut record: UsageRecord) -> Option<Settle> {
        self.meter.writer.as_ref()?;
        let (reservations, prompt) = {
            let mut state = self.lock();
            state.settled = true;
            (
                std::mem::take(&mut state.reservations),
                state.prompt.clone(),
            )
        };
        let mut prompt_owner = None;
        if let Some((owner, key, version)) = prompt {
            if record.prompt_key.is_empty() {
                record.prompt_key = key;
                record.prompt_version = i64::from(version);
            }
            prompt_owner = Some(owner);
        }
        record.created_at_ms = self.started_at_ms;
        Some(Settle {
            charge: !reservations.is_empty(),
            reservations: reservations
                .into_iter()
                .map(|(id, i, o, r, c)| (id, i.saturating_add(o), r, c))
                .collect(),
            record,
            month_start_ms: self.month_start_ms,
            prompt_owner,
        })
    }

    /// Remembers the prompt the task resolved, for the record and the
    /// prompt's stats (built-in prompts, version 0, have no stats).
    pub fn note_prompt(&self, owner: &str, key: &str, version: u32) {
        self.lock().prompt = (version > 0).then(|| (owner.to_owned(), key.to_owned(), version));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update of
        // plain data; the data is still usable.
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
                .fold((0_i64, 0_i64, 0_i64), |(i, o, c), r| {
                    (
                        i.saturating_add(r.1),
                        o.saturating_add(r.2),
                        c.saturating_add(r.4),
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
            ..UsageRecord::default()
        };
        let op = Op::Settle(Settle {
            reservations: reservations
                .into_iter()
                .map(|(id, i, o, r, c)| (id, i.saturating_add(o), r, c))
                .collect(),
            charge: true,
            record,
            month_start_ms: self.month_start_ms,
            prompt_owner: None,
        });
        let trace_id = self.who.trace_id.clone();
        runtime.spawn(async move {
            if let Err(e) = writer.submit(op).await {
                tracing::error!(%trace_id, error = %e, "settling a cancelled request failed; the sweeper will charge it");
            }
        });
    }
}
