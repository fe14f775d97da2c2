//! `prompts`: versioned prompts per team or global, audited.

use crate::{config::Config, store::Store};
use anyhow::Context;
use clap::Subcommand;
use std::fmt::Write as _;

/// `prompts` sub-commands.
#[derive(Debug, Subcommand)]
pub enum PromptsAction {
    /// List stored versions with their stats.
    List {
        /// Team ('' = global versions; omit for every team).
        #[arg(long)]
        team: Option<String>,
        /// Prompt key.
        #[arg(long)]
        key: Option<String>,
    },
    /// Add the next version of a prompt.
    Add {
        /// Team ('' or omitted = the global default).
        #[arg(long, default_value = "")]
        team: String,
        /// Prompt key (task name).
        #[arg(long)]
        key: String,
        /// System prompt text, or @path to read it from a file.
        #[arg(long, default_value = "")]
        system: String,
        /// User template text with {{variables}}, or @path.
        #[arg(long)]
        template: String,
        /// Model override for the primary target.
        #[arg(long)]
        model: Option<String>,
        /// Temperature override.
        #[arg(long)]
        temperature: Option<f32>,
        /// Output token cap override.
        #[arg(long)]
        max_tokens: Option<u32>,
        /// Activate it at once.
        #[arg(long)]
        activate: bool,
    },
    /// Make a stored version the active one.
    Activate {
        /// Team ('' = global).
        #[arg(long, default_value = "")]
        team: String,
        /// Prompt key.
        #[arg(long)]
        key: String,
        /// Version.
        #[arg(long)]
        version: u32,
    },
}

fn text_or_file(value: String) -> anyhow::Result<String> {
    match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}")),
        None => Ok(value),
    }
}

/// Runs a `prompts` sub-command against the configured database.
pub async fn prompts(
    config: &Config,
    action: PromptsAction,
    actor: &str,
) -> anyhow::Result<String> {
    use crate::prompts::store::NewPrompt;
    let store = Store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating")?;
    let prompts = crate::server::prompt_store(store.clone(), config);
    let now = chrono::Utc::now().timestamp_millis();
    let out = match action {
        PromptsAction::List { team, key } => {
            let mut out = String::new();
            for p in prompts.list(team.as_deref(), key.as_deref()).await? {
                let _ = writeln!(
                    out,
                    "{:<12} {:<16} v{:<3} {:<6} uses={:<6} avg_latency={:.0}ms success={:.2} by={}",
                    if p.team_id.is_empty() {
                        "(global)"
                    } else {
                        p.team_id.as_str()
                    },
                    p.prompt.key,
                    p.prompt.version,
                    if p.is_active { "ACTIVE" } else { "" },
                    p.usage_count,
                    p.avg_latency_ms,
                    p.success_rate,
                    p.created_by,
                );
            }
            if out.is_empty() {
                "no stored prompts (built-in defaults in use)\n".into()
            } else {
                out
            }
        }
        PromptsAction::Add {
            team,
            key,
            system,
            template,
            model,
            temperature,
            max_tokens,
            activate,
        } => {
            let new = NewPrompt {
                team_id: team.clone(),
                key: key.clone(),
                system: text_or_file(system)?,
                user_template: text_or_file(template)?,
                model,
                temperature,
                max_tokens,
                activate,
            };
            let version = prompts.add(new, actor, now).await?;
            format!(
                "added {key} v{version} for {}{}\n",
                if team.is_empty() { "(global)" } else { &team },
                if activate { " (active)" } else { "" }
            )
        }
        PromptsAction::Activate { team, key, version } => {
            prompts.activate(&team, &key, version, actor, now).await?;
            format!(
                "activated {key} v{version} for {}\n",
                if team.is_empty() { "(global)" } else { &team }
            )
        }
    };
    store.close().await;
    Ok(out)
}
