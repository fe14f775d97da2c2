//! Turning an incoming request's envelope (context, budget, metadata) into a
//! validated [`CallContext`]: trace ID, team, deadline.

use super::error::Failure;
use crate::{
    api::pb,
    call::CallContext,
    config::ServerConfig,
    domain::{Channel, Priority, instant_after},
    telemetry::trace_id,
};
use std::time::Duration;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;

/// gRPC metadata, read by authentication and the trace ID rules.
impl crate::domain::Headers for MetadataMap {
    fn text(&self, name: &str) -> Option<Result<&str, ()>> {
        self.get(name).map(|v| v.to_str().map_err(|_| ()))
    }
}

/// The measures of a JSON input the request limits use.
pub(crate) use crate::domain::json::{bytes as json_bytes, depth as json_depth};

/// Headroom kept before the caller's `grpc-timeout` (at most 10% of it).
pub const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_millis(50);

/// Longest accepted team/user ID.
const MAX_ID_LEN: usize = 128;

/// Validates the envelope. On failure returns the trace ID to report with the
/// error (the caller's when usable, else a fresh one) and the failure.
pub(crate) fn call_context(
    context: Option<&pb::RequestContext>,
    budget: Option<&pb::Budget>,
    metadata: &MetadataMap,
    server: &ServerConfig,
) -> Result<CallContext, (String, Failure)> {
    let started = Instant::now();
    let ctx_trace = context.map_or("", |c| c.trace_id.as_str());
    let trace_id = match trace_id::resolve(ctx_trace, metadata) {
        Ok((id, _)) => id,
        Err(bad) => {
            return Err((
                trace_id::generate(),
                Failure::invalid(bad.field, &bad.to_string()),
            ));
        }
    };
    let fail = |field: &str, why: &str| Err((trace_id.clone(), Failure::invalid(field, why)));
    let Some(context) = context else {
        return fail("context", "is required");
    };
    if let Err(why) = check_id(&context.team_id, true) {
        return fail("context.team_id", why);
    }
    if let Err(why) = check_id(&context.user_id, false) {
        return fail("context.user_id", why);
    }

    let mut timeout = server.default_timeout;
    // tonic's own deadline layer silently ignores a malformed header; we
    // refuse it (docs/api.md), since the caller believes a deadline is set.
    if let Some(grpc) = metadata.get("grpc-timeout") {
        match grpc.to_str().ok().and_then(parse_grpc_timeout) {
            // Finish before the caller's timer fires: it gets our DEADLINE_EXCEEDED with
            // the attempts, not its transport's bare CANCELLED.
            Some(t) => timeout = timeout.min(early(t)),
            None => return fail("grpc-timeout", "malformed grpc-timeout header"),
        }
    }
    if let Some(budget) = budget {
        if budget.max_latency_ms > 0 {
            // The budget promises the answer within it: same margin.
            timeout = timeout.min(early(Duration::from_millis(u64::from(
                budget.max_latency_ms,
            ))));
        }
        if !budget.max_cost_usd.is_finite() || budget.max_cost_usd < 0.0 {
            return fail("budget.max_cost_usd", "must be a non-negative number");
        }
    }
    let channel = match pb::Channel::try_from(context.channel) {
        Ok(pb::Channel::Sms) => Channel::Sms,
        Ok(pb::Channel::Web) => Channel::Web,
        _ => Channel::System,
    };
    let priority = match pb::Priority::try_from(context.priority) {
        Ok(pb::Priority::Background) => Priority::Background,
        _ => Priority::Interactive,
    };
    Ok(CallContext {
        team_id: context.team_id.clone(),
        user_id: context.user_id.clone(),
        trace_id,
        channel,
        priority,
        started,
        started_at_ms: chrono::Utc::now().timestamp_millis(),
        // `default_timeout` comes from config: an absurd one must not overflow.
        deadline: instant_after(started, timeout),
        budget_usd: budget.map(|b| b.max_cost_usd),
        traceparent: metadata
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .filter(|tp| trace_id::traceparent_trace_id(tp).is_some())
            .map(str::to_owned),
        // Set once the caller is authenticated.
        principal: String::new(),
    })
}

/// Our time under a caller's limit `t`: [`DEADLINE_MARGIN`] less (at most 10% of `t`), so
/// the reply is on the wire before the caller's timer fires.
fn early(t: Duration) -> Duration {
    t.saturating_sub(DEADLINE_MARGIN.min(t / 10))
}

