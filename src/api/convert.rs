//! Conversions between proto messages and domain types.

use crate::{
    api::pb,
    call::CallMeta,
    router::{AttemptOutcome, AttemptRecord},
    tasks::{SmsTurn, sms_generate::GenerateInput},
    usage::{
        policy::{Balance, Caps},
        pricing::usd,
    },
};
use prost_types::{ListValue, Struct, Value as PbValue, value::Kind};
use serde_json::{Map, Number, Value};

/// `google.protobuf.Struct` → JSON object.
pub fn struct_to_json(s: Struct) -> Map<String, Value> {
    s.fields
        .into_iter()
        .map(|(k, v)| (k, value_to_json(v)))
        .collect()
}

fn value_to_json(v: PbValue) -> Value {
    match v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        // JSON has no NaN/Infinity: the edges refuse such input
        // (`request::check_finite`); anything else left becomes null.
        Some(Kind::NumberValue(n)) => Number::from_f64(n).map_or(Value::Null, Value::Number),
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.into_iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => Value::Object(struct_to_json(s)),
    }
}

/// JSON object → `google.protobuf.Struct`.
pub fn json_to_struct(map: Map<String, Value>) -> Struct {
    Struct {
        fields: map
            .into_iter()
            .map(|(k, v)| (k, json_to_value(v)))
            .collect(),
    }
}

