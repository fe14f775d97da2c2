//! Circuit breaker, one per provider (SPEC §4; states and what counts: docs/routing.md).
//!
//! Every state change bumps a *generation*, and a [`Permit`]'s result is ignored once it moved:
//! a slow call started while CLOSED cannot close a breaker that opened meanwhile, nor re-open
//! one that recovered. A connection-level failure counts once per *connection epoch*: one GOAWAY
//! or reset fails every call on the connection, and a call that started before the last counted
//! one is part of that event. A 429 only starts a cooldown. The `error_rate` window is cleared
//! on opening and closing, so a recovered provider starts afresh.
//!
//! OPEN → HALF_OPEN happens lazily when the breaker is next looked at; the mutex is held for a
//! few field updates, never across an `.await`.

mod permit;
mod window;

pub use permit::Permit;
pub use window::WindowCounts;

use crate::domain::instant_after;
use crate::{
    config::{BreakerConfig, BreakerMode},
    domain::ProviderError,
};
use std::{
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
    time::{Duration, SystemTime},
};
use tokio::{sync::mpsc, time::Instant};
use window::Window;

/// Cooldown after a 429 without `Retry-After`: spares a shedding provider, barely slows a one-off.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(1);

/// Longest cooldown one 429 imposes: a broken `Retry-After` must not silently disable a provider.
pub const MAX_COOLDOWN: Duration = crate::domain::MAX_RETRY_AFTER;

/// Where the breaker is in its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls flow; consecutive counted failures are being counted.
    Closed,
    /// Probing: a bounded number of calls decide between CLOSED and OPEN.
    HalfOpen,
    /// Every call is rejected until the open period ends.
    Open,
}

impl BreakerState {
    /// Value of the `circuit_breaker_state{provider}` gauge: higher is worse.
    pub const fn metric_value(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }

    /// Lower-case label for logs and the ops RPC.
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }
}

/// Why [`CircuitBreaker::try_acquire`] refused a call: the provider is skipped uncalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The breaker is open; probing starts in `retry_in`.
    #[error("circuit open (next probe in {retry_in:?})")]
    Open {
        /// Time until the breaker turns half-open.
        retry_in: Duration,
    },
    /// Half-open and every probe slot is taken.
    #[error("circuit half-open, probe slots busy")]
    HalfOpenBusy,
    /// The provider answered 429 and asked us to wait until `until`.
    #[error("cooling down after rate limiting")]
    CoolingDown {
        /// End of the cooldown.
        until: Instant,
    },
}

impl Rejected {
    /// Stable, low-cardinality code for attempt records and metrics.
    pub const fn code(&self) -> &'static str {
        match self {
            Rejected::Open { .. } | Rejected::HalfOpenBusy => "CIRCUIT_OPEN",
            Rejected::CoolingDown { .. } => "RATE_LIMITED",
        }
    }

    /// True for a 429 cooldown, false for the breaker proper.
    pub const fn is_cooldown(&self) -> bool {
        matches!(self, Rejected::CoolingDown { .. })
    }
}

/// What a call's result means for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The provider answered usably.
    Success,
    /// A failure that counts (timeout, connection, 5xx, 408, malformed).
    Failure,
    /// Says nothing about the provider's health (client error, 429).
    Ignored,
}

impl Outcome {
    /// Classifies a provider error with [`ProviderError::counts_against_breaker`].
    pub fn of_error(err: &ProviderError) -> Self {
        if err.counts_against_breaker() {
            Outcome::Failure
        } else {
            Outcome::Ignored
        }
    }
}

/// A point-in-time view of a breaker, for the ops RPC and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSnapshot {
    /// Current state (OPEN whose period has ended already shows HALF_OPEN).
    pub state: BreakerState,
    /// Counted failures in a row; reset when the breaker closes.
    pub consecutive_failures: u32,
    /// Wall-clock time the breaker last opened; `None` while CLOSED.
    pub opened_at: Option<SystemTime>,
    /// Time until OPEN turns HALF_OPEN; `None` unless OPEN.
    pub retry_in: Option<Duration>,
    /// Probe successes so far in this HALF_OPEN period.
    pub half_open_successes: u32,
    /// Probe calls in flight in this HALF_OPEN period.
    pub probes_in_flight: u32,
    /// End of a 429 cooldown still in force.
    pub cooldown_until: Option<Instant>,
    /// Counted calls and failures in the window (zeros in `consecutive` mode).
    pub window: WindowCounts,
    /// Bumped on every state change.
    pub generation: u64,
}

/// One provider's circuit breaker. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: Arc<str>,
    settings: Settings,
    state: Mutex<State>,
    /// Where each opening is told ([`CircuitBreaker::tell_openings`]).
    openings: OnceLock<mpsc::Sender<Opened>>,
}

