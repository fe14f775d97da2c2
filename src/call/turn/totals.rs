//! A turn's running totals: meta summed, and what is left of the budget.

use super::super::CallMeta;

/// The turn's running totals.
pub(super) struct Totals {
    pub meta: CallMeta,
    /// Every model call and tool had a price.
    pub cost_known: bool,
    pub spent_usd: f64,
}

impl Totals {
    pub fn new() -> Self {
        Self {
            meta: CallMeta::default(),
            cost_known: true,
            spent_usd: 0.0,
        }
    }

    /// Adds one finished call: a model call (`model`) or an iteration's tools.
    pub fn add(&mut self, meta: &CallMeta, model: bool) {
        self.meta.attempts.extend(meta.attempts.iter().cloned());
        self.meta.usage = self.meta.usage.saturating_add(meta.usage);
        match meta.cost_usd {
            Some(usd) => self.spent_usd += usd,
            None => self.cost_known = false,
        }
        if model && !meta.provider.is_empty() {
            self.meta.provider.clone_from(&meta.provider);
            self.meta.model.clone_from(&meta.model);
            self.meta.degraded |= meta.degraded;
        }
    }

    /// What is left of `budget_usd` for the next call: `Some(None)` without
    /// a budget, `None` when it is spent.
    pub fn budget_left(&self, budget_usd: Option<f64>) -> Option<Option<f64>> {
        match budget_usd.filter(|b| *b > 0.0) {
            None => Some(None),
            Some(budget) => {
                let left = budget - self.spent_usd;
                (left > 0.0).then_some(Some(left))
            }
        }
    }
}
