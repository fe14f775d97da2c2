//! Sums over usage records for `GetUsage`: totals and groups over `[start, end)`.

use crate::store::{Store, StoreError};
use chrono::{DateTime, Datelike, TimeZone, Utc};
use std::collections::BTreeMap;

const DAY_MS: i64 = 86_400_000;

/// A dimension to group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dimension {
    /// Task name.
    Task,
    /// Serving provider.
    Provider,
    /// Serving model.
    Model,
    /// UTC calendar day.
    Day,
    /// The request's `context.user_id` ('' for calls naming none).
    User,
}

/// Sums over a set of records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Requests.
    pub requests: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cost of priced records, micro-USD (exact).
    pub cost_micros: i64,
    /// Requests that failed.
    pub errors: u64,
    /// Requests served by a fallback.
    pub degraded: u64,
    /// Records with unknown cost.
    pub unpriced: u64,
    /// Median latency, ms.
    pub latency_p50_ms: u32,
    /// 95th percentile latency, ms.
    pub latency_p95_ms: u32,
    /// 99th percentile latency, ms.
    pub latency_p99_ms: u32,
}

/// One group's key: the value of each requested dimension.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct BucketKey {
    /// Task, when grouped by task.
    pub task: Option<String>,
    /// Provider, when grouped by provider.
    pub provider: Option<String>,
    /// Model, when grouped by model.
    pub model: Option<String>,
    /// `YYYY-MM-DD`, when grouped by day.
    pub day: Option<String>,
    /// User, when grouped by user.
    pub user: Option<String>,
}

/// Totals plus groups.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Over the whole period.
    pub totals: Totals,
    /// Per group, ordered by key.
    pub buckets: Vec<(BucketKey, Totals)>,
}

