//! `audit verify`: each team's hash chain checked; the first broken event named, exit non-zero.

use crate::{audit::store, config::Config, store::Store};
use anyhow::Context;
use clap::Subcommand;
use std::fmt::Write;

/// `audit` sub-commands.
#[derive(Debug, Subcommand)]
pub enum AuditAction {
    /// Verifies a team's chain, or every team's.
    Verify {
        /// Only this team.
        #[arg(long)]
        team: Option<String>,
    },
}

/// Runs an `audit` sub-command against the configured database.
pub async fn audit(config: &Config, action: AuditAction) -> anyhow::Result<String> {
    let AuditAction::Verify { team } = action;
    let store = Store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating")?;
    let teams = match team {
        Some(t) => vec![t],
        None => store::teams(&store).await?,
    };
    let mut out = String::new();
    let mut broken = Vec::new();
    for team in &teams {
        let v = store::verify(&store, team).await?;
        if v.ok {
            let _ = writeln!(out, "team {team}: ok, {} events", v.events_checked);
        } else {
            let _ = writeln!(
                out,
                "team {team}: BROKEN at seq {} ({}{}), {} events checked",
                v.first_broken_seq,
                v.reason,
                if v.first_broken_event_id.is_empty() {
                    String::new()
                } else {
                    format!(", event {}", v.first_broken_event_id)
                },
                v.events_checked
            );
            broken.push(team.clone());
        }
    }
    store.close().await;
    if teams.is_empty() {
        out.push_str("no audit events yet\n");
    }
    if broken.is_empty() {
        Ok(out)
    } else {
        anyhow::bail!("{out}audit chain broken for: {}", broken.join(", "))
    }
}
