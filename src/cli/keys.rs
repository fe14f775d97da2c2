//! `keys`: API keys stored in the database (their SHA-256 only).

use crate::{config::Config, store::Store};
use anyhow::Context;
use clap::Subcommand;
use std::fmt::Write as _;

/// `keys` sub-commands.
#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Create a key and print it once (only its SHA-256 is stored).
    Create {
        /// Unique name of the key's holder (shown in logs and the audit trail).
        #[arg(long)]
        name: String,
        /// Teams it may act for, comma-separated, or `*` for all.
        #[arg(long)]
        teams: String,
        /// `caller` or `admin`.
        #[arg(long, default_value = "caller")]
        role: String,
    },
    /// List keys (names, scopes, roles; never the keys).
    List,
    /// Revoke a key by name.
    Revoke {
        /// The key's name.
        #[arg(long)]
        name: String,
    },
}

/// Runs a `keys` sub-command against the configured database.
pub async fn keys(config: &Config, action: KeysAction) -> anyhow::Result<String> {
    use crate::auth::{
        Role, TeamScope,
        keys::{self, KeyRecord, KeyStore},
    };
    let store = Store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating")?;
    let key_store = KeyStore::new(store.clone());
    let now = chrono::Utc::now().timestamp_millis();
    let out = match action {
        KeysAction::Create { name, teams, role } => {
            let role = Role::parse(&role)
                .ok_or_else(|| anyhow::anyhow!("--role must be viewer, caller or admin"))?;
            crate::api::request::check_id(&name, true)
                .map_err(|why| anyhow::anyhow!("--name {why}"))?;
            // The IDs a request's context.team_id may hold, or `*`.
            for team in teams
                .split(',')
                .map(str::trim)
                .filter(|t| *t != "*" && !t.is_empty())
            {
                crate::api::request::check_id(team, true)
                    .map_err(|why| anyhow::anyhow!("--teams: `{team}` {why}"))?;
            }
            let scope = TeamScope::from_list(teams.split(','));
            if scope == TeamScope::Only(Default::default()) {
                anyhow::bail!("--teams needs at least one team ID, or * for all");
            }
            let key = keys::generate();
            key_store
                .insert(&KeyRecord {
                    name: name.clone(),
                    key_sha256: keys::hash_hex(&key),
                    teams: scope.to_list_string(),
                    role: role.as_str().into(),
                    created_at_ms: now,
                    revoked_at_ms: None,
                })
                .await
                .with_context(|| format!("creating key `{name}` (does the name exist?)"))?;
            let change =
                serde_json::json!({"role": role.as_str(), "teams": scope.to_list_string()});
            super::audit_admin(&store, "", "key.created", &name, &change).await?;
            format!(
                "created key `{name}` (role {}, teams {})\n{key}\n\nStore it now: it is not shown again.\n",
                role.as_str(),
                scope.to_list_string()
            )
        }
        KeysAction::List => {
            let mut out = String::new();
            for k in key_store.list().await? {
                let _ = writeln!(
                    out,
                    "{:<20} role={:<6} teams={:<20} sha256={}… {}",
                    k.name,
                    k.role,
                    k.teams,
                    k.key_sha256.get(..12).unwrap_or_default(),
                    if k.revoked_at_ms.is_some() {
                        "REVOKED"
                    } else {
                        ""
                    }
                );
            }
            if out.is_empty() {
                "no stored keys\n".into()
            } else {
                out
            }
        }
        KeysAction::Revoke { name } => {
            if key_store.revoke(&name, now).await? {
                super::audit_admin(&store, "", "key.revoked", &name, &serde_json::json!({}))
                    .await?;
                format!("revoked `{name}`\n")
            } else {
                anyhow::bail!("no valid key named `{name}`")
            }
        }
    };
    store.close().await;
    Ok(out)
}