fn json_to_value(v: Value) -> PbValue {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(a) => Kind::ListValue(ListValue {
            values: a.into_iter().map(json_to_value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(json_to_struct(o)),
    };
    PbValue { kind: Some(kind) }
}

/// Proto history → domain history.
pub fn history(messages: &[pb::SmsMessage]) -> Vec<SmsTurn> {
    messages
        .iter()
        .map(|m| SmsTurn {
            inbound: m.direction != pb::SmsDirection::Outbound as i32,
            text: m.text.clone(),
        })
        .collect()
}

/// A `GenerateSms` request → the task's input, the lead's named fields among its attributes.
pub fn generate_input(req: pb::GenerateSmsRequest) -> GenerateInput {
    let lead = req.lead.unwrap_or_default();
    let mut lead_map: std::collections::BTreeMap<String, String> =
        lead.attributes.into_iter().collect();
    for (k, v) in [
        ("first_name", lead.first_name),
        ("last_name", lead.last_name),
        ("company", lead.company),
    ] {
        if !v.is_empty() {
            lead_map.insert(k.to_owned(), v);
        }
    }
    GenerateInput {
        history: history(&req.history),
        inbound_message: req.inbound_message,
        lead: lead_map,
        goal: req.goal,
        max_segments: req.max_segments,
    }
}

fn millis(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

fn attempt(a: &AttemptRecord) -> pb::Attempt {
    let outcome = match a.outcome {
        AttemptOutcome::Success => pb::AttemptOutcome::Success,
        AttemptOutcome::Error => pb::AttemptOutcome::Error,
        AttemptOutcome::Timeout => pb::AttemptOutcome::Timeout,
        AttemptOutcome::SkippedCircuitOpen => pb::AttemptOutcome::SkippedCircuitOpen,
        AttemptOutcome::SkippedRateLimited => pb::AttemptOutcome::SkippedRateLimited,
        AttemptOutcome::Malformed => pb::AttemptOutcome::Malformed,
        AttemptOutcome::Deadline => pb::AttemptOutcome::Deadline,
        AttemptOutcome::Cancelled => pb::AttemptOutcome::Cancelled,
    };
    pb::Attempt {
        provider: a.provider.clone(),
        model: a.model.clone(),
        outcome: outcome as i32,
        latency_ms: millis(a.latency),
        error_code: a.error_code.clone().unwrap_or_default(),
        retry: a.retry,
    }
}

/// `usd` on the ledger's grid of whole micro-dollars. A turn's cost is a
/// sum of floats (0.1 + 0.2 is 0.30000000000000004); the ledger keeps
/// micro-dollars as integers, and the reply shows what it charged.
fn whole_micro_usd(usd: f64) -> f64 {
    (usd * 1e6).round() / 1e6
}

/// Domain meta → `ResponseMeta`.
pub fn meta(m: &CallMeta) -> pb::ResponseMeta {
    super::access::note(|f| {
        f.attempts = m.attempts.len();
        f.provider.clone_from(&m.provider);
        f.model.clone_from(&m.model);
    });
    pb::ResponseMeta {
        trace_id: m.trace_id.clone(),
        provider: m.provider.clone(),
        model: m.model.clone(),
        degraded: m.degraded,
        attempts: m.attempts.iter().map(attempt).collect(),
        usage: Some(pb::Usage {
            input_tokens: m.usage.input_tokens,
            output_tokens: m.usage.output_tokens,
            cost_usd: m.cost_usd.map_or(0.0, whole_micro_usd),
        }),
        latency_ms: millis(m.latency),
        prompt_key: m.prompt_key.clone(),
        prompt_version: m.prompt_version,
    }
}

/// A team's caps and what remains of them this month (spent + reserved
/// counted as used; never negative).
pub fn limits(caps: &Caps, b: &Balance) -> (pb::UsageLimits, pb::UsageLimits) {
    let left = |cap: i64, used: i64| cap.saturating_sub(used).max(0);
    let as_u64 = |v: i64| u64::try_from(v).unwrap_or(0);
    let limits = pb::UsageLimits {
        max_tokens: caps.tokens.map(as_u64),
        max_requests: caps.requests.map(as_u64),
        max_cost_usd: caps.cost_micros.map(usd),
    };
    let remaining = pb::UsageLimits {
        max_tokens: caps
            .tokens
            .map(|c| as_u64(left(c, b.spent_tokens.saturating_add(b.reserved_tokens)))),
        max_requests: caps.requests.map(|c| {
            as_u64(left(
                c,
                b.spent_requests.saturating_add(b.reserved_requests),
            ))
        }),
        max_cost_usd: caps.cost_micros.map(|c| {
            usd(left(
                c,
                b.spent_cost_micros.saturating_add(b.reserved_cost_micros),
            ))
        }),
    };
    (limits, remaining)
}

/// Breaker and health snapshots → `ProviderHealth`.
pub fn provider_health(
    name: &str,
    config: &crate::config::ProviderConfig,
    guards: &crate::resilience::ProviderGuards,
) -> pb::ProviderHealth {
    let breaker = &guards.breaker.snapshot();
    let health = &guards.health.snapshot();
    use crate::resilience::BreakerState;
    let wall = |at: std::time::SystemTime| {
        let d = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        prost_types::Timestamp {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos() as i32,
        }
    };
    // The cooldown end is a monotonic instant; show it as wall-clock time.
    let cooldown_until = breaker.cooldown_until.and_then(|until| {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        (!left.is_zero()).then(|| wall(std::time::SystemTime::now() + left))
    });
    pb::ProviderHealth {
        provider: name.to_owned(),
        kind: config.kind.as_str().to_owned(),
        state: match breaker.state {
            BreakerState::Closed => pb::BreakerState::Closed,
            BreakerState::Open => pb::BreakerState::Open,
            BreakerState::HalfOpen => pb::BreakerState::HalfOpen,
        } as i32,
        consecutive_failures: breaker.consecutive_failures,
        opened_at: breaker.opened_at.map(wall),
        recent_error_rate: health.error_rate,
        latency_p50_ms: health.p50.map_or(0, millis),
        latency_p99_ms: health.p99.map_or(0, millis),
        cooldown_until,
        recent_calls: count(health.calls),
        recent_errors: count(health.errors),
        recent_deadline_exceeded: count(health.deadline_exceeded),
        recent_cancelled: count(health.cancelled),
        recent_connection_errors: count(health.connection_errors),
        recent_resent: count(health.resent),
        breaker_mode: config.breaker.mode.as_str().to_owned(),
        breaker_window_calls: breaker.window.calls,
        breaker_window_failures: breaker.window.failures,
        limits: guards.limits.mode().to_owned(),
        last_probe: guards.probe.last().map(|p| pb::ProbeResult {
            ok: p.ok(),
            latency_ms: millis(p.latency),
            error_code: p.error_code.unwrap_or_default(),
            at: Some(wall(p.at)),
        }),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Usage sums → `UsageTotals`.
pub fn totals(t: &crate::usage::summary::Totals) -> pb::UsageTotals {
    pb::UsageTotals {
        requests: t.requests,
        input_tokens: t.input_tokens,
        output_tokens: t.output_tokens,
        cost_usd: usd(t.cost_micros),
        errors: t.errors,
        degraded: t.degraded,
        latency_p50_ms: t.latency_p50_ms,
        latency_p95_ms: t.latency_p95_ms,
        unpriced_requests: t.unpriced,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cost_is_shown_in_whole_micro_dollars() {
        assert_eq!(super::whole_micro_usd(0.1 + 0.2), 0.3);
        let sum: f64 = [0.000_005; 3].iter().sum();
        assert_eq!(super::whole_micro_usd(sum).to_string(), "0.000015");
        assert_eq!(super::whole_micro_usd(0.000_000_4), 0.0);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn json_struct_round_trip() {
        let Value::Object(obj) = json!({"a": 1.5, "b": [true, null, "x"], "c": {"d": "e"}}) else {
            unreachable!()
        };
        assert_eq!(struct_to_json(json_to_struct(obj.clone())), obj);
    }
}
