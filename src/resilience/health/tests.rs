//! Health window tests on tokio's paused clock.

// Tests may panic on a broken expectation; the crate-wide deny is for library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use tokio::time::advance;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn error_rate_and_percentiles_on_known_data() {
    let h = ProviderHealth::default();
    for i in (1..=100u64).rev() {
        h.record(ms(i), i % 4 != 0);
    }
    let snap = h.snapshot();
    assert_eq!(snap.calls, 100);
    assert_eq!(snap.errors, 25);
    assert_eq!(snap.error_rate, 0.25);
    assert_eq!(h.recent_error_rate(), 0.25);
    assert_eq!(snap.p50, Some(ms(50)));
    assert_eq!(snap.p99, Some(ms(99)));
    assert_eq!(h.latency_percentile(100.0), Some(ms(100)));
    assert_eq!(h.latency_percentile(1.0), Some(ms(1)));
    // Percentiles where pct/100·n would round up a rank.
    assert_eq!(h.latency_percentile(7.0), Some(ms(7)));
    assert_eq!(h.latency_percentile(55.0), Some(ms(55)));
}

#[test]
fn nearest_rank_on_a_small_sample() {
    let sorted = [ms(10), ms(20), ms(30), ms(40), ms(50)];
    assert_eq!(nearest_rank(&sorted, 50.0), Some(ms(30))); // rank ceil(2.5) = 3
    assert_eq!(nearest_rank(&sorted, 99.0), Some(ms(50)));
    assert_eq!(nearest_rank(&sorted, 20.0), Some(ms(10)));
    assert_eq!(nearest_rank(&sorted, 21.0), Some(ms(20)));
    assert_eq!(nearest_rank(&sorted, 0.0), Some(ms(10)));
    assert_eq!(nearest_rank(&sorted, 250.0), Some(ms(50)));
    assert_eq!(nearest_rank(&sorted, f64::NAN), Some(ms(50)));
    assert_eq!(nearest_rank(&[ms(7)], 99.0), Some(ms(7)));
    assert_eq!(nearest_rank(&[], 50.0), None);
}

#[tokio::test(start_paused = true)]
async fn an_empty_window_reports_no_errors_and_no_latency() {
    let snap = ProviderHealth::default().snapshot();
    assert_eq!(
        snap,
        HealthSnapshot {
            calls: 0,
            errors: 0,
            error_rate: 0.0,
            p50: None,
            p99: None,
            deadline_exceeded: 0,
            cancelled: 0,
            connection_errors: 0,
            resent: 0,
        }
    );
}

#[tokio::test(start_paused = true)]
async fn the_window_keeps_only_the_last_capacity_calls() {
    let h = ProviderHealth::default();
    for _ in 0..900 {
        h.record(ms(5_000), false);
    }
    for _ in 0..DEFAULT_CAPACITY {
        h.record(ms(10), true);
    }
    let snap = h.snapshot();
    assert_eq!(snap.calls, DEFAULT_CAPACITY);
    assert_eq!(snap.error_rate, 0.0);
    assert_eq!(snap.p99, Some(ms(10)));
    assert!(h.lock().samples.capacity() < 2 * DEFAULT_CAPACITY);
}

#[tokio::test(start_paused = true)]
async fn the_window_forgets_calls_older_than_max_age() {
    let h = ProviderHealth::new(10, Duration::from_secs(60));
    h.record(ms(100), false);
    advance(Duration::from_secs(30)).await;
    h.record(ms(200), true);
    advance(Duration::from_secs(30)).await;
    assert_eq!(h.snapshot().calls, 2);
    advance(Duration::from_millis(1)).await;
    let snap = h.snapshot();
    assert_eq!((snap.calls, snap.errors), (1, 0));
    assert_eq!(snap.p50, Some(ms(200)));
    advance(Duration::from_secs(31)).await;
    assert_eq!(h.snapshot().calls, 0);
}

#[tokio::test(start_paused = true)]
async fn attempts_cut_short_by_the_caller_are_counted_apart_from_calls() {
    let h = ProviderHealth::new(3, Duration::from_secs(60));
    h.record(ms(10), true);
    for _ in 0..5 {
        h.record_cut_short(CutShort::Deadline);
    }
    h.record_cut_short(CutShort::Cancelled);
    let snap = h.snapshot();
    assert_eq!((snap.calls, snap.errors, snap.error_rate), (1, 0, 0.0));
    assert_eq!(snap.p99, Some(ms(10)), "no latency of a cut attempt");
    assert_eq!((snap.deadline_exceeded, snap.cancelled), (2, 1));
    advance(Duration::from_secs(61)).await;
    let snap = h.snapshot();
    assert_eq!(
        (snap.calls, snap.deadline_exceeded, snap.cancelled),
        (0, 0, 0)
    );
}
