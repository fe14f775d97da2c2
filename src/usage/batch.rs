//! Applying a batch of ledger operations in one transaction (the group
//! commit of [`super::writer`]) with as few statements as the SQL allows:
//! one per *team and month* rather than several per operation, and
//! multi-row `INSERT`/`DELETE` for reservations and usage records.
//!
//! Why it matters: each statement is a round trip (to PostgreSQL, or to the
//! SQLite connection's worker thread, two context switches), and the ledger
//! writer is a single task, so statements per call bound the throughput of
//! every replica's metering.
//!
//! Order inside a batch: per (team, month), in key order, settlements first,
//! then reservations. Operations in one batch were submitted concurrently,
//! so any order is a valid serialization; settling first frees the
//! estimates being released, and the key order means every transaction
//! (several writers per replica, several replicas) locks ledger rows in the
//! same order, so PostgreSQL never aborts one to break a deadlock. The
//! guarded admission is unchanged: a team's reservations are admitted
//! together when their sum fits (exactly when one-by-one admission would
//! admit them all, amounts being non-negative), otherwise one by one in
//! submission order, as before.

use super::ledger::{
    BALANCE, BalanceRow, CHARGE_AND_RELEASE, Caps, Done, ENSURE_ROW, GUARDED_RESERVE, Op, Reserve,
    Settle, TEAM_CAPS, balance, exceeded, refusal,
};
use super::record::{self, UsageRecord};
use crate::{
    on_store,
    store::{Store, StoreError},
};
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::OnceLock,
};

/// Rows per multi-row statement. A batch is cut greedily into these sizes,
/// so each statement kind has at most this many distinct SQL texts, all of
/// them reused from the connection's prepared-statement cache.
const CHUNKS: [usize; 7] = [64, 32, 16, 8, 4, 2, 1];

/// `(start, len)` chunks covering `0..n`.
fn chunks(n: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for size in CHUNKS {
        while n - start >= size {
            out.push((start, size));
            start += size;
        }
    }
    out
}

/// How bind parameters are written. PostgreSQL needs `$1, $2, …`. SQLite
/// gets anonymous `?`: for numbered ones sqlx asks SQLite for each
/// parameter's name, a linear scan, which makes a 1,152-parameter insert
/// quadratic (it showed up as the top symbol of the SQLite thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Params {
    Numbered,
    Anonymous,
}

impl Params {
    fn of(store: &Store) -> Self {
        match store {
            Store::Sqlite(_) => Params::Anonymous,
            Store::Postgres(_) => Params::Numbered,
        }
    }

    /// `n` placeholders numbered from `first`, comma-separated.
    fn list(self, first: usize, n: usize) -> String {
        let cells: Vec<String> = (first..first + n)
            .map(|i| match self {
                Params::Numbered => format!("${i}"),
                Params::Anonymous => "?".to_owned(),
            })
            .collect();
        cells.join(", ")
    }
}

/// `head` followed by `rows` groups of `columns` placeholders.
fn values_sql(head: &str, columns: usize, rows: usize, params: Params) -> String {
    let groups: Vec<String> = (0..rows)
        .map(|r| format!("({})", params.list(r * columns + 1, columns)))
        .collect();
    format!("{head} VALUES {}", groups.join(", "))
}

/// Cached SQL texts of one statement kind: per placeholder style, per chunk size.
type Texts = OnceLock<[Vec<String>; 2]>;

/// The SQL of `rows` rows for one statement kind, built once per size.
fn cached(
    cache: &'static Texts,
    build: fn(usize, Params) -> String,
    rows: usize,
    params: Params,
) -> &'static str {
    let all = cache.get_or_init(|| {
        [Params::Numbered, Params::Anonymous].map(|p| CHUNKS.iter().map(|&n| build(n, p)).collect())
    });
    let index = CHUNKS
        .iter()
        .position(|&n| n == rows)
        .unwrap_or(CHUNKS.len() - 1);
    all[usize::from(params == Params::Anonymous)]
        .get(index)
        .map_or("", String::as_str)
}

pub(super) const RESERVATION_HEAD: &str = "INSERT INTO usage_reservations (id, team_id, month_start_ms, \
input_tokens, output_tokens, requests, cost_micros, task, user_id, trace_id, channel, priority, created_at_ms)";
const RESERVATION_COLUMNS: usize = 13;

