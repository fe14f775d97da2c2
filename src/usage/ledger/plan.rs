//! The one algorithm applying a batch of ledger operations in one transaction:
//!
//! 1. reservations admitted in memory are taken as admitted; those settled
//!    in the same batch are never written;
//! 2. the settled reservations still open are deleted (a missing one was
//!    swept as an orphan and charged already);
//! 3. each touched row is updated once, in (team, month) order, then its
//!    guarded reservations admitted, a group together when it fits;
//! 4. usage records, then prompt stats (after the ledger rows: every writer
//!    locks rows in the same order, so PostgreSQL never has a cycle to break);
//! 5. the admitted reservations are written;
//! 6. other services' rows ([`super::Write`]), each behind its guard;
//! 7. audit events (the settlements' and the writes' too), teams in order
//!    (their head rows are locked last).

use super::{Backend, Delta, Done, Key, Op, Reserve, Rows, Settle};
use crate::{
    store::StoreError,
    usage::{
        amount::Amount,
        policy::{self, Caps},
    },
};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Applies `ops`; with `read_rows`, also returns every touched row as left.
pub(super) async fn apply<B: Backend>(
    b: &mut B,
    ops: &[Op],
    read_rows: bool,
) -> Result<(Vec<Done>, Rows), StoreError> {
    let mut batch = Batch::sort(ops, B::ADMITS_IN_MEMORY);
    batch.delete_settled(b).await?;
    batch.update_rows(b).await?;
    batch.write_records(b).await?;
    write_services(b, ops, &mut batch.done).await?;
    append_audit(b, ops, &mut batch.done).await?;
    let rows = if read_rows {
        touched_rows(b, ops).await?
    } else {
        Vec::new()
    };
    Ok((batch.done, rows))
}

/// A batch's reservations and settlements, for steps 1 to 5.
struct Batch<'a> {
    settles: Vec<&'a Settle>,
    settling: HashSet<&'a str>,
    done: Vec<Done>,
    deltas: BTreeMap<(&'a str, i64), Delta>,
    to_write: Vec<&'a Reserve>,
    /// Released as if deleted: admitted and settled in this very batch.
    deleted: HashSet<String>,
    guarded: Vec<Vec<(usize, &'a Reserve)>>,
}

impl<'a> Batch<'a> {
    /// Step 1; the guarded are grouped by (team, month, default caps).
    fn sort(ops: &'a [Op], admits_in_memory: bool) -> Self {
        let settles: Vec<&'a Settle> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Settle(s) => Some(s),
                Op::Reserve(_) | Op::Audit(_) | Op::Write(_) => None,
            })
            .collect();
        let settling: HashSet<&'a str> = settles
            .iter()
            .flat_map(|s| s.reservations.iter().map(|r| r.id.as_str()))
            .collect();
        let mut batch = Self {
            settles,
            settling,
            // Every settlement succeeds; reservations are decided below.
            done: vec![Done::Settled; ops.len()],
            deltas: BTreeMap::new(),
            to_write: Vec::new(),
            deleted: HashSet::new(),
            guarded: Vec::new(),
        };
        for (i, op) in ops.iter().enumerate() {
            let Op::Reserve(r) = op else { continue };
            if r.admitted && admits_in_memory {
                batch.done[i] = Done::Admitted;
                batch.deltas.entry(r.key()).or_default().reserved += r.amount();
                if batch.settling.contains(r.id.as_str()) {
                    batch.deleted.insert(r.id.clone());
                } else {
                    batch.to_write.push(r);
                }
                continue;
            }
            let same = |g: &&mut Vec<(usize, &Reserve)>| {
                g.first()
                    .is_some_and(|(_, f)| f.key() == r.key() && f.default_caps == r.default_caps)
            };
            match batch.guarded.iter_mut().find(same) {
                Some(group) => group.push((i, r)),
                None => batch.guarded.push(vec![(i, r)]),
            }
        }
        batch
    }

    /// Step 2, and each settlement's release and charge into its row's delta.
    async fn delete_settled<B: Backend>(&mut self, b: &mut B) -> Result<(), StoreError> {
        let ids: Vec<&str> = self
            .settling
            .iter()
            .copied()
            .filter(|id| !self.deleted.contains(*id))
            .collect();
        if !ids.is_empty() {
            self.deleted.extend(b.delete_reservations(&ids).await?);
        }
        for s in self.settles.iter().copied() {
            let delta = self.deltas.entry(s.key()).or_default();
            for r in &s.reservations {
                if self.deleted.contains(&r.id) {
                    delta.released += r.amount;
                } else {
                    // Swept as orphaned (charged at its estimate) although
                    // the call finished: over-counting beats losing.
                    tracing::warn!(reservation = %r.id, "settling a reservation the sweeper already charged");
                }
            }
            delta.charged += s.charged();
        }
        Ok(())
    }

    /// Step 3.
    async fn update_rows<B: Backend>(&mut self, b: &mut B) -> Result<(), StoreError> {
        let mut keys: BTreeSet<(&str, i64)> = self.deltas.keys().copied().collect();
        keys.extend(
            self.guarded
                .iter()
                .filter_map(|g| g.first().map(|(_, r)| r.key())),
        );
        for key in keys {
            if let Some(d) = self.deltas.get(&key).filter(|d| **d != Delta::default()) {
                b.update_row(key, d).await?;
            }
            for group in self
                .guarded
                .iter()
                .filter(|g| g.first().is_some_and(|(_, r)| r.key() == key))
            {
                admit(b, key, group, &mut self.done, &mut self.to_write).await?;
            }
        }
        Ok(())
    }

    /// Steps 4 and 5.
    async fn write_records<B: Backend>(&self, b: &mut B) -> Result<(), StoreError> {
        let records: Vec<_> = self
            .settles
            .iter()
            .filter(|s| s.recorded)
            .map(|s| &s.record)
            .collect();
        if !records.is_empty() {
            b.insert_records(&records).await?;
        }
        // In key order: a global prompt's row is shared by every team and writer.
        let mut stats: Vec<(&Settle, &str, f64)> = self
            .settles
            .iter()
            .filter(|s| s.recorded)
            .filter_map(|s| {
                s.prompt_stats()
                    .map(|(owner, success)| (*s, owner, success))
            })
            .collect();
        stats.sort_by(|(a, ..), (b, ..)| {
            (
                &a.prompt_owner,
                &a.record.prompt_key,
                a.record.prompt_version,
            )
                .cmp(&(
                    &b.prompt_owner,
                    &b.record.prompt_key,
                    b.record.prompt_version,
                ))
        });
        for (s, owner, success) in stats {
            b.fold_prompt_stats(s, owner, success).await?;
        }
        if !self.to_write.is_empty() {
            b.insert_reservations(&self.to_write).await?;
        }
        Ok(())
    }
}

