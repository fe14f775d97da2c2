//! Rolling per-provider call statistics for display; the breaker owns routing decisions. The
//! last `capacity` calls within `max_age`: bounded memory, and an idle provider does not show an
//! hour-old outage. Only real calls count; attempts the caller cut short are counted apart, as
//! they say nothing about the provider.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};
use tokio::time::Instant;

/// Calls kept per provider: enough for a p99, few enough for a cheap sort.
pub const DEFAULT_CAPACITY: usize = 100;

/// Calls older than this no longer count as "recent".
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(5 * 60);

/// Rolling statistics of one provider. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct ProviderHealth {
    inner: Arc<Mutex<Window>>,
}

#[derive(Debug)]
struct Window {
    capacity: usize,
    max_age: Duration,
    samples: VecDeque<Sample>,
    /// Apart from `samples`, so impatient callers never push real calls out.
    cut_short: VecDeque<(Instant, CutShort)>,
    resent: VecDeque<Instant>,
}

/// Why an attempt ended without the provider's result: the caller's doing, never its failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutShort {
    /// The caller's gRPC deadline or `budget.max_latency_ms` ran out.
    Deadline,
    /// The caller went away (cancelled the RPC, dropped the stream).
    Cancelled,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    latency: Duration,
    ok: bool,
    connection: bool,
}

/// The window's numbers at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSnapshot {
    /// Calls in the window.
    pub calls: usize,
    /// Failed calls in the window.
    pub errors: usize,
    /// `errors / calls`, in `[0, 1]`; 0 when there were no calls.
    pub error_rate: f64,
    /// Median latency (nearest rank); `None` without calls.
    pub p50: Option<Duration>,
    /// 99th-percentile latency (nearest rank); `None` without calls.
    pub p99: Option<Duration>,
    /// Attempts cut at the caller's deadline in the window (not calls).
    pub deadline_exceeded: usize,
    /// Attempts abandoned by a caller that went away (not calls).
    pub cancelled: usize,
    /// Failed calls whose connection broke or could not be made (part of `errors`).
    pub connection_errors: usize,
    /// Calls that never reached the provider and were resent at once, in the same attempt.
    pub resent: usize,
}

impl Default for ProviderHealth {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY, DEFAULT_MAX_AGE)
    }
}

impl ProviderHealth {
    /// A window of the last `capacity` calls (at least 1) within `max_age`.
    pub fn new(capacity: usize, max_age: Duration) -> Self {
        let capacity = capacity.max(1);
        Self {
            inner: Arc::new(Mutex::new(Window {
                capacity,
                max_age,
                samples: VecDeque::with_capacity(capacity),
                cut_short: VecDeque::new(),
                resent: VecDeque::new(),
            })),
        }
    }

    /// Records one finished call, a failure's latency too (a timeout is what the caller saw).
    pub fn record(&self, latency: Duration, ok: bool) {
        self.push(latency, ok, false);
    }

    /// Records a call that failed at the connection level.
    pub fn record_connection_failure(&self, latency: Duration) {
        self.push(latency, false, true);
    }

    fn push(&self, latency: Duration, ok: bool, connection: bool) {
        let now = Instant::now();
        let mut w = self.lock();
        w.prune(now);
        if w.samples.len() >= w.capacity {
            w.samples.pop_front();
        }
        w.samples.push_back(Sample {
            at: now,
            latency,
            ok,
            connection,
        });
    }

    /// Records a call resent at once because it never reached the provider.
    pub fn record_resend(&self) {
        let now = Instant::now();
        let mut w = self.lock();
        w.prune(now);
        if w.resent.len() >= w.capacity {
            w.resent.pop_front();
        }
        w.resent.push_back(now);
    }

    /// Records an attempt the caller cut short: neither a call nor an error.
    pub fn record_cut_short(&self, why: CutShort) {
        let now = Instant::now();
        let mut w = self.lock();
        w.prune(now);
        if w.cut_short.len() >= w.capacity {
            w.cut_short.pop_front();
        }
        w.cut_short.push_back((now, why));
    }

    /// Share of failed calls in the window, in `[0, 1]`; 0 without calls.
    pub fn recent_error_rate(&self) -> f64 {
        self.snapshot().error_rate
    }

    /// Nearest-rank latency percentile `pct` over the window; `None` without calls.
    pub fn latency_percentile(&self, pct: f64) -> Option<Duration> {
        nearest_rank(&self.sorted_latencies(), pct)
    }

    /// Calls, errors, error rate, p50 and p99 in one consistent view.
    pub fn snapshot(&self) -> HealthSnapshot {
        let (calls, errors, sorted, deadline_exceeded, cancelled, connection_errors, resent) = {
            let mut w = self.lock();
            w.prune(Instant::now());
            let errors = w.samples.iter().filter(|s| !s.ok).count();
            let connection_errors = w.samples.iter().filter(|s| s.connection).count();
            let of = |why| w.cut_short.iter().filter(|(_, w)| *w == why).count();
            (
                w.samples.len(),
                errors,
                sorted(&w.samples),
                of(CutShort::Deadline),
                of(CutShort::Cancelled),
                connection_errors,
                w.resent.len(),
            )
        };
        HealthSnapshot {
            calls,
            errors,
            error_rate: if calls == 0 {
                0.0
            } else {
                errors as f64 / calls as f64
            },
            p50: nearest_rank(&sorted, 50.0),
            p99: nearest_rank(&sorted, 99.0),
            deadline_exceeded,
            cancelled,
            connection_errors,
            resent,
        }
    }

    fn sorted_latencies(&self) -> Vec<Duration> {
        let mut w = self.lock();
        w.prune(Instant::now());
        sorted(&w.samples)
    }

    /// Plain data behind the lock: a poisoned lock is still usable.
    fn lock(&self) -> MutexGuard<'_, Window> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Window {
    fn prune(&mut self, now: Instant) {
        while let Some(oldest) = self.samples.front() {
            if now.saturating_duration_since(oldest.at) <= self.max_age {
                break;
            }
            self.samples.pop_front();
        }
        while let Some((at, _)) = self.cut_short.front() {
            if now.saturating_duration_since(*at) <= self.max_age {
                break;
            }
            self.cut_short.pop_front();
        }
        while let Some(at) = self.resent.front() {
            if now.saturating_duration_since(*at) <= self.max_age {
                break;
            }
            self.resent.pop_front();
        }
    }
}

fn sorted(samples: &VecDeque<Sample>) -> Vec<Duration> {
    let mut latencies: Vec<_> = samples.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    latencies
}

/// Nearest-rank percentile of ascending `sorted`: rank `ceil(pct/100 · n)`, `pct` clamped.
fn nearest_rank(sorted: &[Duration], pct: f64) -> Option<Duration> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let pct = if pct.is_nan() {
        100.0
    } else {
        pct.clamp(0.0, 100.0)
    };
    // pct·n/100: with integer pct the product is exact, so the 7th of 100 is rank 7, not 8.
    let rank = (pct * n as f64 / 100.0).ceil() as usize;
    sorted.get(rank.clamp(1, n) - 1).copied()
}

#[cfg(test)]
mod tests;
