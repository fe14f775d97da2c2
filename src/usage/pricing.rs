//! Cost of a call from the pricing table. USD per 1M tokens is micro-USD per
//! token, so costs are integer micro-USD: sums and cap checks are exact.

use crate::config::PriceConfig;
use std::collections::{BTreeMap, HashMap};

/// Price of one model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Price {
    /// Micro-USD per input and per output token (= USD per 1M tokens).
    PerToken {
        /// Input.
        input: f64,
        /// Output.
        output: f64,
    },
    /// Explicitly unknown: cost recorded as null.
    Unknown,
}

/// The pricing table.
#[derive(Debug, Clone, Default)]
pub struct Pricing {
    by_key: HashMap<String, Price>,
}

impl Pricing {
    /// Builds the table from validated config.
    pub fn from_config(config: &BTreeMap<String, PriceConfig>) -> Self {
        let by_key = config
            .iter()
            .map(|(key, p)| {
                let price = match (p.input_per_mtok, p.output_per_mtok) {
                    (Some(input), Some(output)) if p.price.is_none() => {
                        Price::PerToken { input, output }
                    }
                    _ => Price::Unknown,
                };
                (key.clone(), price)
            })
            .collect();
        Self { by_key }
    }

    /// The price of `model` at `provider`: `provider/model` first, then `model`.
    pub fn price(&self, provider: &str, model: &str) -> Price {
        self.by_key
            .get(&format!("{provider}/{model}"))
            .or_else(|| self.by_key.get(model))
            .copied()
            .unwrap_or(Price::Unknown)
    }

    /// Cost in micro-USD of the given tokens, rounded up; `None` when unpriced.
    pub fn cost_micros(
        &self,
        provider: &str,
        model: &str,
        input_tokens: u64,
        output_tokens: u64,
    ) -> Option<i64> {
        match self.price(provider, model) {
            Price::PerToken { input, output } => {
                let micros = input_tokens as f64 * input + output_tokens as f64 * output;
                // `as` saturates (NaN is 0): a cost never wraps or goes negative.
                Some(micros.ceil().max(0.0) as i64)
            }
            Price::Unknown => None,
        }
    }
}

/// Micro-USD → USD.
pub fn usd(micros: i64) -> f64 {
    micros as f64 / 1e6
}

/// Micro-USD as exact decimal USD: `126000` → `0.126`, `-1500000` → `-1.5`.
pub fn usd_text(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let abs = micros.unsigned_abs();
    let fraction = format!("{:06}", abs % 1_000_000);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        format!("{sign}{}", abs / 1_000_000)
    } else {
        format!("{sign}{}.{fraction}", abs / 1_000_000)
    }
}

/// USD → micro-USD, rounded down (caps: never admit more than configured).
pub fn micros_floor(usd: f64) -> i64 {
    (usd * 1e6).floor() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usd_text_is_exact_and_short() {
        assert_eq!(usd_text(126_000), "0.126");
        assert_eq!(usd_text(5), "0.000005");
        assert_eq!(usd_text(0), "0");
        assert_eq!(usd_text(2_000_000), "2");
        assert_eq!(usd_text(-1_500_000), "-1.5");
        assert_eq!(usd_text(i64::MIN), "-9223372036854.775808");
    }

    fn table() -> Pricing {
        let mut cfg = BTreeMap::new();
        cfg.insert(
            "gpt-4o-mini".to_owned(),
            PriceConfig {
                input_per_mtok: Some(0.15),
                output_per_mtok: Some(0.60),
                price: None,
            },
        );
        cfg.insert(
            "azure/gpt-4o-mini".to_owned(),
            PriceConfig {
                input_per_mtok: Some(0.30),
                output_per_mtok: Some(1.20),
                price: None,
            },
        );
        cfg.insert(
            "local-llama".to_owned(),
            PriceConfig {
                input_per_mtok: None,
                output_per_mtok: None,
                price: Some("unknown".into()),
            },
        );
        Pricing::from_config(&cfg)
    }

    #[test]
    fn costs_are_exact_micro_usd_rounded_up() {
        let p = table();
        // 1000 * 0.15 + 500 * 0.60 = 450 micro-USD.
        assert_eq!(p.cost_micros("openai", "gpt-4o-mini", 1000, 500), Some(450));
        // Provider-qualified prices win.
        assert_eq!(p.cost_micros("azure", "gpt-4o-mini", 1000, 500), Some(900));
        // 1 token at 0.15 micro-USD rounds up to 1.
        assert_eq!(p.cost_micros("openai", "gpt-4o-mini", 1, 0), Some(1));
        assert_eq!(p.cost_micros("ollama", "local-llama", 10, 10), None);
        assert_eq!(usd(450), 0.00045);
        assert_eq!(micros_floor(1.5), 1_500_000);
    }
}
