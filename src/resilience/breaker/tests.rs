//! Breaker tests, on tokio's paused clock: time moves only by `advance`.

// Tests may panic on a broken expectation; the crate-wide deny is for library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::time::advance;

const OPEN_FOR: Duration = Duration::from_secs(30);

fn breaker() -> CircuitBreaker {
    CircuitBreaker::new("test", &BreakerConfig::default())
}

fn with_probes(n: u32) -> CircuitBreaker {
    let config = BreakerConfig {
        half_open_max_probes: n,
        ..BreakerConfig::default()
    };
    CircuitBreaker::new("test", &config)
}

fn status(code: u16, retry_after: Option<Duration>) -> ProviderError {
    ProviderError::Status {
        status: code,
        retry_after,
        summary: String::new(),
    }
}

fn call(b: &CircuitBreaker, calls: &AtomicU32, outcome: Outcome) -> Result<(), Rejected> {
    let permit = b.try_acquire()?;
    calls.fetch_add(1, Ordering::SeqCst);
    permit.record(outcome);
    Ok(())
}

fn fail_n(b: &CircuitBreaker, n: u32) {
    for _ in 0..n {
        b.try_acquire().unwrap().record(Outcome::Failure);
    }
}

async fn half_open(b: &CircuitBreaker) {
    fail_n(b, 5);
    advance(OPEN_FOR).await;
    assert_eq!(b.state(), BreakerState::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn trips_on_exactly_the_fifth_consecutive_failure() {
    let b = breaker();
    fail_n(&b, 4);
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(b.snapshot().consecutive_failures, 4);
    fail_n(&b, 1);
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::Open);
    assert_eq!(snap.consecutive_failures, 5);
    assert!(snap.opened_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_count() {
    let b = breaker();
    fail_n(&b, 4);
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(b.snapshot().consecutive_failures, 0);
    fail_n(&b, 4);
    assert_eq!(b.state(), BreakerState::Closed);
    fail_n(&b, 1);
    assert_eq!(b.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn open_rejects_without_calling_and_reports_retry_in() {
    let b = breaker();
    let calls = AtomicU32::new(0);
    for _ in 0..5 {
        call(&b, &calls, Outcome::Failure).unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    advance(Duration::from_secs(10)).await;
    for _ in 0..100 {
        let err = call(&b, &calls, Outcome::Success).unwrap_err();
        assert_eq!(
            err,
            Rejected::Open {
                retry_in: Duration::from_secs(20)
            }
        );
        assert_eq!(err.code(), "CIRCUIT_OPEN");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5, "no call while open");
    assert_eq!(b.snapshot().retry_in, Some(Duration::from_secs(20)));
}

#[tokio::test(start_paused = true)]
async fn becomes_half_open_after_open_for() {
    let b = breaker();
    fail_n(&b, 5);
    advance(OPEN_FOR - Duration::from_millis(1)).await;
    assert_eq!(b.state(), BreakerState::Open);
    assert!(b.try_acquire().is_err());
    advance(Duration::from_millis(1)).await;
    assert_eq!(b.state(), BreakerState::HalfOpen);
    assert!(b.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_n_of_50_concurrent_callers() {
    for n in [1, 2, 3, 7] {
        let b = with_probes(n);
        half_open(&b).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(50));
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let (b, barrier) = (b.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    b.try_acquire()
                })
            })
            .collect();
        let mut granted = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(permit) => granted.push(permit),
                Err(e) => assert_eq!(e, Rejected::HalfOpenBusy),
            }
        }
        assert_eq!(granted.len(), n as usize, "probes = {n}");
        assert_eq!(b.snapshot().probes_in_flight, n);
    }
}

#[test]
fn half_open_admits_exactly_n_across_real_threads() {
    // open_for = 0: half-open as soon as looked at, so no clock is needed.
    for n in [1, 4] {
        let config = BreakerConfig {
            open_for: Duration::ZERO,
            half_open_max_probes: n,
            ..BreakerConfig::default()
        };
        let b = CircuitBreaker::new("test", &config);
        fail_n(&b, 5);
        let barrier = std::sync::Barrier::new(50);
        let granted = std::thread::scope(|s| {
            let handles: Vec<_> = (0..50)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        b.try_acquire().ok()
                    })
                })
                .collect();
            let permits: Vec<_> = handles
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect();
            permits.len()
        });
        assert_eq!(granted, n as usize);
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_permit_frees_its_slot() {
    let b = breaker();
    half_open(&b).await;
    let probe = b.try_acquire().unwrap();
    assert_eq!(b.try_acquire().unwrap_err(), Rejected::HalfOpenBusy);
    let generation = b.snapshot().generation;
    drop(probe); // the client cancelled
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::HalfOpen);
    assert_eq!(snap.generation, generation, "cancel changes no state");
    assert_eq!(snap.probes_in_flight, 0);
    assert!(b.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_stale_success_does_not_close_an_open_breaker() {
    let b = breaker();
    let slow = b.try_acquire().unwrap(); // issued while CLOSED
    fail_n(&b, 5);
    assert_eq!(b.state(), BreakerState::Open);
    slow.record(Outcome::Success);
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::Open);
    assert_eq!(snap.consecutive_failures, 5);
}

