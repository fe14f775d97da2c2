//! Bounds on values the service adds to a clock reading, doubles, or sizes a semaphore or a
//! table by: past these the arithmetic panics (`Instant + Duration`, `Duration * 2`,
//! `Semaphore::new`) or memory runs out, long after start-up. Each check names where.

use crate::config::Config;
use std::time::Duration;

/// Longest backoff cap, lease slack, keepalive or database wait: an hour is past any use, far
/// below overflowing `Instant + Duration` (~2^63 s) or SQLite's busy timeout (~24 days).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// Shortest ASYNC tool worker pause: below it the worker polls the database in a tight loop.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Most calls in flight one provider may be configured for: its HTTP clients get
/// `ceil(max_concurrency / streams_per_connection)` slots at start-up (~7 MB here); more could
/// exhaust memory before serving. Below the semaphore's limit `ProviderLimits::new` clamps to.
pub const MAX_PROVIDER_CONCURRENCY: usize = 100_000;

/// Largest `max_response_bytes` (1 GiB): a body is read into a buffer of its announced size
/// up front, so an unbounded limit lets an upstream's `Content-Length` pick any allocation.
pub const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// `must be at most 1h`, the bound as a duration key is written.
pub(super) fn at_most(limit: Duration) -> String {
    format!(
        "must be at most {}",
        humantime_serde::re::humantime::format_duration(limit)
    )
}

/// Every value past its bound (server, providers, retry, database, tool worker).
pub(super) fn check(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    let s = &config.server;
    // `Semaphore::new` panics past its limit (src/call/mod.rs).
    if s.max_concurrent_requests > tokio::sync::Semaphore::MAX_PERMITS {
        bad(
            "server.max_concurrent_requests".into(),
            &format!(
                "must be at most {} (the limit of a semaphore)",
                tokio::sync::Semaphore::MAX_PERMITS
            ),
        );
    }
    // hyper schedules each ping at `last read + interval` and its deadline
    // at `now + timeout`: plain `Instant + Duration`, which panics.
    for (key, value) in [
        (
            "server.http2_keepalive_interval",
            s.http2_keepalive_interval,
        ),
        ("server.http2_keepalive_timeout", s.http2_keepalive_timeout),
    ] {
        if value > MAX_WAIT {
            bad(key.into(), &at_most(MAX_WAIT));
        }
    }
    // A zero period probes the database in a tight loop.
    if s.health_probe_interval.is_zero() {
        bad(
            "server.health_probe_interval".into(),
            "must be greater than zero",
        );
    }
    for (name, p) in &config.providers {
        let at = |key: &str| format!("providers.{name}.{key}");
        if p.concurrency() > MAX_PROVIDER_CONCURRENCY {
            bad(
                at("max_concurrency"),
                &format!("must be at most {MAX_PROVIDER_CONCURRENCY}"),
            );
        }
        if p.max_response_bytes > MAX_RESPONSE_BYTES {
            bad(
                at("max_response_bytes"),
                &format!("must be at most {MAX_RESPONSE_BYTES} (1 GiB)"),
            );
        }
    }
    // The router draws a wait as a share of the cap (`Duration::mul_f64` panics past ~2^64 s);
    // a zero cap retries without a pause. `max_backoff >= base_backoff` is checked elsewhere.
    let r = &config.retry;
    if r.base_backoff.is_zero() {
        bad(
            "retry.base_backoff".into(),
            "must be greater than zero (zero retries without a pause)",
        );
    }
    if r.max_backoff > MAX_WAIT {
        bad("retry.max_backoff".into(), &at_most(MAX_WAIT));
    }
    // sqlx computes `Instant::now() + acquire_timeout` on every acquire and
    // refuses (with a panic) a busy timeout past `i32::MAX` milliseconds.
    for (key, value) in [
        ("database.busy_timeout", config.database.busy_timeout),
        ("database.acquire_timeout", config.database.acquire_timeout),
    ] {
        if value > MAX_WAIT {
            bad(key.into(), &at_most(MAX_WAIT));
        }
    }
    let w = &config.tool_worker;
    // The worker's pause between looks for work (src/call/worker.rs).
    if w.poll_interval < MIN_POLL_INTERVAL {
        bad(
            "tool_worker.poll_interval".into(),
            &format!(
                "must be at least {} (shorter polls the database without pause)",
                humantime_serde::re::humantime::format_duration(MIN_POLL_INTERVAL)
            ),
        );
    }
    // A SYNC invocation is leased for `tool.timeout + lease_slack` (`Duration + Duration`
    // panics), and the worker adds the slack to the clock in milliseconds.
    if w.lease_slack > MAX_WAIT {
        bad("tool_worker.lease_slack".into(), &at_most(MAX_WAIT));
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn paths(toml: &str) -> Vec<String> {
        Config::from_toml_str(toml, |_| None)
            .err()
            .map(|e| e.paths())
            .unwrap_or_default()
    }

    #[test]
    fn values_past_their_bounds_are_refused_with_their_key() {
        let huge = "\"18446744073709551615s\"";
        let permits = tokio::sync::Semaphore::MAX_PERMITS + 1;
        let toml = format!(
            "[server]\nmax_concurrent_requests = {permits}\n\
             http2_keepalive_interval = {huge}\nhttp2_keepalive_timeout = \"61m\"\n\
             health_probe_interval = \"0s\"\n\
             [providers.p]\nkind = \"mock\"\nmax_concurrency = 100001\n\
             max_response_bytes = 1073741825\n\
             [retry]\nbase_backoff = \"0s\"\nmax_backoff = {huge}\n\
             [database]\nbusy_timeout = \"25d\"\nacquire_timeout = {huge}\n\
             [tool_worker]\npoll_interval = \"0s\"\nlease_slack = {huge}\n"
        );
        assert_eq!(
            paths(&toml),
            [
                "server.max_concurrent_requests",
                "server.http2_keepalive_interval",
                "server.http2_keepalive_timeout",
                "server.health_probe_interval",
                "providers.p.max_concurrency",
                "providers.p.max_response_bytes",
                "retry.base_backoff",
                "retry.max_backoff",
                "database.busy_timeout",
                "database.acquire_timeout",
                "tool_worker.poll_interval",
                "tool_worker.lease_slack",
            ]
        );
        let err = Config::from_toml_str(&toml, |_| None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("tool_worker.lease_slack: must be at most 1h"),
            "{err}"
        );
    }

    #[test]
    fn values_at_their_bounds_are_accepted() {
        let toml = format!(
            "[server]\nmax_concurrent_requests = {}\n\
             http2_keepalive_interval = \"1h\"\nhttp2_keepalive_timeout = \"1h\"\n\
             [providers.p]\nkind = \"mock\"\nmax_concurrency = 100000\n\
             max_response_bytes = 1073741824\n\
             [retry]\nbase_backoff = \"1ms\"\nmax_backoff = \"1h\"\n\
             [database]\nbusy_timeout = \"1h\"\nacquire_timeout = \"1h\"\n\
             [tool_worker]\npoll_interval = \"10ms\"\nlease_slack = \"1h\"\n",
            tokio::sync::Semaphore::MAX_PERMITS
        );
        assert!(paths(&toml).is_empty(), "{:?}", paths(&toml));
    }
}
