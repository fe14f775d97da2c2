//! Retry policy tests: deterministic jitter, seeded randomness, paused clock.

// Tests may panic on a broken expectation; the crate-wide deny is for library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use rand::{SeedableRng, rngs::SmallRng};

const SEC: Duration = Duration::from_secs(1);

fn status(code: u16, retry_after: Option<Duration>) -> ProviderError {
    ProviderError::Status {
        status: code,
        retry_after,
        summary: String::new(),
    }
}

fn server_error() -> ProviderError {
    status(500, None)
}

/// `decide` at a fixed `now`, with `remaining` time before the deadline.
fn decide(
    err: &ProviderError,
    attempt: u32,
    priority: Priority,
    has_next: bool,
    remaining: Duration,
    jitter: f64,
) -> Decision {
    let now = Instant::now();
    RetryPolicy::default().decide(
        err,
        attempt,
        priority,
        has_next,
        now,
        now + remaining,
        &mut FixedJitter(jitter),
    )
}

#[test]
fn backoff_cap_doubles_per_attempt_up_to_the_max() {
    let p = RetryPolicy::default();
    assert_eq!(p.backoff_cap(1), SEC);
    assert_eq!(p.backoff_cap(2), 2 * SEC);
    assert_eq!(p.backoff_cap(3), 4 * SEC);
    assert_eq!(p.backoff_cap(4), 4 * SEC);
    assert_eq!(p.backoff_cap(0), SEC);
    assert_eq!(p.backoff_cap(u32::MAX), 4 * SEC, "no overflow");
}

#[test]
fn backoff_stays_within_zero_and_the_cap() {
    let p = RetryPolicy::default();
    let mut rng = SmallRng::seed_from_u64(7);
    for attempt in 1..=3 {
        let cap = p.backoff_cap(attempt);
        let waits: Vec<_> = (0..2_000)
            .map(|_| p.backoff(attempt, None, &mut rng))
            .collect();
        assert!(waits.iter().all(|w| *w <= cap), "attempt {attempt}");
        assert!(waits.iter().any(|w| *w < cap / 10));
        assert!(waits.iter().any(|w| *w > cap * 9 / 10));
        assert_eq!(
            p.backoff(attempt, None, &mut FixedJitter(0.0)),
            Duration::ZERO
        );
        assert_eq!(p.backoff(attempt, None, &mut FixedJitter(1.0)), cap);
    }
}

#[test]
fn out_of_range_jitter_is_clamped_not_a_panic() {
    let p = RetryPolicy::default();
    for (f, expected) in [
        (f64::NAN, 0.0),
        (-3.0, 0.0),
        (7.0, 1.0),
        (f64::INFINITY, 1.0),
    ] {
        assert_eq!(
            p.backoff(1, None, &mut FixedJitter(f)),
            SEC.mul_f64(expected),
            "{f}"
        );
    }
}

#[test]
fn backoff_is_never_shorter_than_retry_after() {
    let p = RetryPolicy::default();
    let mut rng = SmallRng::seed_from_u64(11);
    for attempt in 1..=3 {
        for ra in [Duration::from_millis(100), 3 * SEC, 10 * SEC] {
            for _ in 0..500 {
                let w = p.backoff(attempt, Some(ra), &mut rng);
                assert!(w >= ra);
                assert!(w <= ra.max(p.backoff_cap(attempt)));
            }
        }
    }
    let w = p.backoff(1, Some(Duration::from_millis(100)), &mut FixedJitter(0.5));
    assert_eq!(w, Duration::from_millis(500));
}

#[test]
fn a_429_without_retry_after_waits_out_the_default_cooldown() {
    use crate::resilience::breaker::DEFAULT_COOLDOWN;
    for jitter in [0.0, 0.3] {
        assert_eq!(
            decide(
                &status(429, None),
                1,
                Priority::Background,
                true,
                60 * SEC,
                jitter
            ),
            Decision::RetryAfter(DEFAULT_COOLDOWN)
        );
        assert_eq!(
            decide(
                &server_error(),
                1,
                Priority::Background,
                true,
                60 * SEC,
                jitter
            ),
            Decision::RetryAfter(SEC.mul_f64(jitter))
        );
    }
    assert_eq!(
        decide(
            &status(429, None),
            1,
            Priority::Interactive,
            true,
            60 * SEC,
            0.0
        ),
        Decision::NextTarget
    );
}

#[test]
fn no_retry_for_non_retryable_errors() {
    let errors = [
        status(400, None),
        status(401, None),
        status(404, None),
        ProviderError::Malformed("bad json".into()),
        ProviderError::Unsupported("no key".into()),
    ];
    for err in &errors {
        for priority in [Priority::Interactive, Priority::Background] {
            assert_eq!(
                decide(err, 1, priority, true, 60 * SEC, 0.0),
                Decision::NextTarget
            );
            assert_eq!(
                decide(err, 1, priority, false, 60 * SEC, 0.0),
                Decision::GiveUp
            );
        }
    }
}

#[test]
fn at_most_three_attempts_per_target() {
    for err in [server_error(), ProviderError::Timeout, status(429, None)] {
        let d = |attempt, has_next| {
            decide(&err, attempt, Priority::Background, has_next, 60 * SEC, 1.0)
        };
        assert_eq!(d(1, false), Decision::RetryAfter(SEC));
        assert_eq!(d(2, false), Decision::RetryAfter(2 * SEC));
        assert_eq!(d(3, false), Decision::GiveUp);
        assert_eq!(d(3, true), Decision::NextTarget);
    }
}

