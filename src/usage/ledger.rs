//! The reserve → settle ledger, in SQL that runs unchanged on SQLite and
//! PostgreSQL.
//!
//! Admission is one guarded `UPDATE ... WHERE spent + reserved + estimate <= cap`
//! per cap, so it is atomic on either backend: PostgreSQL re-checks the
//! `WHERE` on the locked row, SQLite has a single writer (`BEGIN IMMEDIATE`).
//! Concurrent requests and replicas sharing PostgreSQL can never overshoot.
//! A SQLite file's server decides admission in memory instead
//! ([`super::admission`]) and records its reservations here unguarded.
//! A batch of operations runs in one transaction (group commit), applied by
//! [`super::batch`] with one statement per team rather than per operation.

use super::record::UsageRecord;
use crate::{
    on_store,
    store::{Store, StoreError},
};

/// Monthly caps in ledger units; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Tokens (input + output).
    pub tokens: Option<i64>,
    /// Requests.
    pub requests: Option<i64>,
    /// Cost in micro-USD.
    pub cost_micros: Option<i64>,
}

/// Which cap refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapKind {
    /// Token cap.
    Tokens,
    /// Request cap.
    Requests,
    /// Cost cap.
    Cost,
}

impl CapKind {
    /// Stable name used in `QuotaFailure` subjects and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CapKind::Tokens => "monthly_tokens",
            CapKind::Requests => "monthly_requests",
            CapKind::Cost => "monthly_cost_usd",
        }
    }
}

/// A refused admission: the cap, its limit, what is used (spent + reserved)
/// and what the call asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The cap that would be exceeded.
    pub cap: CapKind,
    /// Its limit.
    pub limit: i64,
    /// Spent + reserved now.
    pub used: i64,
    /// What the call would add.
    pub requested: i64,
}

impl Refusal {
    /// What is left under the cap.
    pub fn remaining(&self) -> i64 {
        self.limit.saturating_sub(self.used).max(0)
    }
}

/// A reservation to make before calling a provider.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reserve {
    /// Reservation ID (UUIDv7).
    pub id: String,
    /// Team.
    pub team_id: String,
    /// Month the call is counted in.
    pub month_start_ms: i64,
    /// Estimated input tokens.
    pub input_tokens: i64,
    /// Estimated output tokens (the output cap).
    pub output_tokens: i64,
    /// Requests (1 for a call's first reservation, 0 for a top-up).
    pub requests: i64,
    /// Estimated cost, micro-USD (0 when unpriced).
    pub cost_micros: i64,
    /// Caps from config when the team has no `tenant_limits` row.
    pub default_caps: Caps,
    /// For the orphan record: task, user, trace, channel, priority.
    pub task: String,
    /// User.
    pub user_id: String,
    /// Trace ID.
    pub trace_id: String,
    /// Channel.
    pub channel: String,
    /// Priority.
    pub priority: String,
    /// Now, unix ms.
    pub created_at_ms: i64,
    /// Already admitted in memory ([`super::admission`], a SQLite file's
    /// writer): the writer records it without the guarded `UPDATE`, before
    /// the batch's settlements (its call may already be settling). Only
    /// the SQLite file writer is given such reservations.
    pub admitted: bool,
}

impl Reserve {
    /// Estimated tokens, input + output.
    pub fn tokens(&self) -> i64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// `(tokens, requests, cost_micros)`: what the guarded reservation adds.
    pub fn amount(&self) -> (i64, i64, i64) {
        (self.tokens(), self.requests, self.cost_micros)
    }
}

/// The end of a call: release its reservations, charge what it used, and
/// write its usage record.
#[derive(Debug, Clone, PartialEq)]
pub struct Settle {
    /// Reservations to release: `(id, tokens, requests, cost_micros)`.
    pub reservations: Vec<(String, i64, i64, i64)>,
    /// Charge tokens/requests/cost to the ledger (false for answers given
    /// without any provider, which never count against caps).
    pub charge: bool,
    /// The usage record (team, month via `created_at_ms`, actuals).
    pub record: UsageRecord,
    /// Month the call was admitted in.
    pub month_start_ms: i64,
    /// Team owning the stored prompt version used ('' = global), to fold
    /// this call into that version's stats; `None` for built-in prompts.
    pub prompt_owner: Option<String>,
}

