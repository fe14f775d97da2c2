//! Load generators. The open loop, for every step that measures latency:
//! request `i` is due at `t0 + i / rate` whatever
//! happened to the earlier ones, and its latency is measured from that due
//! time, not from when it was actually sent. A slow server therefore shows up
//! as latency (no coordinated omission) instead of silently lowering the
//! offered rate, as a closed loop of N workers would.
//!
//! A plain OS thread paces the schedule (sub-100 µs sleeps; a tokio timer
//! has 1 ms granularity) and spawns every request as its own task on the
//! runtime, so thousands can be in flight at once. In-flight requests are
//! capped; a request over the cap is dropped and counted as an error, never
//! queued behind the others. Errors are counted by code, never unwrapped.
//!
//! The closed loop, for calls answered at once (the breaker's refusals):
//! `callers` tasks each send a request, wait for its answer and send the
//! next, so exactly that many calls are in flight. Its latency is from each
//! send; its rate is whatever the server answers.

use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

/// The result of one request: `Err` carries a short, stable error code.
pub type Outcome = Result<(), String>;

/// Builds request number `i` (called on the pacing thread, awaited on the runtime).
pub type MakeRequest = Arc<dyn Fn(u64) -> BoxFuture<'static, Outcome> + Send + Sync>;

/// Largest latency the histograms track (µs); larger values are clamped.
const MAX_TRACKED_US: u64 = 120_000_000;

/// One step of load.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Requests per second offered.
    pub rate: f64,
    /// How long requests are sent for.
    pub duration: Duration,
    /// In-flight cap; requests over it are dropped (counted as errors).
    pub max_inflight: usize,
    /// Client-side bound on one request.
    pub timeout: Duration,
}

/// What one step measured.
#[derive(Debug)]
pub struct Measured {
    /// Requests scheduled.
    pub sent: u64,
    /// Successful responses.
    pub ok: u64,
    /// Failures by code.
    pub errors: BTreeMap<String, u64>,
    /// Latency of successful requests, µs, from their due time.
    pub latency: Histogram<u64>,
    /// Due time of the first request to the last response.
    pub elapsed: Duration,
}

impl Measured {
    /// Failed requests (all codes).
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Successful responses per second over the step.
    pub fn achieved_rps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ok as f64 / secs
        } else {
            0.0
        }
    }
}

/// An empty histogram of microseconds, as every step records them.
pub fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, MAX_TRACKED_US, 3)?)
}

/// What the requests of one step came to, recorded as they finish.
struct Recorder {
    latency: Mutex<Histogram<u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    ok: AtomicU64,
    /// Last completion, µs after t0.
    last_done_us: AtomicU64,
}

impl Recorder {
    fn new() -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Recorder {
            latency: Mutex::new(histogram()?),
            errors: Mutex::new(BTreeMap::new()),
            ok: AtomicU64::new(0),
            last_done_us: AtomicU64::new(0),
        }))
    }

    /// The step: `sent` requests over at least `schedule`.
    fn measured(&self, sent: u64, schedule: Duration) -> Measured {
        let last = Duration::from_micros(self.last_done_us.load(Ordering::Relaxed));
        Measured {
            sent,
            ok: self.ok.load(Ordering::Relaxed),
            errors: self
                .errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            latency: self
                .latency
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            elapsed: schedule.max(last),
        }
    }

    fn error(&self, code: &str) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        *errors.entry(code.to_owned()).or_default() += 1;
    }

    fn finish(&self, t0: Instant, due: Instant, outcome: Outcome) {
        let now = Instant::now();
        let done_us = micros(now.saturating_duration_since(t0));
        self.last_done_us.fetch_max(done_us, Ordering::Relaxed);
        match outcome {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                let us = micros(now.saturating_duration_since(due)).clamp(1, MAX_TRACKED_US);
                self.latency
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .saturating_record(us);
            }
            Err(code) => self.error(&code),
        }
    }
}

