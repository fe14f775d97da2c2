//! Sums over usage records for `GetUsage`: totals and groups by task,
//! provider, model and UTC day, over a half-open period `[start, end)`.

use crate::{
    on_store,
    store::{Store, StoreError},
};
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
}

impl Dimension {
    /// SQL expression; fixed strings only, never caller input.
    fn column(self) -> &'static str {
        match self {
            Dimension::Task => "task",
            Dimension::Provider => "provider",
            Dimension::Model => "model",
            Dimension::Day => "CAST(created_at_ms / 86400000 AS BIGINT)",
        }
    }
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

/// Seconds of the earliest and latest instants a protobuf `Timestamp` may
/// hold: 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
const TIMESTAMP_SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

/// Unix ms of a protobuf `Timestamp`'s `(seconds, nanos)`, or `None` when it
/// is not a valid `Timestamp` (outside years 1..=9999, or `nanos` outside
/// `0..1e9`). Callers supply these, so nothing here may overflow.
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

type SumRow = (i64, i64, i64, i64, i64, i64, i64);

/// Sums the team's records in `[start_ms, end_ms)`, grouped by `dims`.
pub async fn summarize(
    store: &Store,
    team: &str,
    start_ms: i64,
    end_ms: i64,
    dims: &[Dimension],
) -> Result<Summary, StoreError> {
    let mut dims = dims.to_vec();
    dims.sort();
    dims.dedup();
    // Latencies come back sorted per group so percentiles are one pass; a
    // month of one team's records is small enough to read.
    let select_dims: String = dims
        .iter()
        .map(|d| format!("CAST({} AS TEXT), ", d.column()))
        .collect();
    let sql = format!(
        "SELECT {select_dims}latency_ms, input_tokens, output_tokens, CAST(COALESCE(cost_micros, 0) AS BIGINT), \
         CAST(CASE WHEN outcome = 'ok' THEN 0 ELSE 1 END AS BIGINT), degraded, \
         CAST(CASE WHEN cost_micros IS NULL THEN 1 ELSE 0 END AS BIGINT) \
         FROM usage_records WHERE team_id = $1 AND created_at_ms >= $2 AND created_at_ms < $3 \
         ORDER BY latency_ms"
    );
    let rows: Vec<(Vec<String>, SumRow)> = on_store!(store, |pool| {
        use sqlx::Row;
        // Audited: the only dynamic parts are `Dimension::column` constants.
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(team)
            .bind(start_ms)
            .bind(end_ms)
            .fetch_all(pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut key = Vec::with_capacity(dims.len());
            for i in 0..dims.len() {
                key.push(row.try_get::<String, _>(i)?);
            }
            let n = dims.len();
            let cost: i64 = row.try_get(n + 3)?;
            let sums: SumRow = (
                row.try_get(n)?,
                row.try_get(n + 1)?,
                row.try_get(n + 2)?,
                cost,
                row.try_get::<i64, _>(n + 4)?,
                row.try_get(n + 5)?,
                row.try_get::<i64, _>(n + 6)?,
            );
            out.push((key, sums));
        }
        Ok::<_, StoreError>(out)
    })?;

    let mut all = Acc::default();
    let mut groups: BTreeMap<BucketKey, Acc> = BTreeMap::new();
    for (key, row) in &rows {
        all.add(row);
        if !dims.is_empty() {
            groups.entry(bucket_key(&dims, key)).or_default().add(row);
        }
    }
    Ok(Summary {
        totals: all.finish(),
        buckets: groups
            .into_iter()
            .map(|(k, acc)| (k, acc.finish()))
            .collect(),
    })
}

fn bucket_key(dims: &[Dimension], values: &[String]) -> BucketKey {
    let mut key = BucketKey::default();
    for (d, v) in dims.iter().zip(values) {
        match d {
            Dimension::Task => key.task = Some(v.clone()),
            Dimension::Provider => key.provider = Some(v.clone()),
            Dimension::Model => key.model = Some(v.clone()),
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
    latencies: Vec<i64>,
}

impl Acc {
    fn add(&mut self, &(latency, input, output, cost, error, degraded, unpriced): &SumRow) {
        let t = &mut self.totals;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        t.requests = t.requests.saturating_add(1);
        t.input_tokens = t.input_tokens.saturating_add(n(input));
        t.output_tokens = t.output_tokens.saturating_add(n(output));
        t.cost_micros = t.cost_micros.saturating_add(cost.max(0));
        t.errors = t.errors.saturating_add(n(error));
        t.degraded = t.degraded.saturating_add(u64::from(degraded != 0));
        t.unpriced = t.unpriced.saturating_add(n(unpriced));
        self.latencies.push(latency);
    }

    fn finish(mut self) -> Totals {
        // Rows arrive sorted by latency, so each group's list is sorted too.
        self.totals.latency_p50_ms = percentile(&self.latencies, 50);
        self.totals.latency_p95_ms = percentile(&self.latencies, 95);
        self.totals
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[i64], p: usize) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    u32::try_from(sorted[rank - 1].max(0)).unwrap_or(u32::MAX)
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

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), 50);
        assert_eq!(percentile(&v, 95), 95);
        assert_eq!(percentile(&[7], 95), 7);
        assert_eq!(percentile(&[], 50), 0);
    }
}