#[tokio::test(start_paused = true)]
async fn stale_permits_neither_count_as_probes_nor_free_probe_slots() {
    let b = breaker();
    let (late_success, late_cancel) = (b.try_acquire().unwrap(), b.try_acquire().unwrap());
    half_open(&b).await;
    let probe = b.try_acquire().unwrap();
    late_success.record(Outcome::Success);
    drop(late_cancel);
    let snap = b.snapshot();
    assert_eq!(snap.half_open_successes, 0, "not a probe success");
    assert_eq!(
        snap.probes_in_flight, 1,
        "the real probe still holds its slot"
    );
    assert_eq!(b.try_acquire().unwrap_err(), Rejected::HalfOpenBusy);
    probe.record(Outcome::Success);
    assert_eq!(b.snapshot().half_open_successes, 1);
}

#[tokio::test(start_paused = true)]
async fn a_stale_failure_does_not_touch_a_recovered_breaker() {
    let b = breaker();
    fail_n(&b, 4);
    let slow = b.try_acquire().unwrap(); // issued while CLOSED, generation 0
    fail_n(&b, 1);
    advance(OPEN_FOR).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    b.try_acquire().unwrap().record(Outcome::Success);
    fail_n(&b, 4);
    assert_eq!(b.state(), BreakerState::Closed);
    assert_ne!(slow.generation(), b.snapshot().generation);
    slow.record(Outcome::Failure); // would be the 5th failure if it counted
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::Closed);
    assert_eq!(snap.consecutive_failures, 4);
}

#[tokio::test(start_paused = true)]
async fn recovery_closes_after_exactly_two_probe_successes() {
    let b = breaker();
    half_open(&b).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::HalfOpen);
    assert_eq!(snap.half_open_successes, 1);
    b.try_acquire().unwrap().record(Outcome::Success);
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::Closed);
    assert_eq!(snap.consecutive_failures, 0);
    assert_eq!(snap.opened_at, None);
}

#[tokio::test(start_paused = true)]
async fn a_probe_failure_reopens_with_a_fresh_open_period() {
    let b = breaker();
    half_open(&b).await;
    advance(Duration::from_secs(100)).await; // long after the first period
    b.try_acquire().unwrap().record(Outcome::Success);
    b.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(
        b.try_acquire().unwrap_err(),
        Rejected::Open { retry_in: OPEN_FOR }
    );
    advance(OPEN_FOR - Duration::from_millis(1)).await;
    assert_eq!(b.state(), BreakerState::Open);
    advance(Duration::from_millis(1)).await;
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::HalfOpen);
    assert_eq!(snap.half_open_successes, 0, "successes start over");
}

#[tokio::test(start_paused = true)]
async fn ignored_outcomes_do_not_count() {
    let b = breaker();
    fail_n(&b, 4);
    for _ in 0..20 {
        b.try_acquire().unwrap().record(Outcome::Ignored);
    }
    assert_eq!(b.snapshot().consecutive_failures, 4);
    assert_eq!(b.state(), BreakerState::Closed);
    fail_n(&b, 1);
    assert_eq!(b.state(), BreakerState::Open);

    advance(OPEN_FOR).await;
    for _ in 0..5 {
        b.try_acquire().unwrap().record(Outcome::Ignored);
    }
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::HalfOpen);
    assert_eq!(snap.half_open_successes, 0);
    assert_eq!(snap.probes_in_flight, 0, "an ignored probe frees its slot");
}

