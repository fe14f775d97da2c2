//! `usage.cap.warning` (80 %) and `usage.cap.reached` (100 %): found in
//! the ledger transaction that settles the spend crossing them, on the rows
//! it holds locked, so each crossing of a bucket's cap is audited exactly
//! once, by the settlement that made it, whichever replica settles it.
//! Only settled spend counts (a reservation is an estimate), and only when
//! some trigger follows a cap: otherwise nothing is read (ADR 0036).

use super::{Backend, Op, Settle, Write};
use crate::{
    audit::{AuditEvent, Category, outbox::Outbox},
    store::{Statement, StoreError},
    usage::{
        amount::Amount,
        bucket::{Bucket, Limits},
        policy::{CapKind, Caps, Refusal},
    },
};
use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
};

/// What the ledger needs to look for crossings: the triggers following
/// them and the caps of teams and users without an override row.
#[derive(Debug)]
pub struct CapTriggers {
    /// The triggers (some follow a cap).
    pub outbox: Arc<Outbox>,
    /// `[metering.default_limits]` and `[metering.user_limits]`.
    pub defaults: Limits,
    /// The caps whose refusal this replica has told already (cleared when
    /// large): a refusal storm asks the database once per cap and period.
    told: Mutex<HashSet<(Bucket, CapKind)>>,
}

impl PartialEq for CapTriggers {
    fn eq(&self, other: &Self) -> bool {
        self.outbox == other.outbox && self.defaults == other.defaults
    }
}

/// Refusals remembered per replica before the memory is cleared.
const TOLD_MAX: usize = 4096;

impl CapTriggers {
    /// The triggers following caps and the default caps.
    pub fn new(outbox: Arc<Outbox>, defaults: Limits) -> Self {
        Self {
            outbox,
            defaults,
            told: Mutex::new(HashSet::new()),
        }
    }

    /// A refusal at or past 80 % of its cap tells `usage.cap.reached`: a
    /// token or cost cap stops calls before settled spend reaches it (their
    /// estimate is held back). The write appends the event only if the
    /// period's guard row is new; `None` once this replica told it.
    pub fn reached_by_refusal(&self, refusal: &Refusal, trace_id: &str) -> Option<Op> {
        if refusal.used < Level::Warning.threshold(refusal.limit) || refusal.limit <= 0 {
            return None;
        }
        {
            let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
            if told.len() >= TOLD_MAX {
                told.clear();
            }
            if !told.insert((refusal.bucket.clone(), refusal.cap)) {
                return None;
            }
        }
        let c = Crossing {
            settle: 0,
            cap: refusal.cap,
            limit: refusal.limit,
            spent: refusal.used,
            level: Level::Reached,
        };
        let now = chrono::Utc::now().timestamp_millis();
        let guard = super::sql::cap_event_guard(
            &refusal.bucket,
            c.cap.as_str(),
            Level::Reached.as_str(),
            now,
        );
        Some(Op::Write(Write {
            team_id: refusal.bucket.team_id.clone(),
            statements: vec![guard],
            durable: false,
            audit: vec![event(&refusal.bucket, &c, trace_id)],
            audit_only_if_stored: true,
            outbox: Vec::new(),
        }))
    }
}

/// How far a cap is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    /// 80 % of the limit, rounded up.
    Warning,
    /// The limit.
    Reached,
}

impl Level {
    /// Where `limit` is crossed at this level.
    fn threshold(self, limit: i64) -> i64 {
        match self {
            // ceil(0.8 × limit), without overflow.
            Level::Warning => ((i128::from(limit) * 4 + 4) / 5) as i64,
            Level::Reached => limit,
        }
    }

    /// Its name in `cap_events.level`.
    fn as_str(self) -> &'static str {
        match self {
            Level::Warning => "warning",
            Level::Reached => "reached",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Level::Warning => "usage.cap.warning",
            Level::Reached => "usage.cap.reached",
        }
    }
}

/// One cap crossed by one settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Crossing {
    /// Which settlement of the bucket's (in batch order) crossed it.
    pub settle: usize,
    pub cap: CapKind,
    pub limit: i64,
    /// Spent once that settlement is counted.
    pub spent: i64,
    pub level: Level,
}

/// The crossings of a bucket whose settled spend ends at `spent_after`,
/// the batch having charged `charges` to it in order.
pub(super) fn crossings(caps: &Caps, spent_after: Amount, charges: &[Amount]) -> Vec<Crossing> {
    let total: Amount = charges.iter().copied().sum();
    let mut before = spent_after - total;
    let mut out = Vec::new();
    for (settle, charge) in charges.iter().enumerate() {
        let after = before + *charge;
        for (cap, limit) in caps.set() {
            for level in [Level::Warning, Level::Reached] {
                let at = level.threshold(limit);
                if at > 0 && cap.of(before) < at && cap.of(after) >= at {
                    out.push(Crossing {
                        settle,
                        cap,
                        limit,
                        spent: cap.of(after),
                        level,
                    });
                }
            }
        }
        before = after;
    }
    out
}

/// The audit events of a batch's crossings and the outbox rows they fire.
#[derive(Debug, Default)]
pub(super) struct Crossed {
    pub events: Vec<AuditEvent>,
    pub outbox: Vec<Statement>,
}

