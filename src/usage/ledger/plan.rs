//! The one algorithm applying a batch of ledger operations in one transaction:
//!
//! 1. reservations admitted in memory are taken as admitted; those settled
//!    in the same batch are never written;
//! 2. the settled reservations still open are deleted (a missing one was
//!    swept as an orphan and charged already);
//! 3. team by team, each touched row (bucket) is updated once in order,
//!    then the team's guarded reservations admitted in all their buckets or
//!    none, a group together when it fits; then, when some trigger
//!    follows a cap, the caps the settlements' charges crossed
//!    ([`super::crossings`]);
//! 4. usage records, then prompt stats (after the ledger rows: every writer
//!    locks rows in the same order, so PostgreSQL never has a cycle to break);
//! 5. the admitted reservations are written;
//! 6. other services' rows ([`super::Write`]), each behind its guard;
//! 7. the triggers' outbox rows the audit events fire, then the events
//!    (the settlements' and the writes' too), teams in order (their head
//!    rows are locked last).

use super::{Backend, Delta, Done, Op, Reserve, Rows, Settle};
use crate::{
    store::StoreError,
    usage::{
        amount::Amount,
        bucket::{Bucket, Limits, Period},
        policy,
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
    let crossed = super::crossings::find(b, &batch.settles).await?;
    batch.write_records(b).await?;
    write_services(b, ops, &mut batch.done).await?;
    append_audit(b, ops, &mut batch.done, crossed).await?;
    let rows = if read_rows {
        touched_rows(b, ops).await?
    } else {
        Vec::new()
    };
    Ok((batch.done, rows))
}

/// Guarded reservations of the same buckets and default caps, admitted together when they fit.
struct Group<'a> {
    buckets: Vec<Bucket>,
    members: Vec<(usize, &'a Reserve)>,
}

/// A batch's reservations and settlements, for steps 1 to 5.
struct Batch<'a> {
    settles: Vec<&'a Settle>,
    settling: HashSet<&'a str>,
    done: Vec<Done>,
    deltas: BTreeMap<Bucket, Delta>,
    to_write: Vec<&'a Reserve>,
    /// Released as if deleted: admitted and settled in this very batch.
    deleted: HashSet<String>,
    guarded: Vec<Group<'a>>,
}

impl<'a> Batch<'a> {
    /// Step 1; the guarded are grouped by (buckets, default caps).
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
            let buckets = r.buckets();
            if r.admitted && admits_in_memory {
                batch.done[i] = Done::Admitted;
                for bucket in buckets {
                    batch.deltas.entry(bucket).or_default().reserved += r.amount();
                }
                if batch.settling.contains(r.id.as_str()) {
                    batch.deleted.insert(r.id.clone());
                } else {
                    batch.to_write.push(r);
                }
                continue;
            }
            let same = |g: &&mut Group<'a>| {
                g.buckets == buckets
                    && g.members
                        .first()
                        .is_some_and(|(_, f)| f.default_caps == r.default_caps)
            };
            match batch.guarded.iter_mut().find(same) {
                Some(group) => group.members.push((i, r)),
                None => batch.guarded.push(Group {
                    buckets,
                    members: vec![(i, r)],
                }),
            }
        }
        batch
    }

    /// Step 2, and each settlement's release and charge into its rows' deltas.
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
            let mut released = Amount::ZERO;
            for r in &s.reservations {
                if self.deleted.contains(&r.id) {
                    released += r.amount;
                } else {
                    // Swept as orphaned (charged at its estimate) although
                    // the call finished: over-counting beats losing.
                    tracing::warn!(reservation = %r.id, "settling a reservation the sweeper already charged");
                }
            }
            for bucket in s.buckets() {
                let delta = self.deltas.entry(bucket).or_default();
                delta.released += released;
                delta.charged += s.charged();
            }
        }
        Ok(())
    }

    /// Step 3, team by team: its month rows first, in order, then its other
    /// rows updated once each, then its guarded reservations admitted. Every
    /// transaction touching a team's rows of a month takes that month row
    /// first, so it serializes them and no two batches (nor the sweeper)
    /// wait on each other in a cycle (ADR 0028).
    async fn update_rows<B: Backend>(&mut self, b: &mut B) -> Result<(), StoreError> {
        let mut teams: BTreeSet<String> = self.deltas.keys().map(|k| k.team_id.clone()).collect();
        teams.extend(
            self.guarded
                .iter()
                .filter_map(|g| g.buckets.first().map(|k| k.team_id.clone())),
        );
        for team in teams {
            let months = self.lock_months(b, &team).await?;
            let first = Bucket::team_month(&team, i64::MIN);
            for (bucket, d) in self
                .deltas
                .range(first..)
                .take_while(|(k, _)| k.team_id == team)
            {
                if *d != Delta::default() && !months.contains(bucket) {
                    b.update_row(bucket, d).await?;
                }
            }
            for group in self
                .guarded
                .iter()
                .filter(|g| g.buckets.first().is_some_and(|k| k.team_id == team))
            {
                admit(b, group, &mut self.done, &mut self.to_write).await?;
            }
        }
        Ok(())
    }

    /// Updates the team's month rows with a delta, in order; when the batch
    /// touches several months (a call admitted before a month ended,
    /// topped up after), also locks those it only reserves in, so none is
    /// taken after a later one. Returns the rows updated.
    async fn lock_months<B: Backend>(
        &self,
        b: &mut B,
        team: &str,
    ) -> Result<BTreeSet<Bucket>, StoreError> {
        let is_month = |k: &Bucket| k.team_id == team && !k.is_user() && k.period == Period::Month;
        let mut months: BTreeSet<&Bucket> = self.deltas.keys().filter(|k| is_month(k)).collect();
        months.extend(
            self.guarded
                .iter()
                .filter_map(|g| g.buckets.first())
                .filter(|k| is_month(k)),
        );
        let several = months.len() > 1;
        let mut updated = BTreeSet::new();
        for bucket in months {
            match self.deltas.get(bucket).filter(|d| **d != Delta::default()) {
                Some(d) => {
                    b.update_row(bucket, d).await?;
                    updated.insert(bucket.clone());
                }
                None if several => b.lock_row(bucket).await?,
                None => {}
            }
        }
        Ok(updated)
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

/// Step 7, the settlements', the writes' and the cap crossings' audit
/// events included, in the batch's order (a team's chain follows its
/// operations).
async fn append_audit<B: Backend>(
    b: &mut B,
    ops: &[Op],
    done: &mut [Done],
    crossed: super::crossings::Crossed,
) -> Result<(), StoreError> {
    let mut audited = Vec::new();
    let mut outbox = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Audit(events) => {
                done[i] = Done::Audited;
                audited.extend(events.iter().cloned());
            }
            Op::Settle(s) => {
                audited.extend(s.audit.iter().cloned());
                outbox.extend(s.outbox.iter());
            }
            Op::Write(w) => {
                let stored = matches!(done[i], Done::Written { stored: true, .. });
                if stored || !w.audit_only_if_stored {
                    audited.extend(w.audit.iter().cloned());
                    outbox.extend(w.outbox.iter());
                }
            }
            Op::Reserve(_) => {}
        }
    }
    audited.extend(crossed.events);
    outbox.extend(crossed.outbox.iter());
    // The triggers the events fire, in their transaction: none lost to a crash.
    for row in outbox {
        b.write(std::slice::from_ref(row)).await?;
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
    let touched: BTreeSet<Bucket> = ops
        .iter()
        .flat_map(|op| match op {
            Op::Reserve(r) => r.buckets(),
            Op::Settle(s) => s.buckets(),
            Op::Audit(_) | Op::Write(_) => Vec::new(),
        })
        .collect();
    let mut rows = Vec::with_capacity(touched.len());
    for bucket in touched {
        let balance = b.balance(&bucket).await?;
        rows.push((bucket, balance));
    }
    Ok(rows)
}

