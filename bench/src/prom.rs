//! The server's own view: histograms scraped from `/metrics` before and
//! after a step (parsed with `prometheus-parse`), and quantiles estimated
//! from the bucket deltas. Bucket bounds limit the precision; `_sum /
//! _count` gives an exact mean.
//!
//! The quantile estimate is written here: `prometheus-parse` reads the
//! exposition but does not do PromQL's `histogram_quantile` (linear inside
//! a bucket), and no maintained crate does it on parsed buckets.

use prometheus_parse::{Sample, Value};

/// Name of the histogram of request time not spent waiting on providers.
pub const OVERHEAD: &str = "orchestrator_overhead_seconds";

/// How long callers waited on the ledger writer, by `op`.
pub const LEDGER_WAIT: &str = "usage_ledger_wait_seconds";
/// One group commit's transaction.
pub const LEDGER_COMMIT: &str = "usage_ledger_commit_seconds";
/// One WAL `fdatasync` after a commit (SQLite, full durability).
pub const LEDGER_SYNC: &str = "usage_ledger_sync_seconds";
/// Operations per group commit.
pub const LEDGER_BATCH: &str = "usage_ledger_batch_operations";

/// What a step reads from `/metrics` before and after itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// [`OVERHEAD`].
    pub overhead: Histogram,
    /// The metering ledger's histograms (empty with metering off).
    pub ledger: Ledger,
}

/// The ledger writer as the server measures it: where a metered call's
/// time goes between its two waits on the writer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    /// [`LEDGER_WAIT`] of reservations (before the provider call).
    pub reserve_wait: Histogram,
    /// [`LEDGER_WAIT`] of settlements (before the response).
    pub settle_wait: Histogram,
    /// [`LEDGER_COMMIT`].
    pub commit: Histogram,
    /// [`LEDGER_SYNC`].
    pub sync: Histogram,
    /// [`LEDGER_BATCH`].
    pub batch: Histogram,
}

impl Ledger {
    fn of(samples: &[Sample]) -> Self {
        Self {
            reserve_wait: Histogram::of(samples, LEDGER_WAIT, &[("op", "reserve")]),
            settle_wait: Histogram::of(samples, LEDGER_WAIT, &[("op", "settle")]),
            commit: Histogram::of(samples, LEDGER_COMMIT, &[]),
            sync: Histogram::of(samples, LEDGER_SYNC, &[]),
            batch: Histogram::of(samples, LEDGER_BATCH, &[]),
        }
    }

    /// Observations made between `before` and `self`.
    pub fn since(&self, before: &Ledger) -> Ledger {
        Ledger {
            reserve_wait: self.reserve_wait.since(&before.reserve_wait),
            settle_wait: self.settle_wait.since(&before.settle_wait),
            commit: self.commit.since(&before.commit),
            sync: self.sync.since(&before.sync),
            batch: self.batch.since(&before.batch),
        }
    }
}

impl Scrape {
    /// Parses a text exposition.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let samples = prometheus_parse::Scrape::parse(lines)?.samples;
        Ok(Self {
            overhead: Histogram::of(&samples, OVERHEAD, &[]),
            ledger: Ledger::of(&samples),
        })
    }
}

/// The number of a counter, gauge or untyped sample (`_sum`, `_count`).
fn scalar(v: &Value) -> f64 {
    match v {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        Value::Histogram(_) | Value::Summary(_) => 0.0,
    }
}

/// A cumulative Prometheus histogram (one series).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// `(le, cumulative count)` in increasing `le`, `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
}

