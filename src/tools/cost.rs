//! A tool invocation's cost from its cost model (`fixed_usd`, `per_unit` of
//! an input field, or per second): estimated and reserved before it runs,
//! computed and charged after.

use crate::config::tools::{CostConfig, CostUnit};
use serde_json::Value;
use std::time::Duration;

/// USD → micro-USD, rounded up; non-finite or negative (never configured) is 0.
fn micros_ceil(usd: f64) -> i64 {
    if !(usd.is_finite() && usd > 0.0) {
        return 0;
    }
    let micros = usd * 1e6;
    // Sums of decimal prices land a hair above a whole micro-dollar
    // (0.0001 + 3 × 0.00001 = 0.00013000000000000002): that is the whole one.
    let whole = micros.round();
    let micros = if (micros - whole).abs() < 1e-6 {
        whole
    } else {
        micros.ceil()
    };
    micros.min(i64::MAX as f64) as i64
}

/// Units of `field` of `input`: text tokens (~4 chars) or characters, array entries.
fn units(unit: CostUnit, field: Option<&str>, input: &Value) -> f64 {
    let Some(value) = field.and_then(|f| input.get(f)) else {
        return 0.0;
    };
    match (unit, value) {
        (CostUnit::Character, Value::String(s)) => s.chars().count() as f64,
        (CostUnit::Token, Value::String(s)) => (s.chars().count() as f64 / 4.0).ceil(),
        (CostUnit::Record, Value::Array(items)) => items.len() as f64,
        _ => 0.0,
    }
}

/// Cost of a run with `input` that took `took`, micro-USD, rounded up.
pub fn micros(cost: &CostConfig, input: &Value, took: Duration) -> i64 {
    let per = cost.per_unit.as_ref().map_or(0.0, |p| {
        let n = match p.unit {
            CostUnit::Second => took.as_secs_f64(),
            unit => units(unit, p.input_field.as_deref(), input),
        };
        n * p.usd
    });
    micros_ceil(cost.fixed_usd + per)
}

/// The estimate reserved before running: the cost had it run its whole timeout.
pub fn estimate(cost: &CostConfig, input: &Value, timeout: Duration) -> i64 {
    micros(cost, input, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tools::PerUnitCost;
    use serde_json::json;

    #[test]
    fn fixed_and_per_unit_costs() {
        let fixed = CostConfig {
            fixed_usd: 0.001,
            ..CostConfig::default()
        };
        assert_eq!(micros(&fixed, &json!({}), Duration::ZERO), 1_000);
        let per = |unit, field: Option<&str>| CostConfig {
            fixed_usd: 0.0001,
            per_unit: Some(PerUnitCost {
                unit,
                usd: 0.00001,
                input_field: field.map(str::to_owned),
            }),
            ..CostConfig::default()
        };
        let input = json!({"text": "abcdefgh", "rows": [1, 2, 3]});
        assert_eq!(
            micros(
                &per(CostUnit::Character, Some("text")),
                &input,
                Duration::ZERO
            ),
            180
        );
        assert_eq!(
            micros(&per(CostUnit::Token, Some("text")), &input, Duration::ZERO),
            120
        );
        assert_eq!(
            micros(&per(CostUnit::Record, Some("rows")), &input, Duration::ZERO),
            130
        );
        assert_eq!(
            micros(
                &per(CostUnit::Record, Some("missing")),
                &input,
                Duration::ZERO
            ),
            100
        );
        let seconds = per(CostUnit::Second, None);
        assert_eq!(micros(&seconds, &input, Duration::from_millis(2500)), 125);
        assert_eq!(estimate(&seconds, &input, Duration::from_secs(30)), 400);
    }
}
