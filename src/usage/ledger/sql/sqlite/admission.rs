//! Admission decided in memory, for a SQLite file: its one writer's process
//! ([`super::claim`]) knows each ledger row (bucket) as committed plus what it
//! admitted or charged since, and admits against that sum without waiting: a
//! call when it fits every one of its buckets.
//!
//! The sum never counts less than the ledger will hold, so concurrent calls
//! cannot overshoot a cap: an admission adds to `pending` before it returns;
//! a settlement adds its charge when submitted; after each commit, under one
//! lock, `committed` becomes the row as left and the batch leaves `pending`;
//! a reservation whose batch failed stays counted until it settles. Idle
//! entries are dropped at [`SWEEP_AT`], so callers naming teams cannot grow it.

use crate::{
    store::{Store, StoreError},
    usage::{
        amount::Amount,
        bucket::{Bucket, Limits, PeriodCaps},
        ledger::{self, Op, Reserve, Rows, Settle},
        policy::{self, Balance, Refusal},
    },
};
use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Entries held before idle ones are dropped: a few MB, more teams than a month's.
const SWEEP_AT: usize = 10_000;

/// One bucket as this process sees it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The ledger row as of the writer's last commit that touched it.
    committed: Balance,
    /// Admitted or charged since, not yet committed.
    pending: Amount,
    /// Admitted reservations not settled nor withdrawn; the entry stays while any is.
    open: usize,
}

impl Entry {
    /// What admission checks against: pending amounts count as reserved.
    fn seen(&self) -> Balance {
        Balance::of(
            self.committed.spent(),
            self.committed.reserved() + self.pending,
        )
    }
}

/// A team (`user` empty) or user whose caps are cached.
type Scope = (String, String);

#[derive(Debug)]
struct Inner {
    ledgers: HashMap<Bucket, Entry>,
    /// The least size at which a sweep runs ([`SWEEP_AT`]).
    sweep_floor: usize,
    sweep_at: usize,
    /// Sweeps that dropped an entry: a row read before one is read again.
    sweeps: u64,
    caps: HashMap<Scope, CachedCaps>,
    /// Admitted reservations whose batch failed, in `pending` until they settle.
    held: HashMap<String, (Vec<Bucket>, Amount)>,
}

#[derive(Debug, Clone, Copy)]
struct CachedCaps {
    caps: PeriodCaps,
    read: Instant,
    refreshing: bool,
}

/// Clears a scope's `refreshing` mark if its reader is dropped before storing.
struct Refreshing<'a> {
    admission: &'a Admission,
    scope: &'a Scope,
    armed: bool,
}

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Some(cached) = self.admission.lock().caps.get_mut(self.scope)
        {
            cached.refreshing = false;
        }
    }
}

/// The in-memory ledger of a SQLite file's one writer.
#[derive(Debug)]
pub struct Admission {
    store: Store,
    limits_refresh: Duration,
    inner: Mutex<Inner>,
    /// A test's pause of the next `admit` between reading a row and using it.
    #[cfg(test)]
    pause: Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            tokio::sync::oneshot::Receiver<()>,
        )>,
    >,
}

/// What a settlement added to its entries, taken back by [`Admission::unsent`].
#[derive(Debug)]
pub struct Settling {
    buckets: Vec<Bucket>,
    charged: Amount,
    reservations: usize,
    held: Vec<String>,
}

impl Admission {
    /// Admission over `store`'s ledger, caps re-read after `limits_refresh`.
    pub fn new(store: Store, limits_refresh: Duration) -> Self {
        Self {
            store,
            limits_refresh,
            inner: Mutex::new(Inner {
                ledgers: HashMap::new(),
                sweep_floor: SWEEP_AT,
                sweep_at: SWEEP_AT,
                sweeps: 0,
                caps: HashMap::new(),
                held: HashMap::new(),
            }),
            #[cfg(test)]
            pause: Mutex::new(None),
        }
    }

    /// Sweeps from `n` entries instead of [`SWEEP_AT`].
    #[cfg(test)]
    pub fn sweep_at(&self, n: usize) {
        let mut inner = self.lock();
        inner.sweep_floor = n;
        inner.sweep_at = n;
    }