impl Settle {
    /// `[tokens, requests, cost_micros]` this settlement charges to the
    /// ledger (nothing for an answer given without any provider).
    pub fn charged(&self) -> [i64; 3] {
        if !self.charge {
            return [0; 3];
        }
        [
            self.record
                .input_tokens
                .saturating_add(self.record.output_tokens),
            i64::from(!self.reservations.is_empty()),
            self.record.cost_micros.unwrap_or(0),
        ]
    }

    /// `(owner, success)` when this call is folded into a stored prompt
    /// version's stats: it used one (built-in prompts, version 0, have no
    /// stats); success is 1.0 for an `ok` outcome, else 0.0.
    pub fn prompt_stats(&self) -> Option<(&str, f64)> {
        let owner = self
            .prompt_owner
            .as_deref()
            .filter(|_| self.record.prompt_version > 0)?;
        let success = if self.record.outcome == "ok" {
            1.0
        } else {
            0.0
        };
        Some((owner, success))
    }
}

/// One ledger operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Admit a call.
    Reserve(Reserve),
    /// Finish a call.
    Settle(Settle),
}

/// What an operation did.
#[derive(Debug, Clone, PartialEq)]
pub enum Done {
    /// Admitted.
    Admitted,
    /// Refused.
    Refused(Refusal),
    /// Settled and recorded.
    Settled,
}

/// A team's ledger row for one month.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Balance {
    /// Settled tokens.
    pub spent_tokens: i64,
    /// Settled requests.
    pub spent_requests: i64,
    /// Settled cost, micro-USD.
    pub spent_cost_micros: i64,
    /// Tokens reserved by calls in flight.
    pub reserved_tokens: i64,
    /// Requests in flight.
    pub reserved_requests: i64,
    /// Cost reserved, micro-USD.
    pub reserved_cost_micros: i64,
}

/// Folds one call into the stats of the stored prompt version it used
/// (`ai_prompts`), in the settlement's transaction.
pub(super) const RECORD_STATS: &str = "UPDATE ai_prompts SET \
avg_latency_ms = (avg_latency_ms * usage_count + $4) / (usage_count + 1), \
success_rate = (success_rate * usage_count + $5) / (usage_count + 1), \
usage_count = usage_count + 1 \
WHERE team_id = $1 AND prompt_key = $2 AND version = $3";

pub(super) const ENSURE_ROW: &str = "INSERT INTO usage_ledger (team_id, month_start_ms) VALUES ($1, $2) \
ON CONFLICT (team_id, month_start_ms) DO NOTHING";

/// Reserves `($3, $4, $5)` = (tokens, requests, cost) for team `$1`, month
/// `$2` when it fits under the team's caps: its `tenant_limits` row when it
/// has one (a NULL there is "no cap"), else the defaults `($6, $7, $8)`.
/// Resolving the caps inside the statement saves a round trip per
/// reservation group (see docs/metering.md). Under PostgreSQL's READ
/// COMMITTED, a concurrently updated ledger row makes the server re-check
/// the `WHERE` on its newest version, so the guard holds across replicas.
pub(super) const GUARDED_RESERVE: &str = "WITH caps (t, r, c) AS (\
SELECT max_tokens, max_requests, max_cost_micros FROM tenant_limits WHERE team_id = $1 \
UNION ALL SELECT CAST($6 AS BIGINT), CAST($7 AS BIGINT), CAST($8 AS BIGINT) \
WHERE NOT EXISTS (SELECT 1 FROM tenant_limits WHERE team_id = $1)) \
UPDATE usage_ledger SET \
reserved_tokens = reserved_tokens + $3, reserved_requests = reserved_requests + $4, \
reserved_cost_micros = reserved_cost_micros + $5 \
FROM caps \
WHERE usage_ledger.team_id = $1 AND usage_ledger.month_start_ms = $2 \
AND (caps.t IS NULL OR usage_ledger.spent_tokens + usage_ledger.reserved_tokens + $3 <= caps.t) \
AND (caps.r IS NULL OR usage_ledger.spent_requests + usage_ledger.reserved_requests + $4 <= caps.r) \
AND (caps.c IS NULL OR usage_ledger.spent_cost_micros + usage_ledger.reserved_cost_micros + $5 <= caps.c)";

pub(super) const TEAM_CAPS: &str =
    "SELECT max_tokens, max_requests, max_cost_micros FROM tenant_limits WHERE team_id = $1";