/// Reserves `amount` in every bucket or in none: `Some(k)` is the bucket that refused.
async fn reserve_all<B: Backend>(
    b: &mut B,
    buckets: &[Bucket],
    defaults: &Limits,
    amount: Amount,
) -> Result<Option<usize>, StoreError> {
    for (k, bucket) in buckets.iter().enumerate() {
        if b.reserve_guarded(bucket, &defaults.of(bucket), amount)
            .await?
        {
            continue;
        }
        let undo = Delta {
            released: amount,
            ..Delta::default()
        };
        for taken in &buckets[..k] {
            b.update_row(taken, &undo).await?;
        }
        return Ok(Some(k));
    }
    Ok(None)
}

/// Admits a group of guarded reservations: together when it fits, else one by one.
async fn admit<'a, B: Backend>(
    b: &mut B,
    group: &Group<'a>,
    done: &mut [Done],
    to_write: &mut Vec<&'a Reserve>,
) -> Result<(), StoreError> {
    let Some((_, first)) = group.members.first() else {
        return Ok(());
    };
    let defaults = first.default_caps;
    let total: Amount = group.members.iter().map(|(_, r)| r.amount()).sum();
    let together = reserve_all(b, &group.buckets, &defaults, total).await?;
    for (i, r) in &group.members {
        let refused_at = match together {
            None => None,
            // A lone reservation was just refused; do not ask twice.
            Some(k) if group.members.len() == 1 => Some(k),
            Some(_) => reserve_all(b, &group.buckets, &defaults, r.amount()).await?,
        };
        done[*i] = match refused_at {
            None => Done::Admitted,
            Some(k) => match explain(b, &group.buckets, k, &defaults, r.amount()).await? {
                Some(refusal) => Done::Refused(refusal),
                None => Done::Admitted,
            },
        };
        if done[*i] == Done::Admitted {
            to_write.push(r);
        }
    }
    Ok(())
}

/// Why bucket `k` refused `amount`; `None` when, re-read, everything fits now
/// and a last guarded try admitted it (READ COMMITTED may see a settlement
/// committed after the refusal).
async fn explain<B: Backend>(
    b: &mut B,
    buckets: &[Bucket],
    mut k: usize,
    defaults: &Limits,
    amount: Amount,
) -> Result<Option<policy::Refusal>, StoreError> {
    let mut retried = false;
    loop {
        let Some(bucket) = buckets.get(k) else {
            return Ok(None);
        };
        // The guard resolves the caps itself; read here only to explain a refusal.
        let caps = b.bucket_caps(bucket).await?.unwrap_or(defaults.of(bucket));
        let balance = b.balance(bucket).await?;
        if retried || policy::check(&balance, &caps, amount).is_err() {
            return Ok(Some(policy::refusal(bucket, &balance, &caps, amount)));
        }
        retried = true;
        match reserve_all(b, buckets, defaults, amount).await? {
            None => return Ok(None),
            Some(again) => k = again,
        }
    }
}
