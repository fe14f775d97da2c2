//! The one algorithm that applies a batch of ledger operations, over either
//! backend, in the backend's one transaction:
//!
//! 1. reservations admitted in memory (a SQLite file's writer) are taken as
//!    admitted, and those settled in the same batch are dropped: a short
//!    call's reservation would be inserted and deleted in one transaction,
//!    so it never is;
//! 2. the settled reservations still open are deleted (a missing one was
//!    swept as an orphan and charged already);
//! 3. each ledger row touched is updated once, in (team, month) order, with
//!    what the batch reserved in memory, released and charged; then its
//!    guarded reservations are admitted, a team's group together when it
//!    fits, else one by one, a refusal explained against the row;
//! 4. the usage records are written, then the prompt versions' stats
//!    folded in (after the ledger rows: every writer, of any replica, locks
//!    rows in the same order, so PostgreSQL never has a cycle to break);
//! 5. the admitted reservations (of step 1 and step 3) are written;
//! 6. other services' rows ([`super::Write`]: an agent turn's
//!    conversation) are written, each behind its guard (its audit events
//!    join the next step's);
//! 7. the audit events are appended to their teams' chains, teams in
//!    order (their head rows are locked last, after everything else).
//!
//! The result is one [`Done`] per operation, and (for a SQLite file's
//! in-memory admission) the rows as the transaction left them.

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
    let settles: Vec<&Settle> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Settle(s) => Some(s),
            Op::Reserve(_) | Op::Audit(_) | Op::Write(_) => None,
        })
        .collect();
    let settling: HashSet<&str> = settles
        .iter()
        .flat_map(|s| s.reservations.iter().map(|r| r.id.as_str()))
        .collect();
    // Every settlement succeeds; reservations are decided below.
    let mut done = vec![Done::Settled; ops.len()];
    let mut deltas: BTreeMap<(&str, i64), Delta> = BTreeMap::new();
    let mut to_write: Vec<&Reserve> = Vec::new();
    // Released as if deleted: admitted and settled in this very batch.
    let mut deleted: HashSet<String> = HashSet::new();
    let mut guarded: Vec<Vec<(usize, &Reserve)>> = Vec::new();

    for (i, op) in ops.iter().enumerate() {
        let Op::Reserve(r) = op else { continue };
        if r.admitted && B::ADMITS_IN_MEMORY {
            done[i] = Done::Admitted;
            deltas.entry(r.key()).or_default().reserved += r.amount();
            if settling.contains(r.id.as_str()) {
                deleted.insert(r.id.clone());
            } else {
                to_write.push(r);
            }
            continue;
        }
        // Grouped by (team, month, default caps), in order of first
        // appearance; a group is admitted together when it fits.
        let same = |g: &&mut Vec<(usize, &Reserve)>| {
            g.first()
                .is_some_and(|(_, f)| f.key() == r.key() && f.default_caps == r.default_caps)
        };
        match guarded.iter_mut().find(same) {
            Some(group) => group.push((i, r)),
            None => guarded.push(vec![(i, r)]),
        }
    }

    let ids: Vec<&str> = settling
        .iter()
        .copied()
        .filter(|id| !deleted.contains(*id))
        .collect();
    if !ids.is_empty() {
        deleted.extend(b.delete_reservations(&ids).await?);
    }
    for s in &settles {
        let delta = deltas.entry(s.key()).or_default();
        for r in &s.reservations {
            if deleted.contains(&r.id) {
                delta.released += r.amount;
            } else {
                // Swept as orphaned (charged at its estimate) although the
                // call finished: charge the actuals too; over-counting
                // beats losing.
                tracing::warn!(reservation = %r.id, "settling a reservation the sweeper already charged");
            }
        }
        delta.charged += s.charged();
    }

    let mut keys: BTreeSet<(&str, i64)> = deltas.keys().copied().collect();
    keys.extend(
        guarded
            .iter()
            .filter_map(|g| g.first().map(|(_, r)| r.key())),
    );
    for key in keys {
        if let Some(d) = deltas.get(&key).filter(|d| **d != Delta::default()) {
            b.update_row(key, d).await?;
        }
        for group in guarded
            .iter()
            .filter(|g| g.first().is_some_and(|(_, r)| r.key() == key))
        {
            admit(b, key, group, &mut done, &mut to_write).await?;
        }
    }

    let records: Vec<_> = settles
        .iter()
        .filter(|s| s.recorded)
        .map(|s| &s.record)
        .collect();
    if !records.is_empty() {
        b.insert_records(&records).await?;
    }
    // Prompt stats last, in key order: their rows are shared by every team
    // (and writer) using a global prompt.
    let mut stats: Vec<(&Settle, &str, f64)> = settles
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
    if !to_write.is_empty() {
        b.insert_reservations(&to_write).await?;
    }

    // Other services' rows, before the audit heads (locked last).
    for (i, op) in ops.iter().enumerate() {
        if let Op::Write(w) = op {
            done[i] = Done::Written {
                stored: b.write(&w.statements).await?,
                durable: w.durable,
            };
        }
    }

    let mut audited = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Audit(events) => {
                done[i] = Done::Audited;
                audited.extend(events.iter().cloned());
            }
            Op::Write(w) => audited.extend(w.audit.iter().cloned()),
            Op::Reserve(_) | Op::Settle(_) => {}
        }
    }
    for (team, events) in crate::audit::store::by_team(audited) {
        let head = b.audit_head(&team).await?;
        let (linked, head) = crate::audit::chain::link(&head, events);
        b.insert_audit(&linked).await?;
        b.set_audit_head(&team, &head).await?;
    }

    let mut rows = Vec::new();
    if read_rows {
        let touched: BTreeSet<(&str, i64)> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Reserve(r) => Some(r.key()),
                Op::Settle(s) => Some(s.key()),
                Op::Audit(_) | Op::Write(_) => None,
            })
            .collect();
        for key in touched {
            let key_owned: Key = (key.0.to_owned(), key.1);
            rows.push((key_owned, b.balance(key).await?));
        }
    }
    Ok((done, rows))
}

/// Admits a group of guarded reservations of one row: all together when
/// the whole group fits, else one by one, in order.
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
    // The guard resolves the team's caps itself; they are read here only
    // to explain a refusal.
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
        // Under PostgreSQL's READ COMMITTED the re-read can see a settlement
        // committed after the guard refused: when the reservation fits now,
        // ask once more (still guarded).
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