/// IDs end up in logs, metrics labels and SQL; keep them boring.
pub(crate) fn check_id(id: &str, required: bool) -> Result<(), &'static str> {
    if id.is_empty() {
        return if required { Err("is required") } else { Ok(()) };
    }
    if id.len() > MAX_ID_LEN {
        return Err("must be at most 128 characters");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@'))
    {
        return Err("may only contain letters, digits and - _ . : @");
    }
    Ok(())
}

/// The trace ID of an RPC without a `context`: `x-trace-id`'s, else `traceparent`'s, else
/// new. A malformed header is INVALID_INPUT, as for every RPC, under a new ID.
pub(crate) fn metadata_trace(metadata: &MetadataMap) -> Result<String, tonic::Status> {
    trace_id::resolve("", metadata)
        .map(|(t, _)| t)
        .map_err(|bad| {
            super::error::to_status(
                Failure::invalid(bad.field, &bad.to_string()),
                &trace_id::generate(),
            )
        })
}

/// Parses the `grpc-timeout` header: up to 8 digits and a unit
/// (`H` hours, `M` minutes, `S` seconds, `m` ms, `u` µs, `n` ns).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    // Checked split: a multi-byte last character must be refused, not panic.
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Refuses a request whose encoded size `total` exceeds `server.max_input_bytes`; the
/// violation names the largest of `fields`, the parts a caller fills.
pub(crate) fn check_input(
    total: usize,
    fields: &[(&str, usize)],
    server: &ServerConfig,
) -> Result<(), Failure> {
    if total <= server.max_input_bytes {
        return Ok(());
    }
    let (field, bytes) = fields
        .iter()
        .copied()
        .max_by_key(|(_, bytes)| *bytes)
        .unwrap_or(("request", total));
    Err(Failure::invalid(
        field,
        &format!(
            "the request is {total} bytes, over the {} byte input limit \
             (server.max_input_bytes); this field holds {bytes}",
            server.max_input_bytes
        ),
    ))
}

/// Refuses more `history` entries than `server.max_history_entries`.
pub(crate) fn check_history(entries: usize, server: &ServerConfig) -> Result<(), Failure> {
    if entries > server.max_history_entries {
        return Err(Failure::invalid(
            "history",
            &format!(
                "has {entries} entries, more than the {} allowed (server.max_history_entries)",
                server.max_history_entries
            ),
        ));
    }
    Ok(())
}

/// Refuses an input nested deeper than `server.max_input_depth`.
pub(crate) fn check_depth(field: &str, depth: usize, server: &ServerConfig) -> Result<(), Failure> {
    if depth > server.max_input_depth {
        return Err(Failure::invalid(
            field,
            &format!(
                "nests objects and arrays {depth} levels deep, more than the {} allowed \
                 (server.max_input_depth)",
                server.max_input_depth
            ),
        ));
    }
    Ok(())
}

