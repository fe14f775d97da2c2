//! Admission decided in memory, for a SQLite file: its one writer's process
//! ([`super::claim`]) knows each ledger row as committed plus what it admitted
//! or charged since, and admits against that sum without waiting.
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
        ledger::{self, Key, Op, Reserve, Rows, Settle},
        policy::{self, Balance, Caps, Refusal},
    },
};
use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Entries held before idle ones are dropped: a few MB, more teams than a month's.
const SWEEP_AT: usize = 10_000;

/// One (team, month) as this process sees it.
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

#[derive(Debug)]
struct Inner {
    ledgers: HashMap<Key, Entry>,
    /// The least size at which a sweep runs ([`SWEEP_AT`]).
    sweep_floor: usize,
    sweep_at: usize,
    /// Sweeps that dropped an entry: a row read before one is read again.
    sweeps: u64,
    caps: HashMap<String, CachedCaps>,
    /// Admitted reservations whose batch failed, in `pending` until they settle.
    held: HashMap<String, (Key, Amount)>,
}

#[derive(Debug, Clone, Copy)]
struct CachedCaps {
    caps: Caps,
    read: Instant,
    refreshing: bool,
}

/// Clears a team's `refreshing` mark if its reader is dropped before storing.
struct Refreshing<'a> {
    admission: &'a Admission,
    team: &'a str,
    armed: bool,
}

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Some(cached) = self.admission.lock().caps.get_mut(self.team)
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

/// What a settlement added to its entry, taken back by [`Admission::unsent`].
#[derive(Debug)]
pub struct Settling {
    key: Key,
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

    /// Reservations of a (team, month) admitted and not yet done with.
    #[cfg(test)]
    pub fn open(&self, team: &str, month_start_ms: i64) -> Option<usize> {
        self.lock()
            .ledgers
            .get(&(team.to_owned(), month_start_ms))
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

    /// Admits `r` or says which cap refuses it.
    pub async fn admit(&self, r: &Reserve) -> Result<Result<(), Refusal>, StoreError> {
        let caps = self.caps(&r.team_id, r.default_caps).await?;
        let key = (r.team_id.clone(), r.month_start_ms);
        // No entry: nothing of this key is queued or in flight, so the row as
        // committed is exact. Of concurrent loads the first in wins, unless a
        // sweep ran meanwhile: the row may predate an entry it dropped.
        let mut loaded = None;
        loop {
            let (known, sweeps) = {
                let inner = self.lock();
                (inner.ledgers.contains_key(&key), inner.sweeps)
            };
            if !known {
                let row = ledger::balance_of(&self.store, &r.team_id, r.month_start_ms).await?;
                loaded = Some((row, sweeps));
                #[cfg(test)]
                {
                    let paused = self.pause.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some((there, resume)) = paused {
                        let _ = there.send(());
                        let _ = resume.await;
                    }
                }
            }
            let mut inner = self.lock();
            let fresh = match loaded {
                Some((row, read_after)) if read_after == inner.sweeps => Some(row),
                _ => None,
            };
            if !inner.ledgers.contains_key(&key) {
                let Some(row) = fresh else { continue };
                inner.make_room(&key.0);
                inner.ledgers.insert(
                    key.clone(),
                    Entry {
                        committed: row,
                        pending: Amount::ZERO,
                        open: 0,
                    },
                );
            }
            let Some(entry) = inner.ledgers.get_mut(&key) else {
                continue;
            };
            if let Err(refusal) = policy::check(&entry.seen(), &caps, r.amount()) {
                return Ok(Err(refusal));
            }
            entry.pending += r.amount();
            entry.open += 1;
            return Ok(Ok(()));
        }
    }

    /// Takes back an admission whose reservation never reached the writer.
    pub fn withdraw(&self, r: &Reserve) {
        if let Some(entry) = self
            .lock()
            .ledgers
            .get_mut(&(r.team_id.clone(), r.month_start_ms))
        {
            entry.pending -= r.amount();
            entry.open = entry.open.saturating_sub(1);
        }
    }

    /// Counts what `s` charges from now on, before the writer commits it.
    pub fn settling(&self, s: &Settle) -> Settling {
        let key = (s.record.team_id.clone(), s.month_start_ms);
        // A charging settlement's entry exists (its reservations keep it).
        // Without one nothing is added, nor taken back if it is never sent:
        // an entry made meanwhile read a row this settlement is not in.
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
        let Some(entry) = inner.ledgers.get_mut(&key) else {
            return Settling {
                key,
                charged: Amount::ZERO,
                reservations: 0,
                held,
            };
        };
        let charged = s.charged();
        entry.pending += charged;
        Settling {
            key,
            charged,
            reservations: s.reservations.len(),
            held,
        }
    }

    /// A settlement that never reached the writer charges nothing; its
    /// reservations stay for the sweeper, except held ones (in no ledger).
    pub fn unsent(&self, s: &Settling) {
        let mut inner = self.lock();
        if let Some(entry) = inner.ledgers.get_mut(&s.key) {
            entry.pending -= s.charged;
            entry.open = entry.open.saturating_sub(s.reservations);
        }
        for id in &s.held {
            inner.release_held(id);
        }
    }

    /// After the writer committed `ops`: `rows` replace what was known.
    pub fn committed(&self, ops: &[Op], rows: Rows) {
        let mut inner = self.lock();
        inner.take_out(ops);
        for (key, balance) in rows {
            if let Some(entry) = inner.ledgers.get_mut(&key) {
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
                    let key = (r.team_id.clone(), r.month_start_ms);
                    inner.held.insert(r.id.clone(), (key, r.amount()));
                }
                Op::Reserve(_) | Op::Audit(_) | Op::Write(_) => {}
                Op::Settle(s) => inner.settled(s),
            }
        }
    }