pub(super) fn insert_reservations(rows: usize, params: Params) -> &'static str {
    static CACHE: Texts = OnceLock::new();
    cached(
        &CACHE,
        |n, p| values_sql(RESERVATION_HEAD, RESERVATION_COLUMNS, n, p),
        rows,
        params,
    )
}

fn insert_records(rows: usize, params: Params) -> &'static str {
    static CACHE: Texts = OnceLock::new();
    cached(
        &CACHE,
        |n, p| values_sql(record::INSERT_HEAD, record::COLUMNS, n, p),
        rows,
        params,
    )
}

fn delete_reservations(rows: usize, params: Params) -> &'static str {
    static CACHE: Texts = OnceLock::new();
    cached(
        &CACHE,
        |n, p| {
            format!(
                "DELETE FROM usage_reservations WHERE id IN ({}) RETURNING id",
                p.list(1, n)
            )
        },
        rows,
        params,
    )
}

/// Ledger deltas of one (team, month): released estimates and charged actuals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Delta {
    pub(super) released: [i64; 3],
    pub(super) charged: [i64; 3],
}

/// What the settlements of a batch do to each (team, month), given the
/// reservations that were still open (deleted now).
pub(super) fn settle_deltas<'a>(
    settles: &[&'a Settle],
    deleted: &HashSet<String>,
) -> BTreeMap<(&'a str, i64), Delta> {
    let mut deltas: BTreeMap<(&str, i64), Delta> = BTreeMap::new();
    for s in settles {
        let delta = deltas
            .entry((s.record.team_id.as_str(), s.month_start_ms))
            .or_default();
        for (id, tokens, requests, cost) in &s.reservations {
            if deleted.contains(id) {
                for (total, added) in delta.released.iter_mut().zip([tokens, requests, cost]) {
                    *total = total.saturating_add(*added);
                }
            } else {
                // Swept as orphaned (charged at its estimate) although the call
                // finished: charge the actuals too; over-counting beats losing.
                tracing::warn!(reservation = %id, "settling a reservation the sweeper already charged");
            }
        }
        for (total, charged) in delta.charged.iter_mut().zip(s.charged()) {
            *total = total.saturating_add(charged);
        }
    }
    deltas.retain(|_, d| *d != Delta::default());
    deltas
}

/// Reservations grouped by (team, month, default caps), groups in order of
/// first appearance, operations in submission order.
pub(super) fn reserve_groups(ops: &[Op]) -> Vec<Vec<(usize, &Reserve)>> {
    let mut groups: Vec<Vec<(usize, &Reserve)>> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let Op::Reserve(r) = op else { continue };
        let same = |g: &&mut Vec<(usize, &Reserve)>| {
            g.first().is_some_and(|(_, f)| {
                f.team_id == r.team_id
                    && f.month_start_ms == r.month_start_ms
                    && f.default_caps == r.default_caps
            })
        };
        match groups.iter_mut().find(same) {
            Some(g) => g.push((i, r)),
            None => groups.push(vec![(i, r)]),
        }
    }
    groups
}

/// The settlements among `ops`, in order.
pub(super) fn settles_of(ops: &[Op]) -> Vec<&Settle> {
    ops.iter()
        .filter_map(|op| match op {
            Op::Settle(s) => Some(s),
            Op::Reserve(_) => None,
        })
        .collect()
}

/// The (team, month) of a reservation group.
fn group_key<'a>(group: &Vec<(usize, &'a Reserve)>) -> Option<(&'a str, i64)> {
    group
        .first()
        .map(|(_, r)| (r.team_id.as_str(), r.month_start_ms))
}

/// `(tokens, requests, cost)` of several reservations together.
pub(super) fn sum(reserves: &[(usize, &Reserve)]) -> (i64, i64, i64) {
    reserves.iter().fold((0, 0, 0), |(t, n, c), (_, r)| {
        (
            t.saturating_add(r.tokens()),
            n.saturating_add(r.requests),
            c.saturating_add(r.cost_micros),
        )
    })
}