/// Nesting depth of a protobuf `Struct` (an empty one is 1), walked
/// without recursion; lists and structs count alike, as in JSON.
pub(crate) fn struct_depth(s: &prost_types::Struct) -> usize {
    use prost_types::value::Kind;
    let mut deepest = 1;
    let mut stack: Vec<(&prost_types::Value, usize)> = s.fields.values().map(|v| (v, 1)).collect();
    while let Some((value, depth)) = stack.pop() {
        match &value.kind {
            Some(Kind::StructValue(s)) => {
                deepest = deepest.max(depth + 1);
                stack.extend(s.fields.values().map(|v| (v, depth + 1)));
            }
            Some(Kind::ListValue(l)) => {
                deepest = deepest.max(depth + 1);
                stack.extend(l.values.iter().map(|v| (v, depth + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// Refuses a `Struct` holding NaN or ±Infinity: JSON has no such numbers, and `null` would
/// change the input unseen (in a prompt, a webhook body, an audit digest). No recursion.
pub(crate) fn check_finite(field: &str, s: &prost_types::Struct) -> Result<(), Failure> {
    use prost_types::value::Kind;
    let mut stack: Vec<&prost_types::Value> = s.fields.values().collect();
    while let Some(value) = stack.pop() {
        match &value.kind {
            Some(Kind::NumberValue(n)) if !n.is_finite() => {
                return Err(Failure::invalid(
                    field,
                    "holds a number that is not finite (NaN or Infinity), which JSON cannot carry",
                ));
            }
            Some(Kind::StructValue(s)) => stack.extend(s.fields.values()),
            Some(Kind::ListValue(l)) => stack.extend(l.values.iter()),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_json_cannot_carry_are_refused() {
        use prost_types::{ListValue, Struct, Value, value::Kind};
        let number = |n: f64| Value {
            kind: Some(Kind::NumberValue(n)),
        };
        let nested = |v: Value| Struct {
            fields: [(
                "a".to_owned(),
                Value {
                    kind: Some(Kind::ListValue(ListValue { values: vec![v] })),
                },
            )]
            .into(),
        };
        assert!(check_finite("input", &nested(number(1.5))).is_ok());
        for n in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(check_finite("input", &nested(number(n))).is_err(), "{n}");
        }
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(
            parse_grpc_timeout("10é"),
            None,
            "no panic on a multi-byte unit"
        );
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
    }

    fn team() -> pb::RequestContext {
        pb::RequestContext {
            team_id: "t1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_absurd_default_timeout_does_not_overflow_the_deadline() {
        let server = ServerConfig {
            default_timeout: Duration::MAX,
            ..Default::default()
        };
        let ctx = call_context(Some(&team()), None, &MetadataMap::new(), &server)
            .map_err(|(_, f)| format!("{f:?}"))
            .unwrap();
        assert!(ctx.deadline > ctx.started + Duration::from_secs(365 * 24 * 3600));
        // The largest grpc-timeout (99999999 hours) is fine too.
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", "99999999H".parse().unwrap());
        assert!(call_context(Some(&team()), None, &metadata, &server).is_ok());
    }

    #[test]
    fn a_malformed_grpc_timeout_is_invalid_input() {
        let server = ServerConfig::default();
        for bad in ["soon", "10", "m", "-5m", "1.5S", "123456789m"] {
            let mut metadata = MetadataMap::new();
            metadata.insert("grpc-timeout", bad.parse().unwrap());
            let Err((_, failure)) = call_context(Some(&team()), None, &metadata, &server) else {
                panic!("{bad:?} accepted");
            };
            assert!(
                matches!(&failure, Failure::Invalid(v) if v[0].0 == "grpc-timeout"),
                "{bad:?}: {failure:?}"
            );
        }
        // Not even text: refused rather than ignored.
        let mut metadata = MetadataMap::new();
        metadata.insert(
            "grpc-timeout",
            tonic::metadata::MetadataValue::try_from(&b"1\xffm"[..]).unwrap(),
        );
        assert!(call_context(Some(&team()), None, &metadata, &server).is_err());
    }

    #[test]
    fn depths_count_every_level_of_objects_and_arrays() {
        let json: serde_json::Value = serde_json::json!({"a": [1, {"b": []}], "c": 2});
        assert_eq!(json_depth(&json), 4);
        assert_eq!(json_depth(&serde_json::json!(7)), 0);
        let back = crate::api::convert::json_to_struct(json.as_object().unwrap().clone());
        assert_eq!(struct_depth(&back), 4);
        assert_eq!(struct_depth(&prost_types::Struct::default()), 1);
        // Deep input is walked without recursion.
        let mut deep = serde_json::json!(1);
        for _ in 0..1_000 {
            deep = serde_json::json!([deep]);
        }
        assert_eq!(json_depth(&deep), 1_000);
    }

    #[test]
    fn the_input_limit_names_the_largest_field() {
        let server = ServerConfig {
            max_input_bytes: 100,
            ..Default::default()
        };
        assert!(check_input(100, &[("message", 90)], &server).is_ok());
        let Err(Failure::Invalid(v)) =
            check_input(120, &[("message", 10), ("history", 100)], &server)
        else {
            panic!("not refused")
        };
        assert_eq!(v[0].0, "history");
        assert!(v[0].1.contains("120 bytes"), "{}", v[0].1);
        assert!(check_history(101, &ServerConfig::default()).is_err());
        assert!(check_history(100, &ServerConfig::default()).is_ok());
    }

    #[test]
    fn json_bytes_is_the_length_of_the_compact_text() {
        let value = serde_json::json!({"a": [1, "é", null], "b": {"c": true}});
        assert_eq!(json_bytes(&value), value.to_string().len());
        assert_eq!(json_bytes(&serde_json::json!({})), 2);
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("team-1", true).is_ok());
        assert!(check_id("", true).is_err());
        assert!(check_id("", false).is_ok());
        assert!(check_id("a b", true).is_err());
        assert!(check_id(&"a".repeat(129), true).is_err());
    }
}
