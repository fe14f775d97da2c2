//! The prompt store's resolution cache by (team, key), each entry served for [`CACHE_TTL`]. Any
//! caller can name a new team, so an insert sweeps expired entries once the cache has doubled
//! since the last sweep, or past [`SWEEP_AT`] a TTL after it: about two TTLs' reads are kept.

use super::Prompt;
use std::{collections::HashMap, time::Duration};
use tokio::time::Instant;

/// How long a resolved prompt is reused before the database is asked again.
pub const CACHE_TTL: Duration = Duration::from_secs(5);

/// Entries below which an insert never sweeps.
const SWEEP_AT: usize = 1024;

/// Resolved prompts by (team, key), with the time they were read.
#[derive(Debug, Default)]
pub(super) struct PromptCache {
    entries: HashMap<(String, String), (Prompt, Instant)>,
    sweep_at: usize,
    swept: Option<Instant>,
}

impl PromptCache {
    pub(super) fn fresh(&self, key: &(String, String)) -> Option<Prompt> {
        self.entries
            .get(key)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(prompt, _)| prompt.clone())
    }

    pub(super) fn insert(&mut self, key: (String, String), prompt: Prompt) {
        self.entries.insert(key, (prompt, Instant::now()));
        let len = self.entries.len();
        let doubled = len >= self.sweep_at.max(SWEEP_AT);
        let due = len >= SWEEP_AT && self.swept.is_none_or(|at| at.elapsed() >= CACHE_TTL);
        if doubled || due {
            self.entries.retain(|_, (_, at)| at.elapsed() < CACHE_TTL);
            self.sweep_at = self.entries.len().saturating_mul(2);
            self.swept = Some(Instant::now());
        }
    }

    pub(super) fn remove(&mut self, key: &(String, String)) {
        self.entries.remove(key);
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(team: usize) -> (String, String) {
        (format!("team-{team}"), "sms_classify".into())
    }

    #[tokio::test(start_paused = true)]
    async fn expired_entries_are_swept_as_new_teams_arrive() {
        let mut cache = PromptCache::default();
        for team in 0..SWEEP_AT - 1 {
            cache.insert(key(team), super::super::builtin("sms_classify"));
        }
        assert_eq!(cache.len(), SWEEP_AT - 1);
        assert!(cache.fresh(&key(0)).is_some());

        tokio::time::advance(CACHE_TTL).await;
        assert!(cache.fresh(&key(0)).is_none(), "served past its TTL");
        cache.insert(key(SWEEP_AT), super::super::builtin("sms_classify"));
        assert_eq!(cache.len(), 1);

        for team in 0..100_000 {
            cache.insert(
                key(SWEEP_AT + 1 + team),
                super::super::builtin("sms_classify"),
            );
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        let ttl_worth = usize::try_from(CACHE_TTL.as_millis()).unwrap();
        assert!(
            cache.len() <= 2 * ttl_worth.max(SWEEP_AT),
            "{}",
            cache.len()
        );

        // A burst, then a quiet TTL: swept although the cache has not doubled.
        let before = cache.len();
        for team in 0..before / 2 {
            cache.insert(key(1_000_000 + team), super::super::builtin("sms_classify"));
        }
        tokio::time::advance(CACHE_TTL).await;
        cache.insert(key(2_000_000), super::super::builtin("sms_classify"));
        assert_eq!(cache.len(), 1, "only the newest entry is fresh");
    }
}
