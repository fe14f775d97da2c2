//! Where a call counts: the ledger rows (buckets) it reserves in and is charged
//! to. A call counts in its team's month and UTC day and, when the request
//! names a user, in that user's month and day (SPEC §14.2); each bucket has
//! its own caps, and a call is admitted only when it fits all of them.

use super::policy::Caps;

/// The length of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Period {
    /// A UTC calendar month.
    Month,
    /// A UTC day.
    Day,
}

impl Period {
    /// Its name in the `usage_ledger.period` column and in limit subjects.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Month => "month",
            Period::Day => "day",
        }
    }

    /// The adjective of a cap's name (`monthly_tokens`, `daily_cost_usd`).
    pub fn adjective(self) -> &'static str {
        match self {
            Period::Month => "monthly",
            Period::Day => "daily",
        }
    }
}

/// One ledger row: a team's (`user_id` empty) or one of its users' spending in
/// a period. Ordered team rows first, month before day: every writer locks a
/// team's month row before any other row of that team (ADR 0028).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bucket {
    /// Team.
    pub team_id: String,
    /// User, empty for the team's own row.
    pub user_id: String,
    /// Month or day.
    pub period: Period,
    /// Start of the period, unix ms.
    pub start_ms: i64,
}

impl Bucket {
    /// The team's month row (the only one before per-user and daily caps).
    pub fn team_month(team_id: &str, month_start_ms: i64) -> Self {
        Bucket {
            team_id: team_id.to_owned(),
            user_id: String::new(),
            period: Period::Month,
            start_ms: month_start_ms,
        }
    }

    /// Whether this is a user's row.
    pub fn is_user(&self) -> bool {
        !self.user_id.is_empty()
    }

    /// The limit subject of a cap of this bucket: `team:<id>/month/cost_usd`,
    /// `user:<id>/day/tokens` (a `QuotaFailure` violation's subject).
    pub fn subject(&self, cap: &str) -> String {
        let (scope, id) = if self.is_user() {
            ("user", &self.user_id)
        } else {
            ("team", &self.team_id)
        };
        format!("{scope}:{id}/{}/{cap}", self.period.as_str())
    }
}

/// Who and when a call counts for: it yields the call's buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Account<'a> {
    /// Team.
    pub team_id: &'a str,
    /// User ('' = none: user caps do not apply).
    pub user_id: &'a str,
    /// The UTC month the call was admitted in, unix ms.
    pub month_start_ms: i64,
    /// The UTC day the call was admitted in, unix ms.
    pub day_start_ms: i64,
}

impl Account<'_> {
    /// The call's buckets, in lock order: team month, team day, then the
    /// user's month and day when a user is named.
    pub fn buckets(&self) -> Vec<Bucket> {
        let bucket = |user_id: &str, period, start_ms| Bucket {
            team_id: self.team_id.to_owned(),
            user_id: user_id.to_owned(),
            period,
            start_ms,
        };
        let mut out = vec![
            bucket("", Period::Month, self.month_start_ms),
            bucket("", Period::Day, self.day_start_ms),
        ];
        if !self.user_id.is_empty() {
            out.push(bucket(self.user_id, Period::Month, self.month_start_ms));
            out.push(bucket(self.user_id, Period::Day, self.day_start_ms));
        }
        out
    }
}

/// A scope's caps per period: the config's for a team or user without an
/// override, else its override row (`tenant_limits`, `user_limits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodCaps {
    /// Per UTC month.
    pub month: Caps,
    /// Per UTC day.
    pub day: Caps,
}

impl PeriodCaps {
    /// The caps of `period`.
    pub fn of(&self, period: Period) -> Caps {
        match period {
            Period::Month => self.month,
            Period::Day => self.day,
        }
    }
}

impl From<Caps> for PeriodCaps {
    /// Monthly caps only.
    fn from(month: Caps) -> Self {
        PeriodCaps {
            month,
            ..PeriodCaps::default()
        }
    }
}

/// The configured caps of every bucket kind: `[metering.default_limits]` for
/// teams, `[metering.user_limits]` for users.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// A team's.
    pub team: PeriodCaps,
    /// A user's.
    pub user: PeriodCaps,
}

impl Limits {
    /// The caps of `bucket`'s kind.
    pub fn of(&self, bucket: &Bucket) -> Caps {
        self.scope(bucket.is_user()).of(bucket.period)
    }

    /// A user's (`true`) or a team's caps.
    pub fn scope(&self, user: bool) -> PeriodCaps {
        if user { self.user } else { self.team }
    }
}

impl From<Caps> for Limits {
    /// Monthly team caps only.
    fn from(month: Caps) -> Self {
        Limits {
            team: month.into(),
            ..Limits::default()
        }
    }
}

/// The start of `ms`'s UTC day, unix ms.
pub fn day_of(ms: i64) -> i64 {
    ms - ms.rem_euclid(86_400_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_month_row_locks_first_and_subjects_name_the_limit() {
        let account = Account {
            team_id: "acme",
            user_id: "u1",
            month_start_ms: 1_000,
            day_start_ms: 86_400_000,
        };
        let buckets = account.buckets();
        assert_eq!(buckets.len(), 4);
        let mut sorted = buckets.clone();
        sorted.sort();
        assert_eq!(sorted, buckets, "buckets come in lock order");
        assert_eq!(buckets[0], Bucket::team_month("acme", 1_000));
        assert_eq!(buckets[0].subject("cost_usd"), "team:acme/month/cost_usd");
        assert_eq!(buckets[3].subject("tokens"), "user:u1/day/tokens");
        let no_user = Account {
            user_id: "",
            ..account
        };
        assert_eq!(no_user.buckets().len(), 2);
        assert_eq!(day_of(86_400_000 * 3 + 5), 86_400_000 * 3);
    }
}