    /// The caps `admit` uses for `team`. When due, one caller re-reads them
    /// while the others use the old ones, rather than all hitting the pool.
    async fn caps(&self, team: &str, defaults: Caps) -> Result<Caps, StoreError> {
        let mut guard = Refreshing {
            admission: self,
            team,
            armed: false,
        };
        if let Some(cached) = self.lock().caps.get_mut(team) {
            if cached.refreshing || cached.read.elapsed() < self.limits_refresh {
                return Ok(cached.caps);
            }
            cached.refreshing = true;
            guard.armed = true;
        }
        let read = Instant::now();
        let caps = ledger::caps_of(&self.store, team, defaults).await?;
        guard.armed = false;
        self.lock().caps.insert(
            team.to_owned(),
            CachedCaps {
                caps,
                read,
                refreshing: false,
            },
        );
        Ok(caps)
    }

    /// `(committed, pending)` of a (team, month) while it is held.
    pub fn snapshot(&self, team: &str, month_start_ms: i64) -> Option<(Balance, Amount)> {
        self.lock()
            .ledgers
            .get(&(team.to_owned(), month_start_ms))
            .map(|e| (e.committed, e.pending))
    }
}

impl Inner {
    /// At [`Inner::sweep_at`] entries drops idle ones and their caps; the next
    /// sweep waits for twice what is left, so sweeping stays linear.
    fn make_room(&mut self, team: &str) {
        if self.ledgers.len() < self.sweep_at {
            return;
        }
        let before = self.ledgers.len();
        self.ledgers
            .retain(|_, e| e.open > 0 || e.pending != Amount::ZERO);
        if self.ledgers.len() < before {
            self.sweeps += 1;
        }
        // Pruned even when no entry went: caps can be read without an entry following.
        let mut teams: HashSet<&str> = self.ledgers.keys().map(|(t, _)| t.as_str()).collect();
        teams.insert(team);
        self.caps
            .retain(|team, c| c.refreshing || teams.contains(team.as_str()));
        self.sweep_at = self.sweep_floor.max(self.ledgers.len().saturating_mul(2));
    }

    fn take_out(&mut self, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Reserve(r) if r.admitted => {
                    let key = (r.team_id.clone(), r.month_start_ms);
                    if let Some(entry) = self.ledgers.get_mut(&key) {
                        entry.pending -= r.amount();
                    }
                }
                Op::Reserve(_) | Op::Audit(_) | Op::Write(_) => {}
                Op::Settle(s) => self.settled(s),
            }
        }
    }

    /// `s` is done with: its charge and any held reservations leave `pending`.
    fn settled(&mut self, s: &Settle) {
        let key = (s.record.team_id.clone(), s.month_start_ms);
        if let Some(entry) = self.ledgers.get_mut(&key) {
            entry.pending -= s.charged();
            entry.open = entry.open.saturating_sub(s.reservations.len());
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
        if let Some((key, amount)) = self.held.remove(id)
            && let Some(entry) = self.ledgers.get_mut(&key)
        {
            entry.pending -= amount;
        }
    }
}