impl Histogram {
    /// The series of histogram `name` whose labels besides `le` are exactly
    /// `labels`; empty when absent.
    pub fn of(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Self {
        let matches = |s: &&Sample| {
            s.labels.len() == labels.len()
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        };
        let series = |metric: String| {
            samples
                .iter()
                .filter(matches)
                .find(|s| s.metric == metric)
                .map(|s| scalar(&s.value))
                .unwrap_or(0.0)
        };
        let mut buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(matches)
            .find_map(|s| match &s.value {
                Value::Histogram(b) if s.metric == name => {
                    Some(b.iter().map(|b| (b.less_than, b.count)).collect())
                }
                _ => None,
            })
            .unwrap_or_default();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Histogram {
            buckets,
            sum: series(format!("{name}_sum")),
            count: series(format!("{name}_count")),
        }
    }

    /// Observations made between `before` and `self`.
    pub fn since(&self, before: &Histogram) -> Histogram {
        let earlier = |le: f64| {
            before
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, c)| *c)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, c)| (le, (c - earlier(le)).max(0.0)))
                .collect(),
            sum: (self.sum - before.sum).max(0.0),
            count: (self.count - before.count).max(0.0),
        }
    }

    /// Mean observation, when there is any.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// Estimated `q` quantile, linear inside a bucket as PromQL's
    /// `histogram_quantile`. Observations above the last finite bound
    /// report that bound (a lower bound of the truth).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(le, cumulative) in &self.buckets {
            if cumulative >= rank {
                if le.is_infinite() {
                    return Some(lower.0);
                }
                let in_bucket = cumulative - lower.1;
                let frac = if in_bucket > 0.0 {
                    (rank - lower.1) / in_bucket
                } else {
                    1.0
                };
                return Some(lower.0 + (le - lower.0) * frac);
            }
            lower = (le, cumulative);
        }
        Some(lower.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE orchestrator_overhead_seconds histogram
orchestrator_overhead_seconds_bucket{le=\"0.0001\"} 10
orchestrator_overhead_seconds_bucket{le=\"0.00025\"} 90
orchestrator_overhead_seconds_bucket{le=\"0.0005\"} 100
orchestrator_overhead_seconds_bucket{le=\"+Inf\"} 100
orchestrator_overhead_seconds_sum 0.015
orchestrator_overhead_seconds_count 100
";

    #[test]
    fn quantiles_from_bucket_deltas() {
        let after = Scrape::parse(TEXT).unwrap().overhead;
        assert_eq!(after.buckets.len(), 4);
        assert_eq!(after.count, 100.0);
        let q50 = after.quantile(0.5).unwrap();
        assert!((q50 - 0.000175).abs() < 1e-9, "{q50}");
        let before = Scrape::parse(&TEXT.replace("} 10\n", "} 5\n"))
            .unwrap()
            .overhead;
        let delta = after.since(&before);
        assert_eq!(delta.buckets[0].1, 5.0);
        assert_eq!(Histogram::default().quantile(0.5), None);
        assert!((after.mean().unwrap() - 0.00015).abs() < 1e-12);
    }

    #[test]
    fn a_labelled_series_is_read_apart_from_its_siblings() {
        let text = "# TYPE usage_ledger_wait_seconds histogram
usage_ledger_wait_seconds_bucket{op=\"reserve\",le=\"0.0005\"} 8
usage_ledger_wait_seconds_bucket{op=\"reserve\",le=\"+Inf\"} 10
usage_ledger_wait_seconds_sum{op=\"reserve\"} 0.004
usage_ledger_wait_seconds_count{op=\"reserve\"} 10
usage_ledger_wait_seconds_bucket{op=\"settle\",le=\"0.0005\"} 1
usage_ledger_wait_seconds_bucket{op=\"settle\",le=\"+Inf\"} 4
usage_ledger_wait_seconds_sum{op=\"settle\"} 0.008
usage_ledger_wait_seconds_count{op=\"settle\"} 4
# TYPE usage_ledger_commit_seconds histogram
usage_ledger_commit_seconds_bucket{le=\"+Inf\"} 7
usage_ledger_commit_seconds_sum 0.0007
usage_ledger_commit_seconds_count 7
";
        let ledger = Scrape::parse(text).unwrap().ledger;
        assert_eq!(
            ledger.reserve_wait.buckets,
            vec![(0.0005, 8.0), (f64::INFINITY, 10.0)]
        );
        assert_eq!(
            (ledger.reserve_wait.sum, ledger.reserve_wait.count),
            (0.004, 10.0)
        );
        assert_eq!(
            ledger.settle_wait.buckets,
            vec![(0.0005, 1.0), (f64::INFINITY, 4.0)]
        );
        assert_eq!(ledger.settle_wait.mean(), Some(0.002));
        assert_eq!(ledger.commit.count, 7.0);
        // Metering off: no ledger series at all.
        assert_eq!(ledger.sync, Histogram::default());
        assert_eq!(Scrape::parse(TEXT).unwrap().ledger, Ledger::default());
    }
}