/// A breaker that opened (`breaker.opened`, SPEC §16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The provider.
    pub provider: Arc<str>,
    /// Counted failures in a row when it opened.
    pub consecutive_failures: u32,
}

/// [`BreakerConfig`] with zeros raised to 1, so even a hand-built config admits calls.
#[derive(Debug, Clone, Copy)]
struct Settings {
    mode: BreakerMode,
    failure_threshold: u32,
    error_rate: f64,
    min_requests: u32,
    open_for: Duration,
    success_threshold: u32,
    max_probes: u32,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Closed,
    Open { until: Instant },
    HalfOpen { probes: u32, successes: u32 },
}

#[derive(Debug)]
struct State {
    phase: Phase,
    generation: u64,
    connection_epoch: u64,
    consecutive_failures: u32,
    window: Window,
    opened_at: Option<SystemTime>,
    cooldown_until: Option<Instant>,
}

impl CircuitBreaker {
    /// A CLOSED breaker for the provider `name` (used in logs only).
    pub fn new(name: &str, config: &BreakerConfig) -> Self {
        let settings = Settings {
            mode: config.mode,
            failure_threshold: config.failure_threshold.max(1),
            error_rate: config.error_rate,
            min_requests: config.min_requests.max(1),
            open_for: config.open_for,
            success_threshold: config.success_threshold.max(1),
            max_probes: config.half_open_max_probes.max(1),
        };
        let state = State {
            phase: Phase::Closed,
            generation: 0,
            connection_epoch: 0,
            consecutive_failures: 0,
            window: Window::new(config.window, Instant::now()),
            opened_at: None,
            cooldown_until: None,
        };
        Self {
            inner: Arc::new(Inner {
                name: name.into(),
                settings,
                state: Mutex::new(state),
                openings: OnceLock::new(),
            }),
        }
    }

    /// Tells `to` of every opening from CLOSED from now on (a failed probe
    /// re-opening it is the same outage); false when another was set first
    /// (one listener per breaker). A full channel drops the news: the
    /// breaker never waits for a listener.
    pub fn tell_openings(&self, to: mpsc::Sender<Opened>) -> bool {
        self.inner.openings.set(to).is_ok()
    }

    /// Whether its openings are told somewhere already.
    pub fn tells_openings(&self) -> bool {
        self.inner.openings.get().is_some()
    }

    /// Asks to make one call; on `Err` skip the provider without a network call. Dropping the
    /// permit unrecorded means "cancelled".
    pub fn try_acquire(&self) -> Result<Permit, Rejected> {
        let now = Instant::now();
        let mut st = self.inner.lock();
        st.refresh(now);
        if let Phase::Open { until } = st.phase {
            return Err(Rejected::Open {
                retry_in: until.saturating_duration_since(now),
            });
        }
        match st.cooldown_until {
            Some(until) if until > now => return Err(Rejected::CoolingDown { until }),
            Some(_) => st.cooldown_until = None,
            None => {}
        }
        if let Phase::HalfOpen { probes, .. } = &mut st.phase {
            if *probes >= self.inner.settings.max_probes {
                return Err(Rejected::HalfOpenBusy);
            }
            *probes += 1;
        }
        Ok(Permit::new(
            Arc::clone(&self.inner),
            st.generation,
            st.connection_epoch,
        ))
    }

    /// Skips the provider for `d` (at most [`MAX_COOLDOWN`]) without counting a failure; a
    /// longer cooldown already running stays.
    pub fn cooldown(&self, d: Duration) {
        self.inner.cooldown(d);
    }

    /// The current state (see [`BreakerState::metric_value`] for the gauge).
    pub fn state(&self) -> BreakerState {
        self.snapshot().state
    }

    /// A consistent view of every field, for the ops RPC.
    pub fn snapshot(&self) -> BreakerSnapshot {
        let now = Instant::now();
        let mut st = self.inner.lock();
        st.refresh(now);
        let (state, retry_in, half_open_successes, probes_in_flight) = match st.phase {
            Phase::Closed => (BreakerState::Closed, None, 0, 0),
            Phase::Open { until } => (
                BreakerState::Open,
                Some(until.saturating_duration_since(now)),
                0,
                0,
            ),
            Phase::HalfOpen { probes, successes } => {
                (BreakerState::HalfOpen, None, successes, probes)
            }
        };
        BreakerSnapshot {
            state,
            consecutive_failures: st.consecutive_failures,
            opened_at: st.opened_at,
            retry_in,
            half_open_successes,
            probes_in_flight,
            cooldown_until: st.cooldown_until.filter(|u| *u > now),
            window: match self.inner.settings.mode {
                BreakerMode::Consecutive => WindowCounts::default(),
                BreakerMode::ErrorRate => st.window.counts(now),
            },
            generation: st.generation,
        }
    }
}

