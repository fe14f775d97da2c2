//! Tool quotas counted in memory by this replica alone: without `[cluster]`,
//! and as the fallback share while the cluster store is down. Only what a
//! limit still needs is kept: an idle (team, tool) is forgotten, so teams
//! that come and go (a wildcard key may name any) do not pile up.

use crate::config::tools::QuotaConfig;
use crate::tools::Denial;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use super::HOUR_MS;

#[derive(Debug, Default)]
struct Counts {
    /// The clock hour counted (unix hours) and invocations in it.
    hour: i64,
    in_hour: u32,
    running: u32,
}

impl Counts {
    /// Nothing a limit still needs at `hour`: nothing running, no count this hour.
    fn idle(&self, hour: i64) -> bool {
        self.running == 0 && (self.in_hour == 0 || self.hour < hour)
    }

    fn check_hour(&self, quota: &QuotaConfig) -> Result<(), Denial> {
        match quota.max_per_hour {
            Some(max) if self.in_hour >= max => Err(Denial::Quota {
                limit: "max_per_hour",
                max,
            }),
            _ => Ok(()),
        }
    }

    fn check_running(&self, quota: &QuotaConfig) -> Result<(), Denial> {
        match quota.max_concurrent {
            Some(max) if self.running >= max => Err(Denial::Quota {
                limit: "max_concurrent",
                max,
            }),
            _ => Ok(()),
        }
    }

    /// One more this hour, counted only under `max_per_hour` (nothing else reads it).
    fn count_hour(&mut self, quota: &QuotaConfig) {
        if quota.max_per_hour.is_some() {
            self.in_hour += 1;
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    counts: HashMap<(String, String), Counts>,
    /// The latest hour seen: entering a new one forgets idle entries, once an hour.
    latest_hour: i64,
}

impl Table {
    /// The counts of `key` at clock hour `hour` (a new hour starts again).
    fn at(&mut self, key: &(String, String), hour: i64) -> &mut Counts {
        if hour > self.latest_hour {
            self.counts.retain(|_, c| !c.idle(hour));
            self.latest_hour = hour;
        }
        let c = self.counts.entry(key.clone()).or_default();
        if c.hour != hour {
            c.hour = hour;
            c.in_hour = 0;
        }
        c
    }
}

/// The counters of every (team, tool) that a limit still needs.
#[derive(Debug, Default, Clone)]
pub struct LocalQuotas {
    table: Arc<Mutex<Table>>,
}

/// A running invocation's place under `max_concurrent`; released on drop.
#[derive(Debug)]
pub struct LocalSlot {
    quotas: LocalQuotas,
    key: (String, String),
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        let mut table = self.quotas.lock();
        let latest = table.latest_hour;
        if let Some(c) = table.counts.get_mut(&self.key) {
            c.running = c.running.saturating_sub(1);
            // The last run with no hourly count left: forgotten now, not next hour.
            if c.idle(latest) {
                table.counts.remove(&self.key);
            }
        }
    }
}

impl LocalQuotas {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A SYNC invocation's place: the hour counted, a slot held while it runs.
    pub fn acquire(
        &self,
        team: &str,
        tool: &str,
        quota: &QuotaConfig,
        now_ms: i64,
    ) -> Result<LocalSlot, Denial> {
        let key = (team.to_owned(), tool.to_owned());
        let mut table = self.lock();
        let c = table.at(&key, now_ms.div_euclid(HOUR_MS));
        c.check_hour(quota)?;
        c.check_running(quota)?;
        c.count_hour(quota);
        c.running += 1;
        Ok(LocalSlot {
            quotas: self.clone(),
            key,
        })
    }

    /// Counts an ASYNC invocation's hour when accepted; its slot is `try_running`'s.
    pub fn admit(
        &self,
        team: &str,
        tool: &str,
        quota: &QuotaConfig,
        now_ms: i64,
    ) -> Result<(), Denial> {
        if quota.max_per_hour.is_none() {
            // Nothing to count: no entry, so nothing to forget later.
            return Ok(());
        }
        let key = (team.to_owned(), tool.to_owned());
        let mut table = self.lock();
        let c = table.at(&key, now_ms.div_euclid(HOUR_MS));
        c.check_hour(quota)?;
        c.count_hour(quota);
        Ok(())
    }

    /// A concurrency slot, or `None` at `max_concurrent` (the hour already counted).
    pub fn try_running(&self, team: &str, tool: &str, quota: &QuotaConfig) -> Option<LocalSlot> {
        let key = (team.to_owned(), tool.to_owned());
        let mut table = self.lock();
        let c = table.counts.entry(key.clone()).or_default();
        c.check_running(quota).ok()?;
        c.running += 1;
        Some(LocalSlot {
            quotas: self.clone(),
            key,
        })
    }

