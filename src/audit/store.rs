//! The audit tables: appending to teams' chains (in a ledger's group commit, or the CLI's own
//! transaction), listing events, and verifying a chain.

use super::{
    AuditEvent, Category,
    chain::{self, Head, Linked},
};
use crate::{
    on_store,
    store::{Store, StoreError},
};
use std::collections::BTreeMap;

/// The stored columns, in the order of [`insert_sql`]'s values and of `SELECT`.
pub const COLUMNS: &str = "id, team_id, seq, at_ms, trace_id, principal, category, action, \
     subject, decision, reason, input_sha256, output_sha256, input_bytes, output_bytes, \
     duration_ms, estimated_cost_micros, actual_cost_micros, idempotency_key, prev_hash, hash";

/// Number of [`COLUMNS`].
pub const COLUMN_COUNT: usize = 21;

/// Creates a team's head row at the start of its chain, when missing.
pub const ENSURE_HEAD: &str = "INSERT INTO audit_heads (team_id, seq, hash) VALUES ($1, 0, $2) \
     ON CONFLICT (team_id) DO NOTHING";

const SELECT_HEAD: &str = "SELECT seq, hash FROM audit_heads WHERE team_id = $1";

/// Moves a team's head.
pub const UPDATE_HEAD: &str = "UPDATE audit_heads SET seq = $2, hash = $3 WHERE team_id = $1";

/// PostgreSQL locks the head row; on SQLite, [`ENSURE_HEAD`]'s write lock already serializes.
pub fn select_head(postgres: bool) -> &'static str {
    if postgres {
        "SELECT seq, hash FROM audit_heads WHERE team_id = $1 FOR UPDATE"
    } else {
        SELECT_HEAD
    }
}

/// `INSERT INTO audit_events (...) VALUES (...), ...` for `rows` events.
pub fn insert_sql(rows: usize) -> String {
    let mut sql = format!("INSERT INTO audit_events ({COLUMNS}) VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        let first = r * COLUMN_COUNT + 1;
        let params: Vec<String> = (first..first + COLUMN_COUNT)
            .map(|i| format!("${i}"))
            .collect();
        sql.push('(');
        sql.push_str(&params.join(", "));
        sql.push(')');
    }
    sql
}

/// Binds one linked event's values, in [`COLUMNS`] order, to a sqlx query.
#[macro_export]
macro_rules! bind_audit_event {
    ($q:expr, $l:expr) => {{
        let l = $l;
        let e = &l.event;
        $q.bind(&e.id)
            .bind(&e.team_id)
            .bind(l.seq)
            .bind(e.at_ms)
            .bind(&e.trace_id)
            .bind(&e.principal)
            .bind(e.category.as_str())
            .bind(&e.action)
            .bind(&e.subject)
            .bind(&e.decision)
            .bind(&e.reason)
            .bind(&e.input_sha256)
            .bind(&e.output_sha256)
            .bind(e.input_bytes)
            .bind(e.output_bytes)
            .bind(e.duration_ms)
            .bind(e.estimated_cost_micros)
            .bind(e.actual_cost_micros)
            .bind(&e.idempotency_key)
            .bind(&l.prev_hash)
            .bind(&l.hash)
    }};
}

/// Events by team, teams sorted: every appender locks heads in this order, so none deadlock.
pub fn by_team(events: impl IntoIterator<Item = AuditEvent>) -> BTreeMap<String, Vec<AuditEvent>> {
    let mut teams: BTreeMap<String, Vec<AuditEvent>> = BTreeMap::new();
    for e in events {
        teams.entry(e.team_id.clone()).or_default().push(e);
    }
    teams
}

