//! The SQL guard held to the cap rule.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::guarded_reserve;
use crate::usage::{
    Amount,
    bucket::{Bucket, Period},
    policy::{Balance, Caps, check},
};
use proptest::prelude::*;

/// A ledger on the real SQLite schema, CHECK constraints included.
fn ledger() -> rusqlite::Connection {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    for sql in [
        include_str!("../../../../migrations/sqlite/0001_init.sql"),
        include_str!("../../../../migrations/sqlite/0002_ledger.sql"),
        include_str!("../../../../migrations/sqlite/0003_prompt_audit.sql"),
        include_str!("../../../../migrations/sqlite/0004_api_keys.sql"),
        include_str!("../../../../migrations/sqlite/0005_slim_ledger_writes.sql"),
        include_str!("../../../../migrations/sqlite/0006_amount_checks.sql"),
        include_str!("../../../../migrations/sqlite/0007_usage_rollup.sql"),
        include_str!("../../../../migrations/sqlite/0008_audit.sql"),
        include_str!("../../../../migrations/sqlite/0009_tool_invocations.sql"),
        include_str!("../../../../migrations/sqlite/0010_conversations.sql"),
        include_str!("../../../../migrations/sqlite/0011_budgets.sql"),
    ] {
        conn.execute_batch(sql).unwrap();
    }
    conn
}

/// Whether [`guarded_reserve`] admits `requested` in `bucket` against
/// `balance` under `caps` (its override row, or the defaults).
fn guard_admits(
    conn: &rusqlite::Connection,
    bucket: &Bucket,
    balance: &Balance,
    caps: &Caps,
    requested: Amount,
    as_override: bool,
) -> bool {
    conn.execute_batch(
        "DELETE FROM usage_ledger; DELETE FROM tenant_limits; DELETE FROM user_limits;",
    )
    .unwrap();
    conn.execute(
        "INSERT INTO usage_ledger (team_id, user_id, period, period_start_ms, spent_tokens, \
         spent_requests, spent_cost_micros, reserved_tokens, reserved_requests, \
         reserved_cost_micros) VALUES (?7, ?8, ?9, 0, ?1, ?2, ?3, ?4, ?5, ?6)",
        rusqlite::params![
            balance.spent_tokens,
            balance.spent_requests,
            balance.spent_cost_micros,
            balance.reserved_tokens,
            balance.reserved_requests,
            balance.reserved_cost_micros,
            bucket.team_id,
            bucket.user_id,
            bucket.period.as_str(),
        ],
    )
    .unwrap();
    let defaults = if as_override {
        // The other period's caps are 0: only the bucket's own may count.
        let (month, day) = match bucket.period {
            Period::Month => (
                (caps.tokens, caps.requests, caps.cost_micros),
                (Some(0), Some(0), Some(0)),
            ),
            Period::Day => (
                (Some(0), Some(0), Some(0)),
                (caps.tokens, caps.requests, caps.cost_micros),
            ),
        };
        let table = if bucket.is_user() {
            "user_limits"
        } else {
            "tenant_limits"
        };
        conn.execute(
            &format!(
                "INSERT INTO {table} (team_id, {}max_tokens, max_requests, max_cost_micros, \
                 max_tokens_per_day, max_requests_per_day, max_cost_micros_per_day, \
                 updated_at_ms) VALUES ('t', {}?1, ?2, ?3, ?4, ?5, ?6, 0)",
                if bucket.is_user() { "user_id, " } else { "" },
                if bucket.is_user() { "'u', " } else { "" },
            ),
            rusqlite::params![month.0, month.1, month.2, day.0, day.1, day.2],
        )
        .unwrap();
        // Ignored: the team's own row wins.
        Caps {
            tokens: Some(0),
            requests: Some(0),
            cost_micros: Some(0),
        }
    } else {
        *caps
    };
    let mut stmt = conn.prepare(guarded_reserve(bucket)).unwrap();
    let names = ["$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10"];
    let values: [&dyn rusqlite::ToSql; 10] = [
        &bucket.team_id,
        &bucket.user_id,
        &bucket.period.as_str(),
        &0_i64,
        &requested.tokens,
        &requested.requests,
        &requested.cost_micros,
        &defaults.tokens,
        &defaults.requests,
        &defaults.cost_micros,
    ];
    for (name, value) in names.iter().zip(values) {
        let index = stmt.parameter_index(name).unwrap().unwrap();
        stmt.raw_bind_parameter(index, value).unwrap();
    }
    stmt.raw_execute().unwrap() == 1
}

fn cap() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![Just(None), (0_i64..2_000).prop_map(Some)]
}

fn part() -> impl Strategy<Value = i64> {
    0_i64..1_200
}

proptest! {
    /// The SQL guard admits exactly what [`check`] admits.
    #[test]
    fn the_sql_guard_agrees_with_the_cap_rule(
        spent in (part(), part(), part()),
        reserved in (part(), part(), part()),
        caps in (cap(), cap(), cap()),
        requested in (part(), 0_i64..3, part()),
        as_override in any::<bool>(),
        kind in (any::<bool>(), any::<bool>()),
    ) {
        let bucket = Bucket {
            team_id: "t".into(),
            user_id: if kind.0 { "u".into() } else { String::new() },
            period: if kind.1 { Period::Day } else { Period::Month },
            start_ms: 0,
        };
        let balance = Balance::of(
            Amount::new(spent.0, spent.1, spent.2),
            Amount::new(reserved.0, reserved.1, reserved.2),
        );
        let caps = Caps { tokens: caps.0, requests: caps.1, cost_micros: caps.2 };
        let requested = Amount::new(requested.0, requested.1, requested.2);
        let conn = ledger();
        prop_assert_eq!(
            guard_admits(&conn, &bucket, &balance, &caps, requested, as_override),
            check(&balance, &caps, requested).is_ok()
        );
    }
}