    /// Every `(team, tool)` with invocations running, and how many.
    pub fn running(&self) -> Vec<(String, String, u32)> {
        self.lock()
            .counts
            .iter()
            .filter(|(_, c)| c.running > 0)
            .map(|((team, tool), c)| (team.clone(), tool.clone(), c.running))
            .collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hour() -> i64 {
        1_790_000_000_000_i64 / HOUR_MS * HOUR_MS
    }

    #[test]
    fn hourly_and_concurrent_limits_per_team() {
        let q = LocalQuotas::default();
        let quota = QuotaConfig {
            max_per_hour: Some(3),
            max_concurrent: Some(2),
        };
        let hour = hour();
        let a = q.acquire("t1", "x", &quota, hour).unwrap();
        let _b = q.acquire("t1", "x", &quota, hour + 1).unwrap();
        assert_eq!(
            q.acquire("t1", "x", &quota, hour + 2).unwrap_err(),
            Denial::Quota {
                limit: "max_concurrent",
                max: 2
            }
        );
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
        assert!(q.acquire("t1", "x", &quota, hour + HOUR_MS).is_ok());
    }

    #[test]
    fn async_invocations_count_the_hour_when_accepted_and_wait_for_a_slot_to_run() {
        let q = LocalQuotas::default();
        let quota = QuotaConfig {
            max_per_hour: Some(3),
            max_concurrent: Some(1),
        };
        let hour = hour();
        let sync = q.acquire("t1", "x", &quota, hour).unwrap();
        // Accepted while the tool is at its max_concurrent: queued, not refused.
        q.admit("t1", "x", &quota, hour + 1).unwrap();
        assert!(q.try_running("t1", "x", &quota).is_none(), "waits");
        drop(sync);
        let running = q.try_running("t1", "x", &quota).unwrap();
        assert!(q.try_running("t1", "x", &quota).is_none());
        // A worker's run counts against SYNC invocations too.
        assert_eq!(
            q.acquire("t1", "x", &quota, hour + 2).unwrap_err(),
            Denial::Quota {
                limit: "max_concurrent",
                max: 1
            }
        );
        drop(running);
        // Running did not count the hour again: two so far, one more fits.
        q.admit("t1", "x", &quota, hour + 3).unwrap();
        assert_eq!(
            q.admit("t1", "x", &quota, hour + 4).unwrap_err(),
            Denial::Quota {
                limit: "max_per_hour",
                max: 3
            }
        );
    }

    #[test]
    fn idle_entries_are_forgotten_and_what_a_limit_needs_is_kept() {
        let q = LocalQuotas::default();
        let unlimited = QuotaConfig::default();
        let hourly = QuotaConfig {
            max_per_hour: Some(1),
            max_concurrent: None,
        };
        let concurrent = QuotaConfig {
            max_per_hour: None,
            max_concurrent: Some(1),
        };
        let hour = hour();
        // Any number of teams, SYNC and ASYNC: nothing kept once idle.
        for i in 0..1_000 {
            let team = format!("team-{i}");
            drop(q.acquire(&team, "x", &unlimited, hour).unwrap());
            q.admit(&team, "x", &unlimited, hour).unwrap();
            drop(q.try_running(&team, "x", &concurrent).unwrap());
        }
        assert_eq!(q.len(), 0);

        // An hourly count is kept for its hour, a slot while it is held.
        let held = q.acquire("held", "x", &concurrent, hour).unwrap();
        drop(q.acquire("counted", "x", &hourly, hour).unwrap());
        assert_eq!(q.len(), 2);
        assert_eq!(
            q.acquire("counted", "x", &hourly, hour + 1).unwrap_err(),
            Denial::Quota {
                limit: "max_per_hour",
                max: 1
            },
            "still counted"
        );

        // The next clock hour forgets the last one's counts, not a slot held.
        q.admit("other", "x", &hourly, hour + HOUR_MS).unwrap();
        assert_eq!(q.len(), 2, "`counted` forgotten; `held` and `other` kept");
        assert!(q.try_running("held", "x", &concurrent).is_none());
        drop(held);
        assert_eq!(q.len(), 1, "`held` forgotten once released");
        assert!(q.acquire("counted", "x", &hourly, hour + HOUR_MS).is_ok());
        assert_eq!(
            q.admit("other", "x", &hourly, hour + HOUR_MS + 1)
                .unwrap_err(),
            Denial::Quota {
                limit: "max_per_hour",
                max: 1
            },
            "counted this hour"
        );
    }
}
