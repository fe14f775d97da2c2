//! The policy gate (SPEC §9.3): a pure function of who asks, for which team,
//! and the tool, so every reason is a unit test.

use super::{Denial, Tool};
use crate::{config::ApprovalsConfig, domain::Role};

/// Who asks, with its role's capabilities, and for which team.
#[derive(Debug, Clone)]
pub struct Caller<'a> {
    pub role: Role,
    /// Its role's capabilities (`tool:crm.*`).
    pub capabilities: &'a [String],
    /// The team metered: the authenticated principal's, never one from the input.
    pub team: &'a str,
    pub may_act_for_team: bool,
}

/// Whether `pattern` grants `capability`: equal, a prefix ending in `*`, or `*`.
pub fn grants(pattern: &str, capability: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => capability.starts_with(prefix),
        None => pattern == capability,
    }
}

/// Allows or denies `caller` running `tool`, in the documented order:
/// disabled, capability, side effects for a viewer, tenant.
pub fn gate(caller: &Caller<'_>, tool: &Tool) -> Result<(), Denial> {
    if !tool.enabled {
        return Err(Denial::Disabled(tool.disabled_reason.clone()));
    }
    if !caller
        .capabilities
        .iter()
        .any(|p| grants(p, &tool.capability))
    {
        return Err(Denial::CapabilityMissing(tool.capability.clone()));
    }
    if caller.role == Role::Viewer && tool.side_effects {
        return Err(Denial::SideEffectsForbidden);
    }
    if tool.tenant_scoped && (caller.team.is_empty() || !caller.may_act_for_team) {
        return Err(Denial::TenantRequired);
    }
    Ok(())
}

/// Whether a call of `tool` waits for a person (SPEC §14.1): its own
/// `approval = "always"`, or `[approvals] side_effects` over a tool that has them.
pub fn needs_approval(tool: &Tool, approvals: &ApprovalsConfig) -> bool {
    tool.approval || (approvals.side_effects && tool.side_effects)
}

/// The capability that decides, and auto-approves, calls of the tool `name`.
pub fn approve_capability(name: &str) -> String {
    format!("approve:{name}")
}

/// Whether `capabilities` include `approve:<name>` (or `approve:*`, or `*`).
pub fn may_approve(capabilities: &[String], name: &str) -> bool {
    let wanted = approve_capability(name);
    capabilities.iter().any(|p| grants(p, &wanted))
}

/// Whether `caller` may see `tool` in a listing: only what the gate allows.
pub fn visible(caller: &Caller<'_>, tool: &Tool) -> bool {
    gate(caller, tool).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, tools::Registry};
    use std::sync::Arc;

    fn tool(side_effects: bool, tenant_scoped: bool, enabled: bool) -> Arc<Tool> {
        let toml = format!(
            r#"
[tools."crm.add_note"]
kind = "http"
url = "https://n8n.example.com/webhook/x"
side_effects = {side_effects}
tenant_scoped = {tenant_scoped}
enabled = {enabled}
"#
        );
        let config = Config::from_toml_str(&toml, |_| None).unwrap();
        Registry::from_config(&config)
            .unwrap()
            .lookup("crm.add_note")
            .unwrap()
    }

    fn caller<'a>(role: Role, caps: &'a [String], team: &'a str, may: bool) -> Caller<'a> {
        Caller {
            role,
            capabilities: caps,
            team,
            may_act_for_team: may,
        }
    }

    #[test]
    fn wildcards_grant_by_prefix() {
        assert!(grants("tool:*", "tool:crm.add_note"));
        assert!(grants("tool:crm.*", "tool:crm.add_note"));
        assert!(grants("*", "tool:x"));
        assert!(grants("tool:crm.add_note", "tool:crm.add_note"));
        assert!(!grants("tool:crm.add_note", "tool:crm.add_notes"));
        assert!(!grants("tool:sms.*", "tool:crm.add_note"));
        assert!(!grants("tool:crm", "tool:crm.add_note"));
    }

    #[test]
    fn approval_follows_the_tool_or_side_effects_and_approve_capabilities_grant_by_prefix() {
        let sends = tool(true, true, true);
        let off = ApprovalsConfig::default();
        let on = ApprovalsConfig {
            side_effects: true,
            ..ApprovalsConfig::default()
        };
        assert!(!needs_approval(&sends, &off));
        assert!(needs_approval(&sends, &on));
        assert!(!needs_approval(&tool(false, true, true), &on));
        let caps = |c: &[&str]| c.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(may_approve(
            &caps(&["approve:crm.add_note"]),
            "crm.add_note"
        ));
        assert!(may_approve(&caps(&["approve:*"]), "crm.add_note"));
        assert!(may_approve(&caps(&["approve:crm.*"]), "crm.add_note"));
        assert!(!may_approve(
            &caps(&["approve:sms.*", "tool:*"]),
            "crm.add_note"
        ));
    }

    #[test]
    fn every_reason_of_the_gate() {
        let all = vec!["tool:*".to_owned()];
        let none: Vec<String> = Vec::new();
        let ok = tool(true, true, true);
        assert_eq!(gate(&caller(Role::Caller, &all, "t1", true), &ok), Ok(()));
        assert_eq!(
            gate(
                &caller(Role::Caller, &all, "t1", true),
                &tool(true, true, false)
            ),
            Err(Denial::Disabled(String::new()))
        );
        assert_eq!(
            gate(&caller(Role::Caller, &none, "t1", true), &ok),
            Err(Denial::CapabilityMissing("tool:crm.add_note".into()))
        );
        // A viewer never runs a side-effect tool, whatever its capabilities.
        assert_eq!(
            gate(&caller(Role::Viewer, &all, "t1", true), &ok),
            Err(Denial::SideEffectsForbidden)
        );
        assert_eq!(
            gate(
                &caller(Role::Viewer, &all, "t1", true),
                &tool(false, true, true)
            ),
            Ok(())
        );
        // The tenant comes from the principal: none, or one it may not act for.
        assert_eq!(
            gate(&caller(Role::Admin, &all, "", true), &ok),
            Err(Denial::TenantRequired)
        );
        assert_eq!(
            gate(&caller(Role::Admin, &all, "t2", false), &ok),
            Err(Denial::TenantRequired)
        );
        assert_eq!(
            gate(
                &caller(Role::Admin, &all, "", false),
                &tool(true, false, true)
            ),
            Ok(())
        );
        for (denial, reason) in [
            (Denial::NotFound(String::new()), "TOOL_NOT_FOUND"),
            (Denial::Disabled(String::new()), "TOOL_DISABLED"),
            (
                Denial::CapabilityMissing(String::new()),
                "CAPABILITY_MISSING",
            ),
            (Denial::SideEffectsForbidden, "SIDE_EFFECTS_FORBIDDEN"),
            (Denial::TenantRequired, "TENANT_REQUIRED"),
            (Denial::InputInvalid(Vec::new()), "TOOL_INPUT_INVALID"),
            (
                Denial::Quota {
                    limit: "max_per_hour",
                    max: 1,
                },
                "QUOTA_EXCEEDED",
            ),
        ] {
            assert_eq!(denial.reason(), reason);
        }
    }
}