#[tokio::test(start_paused = true)]
async fn record_error_classifies_provider_errors() {
    let b = breaker();
    for _ in 0..10 {
        b.try_acquire().unwrap().record_error(&status(400, None));
        b.try_acquire().unwrap().record_error(&status(401, None));
    }
    assert_eq!(b.snapshot().consecutive_failures, 0, "4xx is our fault");
    b.try_acquire()
        .unwrap()
        .record_error(&ProviderError::Timeout);
    b.try_acquire().unwrap().record_error(&status(503, None));
    b.try_acquire().unwrap().record_error(&status(408, None));
    b.try_acquire().unwrap().record_error(&status(529, None));
    b.try_acquire()
        .unwrap()
        .record_error(&ProviderError::Malformed("bad json".into()));
    assert_eq!(b.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn cooldown_skips_until_retry_after_then_admits_again() {
    let b = breaker();
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let generation = b.snapshot().generation;
    b.try_acquire()
        .unwrap()
        .record_error(&status(429, Some(Duration::from_secs(3))));
    let until = start + Duration::from_secs(3);
    assert_eq!(
        call(&b, &calls, Outcome::Success),
        Err(Rejected::CoolingDown { until })
    );
    advance(Duration::from_millis(2_999)).await;
    assert!(
        call(&b, &calls, Outcome::Success)
            .unwrap_err()
            .is_cooldown()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let snap = b.snapshot();
    assert_eq!(snap.cooldown_until, Some(until));
    assert_eq!(snap.state, BreakerState::Closed);
    assert_eq!(snap.consecutive_failures, 0, "a 429 is not a failure");
    assert_eq!(snap.generation, generation);

    advance(Duration::from_millis(1)).await;
    assert!(call(&b, &calls, Outcome::Success).is_ok());
    assert_eq!(b.snapshot().cooldown_until, None);
}

#[tokio::test(start_paused = true)]
async fn cooldown_defaults_without_retry_after_and_is_capped() {
    let b = breaker();
    let start = Instant::now();
    b.try_acquire().unwrap().record_error(&status(429, None));
    assert_eq!(
        b.try_acquire().unwrap_err(),
        Rejected::CoolingDown {
            until: start + DEFAULT_COOLDOWN
        }
    );
    b.cooldown(Duration::from_millis(10));
    assert_eq!(b.snapshot().cooldown_until, Some(start + DEFAULT_COOLDOWN));

    b.cooldown(Duration::from_secs(86_400));
    assert_eq!(b.snapshot().cooldown_until, Some(start + MAX_COOLDOWN));
    advance(MAX_COOLDOWN).await;
    assert!(b.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn every_state_change_bumps_the_generation_and_the_gauge_follows() {
    let b = breaker();
    let mut seen = vec![(b.snapshot().generation, b.state().metric_value())];
    fail_n(&b, 5);
    seen.push((b.snapshot().generation, b.state().metric_value()));
    advance(OPEN_FOR).await;
    seen.push((b.snapshot().generation, b.state().metric_value()));
    b.try_acquire().unwrap().record(Outcome::Success);
    b.try_acquire().unwrap().record(Outcome::Success);
    seen.push((b.snapshot().generation, b.state().metric_value()));
    assert_eq!(seen, [(0, 0), (1, 2), (2, 1), (3, 0)]);
    assert_eq!(BreakerState::HalfOpen.as_str(), "half_open");
}

fn reset() -> ProviderError {
    ProviderError::Connect(crate::domain::ConnectFailure::ConnectionReset)
}

#[tokio::test(start_paused = true)]
async fn a_connection_event_counts_once_however_many_calls_it_broke() {
    let b = breaker();
    let on_the_connection: Vec<Permit> = (0..30).map(|_| b.try_acquire().unwrap()).collect();
    for permit in on_the_connection {
        permit.record_error(&reset());
    }
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::Closed);
    assert_eq!(snap.consecutive_failures, 1);

    for event in 2..=4 {
        let calls: Vec<Permit> = (0..10).map(|_| b.try_acquire().unwrap()).collect();
        for permit in calls {
            permit.record_error(&reset());
        }
        assert_eq!(b.snapshot().consecutive_failures, event);
    }
    b.try_acquire().unwrap().record_error(&reset());
    assert_eq!(b.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn only_connection_failures_share_a_count() {
    let b = breaker();
    let calls: Vec<Permit> = (0..3).map(|_| b.try_acquire().unwrap()).collect();
    for permit in calls {
        permit.record_error(&status(503, None));
    }
    assert_eq!(b.snapshot().consecutive_failures, 3);
    let calls: Vec<Permit> = (0..3).map(|_| b.try_acquire().unwrap()).collect();
    for permit in calls {
        permit.record_error(&reset());
    }
    assert_eq!(b.snapshot().consecutive_failures, 4);
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(b.snapshot().consecutive_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn an_outage_is_told_once_and_a_full_channel_never_blocks() {
    let b = breaker();
    let (tx, mut rx) = mpsc::channel(1);
    assert!(b.tell_openings(tx.clone()));
    assert!(!b.tell_openings(tx), "one listener per breaker");
    assert!(b.tells_openings());
    fail_n(&b, 5);
    let opened = rx.try_recv().unwrap();
    assert_eq!(&*opened.provider, "test");
    assert_eq!(opened.consecutive_failures, 5);
    // A failed probe re-opens it: the same outage, not told again.
    advance(OPEN_FOR).await;
    b.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), BreakerState::Open);
    assert!(rx.try_recv().is_err());
    // Recovered, then down again: told. The channel (capacity 1) is left
    // full, and the next opening is dropped, not waited for.
    for _ in 0..2 {
        advance(OPEN_FOR).await;
        b.try_acquire().unwrap().record(Outcome::Success);
        b.try_acquire().unwrap().record(Outcome::Success);
        assert_eq!(b.state(), BreakerState::Closed);
        fail_n(&b, 5);
    }
    assert_eq!(rx.try_recv().unwrap().consecutive_failures, 5);
    assert!(rx.try_recv().is_err());
}
