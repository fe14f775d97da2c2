//! What the ledger counts: tokens, requests and cost, as one value. Sums
//! saturate and nothing goes below zero, so no provider's numbers or bug can
//! turn a team's month negative (as the CHECK constraints, docs/metering.md).

use std::ops::{Add, AddAssign, Sub, SubAssign};

/// Tokens (input + output), requests and cost in micro-USD.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Amount {
    /// Input plus output tokens.
    pub tokens: i64,
    /// Requests.
    pub requests: i64,
    /// Cost, micro-USD.
    pub cost_micros: i64,
}

impl Amount {
    /// Nothing.
    pub const ZERO: Amount = Amount {
        tokens: 0,
        requests: 0,
        cost_micros: 0,
    };

    /// An amount, each part clamped at zero.
    pub fn new(tokens: i64, requests: i64, cost_micros: i64) -> Self {
        Amount {
            tokens: tokens.max(0),
            requests: requests.max(0),
            cost_micros: cost_micros.max(0),
        }
    }

    /// The three parts with their cap, in the order refusals check them.
    pub fn parts(self) -> [i64; 3] {
        [self.requests, self.tokens, self.cost_micros]
    }
}

impl Add for Amount {
    type Output = Amount;

    fn add(self, other: Amount) -> Amount {
        Amount {
            tokens: self.tokens.saturating_add(other.tokens),
            requests: self.requests.saturating_add(other.requests),
            cost_micros: self.cost_micros.saturating_add(other.cost_micros),
        }
    }
}

impl AddAssign for Amount {
    fn add_assign(&mut self, other: Amount) {
        *self = *self + other;
    }
}

impl Sub for Amount {
    type Output = Amount;

    fn sub(self, other: Amount) -> Amount {
        Amount {
            tokens: self.tokens.saturating_sub(other.tokens).max(0),
            requests: self.requests.saturating_sub(other.requests).max(0),
            cost_micros: self.cost_micros.saturating_sub(other.cost_micros).max(0),
        }
    }
}

impl SubAssign for Amount {
    fn sub_assign(&mut self, other: Amount) {
        *self = *self - other;
    }
}

impl std::iter::Sum for Amount {
    fn sum<I: Iterator<Item = Amount>>(iter: I) -> Amount {
        iter.fold(Amount::ZERO, Add::add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_saturate_and_nothing_goes_negative() {
        let big = Amount::new(i64::MAX, i64::MAX, i64::MAX);
        assert_eq!(big + Amount::new(1, 1, 1), big);
        assert_eq!(
            Amount::new(1, 1, 1) - Amount::new(5, 0, 2),
            Amount::new(0, 1, 0)
        );
        assert_eq!(Amount::new(-3, 2, -1), Amount::new(0, 2, 0));
        let total: Amount = [Amount::new(1, 2, 3), Amount::new(4, 5, 6)]
            .into_iter()
            .sum();
        assert_eq!(total, Amount::new(5, 7, 9));
        assert_eq!(total.parts(), [7, 5, 9]);
    }
}