impl Inner {
    /// A poisoned lock still holds plain counters: carry on.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cooldown(&self, d: Duration) {
        let until = instant_after(Instant::now(), d.min(MAX_COOLDOWN));
        let mut st = self.lock();
        st.cooldown_until = Some(st.cooldown_until.map_or(until, |u| u.max(until)));
    }

    /// Applies one permit's result (`None`: cancelled). `connection_epoch` is set for a
    /// connection failure, which counts only if none was counted since the call started.
    fn finish(&self, generation: u64, outcome: Option<Outcome>, connection_epoch: Option<u64>) {
        let now = Instant::now();
        let mut st = self.lock();
        st.refresh(now);
        if st.generation != generation {
            // Stale: issued before the last state change, in a period that is over.
            return;
        }
        let outcome = match (outcome, connection_epoch) {
            (Some(Outcome::Failure), Some(epoch)) if epoch != st.connection_epoch => {
                // Broken by a connection event already counted.
                Some(Outcome::Ignored)
            }
            (Some(Outcome::Failure), Some(_)) => {
                st.connection_epoch = st.connection_epoch.wrapping_add(1);
                Some(Outcome::Failure)
            }
            (outcome, _) => outcome,
        };
        let s = self.settings;
        match st.phase {
            Phase::Closed => match outcome {
                Some(Outcome::Success) => {
                    st.consecutive_failures = 0;
                    if s.mode == BreakerMode::ErrorRate {
                        st.window.record(now, false);
                    }
                }
                Some(Outcome::Failure) => {
                    st.consecutive_failures = st.consecutive_failures.saturating_add(1);
                    if s.trips(&mut st, now) {
                        st.open(now, s.open_for, &self.name);
                        self.tell_opened(&st);
                    }
                }
                Some(Outcome::Ignored) | None => {}
            },
            // Only probes are issued while HALF_OPEN, so this permit is one.
            Phase::HalfOpen { probes, successes } => {
                let probes = probes.saturating_sub(1);
                match outcome {
                    Some(Outcome::Success) if successes + 1 >= s.success_threshold => {
                        st.close(&self.name);
                    }
                    Some(Outcome::Success) => {
                        st.phase = Phase::HalfOpen {
                            probes,
                            successes: successes + 1,
                        };
                    }
                    Some(Outcome::Failure) => {
                        st.consecutive_failures = st.consecutive_failures.saturating_add(1);
                        // Still the same outage: only an opening from CLOSED is told.
                        st.open(now, s.open_for, &self.name);
                    }
                    Some(Outcome::Ignored) | None => {
                        st.phase = Phase::HalfOpen { probes, successes };
                    }
                }
            }
            // No permit is issued while OPEN, and opening bumps the generation.
            Phase::Open { .. } => {}
        }
    }

    fn tell_opened(&self, st: &State) {
        if let Some(to) = self.openings.get() {
            let opened = Opened {
                provider: self.name.clone(),
                consecutive_failures: st.consecutive_failures,
            };
            match to.try_send(opened) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(provider = %self.name, "breaker opening not told: its listener lags");
                }
            }
        }
    }
}

impl Settings {
    /// Counts one failure of a CLOSED breaker; whether it opens the breaker.
    fn trips(&self, st: &mut State, now: Instant) -> bool {
        match self.mode {
            BreakerMode::Consecutive => st.consecutive_failures >= self.failure_threshold,
            BreakerMode::ErrorRate => {
                st.window.record(now, true);
                st.window
                    .counts(now)
                    .trips(self.min_requests, self.error_rate)
            }
        }
    }
}

impl State {
    /// The only time-driven transition: OPEN → HALF_OPEN.
    fn refresh(&mut self, now: Instant) {
        if let Phase::Open { until } = self.phase
            && now >= until
        {
            self.phase = Phase::HalfOpen {
                probes: 0,
                successes: 0,
            };
            self.generation = self.generation.wrapping_add(1);
        }
    }

    fn open(&mut self, now: Instant, open_for: Duration, name: &str) {
        self.phase = Phase::Open {
            until: instant_after(now, open_for),
        };
        self.generation = self.generation.wrapping_add(1);
        self.opened_at = Some(SystemTime::now());
        self.window.clear();
        tracing::warn!(
            provider = name,
            consecutive_failures = self.consecutive_failures,
            "circuit breaker opened"
        );
    }

    fn close(&mut self, name: &str) {
        self.phase = Phase::Closed;
        self.generation = self.generation.wrapping_add(1);
        self.consecutive_failures = 0;
        self.window.clear();
        self.opened_at = None;
        tracing::info!(provider = name, "circuit breaker closed");
    }
}

#[cfg(test)]
mod error_rate_tests;
#[cfg(test)]
mod tests;
