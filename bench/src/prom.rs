//! The server's own view: the `orchestrator_overhead_seconds` histogram
//! scraped from `/metrics` before and after a step, and quantiles estimated
//! from the bucket deltas (linear inside a bucket, as PromQL's
//! `histogram_quantile` does). Bucket bounds limit the precision; `_sum /
//! _count` gives an exact mean.

/// Name of the histogram of request time not spent waiting on providers.
pub const OVERHEAD: &str = "orchestrator_overhead_seconds";
/// Name of the histogram of provider call time (one series per provider
/// and model), as the server measures it.
pub const PROVIDER_TIME: &str = "llm_response_time_seconds";

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
    /// `(sum, count)` of [`PROVIDER_TIME`] over all its series.
    pub provider_time: (f64, f64),
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
    fn parse(text: &str) -> Self {
        Self {
            reserve_wait: Histogram::parse_series(text, LEDGER_WAIT, "op=\"reserve\""),
            settle_wait: Histogram::parse_series(text, LEDGER_WAIT, "op=\"settle\""),
            commit: Histogram::parse(text, LEDGER_COMMIT),
            sync: Histogram::parse(text, LEDGER_SYNC),
            batch: Histogram::parse(text, LEDGER_BATCH),
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
    pub fn parse(text: &str) -> Self {
        Self {
            overhead: Histogram::parse(text, OVERHEAD),
            provider_time: sum_and_count(text, PROVIDER_TIME),
            ledger: Ledger::parse(text),
        }
    }

    /// Mean provider call time between `before` and `self`, seconds.
    pub fn provider_time_since(&self, before: &Scrape) -> Option<f64> {
        let sum = self.provider_time.0 - before.provider_time.0;
        let count = self.provider_time.1 - before.provider_time.1;
        (count > 0.0).then(|| sum / count)
    }
}

/// `_sum` and `_count` of histogram `name` added over all its label sets.
pub fn sum_and_count(text: &str, name: &str) -> (f64, f64) {
    let value = |line: &str| -> f64 {
        line.rsplit_once(' ')
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let (sum, count) = (format!("{name}_sum"), format!("{name}_count"));
    let mut total = (0.0, 0.0);
    for line in text.lines() {
        // The series name ends where its labels or its value begin.
        let series = line.split(['{', ' ']).next().unwrap_or("");
        if series == sum {
            total.0 += value(line);
        } else if series == count {
            total.1 += value(line);
        }
    }
    total
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
    /// Parses histogram `name` (without labels) out of a text exposition;
    /// empty when absent.
    pub fn parse(text: &str, name: &str) -> Self {
        Self::parse_series(text, name, "")
    }

    /// Parses the series of histogram `name` whose labels besides `le` are
    /// exactly `labels` (as exposed, e.g. `op="reserve"`; empty for none);
    /// empty when absent.
    pub fn parse_series(text: &str, name: &str, labels: &str) -> Self {
        let (bucket, sum, count) = if labels.is_empty() {
            (
                format!("{name}_bucket{{le=\""),
                format!("{name}_sum "),
                format!("{name}_count "),
            )
        } else {
            (
                format!("{name}_bucket{{{labels},le=\""),
                format!("{name}_sum{{{labels}}} "),
                format!("{name}_count{{{labels}}} "),
            )
        };
        let value = |prefix: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(prefix))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let mut h = Histogram {
            sum: value(&sum),
            count: value(&count),
            ..Histogram::default()
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(&bucket) {
                let Some((le, value)) = rest.split_once("\"}") else {
                    continue;
                };
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                if let (false, Ok(v)) = (le.is_nan(), value.trim().parse::<f64>()) {
                    h.buckets.push((le, v));
                }
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        h
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

    /// Estimated `q` quantile. Observations above the last finite bound
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
        let after = Histogram::parse(TEXT, OVERHEAD);
        assert_eq!(after.buckets.len(), 4);
        assert_eq!(after.count, 100.0);
        let q50 = after.quantile(0.5).unwrap();
        assert!((q50 - 0.000175).abs() < 1e-9, "{q50}");
        let before = Histogram::parse(&TEXT.replace("} 10\n", "} 5\n"), OVERHEAD);
        let delta = after.since(&before);
        assert_eq!(delta.buckets[0].1, 5.0);
        assert_eq!(Histogram::default().quantile(0.5), None);
        assert!((after.mean().unwrap() - 0.00015).abs() < 1e-12);
    }

    #[test]
    fn a_labelled_series_is_read_apart_from_its_siblings() {
        let text = "usage_ledger_wait_seconds_bucket{op=\"reserve\",le=\"0.0005\"} 8
usage_ledger_wait_seconds_bucket{op=\"reserve\",le=\"+Inf\"} 10
usage_ledger_wait_seconds_sum{op=\"reserve\"} 0.004
usage_ledger_wait_seconds_count{op=\"reserve\"} 10
usage_ledger_wait_seconds_bucket{op=\"settle\",le=\"0.0005\"} 1
usage_ledger_wait_seconds_bucket{op=\"settle\",le=\"+Inf\"} 4
usage_ledger_wait_seconds_sum{op=\"settle\"} 0.008
usage_ledger_wait_seconds_count{op=\"settle\"} 4
usage_ledger_commit_seconds_bucket{le=\"+Inf\"} 7
usage_ledger_commit_seconds_sum 0.0007
usage_ledger_commit_seconds_count 7
";
        let ledger = Scrape::parse(text).ledger;
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
        assert_eq!(Scrape::parse(TEXT).ledger, Ledger::default());
    }

    #[test]
    fn provider_time_adds_up_every_series() {
        let text = "llm_response_time_seconds_bucket{provider=\"a\",le=\"+Inf\"} 3
llm_response_time_seconds_sum{provider=\"a\",model=\"m\"} 0.3
llm_response_time_seconds_count{provider=\"a\",model=\"m\"} 3
llm_response_time_seconds_sum{provider=\"b\",model=\"m\"} 0.5
llm_response_time_seconds_count{provider=\"b\",model=\"m\"} 1
llm_response_time_seconds_sum_other 9
";
        let (sum, count) = sum_and_count(text, PROVIDER_TIME);
        assert!((sum - 0.8).abs() < 1e-12, "{sum}");
        assert_eq!(count, 4.0);
        let after = Scrape::parse(text);
        let before = Scrape::parse(&text.replace("} 1\n", "} 0\n").replace("} 0.5\n", "} 0\n"));
        let mean = after.provider_time_since(&before).unwrap();
        assert!((mean - 0.5).abs() < 1e-12, "{mean}");
        assert_eq!(after.provider_time_since(&after), None);
    }
}
