//! `mode = "error_rate"` on the paused clock: one call a second, so the window slides meanwhile.

// Tests may panic on a broken expectation; the crate-wide deny is for library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use tokio::time::advance;

const SECOND: Duration = Duration::from_secs(1);

fn error_rate_breaker() -> CircuitBreaker {
    let config = BreakerConfig {
        mode: BreakerMode::ErrorRate,
        ..BreakerConfig::default()
    };
    CircuitBreaker::new("test", &config)
}

/// Runs `pattern` (true = failure) one call a second, `calls` times or until refused; calls made.
async fn run(b: &CircuitBreaker, pattern: &[bool], calls: usize) -> usize {
    for (n, failed) in pattern.iter().cycle().take(calls).enumerate() {
        let Ok(permit) = b.try_acquire() else {
            return n;
        };
        permit.record(if *failed {
            Outcome::Failure
        } else {
            Outcome::Success
        });
        advance(SECOND).await;
    }
    calls
}

#[tokio::test(start_paused = true)]
async fn a_provider_failing_40_percent_stays_closed() {
    let b = error_rate_breaker();
    let made = run(&b, &[false, false, false, true, true], 300).await;
    assert_eq!(made, 300);
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::Closed);
    assert!((27..=30).contains(&snap.window.calls), "{:?}", snap.window);
    let share = f64::from(snap.window.failures) / f64::from(snap.window.calls);
    assert!((0.35..0.45).contains(&share), "{:?}", snap.window);
}

#[tokio::test(start_paused = true)]
async fn a_provider_failing_60_percent_opens_once_min_requests_are_seen() {
    let b = error_rate_breaker();
    let made = run(&b, &[true, true, true, false, false], 300).await;
    // The 11th call is the first failure with 10 calls in the window.
    assert_eq!(made, 11);
    let snap = b.snapshot();
    assert_eq!(snap.state, BreakerState::Open);
    assert_eq!(snap.window, WindowCounts::default(), "cleared on opening");
}

#[tokio::test(start_paused = true)]
async fn fewer_than_min_requests_never_open() {
    let b = error_rate_breaker();
    for _ in 0..9 {
        b.try_acquire().unwrap().record(Outcome::Failure);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(b.snapshot().consecutive_failures, 9);
}

#[tokio::test(start_paused = true)]
async fn failures_older_than_the_window_slide_out() {
    let b = error_rate_breaker();
    for _ in 0..9 {
        b.try_acquire().unwrap().record(Outcome::Failure);
    }
    advance(Duration::from_secs(31)).await;
    assert_eq!(b.snapshot().window, WindowCounts::default());
    b.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(
        b.snapshot().window,
        WindowCounts {
            calls: 1,
            failures: 1
        }
    );
}

#[tokio::test(start_paused = true)]
async fn ignored_outcomes_and_cancellations_are_not_calls() {
    let b = error_rate_breaker();
    for _ in 0..20 {
        b.try_acquire().unwrap().record(Outcome::Ignored);
        drop(b.try_acquire().unwrap());
    }
    for _ in 0..9 {
        b.try_acquire().unwrap().record(Outcome::Failure);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(b.snapshot().window.calls, 9);
}

#[tokio::test(start_paused = true)]
async fn half_open_is_as_in_consecutive_mode_and_recovery_starts_afresh() {
    let b = error_rate_breaker();
    run(&b, &[true], 10).await;
    assert_eq!(b.state(), BreakerState::Open);
    advance(Duration::from_secs(30)).await;
    assert_eq!(b.state(), BreakerState::HalfOpen);
    let probe = b.try_acquire().unwrap();
    assert_eq!(b.try_acquire().unwrap_err(), Rejected::HalfOpenBusy);
    probe.record(Outcome::Failure);
    assert_eq!(b.state(), BreakerState::Open);
    advance(Duration::from_secs(30)).await;
    for _ in 0..2 {
        b.try_acquire().unwrap().record(Outcome::Success);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    for _ in 0..9 {
        b.try_acquire().unwrap().record(Outcome::Failure);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    b.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(b.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_stale_failure_neither_counts_nor_reopens() {
    let b = error_rate_breaker();
    let slow = b.try_acquire().unwrap();
    run(&b, &[true], 10).await;
    assert_eq!(b.state(), BreakerState::Open);
    advance(Duration::from_secs(30)).await;
    for _ in 0..2 {
        b.try_acquire().unwrap().record(Outcome::Success);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    slow.record(Outcome::Failure);
    assert_eq!(b.snapshot().window, WindowCounts::default());
}

#[tokio::test(start_paused = true)]
async fn a_connection_event_is_one_failure_in_the_window() {
    let b = error_rate_breaker();
    let reset = ProviderError::Connect(crate::domain::ConnectFailure::ConnectionReset);
    let calls: Vec<Permit> = (0..10).map(|_| b.try_acquire().unwrap()).collect();
    for permit in calls {
        permit.record_error(&reset);
    }
    assert_eq!(
        b.snapshot().window,
        WindowCounts {
            calls: 1,
            failures: 1
        }
    );
}
