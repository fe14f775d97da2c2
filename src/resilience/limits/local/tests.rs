//! Limit tests on tokio's paused clock (which also drives the rate limiter).

// Tests may panic on a broken expectation; the crate-wide deny is for library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::time::advance;

const SEC: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn the_concurrency_bound_is_exact_and_try_acquire_fails_when_saturated() {
    let limits = LocalLimits::new(None, None, 3);
    let held: Vec<_> = (0..3).map(|_| limits.try_acquire(0).unwrap()).collect();
    assert_eq!(limits.in_flight(), 3);
    assert_eq!(limits.try_acquire(0).unwrap_err(), LimitRejected::Saturated);
    drop(held);
    assert_eq!(limits.in_flight(), 0);
    let _again = limits.try_acquire(0).unwrap();
}

#[tokio::test(start_paused = true)]
async fn fifty_waiting_callers_never_exceed_the_bound() {
    let limits = LocalLimits::new(None, None, 4);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (limits, in_flight, peak) =
                (limits.clone(), Arc::clone(&in_flight), Arc::clone(&peak));
            tokio::spawn(async move {
                let _permit = limits.acquire_until(start + 60 * SEC, 0).await?;
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, LimitRejected>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 4);
    // 50 calls, 4 at a time, 100 ms each: 13 rounds.
    assert_eq!(start.elapsed(), Duration::from_millis(1_300));
}

#[tokio::test(start_paused = true)]
async fn acquire_until_gives_up_at_the_deadline() {
    let limits = LocalLimits::new(None, None, 1);
    let held = limits.try_acquire(0).unwrap();
    let start = Instant::now();
    let err = limits.acquire_until(start + 5 * SEC, 0).await.unwrap_err();
    assert_eq!(err, LimitRejected::Saturated);
    assert_eq!(start.elapsed(), 5 * SEC);

    let start = Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(2 * SEC).await;
        drop(held);
    });
    let _permit = limits.acquire_until(start + 5 * SEC, 0).await.unwrap();
    assert_eq!(start.elapsed(), 2 * SEC);
}

#[tokio::test(start_paused = true)]
async fn the_rpm_limit_is_enforced() {
    let limits = LocalLimits::new(Some(3), None, 64);
    // A burst of `rpm`, then one every 60 s / 3 = 20 s.
    for _ in 0..3 {
        drop(limits.try_acquire(0).unwrap());
    }
    assert_eq!(
        limits.try_acquire(0).unwrap_err(),
        LimitRejected::RateLimited { retry_in: 20 * SEC }
    );
    assert_eq!(limits.in_flight(), 0, "a rate-limited try holds no slot");
    advance(19 * SEC).await;
    assert!(limits.try_acquire(0).is_err());
    advance(SEC).await;
    drop(limits.try_acquire(0).unwrap());
    assert!(limits.try_acquire(0).is_err());

    let mut admitted = 0;
    for _ in 0..120 {
        advance(SEC).await;
        for _ in 0..10 {
            if limits.try_acquire(0).is_ok() {
                admitted += 1;
            }
        }
    }
    assert_eq!(admitted, 6);
}

#[tokio::test(start_paused = true)]
async fn acquire_until_waits_for_the_rate_limit_within_the_deadline() {
    let limits = LocalLimits::new(Some(1), None, 64);
    drop(limits.try_acquire(0).unwrap());

    let start = Instant::now();
    let err = limits.acquire_until(start + 30 * SEC, 0).await.unwrap_err();
    assert_eq!(err, LimitRejected::RateLimited { retry_in: 60 * SEC });
    assert_eq!(start.elapsed(), Duration::ZERO, "no pointless wait");

    let _permit = limits.acquire_until(start + 120 * SEC, 0).await.unwrap();
    assert_eq!(start.elapsed(), 60 * SEC);
}

#[tokio::test(start_paused = true)]
async fn a_saturated_try_spends_no_rate_token() {
    let limits = LocalLimits::new(Some(2), None, 1);
    let held = limits.try_acquire(0).unwrap(); // token 1 of 2
    for _ in 0..10 {
        assert_eq!(limits.try_acquire(0).unwrap_err(), LimitRejected::Saturated);
    }
    drop(held);
    let _second = limits.try_acquire(0).unwrap(); // token 2 is still there
}

#[tokio::test(start_paused = true)]
async fn no_rpm_means_unlimited_and_zero_slots_means_one() {
    let limits = LocalLimits::new(None, None, 2);
    for _ in 0..10_000 {
        drop(limits.try_acquire(0).unwrap());
    }
    let zero = LocalLimits::new(Some(0), None, 0);
    assert_eq!(zero.max_concurrency(), 1);
    let _only = zero.try_acquire(0).unwrap();
    assert_eq!(zero.try_acquire(0).unwrap_err(), LimitRejected::Saturated);
}