/// Step 3½ of the plan: every bucket the batch charged, re-read as its
/// transaction holds it, its crossings audited.
pub(super) async fn find<B: Backend>(
    b: &mut B,
    settles: &[&Settle],
) -> Result<Crossed, StoreError> {
    let mut out = Crossed::default();
    let Some(triggers) = settles.iter().find_map(|s| s.triggers.clone()) else {
        return Ok(out);
    };
    // Each bucket's charges with the trace that made each, in batch order.
    let mut charged: BTreeMap<Bucket, Vec<(Amount, &str)>> = BTreeMap::new();
    for s in settles {
        let charge = s.charged();
        if charge == Amount::ZERO {
            continue;
        }
        for bucket in s.buckets() {
            let trace = s.record.trace_id.as_str();
            charged.entry(bucket).or_default().push((charge, trace));
        }
    }
    let now = chrono::Utc::now().timestamp_millis();
    for (bucket, charges) in charged {
        let caps = match b.bucket_caps(&bucket).await? {
            Some(caps) => caps,
            None => triggers.defaults.of(&bucket),
        };
        if caps.set().next().is_none() {
            continue;
        }
        let spent = b.balance(&bucket).await?.spent();
        let amounts: Vec<Amount> = charges.iter().map(|(a, _)| *a).collect();
        for c in crossings(&caps, spent, &amounts) {
            // Once per period: a refusal may have told `reached` already.
            let guard = super::sql::cap_event_guard(&bucket, c.cap.as_str(), c.level.as_str(), now);
            if b.write(&[guard]).await? {
                let trace = charges.get(c.settle).map_or("", |(_, t)| *t);
                out.events.push(event(&bucket, &c, trace));
            }
        }
    }
    out.outbox = triggers.outbox.statements(&out.events, now);
    Ok(out)
}

/// `usage.cap.warning|reached` on the bucket's team chain: subject the
/// limit (`team:acme/month/requests`), reason `CAP_WARNING cap=<name>
/// limit=<n> spent=<n>` (a cost in micro-USD).
fn event(bucket: &Bucket, c: &Crossing, trace_id: &str) -> AuditEvent {
    let (decision, code) = match c.level {
        Level::Warning => ("allow", "CAP_WARNING"),
        Level::Reached => ("deny", "CAP_REACHED"),
    };
    let name = format!("{}_{}", bucket.period.adjective(), c.cap.as_str());
    AuditEvent::new(
        &bucket.team_id,
        "system:ledger",
        trace_id,
        Category::Usage,
        c.level.action(),
        &bucket.subject(c.cap.as_str()),
    )
    .decided(
        decision,
        &format!("{code} cap={name} limit={} spent={}", c.limit, c.spent),
    )
}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod tests {
    use super::*;

    fn requests(n: i64) -> Amount {
        Amount::new(0, n, 0)
    }

    #[test]
    fn each_level_is_crossed_once_by_the_settlement_that_crosses_it() {
        let caps = Caps {
            requests: Some(5),
            ..Caps::default()
        };
        // Spent 2 before; five settlements of one request each.
        let found = crossings(&caps, requests(7), &[requests(1); 5]);
        let seen: Vec<(usize, Level, i64)> =
            found.iter().map(|c| (c.settle, c.level, c.spent)).collect();
        assert_eq!(seen, [(1, Level::Warning, 4), (2, Level::Reached, 5)]);
        // Already past both: nothing more.
        assert!(crossings(&caps, requests(9), &[requests(1); 2]).is_empty());
        // One charge jumping over both gives both.
        let both = crossings(&caps, requests(6), &[requests(6)]);
        assert_eq!(both.len(), 2);
    }

    #[test]
    fn thresholds_round_up_and_every_set_cap_is_watched() {
        assert_eq!(Level::Warning.threshold(5), 4);
        assert_eq!(Level::Warning.threshold(7), 6);
        assert_eq!(Level::Warning.threshold(1), 1);
        assert!(Level::Warning.threshold(i64::MAX) > 0);
        let caps = Caps {
            tokens: Some(1_000),
            cost_micros: Some(10_000_000),
            requests: None,
        };
        let found = crossings(
            &caps,
            Amount::new(900, 3, 8_000_000),
            &[Amount::new(900, 3, 8_000_000)],
        );
        let kinds: Vec<CapKind> = found.iter().map(|c| c.cap).collect();
        assert_eq!(kinds, [CapKind::Tokens, CapKind::Cost]);
        assert!(found.iter().all(|c| c.level == Level::Warning));
        // A zero cap is never "crossed": nothing was ever allowed.
        let zero = Caps {
            requests: Some(0),
            ..Caps::default()
        };
        assert!(crossings(&zero, requests(1), &[requests(1)]).is_empty());
    }

    #[test]
    fn an_event_names_the_limit_and_the_spend() {
        let bucket = Bucket {
            team_id: "acme".into(),
            user_id: "u1".into(),
            period: crate::usage::bucket::Period::Day,
            start_ms: 0,
        };
        let c = Crossing {
            settle: 0,
            cap: CapKind::Cost,
            limit: 2_500_000,
            spent: 2_600_000,
            level: Level::Reached,
        };
        let e = event(&bucket, &c, "t-1");
        assert_eq!(e.team_id, "acme");
        assert_eq!(e.action, "usage.cap.reached");
        assert_eq!(e.subject, "user:u1/day/cost_usd");
        assert_eq!(e.decision, "deny");
        assert_eq!(
            e.reason,
            "CAP_REACHED cap=daily_cost_usd limit=2500000 spent=2600000"
        );
        assert_eq!(e.trace_id, "t-1");
    }
}
