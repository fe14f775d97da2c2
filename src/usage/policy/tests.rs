//! The cap rule (the SQL guard is held to it in `ledger::sql`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const CAPS: Caps = Caps {
    tokens: Some(1_000),
    requests: Some(100),
    cost_micros: Some(50_000),
};

fn team() -> Bucket {
    Bucket::team_month("t", 0)
}

fn amount(tokens: i64, requests: i64, cost_micros: i64) -> Amount {
    Amount::new(tokens, requests, cost_micros)
}

#[test]
fn refusal_names_the_exceeded_cap() {
    let b = Balance {
        spent_tokens: 900,
        reserved_requests: 10,
        ..Balance::default()
    };
    let r = refusal(&team(), &b, &CAPS, amount(200, 1, 10));
    assert_eq!(
        r,
        Refusal {
            bucket: team(),
            cap: CapKind::Tokens,
            limit: 1_000,
            used: 900,
            requested: 200
        }
    );
    assert_eq!(r.remaining(), 100);
    assert_eq!(r.subject(), "team:t/month/tokens");
    assert_eq!(r.cap_name(), "monthly_tokens");
    assert_eq!(check(&b, &CAPS, amount(200, 1, 10)), Err(CapKind::Tokens));
    assert_eq!(check(&b, &CAPS, amount(100, 1, 10)), Ok(()));
}

#[test]
fn refusal_against_a_balance_that_fits_names_the_closest_cap() {
    // Re-read after a concurrent settlement: it fits now. Cost at 90 %.
    let b = Balance {
        spent_tokens: 400,
        spent_requests: 10,
        spent_cost_micros: 40_000,
        reserved_cost_micros: 4_000,
        ..Balance::default()
    };
    let r = amount(100, 1, 1_000);
    assert_eq!(check(&b, &CAPS, r), Ok(()));
    assert_eq!(
        refusal(&team(), &b, &CAPS, r),
        Refusal {
            bucket: team(),
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
    let r = refusal(&team(), &b, &caps, amount(100, 1, 1_000));
    assert_eq!((r.cap, r.limit, r.used), (CapKind::Requests, 20, 10));
    assert_eq!(r.remaining(), 10);
}
