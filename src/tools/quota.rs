//! Per-team tool quotas (`max_per_hour`, `max_concurrent`), counted in
//! memory on each replica: with N replicas a team may reach N times a
//! limit (docs/tools.md says so; caps in money are the ledger's, shared).

use super::Denial;
use crate::config::tools::QuotaConfig;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

#[derive(Debug, Default)]
struct Counts {
    /// The clock hour counted (unix hours) and invocations in it.
    hour: i64,
    in_hour: u32,
    running: u32,
}

/// The counters of every (team, tool).
#[derive(Debug, Default, Clone)]
pub struct Quotas {
    counts: Arc<Mutex<HashMap<(String, String), Counts>>>,
}

/// A running invocation's place under `max_concurrent`; released on drop.
#[derive(Debug)]
pub struct Slot {
    quotas: Quotas,
    key: (String, String),
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self
            .quotas
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = counts.get_mut(&self.key) {
            c.running = c.running.saturating_sub(1);
        }
    }
}

impl Quotas {
    /// Takes a place for `team` running `tool` at `now_ms` (unix ms), or
    /// the limit that is full.
    pub fn acquire(
        &self,
        team: &str,
        tool: &str,
        quota: &QuotaConfig,
        now_ms: i64,
    ) -> Result<Slot, Denial> {
        let key = (team.to_owned(), tool.to_owned());
        let hour = now_ms.div_euclid(3_600_000);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let c = counts.entry(key.clone()).or_default();
        if c.hour != hour {
            c.hour = hour;
            c.in_hour = 0;
        }
        if let Some(max) = quota.max_per_hour
            && c.in_hour >= max
        {
            return Err(Denial::Quota {
                limit: "max_per_hour",
                max,
            });
        }
        if let Some(max) = quota.max_concurrent
            && c.running >= max
        {
            return Err(Denial::Quota {
                limit: "max_concurrent",
                max,
            });
        }
        c.in_hour += 1;
        c.running += 1;
        Ok(Slot {
            quotas: self.clone(),
            key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hourly_and_concurrent_limits_per_team() {
        let q = Quotas::default();
        let quota = QuotaConfig {
            max_per_hour: Some(3),
            max_concurrent: Some(2),
        };
        let hour = 1_790_000_000_000_i64 / 3_600_000 * 3_600_000;
        let a = q.acquire("t1", "x", &quota, hour).unwrap();
        let _b = q.acquire("t1", "x", &quota, hour + 1).unwrap();
        assert_eq!(
            q.acquire("t1", "x", &quota, hour + 2).unwrap_err(),
            Denial::Quota {
                limit: "max_concurrent",
                max: 2
            }
        );
        // Another team has its own counters.
        let _other = q.acquire("t2", "x", &quota, hour).unwrap();
        drop(a);
        let _c = q.acquire("t1", "x", &quota, hour + 3).unwrap();
        assert_eq!(
            q.acquire("t1", "x", &quota, hour + 4).unwrap_err(),
            Denial::Quota {
                limit: "max_per_hour",
                max: 3
            }
        );
        // The next clock hour starts again (the running ones still count).
        drop(_c);
        assert!(q.acquire("t1", "x", &quota, hour + 3_600_000).is_ok());
    }
}