#[test]
fn never_a_wait_ending_at_or_past_the_deadline() {
    let p = RetryPolicy::default();
    let mut rng = SmallRng::seed_from_u64(3);
    let now = Instant::now();
    for i in 0..5_000u64 {
        let remaining = Duration::from_millis(i % 5_000);
        let retry_after = (i % 3 == 0).then(|| Duration::from_millis(i % 4_000));
        let attempt = (i % 3) as u32 + 1;
        let priority = if i % 2 == 0 {
            Priority::Background
        } else {
            Priority::Interactive
        };
        let err = status(503, retry_after);
        let decision = p.decide(
            &err,
            attempt,
            priority,
            i % 4 == 0,
            now,
            now + remaining,
            &mut rng,
        );
        if let Decision::RetryAfter(w) = decision {
            assert!(w < remaining, "wait {w:?} with {remaining:?} left");
            assert!(retry_after.is_none_or(|ra| w >= ra));
        }
    }
    let d = decide(&server_error(), 1, Priority::Background, false, SEC, 1.0);
    assert_eq!(d, Decision::GiveUp);
    let d = decide(
        &status(429, Some(30 * SEC)),
        1,
        Priority::Background,
        true,
        10 * SEC,
        0.0,
    );
    assert_eq!(d, Decision::NextTarget);
    let past = p.decide(
        &server_error(),
        1,
        Priority::Background,
        false,
        now,
        now,
        &mut rng,
    );
    assert_eq!(past, Decision::GiveUp);
}

#[test]
fn interactive_fails_over_rather_than_waiting() {
    let i = Priority::Interactive;
    let err = server_error();
    assert_eq!(
        decide(&err, 1, i, true, 60 * SEC, 0.5),
        Decision::NextTarget
    );
    assert_eq!(
        decide(&err, 1, i, true, 60 * SEC, 0.2),
        Decision::RetryAfter(Duration::from_millis(200))
    );
    assert_eq!(
        decide(&err, 1, i, true, 60 * SEC, 0.25),
        Decision::RetryAfter(DEFAULT_INTERACTIVE_MAX_WAIT)
    );
    let limited = status(429, Some(SEC));
    assert_eq!(
        decide(&limited, 1, i, true, 60 * SEC, 0.0),
        Decision::NextTarget
    );
}

#[test]
fn interactive_at_the_last_target_retries_within_the_deadline() {
    let i = Priority::Interactive;
    let err = server_error();
    assert_eq!(
        decide(&err, 1, i, false, 60 * SEC, 0.5),
        Decision::RetryAfter(Duration::from_millis(500))
    );
    assert_eq!(
        decide(&err, 2, i, false, 60 * SEC, 1.0),
        Decision::RetryAfter(2 * SEC)
    );
    assert_eq!(
        decide(&err, 1, i, false, Duration::from_millis(300), 0.5),
        Decision::GiveUp
    );
}

#[test]
fn background_uses_the_full_schedule_even_with_a_next_target() {
    let b = Priority::Background;
    let err = ProviderError::Timeout;
    assert_eq!(
        decide(&err, 1, b, true, 60 * SEC, 1.0),
        Decision::RetryAfter(SEC)
    );
    assert_eq!(
        decide(&err, 2, b, true, 60 * SEC, 1.0),
        Decision::RetryAfter(2 * SEC)
    );
    let limited = status(429, Some(5 * SEC));
    assert_eq!(
        decide(&limited, 1, b, true, 60 * SEC, 0.0),
        Decision::RetryAfter(5 * SEC)
    );
}

/// Drives the policy as the router does, against an always-failing target; counts the calls.
async fn calls_until_done(deadline_in: Duration) -> (u32, Decision, Duration) {
    let policy = RetryPolicy::default();
    let start = Instant::now();
    let deadline = start + deadline_in;
    let mut calls = 0;
    loop {
        calls += 1;
        let decision = policy.decide(
            &server_error(),
            calls,
            Priority::Background,
            false,
            Instant::now(),
            deadline,
            &mut FixedJitter(1.0),
        );
        match decision {
            Decision::RetryAfter(w) => tokio::time::sleep(w).await,
            other => return (calls, other, start.elapsed()),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_background_walk_makes_exactly_three_calls_then_gives_up() {
    assert_eq!(
        calls_until_done(60 * SEC).await,
        (3, Decision::GiveUp, 3 * SEC)
    );
    // With 2.5 s left, the second wait (2 s, after 1 s) would end past the deadline.
    let short = calls_until_done(Duration::from_millis(2_500)).await;
    assert_eq!(short, (2, Decision::GiveUp, SEC));
}

#[test]
fn a_router_jitter_is_fixed_or_uniform_in_zero_one() {
    assert_eq!(Jitter::default(), Jitter::Random);
    assert_eq!(Jitter::Fixed(0.25).fraction(), 0.25);
    let p = RetryPolicy::default();
    assert_eq!(p.backoff(2, None, &mut Jitter::Fixed(1.0)), 2 * SEC);
    let draws: Vec<f64> = (0..1_000).map(|_| Jitter::Random.fraction()).collect();
    assert!(draws.iter().all(|f| (0.0..1.0).contains(f)));
    assert!(draws.iter().any(|f| *f < 0.1) && draws.iter().any(|f| *f > 0.9));
}
