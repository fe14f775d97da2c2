//! `[approvals]`: which tool calls wait for a person (SPEC §14.1), who may
//! decide them, and how long a request stays open.

use serde::Deserialize;
use std::time::Duration;

/// `[approvals]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalsConfig {
    /// Every `side_effects` tool is `approval = "always"`.
    pub side_effects: bool,
    /// The principal that asked may not decide its own request.
    pub four_eyes: bool,
    /// A request still open this long ends `EXPIRED` (its invocation `REJECTED`).
    #[serde(with = "humantime_serde")]
    pub approval_timeout: Duration,
    /// How often each replica looks for expired requests.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        Self {
            side_effects: false,
            four_eyes: false,
            approval_timeout: Duration::from_secs(24 * 3600),
            sweep_interval: Duration::from_secs(10),
        }
    }
}

/// A tool's `approval` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalSetting {
    /// Runs without asking (unless `[approvals] side_effects` covers it).
    #[default]
    Never,
    /// Every call waits for a decision, unless its caller holds `approve:<tool>`.
    Always,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use crate::config::Config;
    use std::time::Duration;

    #[test]
    fn defaults_hold_a_day_and_unknown_keys_are_refused() {
        let default = Config::from_toml_str("", |_| None).unwrap();
        assert!(!default.approvals.side_effects && !default.approvals.four_eyes);
        assert_eq!(
            default.approvals.approval_timeout,
            Duration::from_secs(86_400)
        );
        let set = Config::from_toml_str(
            "[approvals]\nside_effects = true\nfour_eyes = true\napproval_timeout = \"2h\"\n",
            |_| None,
        )
        .unwrap();
        assert!(set.approvals.side_effects && set.approvals.four_eyes);
        assert_eq!(set.approvals.approval_timeout, Duration::from_secs(7200));
        let err = Config::from_toml_str("[approvals]\ntimeout = \"2h\"\n", |_| None).unwrap_err();
        assert!(
            err.paths().iter().any(|p| p.starts_with("approvals")),
            "{:?}",
            err.paths()
        );
    }
}