pub(super) const BALANCE: &str = "SELECT spent_tokens, spent_requests, spent_cost_micros, reserved_tokens, \
reserved_requests, reserved_cost_micros FROM usage_ledger WHERE team_id = $1 AND month_start_ms = $2";

/// Settles a (team, month): releases estimates ($3..$5) and charges
/// actuals ($6..$8) in one statement. A release never takes a reserved
/// amount below zero (the CHECK constraints would refuse the statement):
/// more released than reserved can only follow an earlier inconsistency,
/// and the row heals at zero instead of failing every later settlement.
pub(super) const CHARGE_AND_RELEASE: &str = "UPDATE usage_ledger SET \
reserved_tokens = CASE WHEN reserved_tokens > $3 THEN reserved_tokens - $3 ELSE 0 END, \
reserved_requests = CASE WHEN reserved_requests > $4 THEN reserved_requests - $4 ELSE 0 END, \
reserved_cost_micros = CASE WHEN reserved_cost_micros > $5 THEN reserved_cost_micros - $5 ELSE 0 END, \
spent_tokens = spent_tokens + $6, \
spent_requests = spent_requests + $7, spent_cost_micros = spent_cost_micros + $8 \
WHERE team_id = $1 AND month_start_ms = $2";

pub(super) type BalanceRow = (i64, i64, i64, i64, i64, i64);

pub(super) fn balance(row: Option<BalanceRow>) -> Balance {
    let (st, sr, sc, rt, rr, rc) = row.unwrap_or_default();
    Balance {
        spent_tokens: st,
        spent_requests: sr,
        spent_cost_micros: sc,
        reserved_tokens: rt,
        reserved_requests: rr,
        reserved_cost_micros: rc,
    }
}

/// `(cap, limit, used, requested)` of every cap that is set.
fn checks(b: &Balance, caps: &Caps, r: &Reserve) -> Vec<(CapKind, i64, i64, i64)> {
    [
        (
            CapKind::Requests,
            caps.requests,
            b.spent_requests.saturating_add(b.reserved_requests),
            r.requests,
        ),
        (
            CapKind::Tokens,
            caps.tokens,
            b.spent_tokens.saturating_add(b.reserved_tokens),
            r.tokens(),
        ),
        (
            CapKind::Cost,
            caps.cost_micros,
            b.spent_cost_micros.saturating_add(b.reserved_cost_micros),
            r.cost_micros,
        ),
    ]
    .into_iter()
    .filter_map(|(cap, limit, used, requested)| limit.map(|l| (cap, l, used, requested)))
    .collect()
}

/// The first cap (requests, tokens, cost) that a reservation of `r` against
/// `b` under `caps` would exceed; `None` when it fits `b`.
pub(super) fn exceeded(b: &Balance, caps: &Caps, r: &Reserve) -> Option<Refusal> {
    checks(b, caps, r)
        .into_iter()
        .find(|&(_, limit, used, requested)| used.saturating_add(requested) > limit)
        .map(|(cap, limit, used, requested)| Refusal {
            cap,
            limit,
            used,
            requested,
        })
}

/// Why a reservation of `r` was refused, described against the balance `b`
/// re-read after the guarded `UPDATE` refused it.
///
/// Usually `b` shows the cap that is exceeded. Under PostgreSQL's READ
/// COMMITTED the re-read can see a settlement committed after the `UPDATE`,
/// so `r` seems to fit; the refusal then names the cap closest to being
/// exceeded (the largest share of its limit used with `r`), with its real
/// limit and use, rather than a cap that played no part.
pub(super) fn refusal(b: &Balance, caps: &Caps, r: &Reserve) -> Refusal {
    if let Some(refusal) = exceeded(b, caps, r) {
        return refusal;
    }
    let share = |limit: i64, used: i64, requested: i64| {
        if limit <= 0 {
            1.0
        } else {
            used.saturating_add(requested) as f64 / limit as f64
        }
    };
    let closest = checks(b, caps, r)
        .into_iter()
        .max_by(|x, y| share(x.1, x.2, x.3).total_cmp(&share(y.1, y.2, y.3)));
    match closest {
        Some((cap, limit, used, requested)) => Refusal {
            cap,
            limit,
            used,
            requested,
        },
        // No cap at all: the guarded UPDATE always admits, so this is never
        // reached; describe the request count as it stands.
        None => Refusal {
            cap: CapKind::Requests,
            limit: b.spent_requests.saturating_add(b.reserved_requests),
            used: b.spent_requests + b.reserved_requests,
            requested: r.requests,
        },
    }
}

