//! The audit tables: appending to teams' chains (in a ledger's group commit, or the CLI's own
//! transaction), listing events, and verifying a chain.

pub mod sql;

use super::{
    AuditEvent,
    chain::{self, Head, Linked},
};
use crate::store::{Store, StoreError};
use std::collections::BTreeMap;

/// The audit tables' operations (implemented per backend in [`sql`]).
#[async_trait::async_trait]
pub trait AuditRepository: Send + Sync + std::fmt::Debug {
    /// Appends `events` to their teams' chains in a transaction of its own.
    async fn append(&self, events: Vec<AuditEvent>) -> Result<(), StoreError>;

    /// A team's events matching `filter`, in chain order.
    async fn list(&self, filter: &Filter) -> Result<Vec<Linked>, StoreError>;

    /// Every team with a head or events.
    async fn teams(&self) -> Result<Vec<String>, StoreError>;

    /// A team's head, `(seq, hash)`; `None` before its first event.
    async fn head(&self, team: &str) -> Result<Option<(i64, String)>, StoreError>;
}

/// Events by team, teams sorted: every appender locks heads in this order, so none deadlock.
pub fn by_team(events: impl IntoIterator<Item = AuditEvent>) -> BTreeMap<String, Vec<AuditEvent>> {
    let mut teams: BTreeMap<String, Vec<AuditEvent>> = BTreeMap::new();
    for e in events {
        teams.entry(e.team_id.clone()).or_default().push(e);
    }
    teams
}

/// Appends `events` in a transaction of its own (the CLI; a server uses its group commit).
pub async fn append(store: &Store, events: Vec<AuditEvent>) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    sql::repository(store).append(events).await
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

/// A team's events matching `filter`, in chain order.
pub async fn list(store: &Store, filter: &Filter) -> Result<Vec<Linked>, StoreError> {
    sql::repository(store).list(filter).await
}

/// Every team with a head or events (a lost head row then fails verification).
pub async fn teams(store: &Store) -> Result<Vec<String>, StoreError> {
    sql::repository(store).teams().await
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
    sql::repository(store).head(team).await
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