/// `[start, end)` of the UTC calendar month containing `at`, in unix ms.
pub fn month_of(at: DateTime<Utc>) -> (i64, i64) {
    let start = Utc
        .with_ymd_and_hms(at.year(), at.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or(at);
    let (y, m) = if at.month() == 12 {
        (at.year() + 1, 1)
    } else {
        (at.year(), at.month() + 1)
    };
    let end = Utc
        .with_ymd_and_hms(y, m, 1, 0, 0, 0)
        .single()
        .unwrap_or(at);
    (start.timestamp_millis(), end.timestamp_millis())
}

/// Seconds a protobuf `Timestamp` may hold: 0001-01-01 to 9999-12-31T23:59:59Z.
const TIMESTAMP_SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

/// Unix ms of a protobuf `Timestamp`, `None` when invalid (caller input: no overflow).
pub fn timestamp_ms(seconds: i64, nanos: i32) -> Option<i64> {
    if !TIMESTAMP_SECONDS.contains(&seconds) || !(0..1_000_000_000).contains(&nanos) {
        return None;
    }
    seconds
        .checked_mul(1000)?
        .checked_add(i64::from(nanos / 1_000_000))
}

/// [`month_of`] the instant `ms` (unix ms); `None` outside chrono's range.
pub fn month_of_ms(ms: i64) -> Option<(i64, i64)> {
    DateTime::from_timestamp_millis(ms).map(month_of)
}

/// Latency, input, output, cost, error, degraded, unpriced (0 or 1).
pub(super) type SumRow = (i64, i64, i64, i64, i64, i64, i64);

/// Requests, input, output, cost, errors, degraded, unpriced.
pub(super) type RollupRow = (i64, i64, i64, i64, i64, i64, i64);

/// The floor of `ms`'s latency bucket: exact below 32 ms, then 32 per
/// doubling (~3 %), as the `usage_records_rollup` trigger (migration 0007).
pub fn latency_floor(ms: i64) -> i64 {
    if ms < 32 {
        return ms.max(0);
    }
    let doubling = 63 - i64::from(ms.leading_zeros());
    let width = 1_i64 << (doubling - 5);
    ms / width * width
}

/// Sums the team's records in `[start_ms, end_ms)` by `dims`; whole days from rollups.
pub async fn summarize(
    store: &Store,
    team: &str,
    start_ms: i64,
    end_ms: i64,
    dims: &[Dimension],
) -> Result<Summary, StoreError> {
    summarize_teams(store, &[team.to_owned()], start_ms, end_ms, dims).await
}

/// [`summarize`] over several teams at once: one set of groups, and percentiles
/// over all their calls (the console's fleet figures).
pub async fn summarize_teams(
    store: &Store,
    teams: &[String],
    start_ms: i64,
    end_ms: i64,
    dims: &[Dimension],
) -> Result<Summary, StoreError> {
    let mut dims = dims.to_vec();
    dims.sort();
    dims.dedup();
    let mut sums = Sums {
        dims,
        all: Acc::default(),
        groups: BTreeMap::new(),
    };
    for team in teams {
        sums.add_team(store, team, start_ms, end_ms).await?;
    }
    Ok(Summary {
        totals: sums.all.finish(),
        buckets: sums
            .groups
            .into_iter()
            .map(|(k, acc)| (k, acc.finish()))
            .collect(),
    })
}

/// Sums under way: over everything, and per group of `dims`.
struct Sums {
    dims: Vec<Dimension>,
    all: Acc,
    groups: BTreeMap<BucketKey, Acc>,
}

impl Sums {
    fn group(&mut self, key: &[String]) -> Option<&mut Acc> {
        if self.dims.is_empty() {
            return None;
        }
        Some(self.groups.entry(bucket_key(&self.dims, key)).or_default())
    }

    async fn add_team(
        &mut self,
        store: &Store,
        team: &str,
        start_ms: i64,
        end_ms: i64,
    ) -> Result<(), StoreError> {
        let repository = super::sql::repository(store);
        // Whole days: [first_day, end_day) in UTC days.
        let first_day = start_ms.div_euclid(DAY_MS) + i64::from(start_ms.rem_euclid(DAY_MS) != 0);
        let end_day = end_ms.div_euclid(DAY_MS);
        let mut edges = vec![(start_ms, end_ms)];
        // The rollups have no user: grouping by user reads the records.
        if first_day < end_day && !self.dims.contains(&Dimension::User) {
            edges = vec![(start_ms, first_day * DAY_MS), (end_day * DAY_MS, end_ms)];
            for (key, sums) in repository
                .rollups(team, first_day, end_day, &self.dims)
                .await?
            {
                self.all.add_rollup(&sums);
                if let Some(acc) = self.group(&key) {
                    acc.add_rollup(&sums);
                }
            }
            for (key, floor, count) in repository
                .latency_histogram(team, first_day, end_day, &self.dims)
                .await?
            {
                self.all.add_latencies(floor, count);
                if let Some(acc) = self.group(&key) {
                    acc.add_latencies(floor, count);
                }
            }
        }
        for (from, to) in edges.into_iter().filter(|(from, to)| from < to) {
            let dims = self.dims.clone();
            let mut each = |key: Vec<String>, row: SumRow| {
                self.all.add(&row);
                if let Some(acc) = self.group(&key) {
                    acc.add(&row);
                }
            };
            repository.records(team, from, to, &dims, &mut each).await?;
        }
        Ok(())
    }
}

fn bucket_key(dims: &[Dimension], values: &[String]) -> BucketKey {
    let mut key = BucketKey::default();
    for (d, v) in dims.iter().zip(values) {
        match d {
            Dimension::Task => key.task = Some(v.clone()),
            Dimension::Provider => key.provider = Some(v.clone()),
            Dimension::Model => key.model = Some(v.clone()),
            Dimension::User => key.user = Some(v.clone()),
            Dimension::Day => {
                key.day = v
                    .parse::<i64>()
                    .ok()
                    .and_then(|day| Utc.timestamp_millis_opt(day * DAY_MS).single())
                    .map(|t| t.format("%Y-%m-%d").to_string());
            }
        }
    }
    key
}

#[derive(Default)]
struct Acc {
    totals: Totals,
    /// Records per latency bucket floor (see [`latency_floor`]).
    latencies: BTreeMap<i64, u64>,
}

impl Acc {
    fn add(&mut self, &(latency, input, output, cost, error, degraded, unpriced): &SumRow) {
        self.add_rollup(&(
            1,
            input,
            output,
            cost,
            error,
            i64::from(degraded != 0),
            unpriced,
        ));
        self.add_latencies(latency_floor(latency), 1);
    }

    fn add_rollup(
        &mut self,
        &(requests, input, output, cost, errors, degraded, unpriced): &RollupRow,
    ) {
        let t = &mut self.totals;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        t.requests = t.requests.saturating_add(n(requests));
        t.input_tokens = t.input_tokens.saturating_add(n(input));
        t.output_tokens = t.output_tokens.saturating_add(n(output));
        t.cost_micros = t.cost_micros.saturating_add(cost.max(0));
        t.errors = t.errors.saturating_add(n(errors));
        t.degraded = t.degraded.saturating_add(n(degraded));
        t.unpriced = t.unpriced.saturating_add(n(unpriced));
    }

    fn add_latencies(&mut self, floor: i64, count: u64) {
        let slot = self.latencies.entry(floor).or_default();
        *slot = slot.saturating_add(count);
    }

    fn finish(self) -> Totals {
        let mut totals = self.totals;
        totals.latency_p50_ms = percentile(&self.latencies, 50);
        totals.latency_p95_ms = percentile(&self.latencies, 95);
        totals.latency_p99_ms = percentile(&self.latencies, 99);
        totals
    }
}

/// Nearest-rank percentile of a histogram (`floor → count`).
fn percentile(histogram: &BTreeMap<i64, u64>, p: u64) -> u32 {
    let total: u64 = histogram.values().fold(0, |a, c| a.saturating_add(*c));
    if total == 0 {
        return 0;
    }
    let rank = p.saturating_mul(total).div_ceil(100).max(1);
    let mut seen = 0_u64;
    for (floor, count) in histogram {
        seen = seen.saturating_add(*count);
        if seen >= rank {
            return u32::try_from((*floor).max(0)).unwrap_or(u32::MAX);
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_are_utc_calendar_months() {
        let at = Utc
            .with_ymd_and_hms(2026, 12, 31, 23, 59, 59)
            .single()
            .unwrap();
        let (s, e) = month_of(at);
        assert_eq!(
            s,
            Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0)
                .single()
                .unwrap()
                .timestamp_millis()
        );
        assert_eq!(
            e,
            Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0)
                .single()
                .unwrap()
                .timestamp_millis()
        );
    }

    #[test]
    fn timestamps_outside_the_protobuf_range_are_refused() {
        assert_eq!(timestamp_ms(1, 999_999_999), Some(1_999));
        assert_eq!(timestamp_ms(-1, 500_000_000), Some(-500));
        assert_eq!(timestamp_ms(i64::MAX, 0), None);
        assert_eq!(timestamp_ms(i64::MIN, 0), None);
        assert_eq!(timestamp_ms(253_402_300_800, 0), None);
        assert_eq!(timestamp_ms(-62_135_596_801, 0), None);
        assert_eq!(timestamp_ms(0, -1), None);
        assert_eq!(timestamp_ms(0, 1_000_000_000), None);
        let latest = timestamp_ms(253_402_300_799, 999_999_999).unwrap();
        assert!(month_of_ms(latest).is_some());
        let earliest = timestamp_ms(-62_135_596_800, 0).unwrap();
        assert_eq!(month_of_ms(earliest).map(|m| m.0), Some(earliest));
    }

    fn histogram(latencies: &[i64]) -> BTreeMap<i64, u64> {
        let mut acc = Acc::default();
        for &l in latencies {
            acc.add_latencies(latency_floor(l), 1);
        }
        acc.latencies
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<i64> = (1..=31).collect();
        assert_eq!(percentile(&histogram(&v), 50), 16);
        assert_eq!(percentile(&histogram(&v), 95), 30);
        assert_eq!(percentile(&histogram(&[7]), 95), 7);
        assert_eq!(percentile(&BTreeMap::new(), 50), 0);
        // Above 32 ms: the bucket's floor, within 1/32 of the value.
        let slow: Vec<i64> = (1..=100).map(|i| i * 100).collect();
        let p50 = percentile(&histogram(&slow), 50);
        assert!(
            p50 <= 5000 && f64::from(p50) >= 5000.0 * (1.0 - 1.0 / 32.0),
            "{p50}"
        );
    }

    #[test]
    fn latency_buckets_are_exact_below_32_ms_and_within_a_32nd_above() {
        for ms in 0..32 {
            assert_eq!(latency_floor(ms), ms);
        }
        assert_eq!(latency_floor(-5), 0);
        assert_eq!(latency_floor(32), 32);
        assert_eq!(latency_floor(63), 63);
        assert_eq!(latency_floor(64), 64);
        assert_eq!(latency_floor(65), 64);
        assert_eq!(latency_floor(1000), 992);
        for ms in [33_i64, 100, 999, 12_345, 600_000, i64::MAX] {
            let floor = latency_floor(ms);
            assert!(
                floor <= ms && (ms - floor) as f64 <= ms as f64 / 32.0,
                "{ms} → {floor}"
            );
        }
    }
}
