//! The cap rule: a call fits when for every set cap used plus asked stays
//! within it; [`check`] in Rust, the ledger's guarded reserve in SQL (atomic
//! on the locked row), a property test holding the two together.

use super::{amount::Amount, bucket::Bucket};

/// The caps of one bucket (a team's or user's month or day); `None` is unlimited.
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
    /// Each set cap and its limit, in refusal order.
    pub fn set(&self) -> impl Iterator<Item = (CapKind, i64)> {
        [
            (CapKind::Requests, self.requests),
            (CapKind::Tokens, self.tokens),
            (CapKind::Cost, self.cost_micros),
        ]
        .into_iter()
        .filter_map(|(kind, limit)| limit.map(|l| (kind, l)))
    }

    /// Each set cap with `used` and `requested`, in refusal order.
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

    fn refusal(&self, bucket: &Bucket) -> Refusal {
        Refusal {
            bucket: bucket.clone(),
            cap: self.cap,
            limit: self.limit,
            used: self.used,
            requested: self.requested,
        }
    }
}

/// Which cap refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapKind {
    /// Token cap.
    Tokens,
    /// Request cap.
    Requests,
    /// Cost cap.
    Cost,
}

impl CapKind {
    /// Its part of an amount.
    pub fn of(self, amount: Amount) -> i64 {
        match self {
            CapKind::Tokens => amount.tokens,
            CapKind::Requests => amount.requests,
            CapKind::Cost => amount.cost_micros,
        }
    }

    /// Stable name, the last part of a limit subject (`team:<id>/month/cost_usd`).
    pub fn as_str(self) -> &'static str {
        match self {
            CapKind::Tokens => "tokens",
            CapKind::Requests => "requests",
            CapKind::Cost => "cost_usd",
        }
    }
}

/// A refused admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The bucket whose cap refused.
    pub bucket: Bucket,
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
    /// The limit's subject: `team:<id>/month/cost_usd`, `user:<id>/day/tokens`.
    pub fn subject(&self) -> String {
        self.bucket.subject(self.cap.as_str())
    }

    /// The cap's name: `monthly_tokens`, `daily_cost_usd`, ...
    pub fn cap_name(&self) -> String {
        format!("{}_{}", self.bucket.period.adjective(), self.cap.as_str())
    }

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

/// The cap rule; else the first cap exceeded (requests, tokens, cost) refuses.
pub fn check(balance: &Balance, caps: &Caps, requested: Amount) -> Result<(), CapKind> {
    match caps.each(balance.used(), requested).find(Check::exceeded) {
        Some(check) => Err(check.cap),
        None => Ok(()),
    }
}

/// [`check`] of `bucket`, its refusal in full.
pub fn check_bucket(
    bucket: &Bucket,
    balance: &Balance,
    caps: &Caps,
    requested: Amount,
) -> Result<(), Refusal> {
    match caps.each(balance.used(), requested).find(Check::exceeded) {
        Some(check) => Err(check.refusal(bucket)),
        None => Ok(()),
    }
}

/// Why the ledger's SQL guard (`GUARDED_RESERVE`) refused `requested`, against the re-read balance;
/// if it now seems to fit (READ COMMITTED), the cap closest to its limit.
pub fn refusal(bucket: &Bucket, balance: &Balance, caps: &Caps, requested: Amount) -> Refusal {
    if let Err(refusal) = check_bucket(bucket, balance, caps, requested) {
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
            // No cap: the guard always admits, so this is never reached.
            Refusal {
                bucket: bucket.clone(),
                cap: CapKind::Requests,
                limit: balance.used().requests,
                used: balance.used().requests,
                requested: requested.requests,
            },
            |c| c.refusal(bucket),
        )
}

#[cfg(test)]
mod tests;