/// Applies a batch of operations in one transaction (see [`super::batch`]).
pub use super::batch::apply;

/// The team's balance for a month.
pub async fn balance_of(
    store: &Store,
    team: &str,
    month_start_ms: i64,
) -> Result<Balance, StoreError> {
    let row: Option<BalanceRow> = on_store!(store, |pool| {
        sqlx::query_as(BALANCE)
            .bind(team)
            .bind(month_start_ms)
            .fetch_optional(pool)
            .await?
    });
    Ok(balance(row))
}

/// The caps of a team: its `tenant_limits` row, else `defaults`.
pub async fn caps_of(store: &Store, team: &str, defaults: Caps) -> Result<Caps, StoreError> {
    let row: Option<(Option<i64>, Option<i64>, Option<i64>)> =
        on_store!(store, |pool| sqlx::query_as(TEAM_CAPS)
            .bind(team)
            .fetch_optional(pool)
            .await?);
    Ok(
        row.map_or(defaults, |(tokens, requests, cost_micros)| Caps {
            tokens,
            requests,
            cost_micros,
        }),
    )
}

/// Sets (or with all `None`, makes unlimited) a team's caps.
pub async fn set_caps(
    store: &Store,
    team: &str,
    caps: Caps,
    now_ms: i64,
) -> Result<(), StoreError> {
    const UPSERT: &str = "INSERT INTO tenant_limits (team_id, max_tokens, max_requests, max_cost_micros, updated_at_ms) \
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (team_id) DO UPDATE SET max_tokens = excluded.max_tokens, \
max_requests = excluded.max_requests, max_cost_micros = excluded.max_cost_micros, updated_at_ms = excluded.updated_at_ms";
    on_store!(store, |pool| {
        sqlx::query(UPSERT)
            .bind(team)
            .bind(caps.tokens)
            .bind(caps.requests)
            .bind(caps.cost_micros)
            .bind(now_ms)
            .execute(pool)
            .await
            .map(drop)?
    });
    Ok(())
}

/// Removes a team's override (it falls back to the config defaults).
pub async fn clear_caps(store: &Store, team: &str) -> Result<bool, StoreError> {
    let n = on_store!(store, |pool| {
        sqlx::query("DELETE FROM tenant_limits WHERE team_id = $1")
            .bind(team)
            .execute(pool)
            .await?
            .rows_affected()
    });
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserve(tokens: i64, requests: i64, cost_micros: i64) -> Reserve {
        Reserve {
            input_tokens: tokens,
            requests,
            cost_micros,
            ..Reserve::default()
        }
    }

    const CAPS: Caps = Caps {
        tokens: Some(1_000),
        requests: Some(100),
        cost_micros: Some(50_000),
    };

    #[test]
    fn refusal_names_the_exceeded_cap() {
        let b = Balance {
            spent_tokens: 900,
            reserved_requests: 10,
            ..Balance::default()
        };
        let r = refusal(&b, &CAPS, &reserve(200, 1, 10));
        assert_eq!(
            r,
            Refusal {
                cap: CapKind::Tokens,
                limit: 1_000,
                used: 900,
                requested: 200
            }
        );
        assert_eq!(r.remaining(), 100);
    }

    #[test]
    fn refusal_against_a_balance_that_fits_names_the_closest_cap() {
        // Re-read after a concurrent settlement (READ COMMITTED): it fits
        // now. Cost is at 90 % of its cap, tokens at 50 %, requests at 11 %.
        let b = Balance {
            spent_tokens: 400,
            spent_requests: 10,
            spent_cost_micros: 40_000,
            reserved_cost_micros: 4_000,
            ..Balance::default()
        };
        let r = reserve(100, 1, 1_000);
        assert_eq!(exceeded(&b, &CAPS, &r), None);
        assert_eq!(
            refusal(&b, &CAPS, &r),
            Refusal {
                cap: CapKind::Cost,
                limit: 50_000,
                used: 44_000,
                requested: 1_000
            }
        );

        // Only a request cap set: it is the one named, with its real limit.
        let caps = Caps {
            requests: Some(20),
            ..Caps::default()
        };
        let r = refusal(&b, &caps, &reserve(100, 1, 1_000));
        assert_eq!((r.cap, r.limit, r.used), (CapKind::Requests, 20, 10));
        assert_eq!(r.remaining(), 10);
    }
}
