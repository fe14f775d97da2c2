//! `[audit]`: what the audit log records beyond decisions (SPEC §14.3).
//! Tool, workflow, agent-turn, prompt and admin events are always written;
//! this section only chooses whether every model call leaves one too.

use serde::Deserialize;

/// `[audit]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Every model call leaves `call.completed` or `call.failed`, in the
    /// group commit of its usage record (off only to measure what it costs).
    pub calls: bool,
}

impl Default for AuditConfig {
    fn default() -> Self {
        // Seed 000 §7.4: the audit trail covers every call unless turned off.
        Self { calls: true }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use crate::config::Config;

    #[test]
    fn calls_are_audited_unless_turned_off_and_unknown_keys_are_refused() {
        let default = Config::from_toml_str("", |_| None).unwrap();
        assert!(default.audit.calls);
        let off = Config::from_toml_str("[audit]\ncalls = false\n", |_| None).unwrap();
        assert!(!off.audit.calls);
        let err = Config::from_toml_str("[audit]\ncall = false\n", |_| None).unwrap_err();
        assert!(
            err.paths().iter().any(|p| p.starts_with("audit")),
            "{:?}",
            err.paths()
        );
    }
}
