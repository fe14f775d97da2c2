//! `[auth]`: who may call, for which teams, with which capabilities.

use super::{RoleConfig, tools};
use crate::domain::Role;
use serde::Deserialize;
use std::{collections::BTreeMap, time::Duration};

/// `[auth]`: API keys mapped to teams and roles.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Require a key on every RPC except health checks and reflection.
    pub enabled: bool,
    /// Keys given by hash here; others live in the `api_keys` table (`ai-orchestrator keys`).
    pub keys: Vec<ApiKeyConfig>,
    /// How often database keys are reloaded: creation and revocation apply within this.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    /// Capabilities per role; an unlisted role keeps its default ([`tools::default_roles`]).
    pub roles: BTreeMap<String, RoleConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            keys: Vec::new(),
            refresh_interval: Duration::from_secs(10),
            roles: BTreeMap::new(),
        }
    }
}

impl AuthConfig {
    /// The capabilities of `role`: configured, else its default.
    pub fn capabilities(&self, role: &str) -> Vec<String> {
        match self.roles.get(role) {
            Some(r) => r.capabilities.clone(),
            None => tools::default_roles()
                .remove(role)
                .map(|r| r.capabilities)
                .unwrap_or_default(),
        }
    }
}

/// One `[[auth.keys]]` entry. The key itself never appears in the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Who holds the key (audit trail, logs).
    pub name: String,
    /// Lowercase hex SHA-256 of the key (`printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    /// Teams the key may act for; `["*"]` for all (trusted internal services).
    pub teams: Vec<String>,
    /// `caller` (default) or `admin` (prompt administration too).
    #[serde(default = "default_role")]
    pub role: Role,
}

fn default_role() -> Role {
    Role::Caller
}
