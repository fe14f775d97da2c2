//! Refusals over money and caps: a cap of the ledger (`QuotaFailure` naming
//! the limit) and a request's budget, for a call or a tool.

use super::*;

pub(super) fn quota_exceeded(
    refusal: &Refusal,
    details: &mut ErrorDetails,
    info: &mut HashMap<String, String>,
) -> Parts {
    let (limit, remaining) = match refusal.cap {
        CapKind::Cost => (
            format!("{:.6}", usd(refusal.limit)),
            format!("{:.6}", usd(refusal.remaining())),
        ),
        _ => (refusal.limit.to_string(), refusal.remaining().to_string()),
    };
    let subject = refusal.subject();
    let period = refusal.bucket.period.as_str();
    details.add_quota_failure_violation(
        subject.clone(),
        format!("{period} limit {limit} would be exceeded; {remaining} remaining"),
    );
    let whose = if refusal.bucket.is_user() {
        "user's"
    } else {
        "team's"
    };
    info.insert("cap".into(), refusal.cap_name());
    info.insert("limit_subject".into(), subject.clone());
    info.insert("limit".into(), limit);
    info.insert("remaining".into(), remaining);
    (
        Code::ResourceExhausted,
        reason::QUOTA_EXCEEDED,
        format!(
            "the {whose} {} cap would be exceeded ({subject})",
            refusal.cap_name()
        ),
    )
}

pub(super) fn call_budget_exceeded(
    estimate_micros: i64,
    budget_usd: f64,
    details: &mut ErrorDetails,
    info: &mut HashMap<String, String>,
) -> Parts {
    details.add_bad_request_violation(
        "budget.max_cost_usd",
        format!(
            "estimated cost {} USD exceeds the budget {budget_usd} USD",
            usd_text(estimate_micros),
        ),
    );
    info.insert("estimated_cost_usd".into(), usd_text(estimate_micros));
    info.insert("budget_usd".into(), budget_usd.to_string());
    // The input is fine, but this call cannot run within its budget.
    (
        Code::FailedPrecondition,
        reason::BUDGET_EXCEEDED,
        "the estimated cost exceeds budget.max_cost_usd".to_owned(),
    )
}

pub(super) fn tool_budget_exceeded(
    estimate_micros: i64,
    budget_usd: f64,
    details: &mut ErrorDetails,
    info: &mut HashMap<String, String>,
) -> Parts {
    // SPEC §9.3: a tool's budget refusal is a quota failure.
    details.add_quota_failure_violation(
        "budget.max_cost_usd",
        format!(
            "estimated cost {} USD exceeds the budget {budget_usd} USD",
            usd_text(estimate_micros)
        ),
    );
    info.insert("estimated_cost_usd".into(), usd_text(estimate_micros));
    info.insert("budget_usd".into(), budget_usd.to_string());
    (
        Code::ResourceExhausted,
        reason::BUDGET_EXCEEDED,
        "the tool's estimated cost exceeds budget.max_cost_usd".to_owned(),
    )
}