/// `d` in whole microseconds.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Runs one step: offers `plan.rate` requests/s for `plan.duration`, then
/// waits (up to `plan.timeout`) for the requests still in flight.
pub async fn run(plan: Plan, make: MakeRequest) -> anyhow::Result<Measured> {
    let total = ((plan.rate * plan.duration.as_secs_f64()).round() as u64).max(1);
    let recorder = Recorder::new()?;
    let inflight = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Handle::current();
    let t0 = Instant::now() + Duration::from_millis(5);
    let (rec, flying) = (recorder.clone(), inflight.clone());
    let pacer = std::thread::Builder::new()
        .name("bench-pacer".into())
        .spawn(move || {
            for i in 0..total {
                let due = t0 + Duration::from_secs_f64(i as f64 / plan.rate);
                let now = Instant::now();
                if due > now {
                    #[allow(clippy::disallowed_methods)]
                    // the pacer's own thread, not a runtime worker
                    std::thread::sleep(due - now);
                }
                if flying.fetch_add(1, Ordering::AcqRel) >= plan.max_inflight {
                    flying.fetch_sub(1, Ordering::AcqRel);
                    rec.error("DROPPED_INFLIGHT_CAP");
                    continue;
                }
                let request = make(i);
                let (rec, flying) = (rec.clone(), flying.clone());
                runtime.spawn(async move {
                    let outcome = match tokio::time::timeout(plan.timeout, request).await {
                        Ok(outcome) => outcome,
                        Err(_) => Err("CLIENT_TIMEOUT".to_owned()),
                    };
                    rec.finish(t0, due, outcome);
                    flying.fetch_sub(1, Ordering::AcqRel);
                });
            }
        })?;
    tokio::task::spawn_blocking(move || pacer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the pacing thread panicked"))?;
    // Every request has its own client-side timeout; allow a little more.
    let drain_until = Instant::now() + plan.timeout + Duration::from_secs(1);
    while inflight.load(Ordering::Acquire) > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let stuck = inflight.load(Ordering::Acquire) as u64;
    if stuck > 0 {
        recorder
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert("STUCK".into(), stuck);
    }
    Ok(recorder.measured(total, plan.duration))
}

/// Runs a closed loop: `callers` tasks, each sending its next request as
/// soon as the previous one is answered (or timed out after `timeout`),
/// for `duration`.
pub async fn closed(
    callers: usize,
    duration: Duration,
    timeout: Duration,
    make: MakeRequest,
) -> anyhow::Result<Measured> {
    let recorder = Recorder::new()?;
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let until = t0 + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers.max(1) {
        let (rec, next, make) = (recorder.clone(), next.clone(), make.clone());
        tasks.spawn(async move {
            while Instant::now() < until {
                let request = make(next.fetch_add(1, Ordering::Relaxed));
                let sent = Instant::now();
                let outcome = match tokio::time::timeout(timeout, request).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err("CLIENT_TIMEOUT".to_owned()),
                };
                rec.finish(t0, sent, outcome);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done?;
    }
    Ok(recorder.measured(next.load(Ordering::Relaxed), duration))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The breaker's refusals are measured with exactly `callers` calls in
    /// flight, each answered one counted once.
    #[tokio::test]
    async fn a_closed_loop_holds_exactly_its_callers_in_flight() {
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (n, p) = (now.clone(), peak.clone());
        let make: MakeRequest = Arc::new(move |i| {
            let (now, peak) = (n.clone(), p.clone());
            Box::pin(async move {
                peak.fetch_max(now.fetch_add(1, Ordering::AcqRel) + 1, Ordering::AcqRel);
                tokio::time::sleep(Duration::from_millis(2)).await;
                now.fetch_sub(1, Ordering::AcqRel);
                if i % 2 == 0 {
                    Ok(())
                } else {
                    Err("ODD".into())
                }
            })
        });
        let m = closed(5, Duration::from_millis(100), Duration::from_secs(1), make)
            .await
            .unwrap();
        assert_eq!(peak.load(Ordering::Acquire), 5);
        assert_eq!(now.load(Ordering::Acquire), 0, "a call outlived the loop");
        assert_eq!(m.sent, m.ok + m.error_count());
        assert!(m.ok > 5 && m.errors["ODD"] > 5, "{m:?}");
        assert_eq!(m.latency.len(), m.ok);
    }
}