/// Appends `$events` in `$tx`, the caller's transaction, so a change and its event commit together.
#[macro_export]
macro_rules! append_audit_events {
    ($tx:expr, $postgres:expr, $events:expr) => {{
        use $crate::audit::{chain, store};
        async {
            for (team, events) in store::by_team($events) {
                sqlx::query(store::ENSURE_HEAD)
                    .bind(&team)
                    .bind(chain::GENESIS)
                    .execute(&mut *$tx)
                    .await?;
                let (seq, hash): (i64, String) = sqlx::query_as(store::select_head($postgres))
                    .bind(&team)
                    .fetch_one(&mut *$tx)
                    .await?;
                let (linked, head) = chain::link(&chain::Head { seq, hash }, events);
                for chunk in linked.chunks(32) {
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(store::insert_sql(chunk.len())));
                    for l in chunk {
                        q = $crate::bind_audit_event!(q, l);
                    }
                    q.execute(&mut *$tx).await?;
                }
                sqlx::query(store::UPDATE_HEAD)
                    .bind(&team)
                    .bind(head.seq)
                    .bind(&head.hash)
                    .execute(&mut *$tx)
                    .await?;
            }
            Ok::<(), sqlx::Error>(())
        }
        .await
    }};
}

/// Appends `events` in a transaction of its own (the CLI; a server uses its group commit).
pub async fn append(store: &Store, events: Vec<AuditEvent>) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let postgres = matches!(store, Store::Postgres(_));
    on_store!(store, |pool| {
        let mut tx = pool.begin().await?;
        crate::append_audit_events!(tx, postgres, events)?;
        tx.commit().await?;
        Ok::<_, StoreError>(())
    })
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Team (required).
    pub team_id: String,
    /// From this instant, unix ms (inclusive).
    pub since_ms: Option<i64>,
    /// Until this instant, unix ms (exclusive).
    pub until_ms: Option<i64>,
    /// Only this trace.
    pub trace_id: Option<String>,
    /// After this sequence number (the page token).
    pub after_seq: i64,
    /// At most this many.
    pub limit: i64,
}

const SELECT: &str = "SELECT id, team_id, seq, at_ms, trace_id, principal, category, action, \
     subject, decision, reason, input_sha256, output_sha256, input_bytes, output_bytes, \
     duration_ms, estimated_cost_micros, actual_cost_micros, idempotency_key, prev_hash, hash \
     FROM audit_events";

fn decode<R: sqlx::Row>(row: &R) -> Result<Linked, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database>,
{
    let category: String = row.try_get(6)?;
    Ok(Linked {
        event: AuditEvent {
            id: row.try_get(0)?,
            team_id: row.try_get(1)?,
            at_ms: row.try_get(3)?,
            trace_id: row.try_get(4)?,
            principal: row.try_get(5)?,
            // An unknown category is tampering, which the hash check reports.
            category: Category::parse(&category).unwrap_or(Category::Admin),
            action: row.try_get(7)?,
            subject: row.try_get(8)?,
            decision: row.try_get(9)?,
            reason: row.try_get(10)?,
            input_sha256: row.try_get(11)?,
            output_sha256: row.try_get(12)?,
            input_bytes: row.try_get(13)?,
            output_bytes: row.try_get(14)?,
            duration_ms: row.try_get(15)?,
            estimated_cost_micros: row.try_get(16)?,
            actual_cost_micros: row.try_get(17)?,
            idempotency_key: row.try_get(18)?,
        },
        seq: row.try_get(2)?,
        prev_hash: row.try_get(19)?,
        hash: row.try_get(20)?,
    })
}

/// A team's events matching `filter`, in chain order.
pub async fn list(store: &Store, filter: &Filter) -> Result<Vec<Linked>, StoreError> {
    let sql = format!(
        "{SELECT} WHERE team_id = $1 AND seq > $2 AND at_ms >= $3 AND at_ms < $4 \
         AND ($5 = '' OR trace_id = $5) ORDER BY seq LIMIT $6"
    );
    let rows = on_store!(store, |pool| {
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(&filter.team_id)
            .bind(filter.after_seq)
            .bind(filter.since_ms.unwrap_or(i64::MIN))
            .bind(filter.until_ms.unwrap_or(i64::MAX))
            .bind(filter.trace_id.clone().unwrap_or_default())
            .bind(filter.limit.max(1))
            .fetch_all(pool)
            .await?;
        rows.iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?
    });
    Ok(rows)
}

/// Every team with a head or events (a lost head row then fails verification).
pub async fn teams(store: &Store) -> Result<Vec<String>, StoreError> {
    let teams: Vec<String> = on_store!(store, |pool| {
        sqlx::query_scalar(
            "SELECT team_id FROM audit_heads UNION SELECT team_id FROM audit_events ORDER BY 1",
        )
        .fetch_all(pool)
        .await?
    });
    Ok(teams)
}