/// One guarded reservation of `(tokens, requests, cost)` for (team, month)
/// under the team's caps, `$defaults` when it has no `tenant_limits` row:
/// true when admitted. The ledger row is created on the first
/// miss (`ensured` remembers it), so the common case is one statement.
macro_rules! guarded {
    ($tx:ident, $team:expr, $month:expr, $defaults:expr, $ensured:ident, $amount:expr) => {{
        let (tokens, requests, cost): (i64, i64, i64) = $amount;
        loop {
            let rows = sqlx::query(GUARDED_RESERVE)
                .bind($team)
                .bind($month)
                .bind(tokens)
                .bind(requests)
                .bind(cost)
                .bind($defaults.tokens)
                .bind($defaults.requests)
                .bind($defaults.cost_micros)
                .execute(&mut *$tx)
                .await?
                .rows_affected();
            if rows == 1 || $ensured {
                break rows == 1;
            }
            sqlx::query(ENSURE_ROW)
                .bind($team)
                .bind($month)
                .execute(&mut *$tx)
                .await?;
            $ensured = true;
        }
    }};
}

/// Applies `ops` in one transaction and returns one result per op, in order
/// (settlements first, then reservations; see the module docs).
pub async fn apply(store: &Store, ops: &[Op]) -> Result<Vec<Done>, StoreError> {
    let settles = settles_of(ops);
    let ids: Vec<&str> = settles
        .iter()
        .flat_map(|s| s.reservations.iter().map(|(id, ..)| id.as_str()))
        .collect();
    let groups = reserve_groups(ops);
    let params = Params::of(store);
    // Every settlement succeeds; reservations are filled in below.
    let mut done: Vec<Done> = vec![Done::Settled; ops.len()];
    on_store!(store, |pool| {
        // SQLite: take the write lock up front, so two writers never deadlock
        // upgrading read locks; the busy timeout queues them instead.
        let mut tx = match store {
            Store::Sqlite(_) => pool.begin_with("BEGIN IMMEDIATE").await?,
            Store::Postgres(_) => pool.begin().await?,
        };

        // Settlements: release what is still reserved (the rows deleted
        // here), write the records; the ledger rows follow per team.
        let mut deleted = HashSet::new();
        for (start, len) in chunks(ids.len()) {
            let mut q = sqlx::query_scalar::<_, String>(delete_reservations(len, params));
            for id in &ids[start..start + len] {
                q = q.bind(*id);
            }
            deleted.extend(q.fetch_all(&mut *tx).await?);
        }
        let records: Vec<&UsageRecord> = settles.iter().map(|s| &s.record).collect();
        for (start, len) in chunks(records.len()) {
            let mut q = sqlx::query(insert_records(len, params));
            for r in &records[start..start + len] {
                q = crate::bind_usage_record!(q, r);
            }
            q.execute(&mut *tx).await?;
        }
        // Ledger rows in (team, month) order, each settled before its new
        // reservations are admitted: every transaction, of this replica's
        // writers or another's, locks ledger rows in the same order, so
        // PostgreSQL never has a lock cycle to break by aborting a batch.
        let deltas = settle_deltas(&settles, &deleted);
        let mut keys: BTreeSet<(&str, i64)> = deltas.keys().copied().collect();
        keys.extend(groups.iter().filter_map(group_key));
        let mut admitted: Vec<&Reserve> = Vec::new();
        for key in keys {
            if let Some(d) = deltas.get(&key) {
                let (team, month) = key;
                for attempt in 0..2 {
                    let updated = sqlx::query(CHARGE_AND_RELEASE)
                        .bind(team)
                        .bind(month)
                        .bind(d.released[0])
                        .bind(d.released[1])
                        .bind(d.released[2])
                        .bind(d.charged[0])
                        .bind(d.charged[1])
                        .bind(d.charged[2])
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    if updated > 0 || attempt > 0 {
                        break;
                    }
                    sqlx::query(ENSURE_ROW)
                        .bind(team)
                        .bind(month)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            // Its reservations: one guarded UPDATE per group when the whole
            // group fits, else one per reservation, in order.
            for group in groups.iter().filter(|g| group_key(g) == Some(key)) {
                let Some((_, first)) = group.first() else {
                    continue;
                };
                let (team, month) = (first.team_id.as_str(), first.month_start_ms);
                // The guarded UPDATE resolves the team's own caps itself; they
                // are read here only to explain a refusal (`caps` below).
                let defaults = first.default_caps;
                let mut ensured = false;
                if guarded!(tx, team, month, defaults, ensured, sum(group)) {
                    admitted.extend(group.iter().map(|(_, r)| *r));
                    for (i, _) in group {
                        done[*i] = Done::Admitted;
                    }
                    continue;
                }
                let team_caps: Option<(Option<i64>, Option<i64>, Option<i64>)> =
                    sqlx::query_as(TEAM_CAPS)
                        .bind(team)
                        .fetch_optional(&mut *tx)
                        .await?;
                let caps = team_caps.map_or(defaults, |(tokens, requests, cost_micros)| Caps {
                    tokens,
                    requests,
                    cost_micros,
                });
                for (i, r) in group {
                    // A lone reservation was just refused; do not ask twice.
                    let fits =
                        group.len() > 1 && guarded!(tx, team, month, defaults, ensured, r.amount());
                    if fits {
                        admitted.push(r);
                        done[*i] = Done::Admitted;
                        continue;
                    }
                    let row: Option<BalanceRow> = sqlx::query_as(BALANCE)
                        .bind(team)
                        .bind(month)
                        .fetch_optional(&mut *tx)
                        .await?;
                    let b = balance(row);
                    // Under PostgreSQL's READ COMMITTED the re-read can see a
                    // settlement committed after the UPDATE refused: when the
                    // reservation fits now, ask once more (still guarded).
                    let fits_now = exceeded(&b, &caps, r).is_none()
                        && guarded!(tx, team, month, defaults, ensured, r.amount());
                    if fits_now {
                        admitted.push(r);
                        done[*i] = Done::Admitted;
                    } else {
                        done[*i] = Done::Refused(refusal(&b, &caps, r));
                    }
                }
            }
        }
        // Prompt stats last, in key order: their rows are shared by every
        // team (and writer) using a global prompt, so they are locked after
        // the ledger rows and always in the same order.
        let mut stats_of: Vec<&Settle> = settles
            .iter()
            .copied()
            .filter(|s| s.prompt_stats().is_some())
            .collect();
        stats_of.sort_by(|a, b| {
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
        for s in &stats_of {
            let Some((owner, success)) = s.prompt_stats() else {
                continue;
            };
            sqlx::query(super::ledger::RECORD_STATS)
                .bind(owner)
                .bind(&s.record.prompt_key)
                .bind(s.record.prompt_version)
                .bind(s.record.latency_ms as f64)
                .bind(success)
                .execute(&mut *tx)
                .await?;
        }

        for (start, len) in chunks(admitted.len()) {
            let mut q = sqlx::query(insert_reservations(len, params));
            for r in &admitted[start..start + len] {
                q = q
                    .bind(&r.id)
                    .bind(&r.team_id)
                    .bind(r.month_start_ms)
                    .bind(r.input_tokens)
                    .bind(r.output_tokens)
                    .bind(r.requests)
                    .bind(r.cost_micros)
                    .bind(&r.task)
                    .bind(&r.user_id)
                    .bind(&r.trace_id)
                    .bind(&r.channel)
                    .bind(&r.priority)
                    .bind(r.created_at_ms);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(done)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_with_few_sizes() {
        for n in 0..300 {
            let c = chunks(n);
            assert_eq!(c.iter().map(|(_, len)| len).sum::<usize>(), n);
            let mut next = 0;
            for (start, len) in c {
                assert_eq!(start, next);
                assert!(CHUNKS.contains(&len));
                next += len;
            }
        }
        assert_eq!(
            values_sql("INSERT INTO t (a, b)", 2, 2, Params::Numbered),
            "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4)"
        );
        assert_eq!(
            values_sql("INSERT INTO t (a, b)", 2, 2, Params::Anonymous),
            "INSERT INTO t (a, b) VALUES (?, ?), (?, ?)"
        );
        assert!(delete_reservations(2, Params::Numbered).ends_with("IN ($1, $2) RETURNING id"));
        assert!(delete_reservations(2, Params::Anonymous).ends_with("IN (?, ?) RETURNING id"));
    }
}