    /// Entries held now.
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.lock().ledgers.len()
    }

    /// Reservations of a team's month admitted and not yet done with.
    #[cfg(test)]
    pub fn open(&self, team: &str, month_start_ms: i64) -> Option<usize> {
        self.lock()
            .ledgers
            .get(&Bucket::team_month(team, month_start_ms))
            .map(|e| e.open)
    }

    /// Pauses the next `admit` after it reads a row, until the sender goes.
    #[cfg(test)]
    pub fn pause_after_read(
        &self,
    ) -> (
        tokio::sync::oneshot::Receiver<()>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (there, heard) = tokio::sync::oneshot::channel();
        let (resume, resumed) = tokio::sync::oneshot::channel();
        *self.pause.lock().unwrap_or_else(|e| e.into_inner()) = Some((there, resumed));
        (heard, resume)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data updated in single steps: consistent after a panic elsewhere.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `r` or says which cap of which bucket refuses it.
    pub async fn admit(&self, r: &Reserve) -> Result<Result<(), Refusal>, StoreError> {
        let buckets = r.buckets();
        let team = self.caps(&r.team_id, "", r.default_caps).await?;
        let user = if r.user_id.is_empty() {
            PeriodCaps::default()
        } else {
            self.caps(&r.team_id, &r.user_id, r.default_caps).await?
        };
        let caps = Limits { team, user };
        // A missing entry: nothing of its bucket is queued or in flight, so
        // the row as committed is exact. Of concurrent loads the first in
        // wins, unless a sweep ran meanwhile: the row may predate an entry it
        // dropped.
        let mut loaded: HashMap<&Bucket, (Balance, u64)> = HashMap::new();
        loop {
            let (missing, sweeps) = {
                let inner = self.lock();
                let missing: Vec<&Bucket> = buckets
                    .iter()
                    .filter(|b| !inner.ledgers.contains_key(*b))
                    .collect();
                (missing, inner.sweeps)
            };
            for bucket in missing {
                let row = ledger::balance_of(&self.store, bucket).await?;
                loaded.insert(bucket, (row, sweeps));
                #[cfg(test)]
                self.paused().await;
            }
            let mut inner = self.lock();
            if !inner.enter(&buckets, &loaded) {
                continue;
            }
            return Ok(inner.take(&buckets, &caps, r.amount()));
        }
    }

    /// A test's pause after a row is read, if one was asked for.
    #[cfg(test)]
    async fn paused(&self) {
        let paused = self.pause.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((there, resume)) = paused {
            let _ = there.send(());
            let _ = resume.await;
        }
    }

    /// Takes back an admission whose reservation never reached the writer.
    pub fn withdraw(&self, r: &Reserve) {
        let mut inner = self.lock();
        for bucket in r.buckets() {
            if let Some(entry) = inner.ledgers.get_mut(&bucket) {
                entry.pending -= r.amount();
                entry.open = entry.open.saturating_sub(1);
            }
        }
    }

    /// Counts what `s` charges from now on, before the writer commits it.
    pub fn settling(&self, s: &Settle) -> Settling {
        let buckets = s.buckets();
        // A charging settlement's entries exist (its reservations keep them).
        // Where one is missing nothing is added, nor taken back if it is never
        // sent: an entry made meanwhile read a row this settlement is not in.
        let mut inner = self.lock();
        let held = if inner.held.is_empty() {
            Vec::new()
        } else {
            s.reservations
                .iter()
                .filter(|r| inner.held.contains_key(&r.id))
                .map(|r| r.id.clone())
                .collect()
        };
        let charged = s.charged();
        let mut counted = Vec::with_capacity(buckets.len());
        for bucket in buckets {
            if let Some(entry) = inner.ledgers.get_mut(&bucket) {
                entry.pending += charged;
                counted.push(bucket);
            }
        }
        Settling {
            buckets: counted,
            charged,
            reservations: s.reservations.len(),
            held,
        }
    }

    /// A settlement that never reached the writer charges nothing; its
    /// reservations stay for the sweeper, except held ones (in no ledger).
    pub fn unsent(&self, s: &Settling) {
        let mut inner = self.lock();
        for bucket in &s.buckets {
            if let Some(entry) = inner.ledgers.get_mut(bucket) {
                entry.pending -= s.charged;
                entry.open = entry.open.saturating_sub(s.reservations);
            }
        }
        for id in &s.held {
            inner.release_held(id);
        }
    }

    /// After the writer committed `ops`: `rows` replace what was known.
    pub fn committed(&self, ops: &[Op], rows: Rows) {
        let mut inner = self.lock();
        inner.take_out(ops);
        for (bucket, balance) in rows {
            if let Some(entry) = inner.ledgers.get_mut(&bucket) {
                entry.committed = balance;
            }
        }
    }

    /// After a rollback: reservations stay counted until their calls settle.
    pub fn failed(&self, ops: &[Op]) {
        let mut inner = self.lock();
        for op in ops {
            match op {
                Op::Reserve(r) if r.admitted => {
                    inner.held.insert(r.id.clone(), (r.buckets(), r.amount()));
                }
                Op::Reserve(_) | Op::Audit(_) | Op::Write(_) => {}
                Op::Settle(s) => inner.settled(s),
            }
        }
    }

    /// The caps `admit` uses for a team (`user` empty) or user. When due, one
    /// caller re-reads them while the others use the old ones, rather than all
    /// hitting the pool.
    async fn caps(
        &self,
        team: &str,
        user: &str,
        defaults: Limits,
    ) -> Result<PeriodCaps, StoreError> {
        let scope: Scope = (team.to_owned(), user.to_owned());
        let mut guard = Refreshing {
            admission: self,
            scope: &scope,
            armed: false,
        };
        if let Some(cached) = self.lock().caps.get_mut(&scope) {
            if cached.refreshing || cached.read.elapsed() < self.limits_refresh {
                return Ok(cached.caps);
            }
            cached.refreshing = true;
            guard.armed = true;
        }
        let read = Instant::now();
        let defaults = defaults.scope(!user.is_empty());
        let caps = ledger::caps_of(&self.store, team, user, defaults).await?;
        guard.armed = false;
        self.lock().caps.insert(
            scope.clone(),
            CachedCaps {
                caps,
                read,
                refreshing: false,
            },
        );
        Ok(caps)
    }

    /// `(committed, pending)` of a team's month while it is held.
    pub fn snapshot(&self, team: &str, month_start_ms: i64) -> Option<(Balance, Amount)> {
        self.lock()
            .ledgers
            .get(&Bucket::team_month(team, month_start_ms))
            .map(|e| (e.committed, e.pending))
    }
}

