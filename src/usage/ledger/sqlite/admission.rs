//! Admission decided in memory, for a SQLite file.
//!
//! A SQLite file has one ledger writer in one process (the server holds the
//! file exclusively, [`super::claim`]), so that process
//! can know each team's ledger exactly: the balance as of the writer's last
//! commit, plus what it has admitted or charged since and not yet committed.
//! A call is then admitted (or refused) against that sum without waiting
//! for the writer; its reservation row is written by the writer's next
//! batch, nobody waiting for it.
//!
//! The sum never counts less than the ledger will hold once every queued
//! operation is committed, so concurrent calls cannot overshoot a cap:
//! - an admission adds its estimate to `pending` before it returns;
//! - a settlement adds what it charges when it is submitted, and releases
//!   its estimates only once committed (the writer re-reads the row);
//! - after each commit the writer replaces `committed` with the row as its
//!   transaction left it, and takes that batch's amounts out of `pending`,
//!   under one lock, so whatever the batch really did (a reservation the
//!   sweeper charged, a row another connection changed) is what counts;
//! - a reservation whose batch failed stays counted until its call settles.
//!
//! Caps come from `tenant_limits` (or the config defaults) and are read
//! again once older than `metering.limits_refresh`: `ai-orchestrator limits`
//! is another process and cannot tell this one.
//!
//! PostgreSQL keeps admission in SQL (the guarded `UPDATE` of
//! [`crate::usage::policy::GUARDED_RESERVE`]): replicas share its ledger,
//! and none of them alone knows the whole of it.

use crate::{
    store::{Store, StoreError},
    usage::{
        amount::Amount,
        ledger::{self, Key, Op, Reserve, Rows, Settle},
        policy::{self, Balance, Caps, Refusal},
    },
};
use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// One (team, month) as this process sees it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The ledger row as of the writer's last commit that touched it.
    committed: Balance,
    /// Admitted or charged since, not yet committed.
    pending: Amount,
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

#[derive(Debug, Default)]
struct Inner {
    ledgers: HashMap<Key, Entry>,
    /// A team's caps, when they were read, and whether a caller is
    /// reading them again.
    caps: HashMap<String, CachedCaps>,
    /// Reservations admitted whose batch failed: `id → (key, amount)`,
    /// still counted in their key's `pending` until their call settles.
    held: HashMap<String, (Key, Amount)>,
}

#[derive(Debug, Clone, Copy)]
struct CachedCaps {
    caps: Caps,
    read: Instant,
    refreshing: bool,
}

/// Clears a team's `refreshing` mark if its reader is dropped (a cancelled
/// call) before storing what it read, so another caller reads instead.
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
}

impl Admission {
    /// Admission over `store`'s ledger; caps are re-read once older than
    /// `limits_refresh`.
    pub fn new(store: Store, limits_refresh: Duration) -> Self {
        Self {
            store,
            limits_refresh,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data, updated in single steps: still consistent after a
        // panic elsewhere.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `r` (its amount now counts against the team's caps) or says
    /// which cap refuses it. Reads the database only for a team's first
    /// call of a month and when its caps are due for a refresh.
    pub async fn admit(&self, r: &Reserve) -> Result<Result<(), Refusal>, StoreError> {
        let caps = self.caps(&r.team_id, r.default_caps).await?;
        let key = (r.team_id.clone(), r.month_start_ms);
        // No entry means nothing of this key is queued or in flight here
        // (entries are never dropped), so the row as committed is the whole
        // ledger. A concurrent first call may load it too: the first entry
        // in wins, either is exact.
        let loaded = if self.lock().ledgers.contains_key(&key) {
            None
        } else {
            Some(ledger::balance_of(&self.store, &r.team_id, r.month_start_ms).await?)
        };
        let mut inner = self.lock();
        let entry = inner.ledgers.entry(key).or_insert(Entry {
            committed: loaded.unwrap_or_default(),
            pending: Amount::ZERO,
        });
        if let Err(refusal) = policy::check(&entry.seen(), &caps, r.amount()) {
            return Ok(Err(refusal));
        }
        entry.pending += r.amount();
        Ok(Ok(()))
    }

    /// Takes back an admission whose reservation never reached the writer.
    pub fn withdraw(&self, r: &Reserve) {
        if let Some(entry) = self
            .lock()
            .ledgers
            .get_mut(&(r.team_id.clone(), r.month_start_ms))
        {
            entry.pending -= r.amount();
        }
    }

    /// Counts what `s` charges from now on, before the writer commits it.
    pub fn settling(&self, s: &Settle) {
        let charged = s.charged();
        if charged == Amount::ZERO {
            return;
        }
        // A settlement that charges has reservations, so its call was
        // admitted here and its entry exists (entries are never dropped).
        let key = (s.record.team_id.clone(), s.month_start_ms);
        if let Some(entry) = self.lock().ledgers.get_mut(&key) {
            entry.pending += charged;
        }
    }

    /// After the writer committed `ops` (in-memory admitted reservations
    /// and settlements among them): the rows as its transaction left them
    /// replace what was known, and the batch's amounts leave `pending`.
    pub fn committed(&self, ops: &[Op], rows: Rows) {
        let mut inner = self.lock();
        inner.take_out(ops);
        for (key, balance) in rows {
            if let Some(entry) = inner.ledgers.get_mut(&key) {
                entry.committed = balance;
            }
        }
    }

    /// After a batch failed (rolled back): its settlements charged nothing,
    /// and its reservations stay counted until their calls settle, since
    /// those calls are already running.
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

    /// The caps `admit` would use for `team` now. Once they are due for a
    /// refresh, one caller reads them again while the others keep using
    /// the ones it is replacing: a busy team would otherwise send every
    /// call of that moment to the pool at once.
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

    /// `(committed, pending)` of a (team, month), for tests and ops.
    pub fn snapshot(&self, team: &str, month_start_ms: i64) -> Option<(Balance, Amount)> {
        self.lock()
            .ledgers
            .get(&(team.to_owned(), month_start_ms))
            .map(|e| (e.committed, e.pending))
    }
}

impl Inner {
    /// Takes a committed (or rolled back) batch's amounts out of `pending`.
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

    /// `s` is done with (committed or rolled back): its charge and any of
    /// its reservations held after a failed batch leave `pending`.
    fn settled(&mut self, s: &Settle) {
        let key = (s.record.team_id.clone(), s.month_start_ms);
        if let Some(entry) = self.ledgers.get_mut(&key) {
            entry.pending -= s.charged();
        }
        if self.held.is_empty() {
            return;
        }
        for r in &s.reservations {
            if let Some((key, amount)) = self.held.remove(&r.id)
                && let Some(entry) = self.ledgers.get_mut(&key)
            {
                entry.pending -= amount;
            }
        }
    }
}
