//! The cap rule: the one statement of when a call fits a team's monthly
//! caps, and how a refusal is explained.
//!
//! A call fits when, for every cap that is set, what the team has used
//! (spent plus reserved) plus what the call asks for stays within the cap.
//! [`check`] is that rule in Rust (a SQLite file's in-memory admission);
//! [`GUARDED_RESERVE`] is the same rule in SQL, where PostgreSQL applies it
//! atomically on the locked row, so replicas sharing the ledger never
//! overshoot. A property test holds the two together.

use super::amount::Amount;

/// Monthly caps; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Tokens (input + output).
    pub tokens: Option<i64>,
    /// Requests.
    pub requests: Option<i64>,
    /// Cost in micro-USD.
    pub cost_micros: Option<i64>,
}

impl Caps {
    /// Each set cap with what `used` and `requested` hold of it, in the
    /// order a refusal names them: requests, tokens, cost.
    fn each(&self, used: Amount, requested: Amount) -> impl Iterator<Item = Check> {
        let limits = [self.requests, self.tokens, self.cost_micros];
        let kinds = [CapKind::Requests, CapKind::Tokens, CapKind::Cost];
        kinds
            .into_iter()
            .zip(limits)
            .zip(used.parts().into_iter().zip(requested.parts()))
            .filter_map(|((cap, limit), (used, requested))| {
                limit.map(|limit| Check {
                    cap,
                    limit,
                    used,
                    requested,
                })
            })
    }
}

/// One cap held against one call.
struct Check {
    cap: CapKind,
    limit: i64,
    used: i64,
    requested: i64,
}

impl Check {
    fn exceeded(&self) -> bool {
        self.used.saturating_add(self.requested) > self.limit
    }

    fn refusal(&self) -> Refusal {
        Refusal {
            cap: self.cap,
            limit: self.limit,
            used: self.used,
            requested: self.requested,
        }
    }
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
        remaining(self.limit, self.used)
    }
}

/// What is left of `limit` once `used` is taken, never below zero.
pub fn remaining(limit: i64, used: i64) -> i64 {
    limit.saturating_sub(used).max(0)
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

impl Balance {
    /// A row of `spent` and `reserved`.
    pub fn of(spent: Amount, reserved: Amount) -> Self {
        Balance {
            spent_tokens: spent.tokens,
            spent_requests: spent.requests,
            spent_cost_micros: spent.cost_micros,
            reserved_tokens: reserved.tokens,
            reserved_requests: reserved.requests,
            reserved_cost_micros: reserved.cost_micros,
        }
    }

    /// What settled calls used.
    pub fn spent(&self) -> Amount {
        Amount::new(
            self.spent_tokens,
            self.spent_requests,
            self.spent_cost_micros,
        )
    }

    /// What calls in flight hold.
    pub fn reserved(&self) -> Amount {
        Amount::new(
            self.reserved_tokens,
            self.reserved_requests,
            self.reserved_cost_micros,
        )
    }

    /// What counts against the caps: spent plus reserved.
    pub fn used(&self) -> Amount {
        self.spent() + self.reserved()
    }
}

/// The cap rule: `requested` fits `balance` under `caps` when every set cap
/// holds what is used plus what is requested. Else the first cap it would
/// exceed (requests, tokens, cost) refuses it.
pub fn check(balance: &Balance, caps: &Caps, requested: Amount) -> Result<(), Refusal> {
    match caps.each(balance.used(), requested).find(Check::exceeded) {
        Some(check) => Err(check.refusal()),
        None => Ok(()),
    }
}

/// Why `requested` was refused, described against the balance re-read after
/// [`GUARDED_RESERVE`] refused it.
///
/// Usually the re-read shows the cap that is exceeded. Under PostgreSQL's
/// READ COMMITTED it can see a settlement committed after the guard
/// refused, so the call seems to fit; the refusal then names the cap
/// closest to being exceeded (the largest share of its limit used with the
/// call), with its real limit and use, rather than a cap that played no
/// part.
pub fn refusal(balance: &Balance, caps: &Caps, requested: Amount) -> Refusal {
    if let Err(refusal) = check(balance, caps, requested) {
        return refusal;
    }
    let share = |c: &Check| {
        if c.limit <= 0 {
            1.0
        } else {
            c.used.saturating_add(c.requested) as f64 / c.limit as f64
        }
    };
    caps.each(balance.used(), requested)
        .max_by(|x, y| share(x).total_cmp(&share(y)))
        .map_or(
            // No cap at all: the guard always admits, so this is never
            // reached; describe the request count as it stands.
            Refusal {
                cap: CapKind::Requests,
                limit: balance.used().requests,
                used: balance.used().requests,
                requested: requested.requests,
            },
            |c| c.refusal(),
        )
}

/// [`check`] in SQL, shared by both backends: reserves `($3, $4, $5)` =
/// (tokens, requests, cost) for team `$1`, month `$2` when it fits under the
/// team's caps: its `tenant_limits` row when it has one (a NULL there is "no
/// cap"), else the defaults `($6, $7, $8)`. Resolving the caps inside the
/// statement saves a round trip per reservation group. Under PostgreSQL's
/// READ COMMITTED, a concurrently updated ledger row makes the server
/// re-check the `WHERE` on its newest version, so the guard holds across
/// replicas.
pub const GUARDED_RESERVE: &str = "WITH caps (t, r, c) AS (\
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

#[cfg(test)]
mod tests;