/// The outcome of verifying one team's chain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verification {
    /// Whether every event holds and the chain ends where its head says.
    pub ok: bool,
    /// Events read.
    pub events_checked: u64,
    /// The first event that does not hold (empty when the chain only lost its end).
    pub first_broken_event_id: String,
    /// Its position, or the first missing one.
    pub first_broken_seq: i64,
    /// `hash`, `link`, `gap`, `truncated` (events past the last lost) or `head` (head disagrees).
    pub reason: String,
}

/// Events per query while verifying, so memory stays bounded.
const VERIFY_PAGE: i64 = 1000;

/// Rounds [`verify`] follows a moving head: a team writing nonstop would keep it reading forever.
const VERIFY_ROUNDS: u32 = 3;

/// Verifies `team`'s chain up to its head, read first: events commit with their head, so one
/// appended meanwhile is checked once a re-read head covers it, or else is a `head` break.
pub async fn verify(store: &Store, team: &str) -> Result<Verification, StoreError> {
    let mut head = Head::default();
    let mut checked = 0_u64;
    let mut stored = read_head(store, team).await?;
    for round in 1..=VERIFY_ROUNDS {
        let target = stored.as_ref().map_or(0, |(seq, _)| *seq);
        if let Some(broken) = check_until(store, team, target, &mut head, &mut checked).await? {
            return Ok(broken);
        }
        let broken = |reason: &str| Verification {
            ok: false,
            events_checked: checked,
            first_broken_event_id: String::new(),
            first_broken_seq: head.seq + 1,
            reason: reason.to_owned(),
        };
        match &stored {
            Some((seq, _)) if *seq > head.seq => return Ok(broken("truncated")),
            Some((_, hash)) if *hash != head.hash => return Ok(broken("head")),
            _ => {}
        }
        if !any_after(store, team, target).await? || round == VERIFY_ROUNDS {
            break;
        }
        let again = read_head(store, team).await?;
        if again.as_ref().map_or(0, |(seq, _)| *seq) <= target {
            return Ok(broken("head"));
        }
        stored = again;
    }
    Ok(Verification {
        ok: true,
        events_checked: checked,
        ..Verification::default()
    })
}

async fn read_head(store: &Store, team: &str) -> Result<Option<(i64, String)>, StoreError> {
    Ok(on_store!(store, |pool| {
        sqlx::query_as(SELECT_HEAD)
            .bind(team)
            .fetch_optional(pool)
            .await?
    }))
}

async fn any_after(store: &Store, team: &str, seq: i64) -> Result<bool, StoreError> {
    let next = list(
        store,
        &Filter {
            team_id: team.to_owned(),
            after_seq: seq,
            limit: 1,
            ..Filter::default()
        },
    )
    .await?;
    Ok(!next.is_empty())
}

async fn check_until(
    store: &Store,
    team: &str,
    target: i64,
    head: &mut Head,
    checked: &mut u64,
) -> Result<Option<Verification>, StoreError> {
    while head.seq < target {
        let page = list(
            store,
            &Filter {
                team_id: team.to_owned(),
                after_seq: head.seq,
                limit: VERIFY_PAGE.min(target - head.seq),
                ..Filter::default()
            },
        )
        .await?;
        let mut moved = false;
        for e in page.iter().take_while(|e| e.seq <= target) {
            *checked += 1;
            let reason = if e.seq != head.seq + 1 {
                Some("gap")
            } else if e.prev_hash != head.hash {
                Some("link")
            } else if chain::hash(&e.prev_hash, e.seq, &e.event) != e.hash {
                Some("hash")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Ok(Some(Verification {
                    ok: false,
                    events_checked: *checked,
                    first_broken_event_id: e.event.id.clone(),
                    first_broken_seq: if reason == "gap" { head.seq + 1 } else { e.seq },
                    reason: reason.to_owned(),
                }));
            }
            *head = Head {
                seq: e.seq,
                hash: e.hash.clone(),
            };
            moved = true;
        }
        if !moved {
            // Nothing up to the target: the caller reports the rest missing.
            break;
        }
    }
    Ok(None)
}
