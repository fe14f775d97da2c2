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
//! Entries are kept only while they are needed. Once the map holds
//! [`SWEEP_AT`] of them, those with nothing queued or in flight (every
//! admitted reservation's call done with, nothing pending) are dropped with
//! their teams' caps: their rows as committed are the whole ledger again,
//! and are read back at the team's next call. A caller allowed to name
//! teams therefore cannot grow this map past that bound, or twice the
//! entries with calls in flight when that is more.
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
    collections::{HashMap, HashSet},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Entries held before those with nothing in flight are dropped: a few
/// MB, far more teams than one replica serves in a month.
const SWEEP_AT: usize = 10_000;

/// One (team, month) as this process sees it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The ledger row as of the writer's last commit that touched it.
    committed: Balance,
    /// Admitted or charged since, not yet committed.
    pending: Amount,
    /// Reservations admitted here whose call has not settled (committed
    /// or rolled back) nor been withdrawn: while any is, the entry stays.
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
    /// `ledgers`' size at which the next sweep runs.
    sweep_at: usize,
    /// Sweeps that dropped an entry so far: a row read before one may be
    /// older than an entry dropped by it, so such a read is read again.
    sweeps: u64,
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
    /// A test's pause of the next `admit` between its read of a row and
    /// its use: it says when it got there, then waits.
    #[cfg(test)]
    pause: Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            tokio::sync::oneshot::Receiver<()>,
        )>,
    >,
}

/// What a settlement added to its entry when it was submitted
/// ([`Admission::settling`]), to be taken back should it never reach the
/// writer ([`Admission::unsent`]).
#[derive(Debug)]
pub struct Settling {
    key: Key,
    charged: Amount,
    reservations: usize,
    /// Its reservations whose batch failed (`Inner::held`): almost always
    /// none, so nothing is allocated.
    held: Vec<String>,
}

impl Admission {
    /// Admission over `store`'s ledger; caps are re-read once older than
    /// `limits_refresh`.
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

    /// Pauses the next `admit` that reads a row, right after the read: the
    /// first receiver hears when it is there, and it goes on once the
    /// sender is used or dropped.
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
        // (an entry is dropped only once nothing is), so the row as
        // committed is the whole ledger. A concurrent first call may load
        // it too: the first entry in wins, either is exact, unless a sweep
        // ran meanwhile (the row read may then predate an entry it
        // dropped, and is read again).
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
        // A settlement that charges has reservations, so its call was
        // admitted here and its entry exists (they are open until it is
        // done). Should it not, nothing was added, and nothing is taken
        // back if the settlement is never sent: an entry made meanwhile
        // read a row that this settlement is not in.
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

    /// A settlement counted by [`Admission::settling`] that never reached
    /// the writer (its caller was dropped while the queue was full): it
    /// charges nothing, and its call is done with. Its reservations stay in
    /// the ledger, counted as reserved, for the sweeper to charge; those
    /// whose batch failed are in no ledger, and stop counting.
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

    /// `(committed, pending)` of a (team, month) while it is held, for
    /// tests and ops.
    pub fn snapshot(&self, team: &str, month_start_ms: i64) -> Option<(Balance, Amount)> {
        self.lock()
            .ledgers
            .get(&(team.to_owned(), month_start_ms))
            .map(|e| (e.committed, e.pending))
    }
}

impl Inner {
    /// Before an entry of `team` is added at [`Inner::sweep_at`] entries:
    /// drops those with nothing queued or in flight, and the caps of teams
    /// left with none (read again at their next call). The next sweep
    /// waits until the map holds twice what is left (at least
    /// `sweep_floor`), so sweeping stays linear in the entries added even
    /// when most are in flight.
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
        // Caps are pruned even when no entry went: a team's caps can be
        // read without an entry following (a failed read of its row).
        let mut teams: HashSet<&str> = self.ledgers.keys().map(|(t, _)| t.as_str()).collect();
        teams.insert(team);
        self.caps
            .retain(|team, c| c.refreshing || teams.contains(team.as_str()));
        self.sweep_at = self.sweep_floor.max(self.ledgers.len().saturating_mul(2));
    }

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