/// Step 6.
async fn write_services<B: Backend>(
    b: &mut B,
    ops: &[Op],
    done: &mut [Done],
) -> Result<(), StoreError> {
    for (i, op) in ops.iter().enumerate() {
        if let Op::Write(w) = op {
            done[i] = Done::Written {
                stored: b.write(&w.statements).await?,
                durable: w.durable,
            };
        }
    }
    Ok(())
}

/// Step 7, the settlements' and the writes' audit events included, in
/// the batch's order (a team's chain follows its operations).
async fn append_audit<B: Backend>(
    b: &mut B,
    ops: &[Op],
    done: &mut [Done],
) -> Result<(), StoreError> {
    let mut audited = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Audit(events) => {
                done[i] = Done::Audited;
                audited.extend(events.iter().cloned());
            }
            Op::Settle(s) => audited.extend(s.audit.iter().cloned()),
            Op::Write(w) => audited.extend(w.audit.iter().cloned()),
            Op::Reserve(_) => {}
        }
    }
    for (team, events) in crate::audit::store::by_team(audited) {
        let head = b.audit_head(&team).await?;
        let (linked, head) = crate::audit::chain::link(&head, events);
        b.insert_audit(&linked).await?;
        b.set_audit_head(&team, &head).await?;
    }
    Ok(())
}

/// Every row the batch touched, as the transaction left it.
async fn touched_rows<B: Backend>(b: &mut B, ops: &[Op]) -> Result<Rows, StoreError> {
    let touched: BTreeSet<(&str, i64)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Reserve(r) => Some(r.key()),
            Op::Settle(s) => Some(s.key()),
            Op::Audit(_) | Op::Write(_) => None,
        })
        .collect();
    let mut rows = Vec::new();
    for key in touched {
        let key_owned: Key = (key.0.to_owned(), key.1);
        rows.push((key_owned, b.balance(key).await?));
    }
    Ok(rows)
}

/// Admits a group of guarded reservations of one row: together when it
/// fits, else one by one.
async fn admit<'a, B: Backend>(
    b: &mut B,
    key: (&str, i64),
    group: &[(usize, &'a Reserve)],
    done: &mut [Done],
    to_write: &mut Vec<&'a Reserve>,
) -> Result<(), StoreError> {
    let Some((_, first)) = group.first() else {
        return Ok(());
    };
    let defaults = first.default_caps;
    let total: Amount = group.iter().map(|(_, r)| r.amount()).sum();
    if b.reserve_guarded(key, &defaults, total).await? {
        for (i, r) in group {
            done[*i] = Done::Admitted;
            to_write.push(r);
        }
        return Ok(());
    }
    // The guard resolves the caps itself; read here only to explain a refusal.
    let caps: Caps = b.team_caps(key.0).await?.unwrap_or(defaults);
    for (i, r) in group {
        // A lone reservation was just refused; do not ask twice.
        let fits = group.len() > 1 && b.reserve_guarded(key, &defaults, r.amount()).await?;
        if fits {
            done[*i] = Done::Admitted;
            to_write.push(r);
            continue;
        }
        let balance = b.balance(key).await?;
        // READ COMMITTED: the re-read may see a settlement committed after the
        // refusal; if it fits now, ask once more (still guarded).
        let fits_now = policy::check(&balance, &caps, r.amount()).is_ok()
            && b.reserve_guarded(key, &defaults, r.amount()).await?;
        if fits_now {
            done[*i] = Done::Admitted;
            to_write.push(r);
        } else {
            done[*i] = Done::Refused(policy::refusal(&balance, &caps, r.amount()));
        }
    }
    Ok(())
}