impl Inner {
    /// Makes an entry of every missing bucket from a row read since the last
    /// sweep; false when one has none yet (read it, then try again).
    fn enter(&mut self, buckets: &[Bucket], loaded: &HashMap<&Bucket, (Balance, u64)>) -> bool {
        let mut fresh = Vec::new();
        for bucket in buckets {
            if self.ledgers.contains_key(bucket) {
                continue;
            }
            match loaded.get(bucket) {
                Some((row, read_after)) if *read_after == self.sweeps => fresh.push((bucket, *row)),
                _ => return false,
            }
        }
        if fresh.is_empty() {
            return true;
        }
        self.make_room(buckets);
        for (bucket, row) in fresh {
            self.ledgers.insert(
                bucket.clone(),
                Entry {
                    committed: row,
                    pending: Amount::ZERO,
                    open: 0,
                },
            );
        }
        true
    }

    /// Admits `amount` in every bucket (all entered) or refuses it.
    fn take(&mut self, buckets: &[Bucket], caps: &Limits, amount: Amount) -> Result<(), Refusal> {
        for bucket in buckets {
            let seen = self
                .ledgers
                .get(bucket)
                .map(Entry::seen)
                .unwrap_or_default();
            policy::check_bucket(bucket, &seen, &caps.of(bucket), amount)?;
        }
        for bucket in buckets {
            if let Some(entry) = self.ledgers.get_mut(bucket) {
                entry.pending += amount;
                entry.open += 1;
            }
        }
        Ok(())
    }

    /// At [`Inner::sweep_at`] entries drops idle ones (but `keep`'s) and their
    /// caps; the next sweep waits for twice what is left, so sweeping stays linear.
    fn make_room(&mut self, keep: &[Bucket]) {
        if self.ledgers.len() < self.sweep_at {
            return;
        }
        let before = self.ledgers.len();
        self.ledgers
            .retain(|b, e| e.open > 0 || e.pending != Amount::ZERO || keep.contains(b));
        if self.ledgers.len() < before {
            self.sweeps += 1;
        }
        // Pruned even when no entry went: caps can be read without an entry following.
        let mut scopes: HashSet<(&str, &str)> = self
            .ledgers
            .keys()
            .map(|b| (b.team_id.as_str(), b.user_id.as_str()))
            .collect();
        scopes.extend(
            keep.iter()
                .map(|b| (b.team_id.as_str(), b.user_id.as_str())),
        );
        self.caps.retain(|(team, user), c| {
            c.refreshing || scopes.contains(&(team.as_str(), user.as_str()))
        });
        self.sweep_at = self.sweep_floor.max(self.ledgers.len().saturating_mul(2));
    }

    fn take_out(&mut self, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Reserve(r) if r.admitted => {
                    for bucket in r.buckets() {
                        if let Some(entry) = self.ledgers.get_mut(&bucket) {
                            entry.pending -= r.amount();
                        }
                    }
                }
                Op::Reserve(_) | Op::Audit(_) | Op::Write(_) => {}
                Op::Settle(s) => self.settled(s),
            }
        }
    }

    /// `s` is done with: its charge and any held reservations leave `pending`.
    fn settled(&mut self, s: &Settle) {
        for bucket in s.buckets() {
            if let Some(entry) = self.ledgers.get_mut(&bucket) {
                entry.pending -= s.charged();
                entry.open = entry.open.saturating_sub(s.reservations.len());
            }
        }
        if self.held.is_empty() {
            return;
        }
        for r in &s.reservations {
            self.release_held(&r.id);
        }
    }

    /// A reservation whose batch failed is done with: it stops counting.
    fn release_held(&mut self, id: &str) {
        let Some((buckets, amount)) = self.held.remove(id) else {
            return;
        };
        for bucket in buckets {
            if let Some(entry) = self.ledgers.get_mut(&bucket) {
                entry.pending -= amount;
            }
        }
    }
}
