//! `limits`: a team's monthly caps (overrides of
//! `metering.default_limits`) and this month's balance.

use crate::{config::Config, store::Store};
use anyhow::Context;
use clap::Subcommand;

/// `limits` sub-commands.
#[derive(Debug, Subcommand)]
pub enum LimitsAction {
    /// Print the caps in force for a team and this month's balance.
    Show {
        /// Team.
        #[arg(long)]
        team: String,
    },
    /// Override a team's caps; an omitted cap is unlimited for that team.
    Set {
        /// Team.
        #[arg(long)]
        team: String,
        /// Tokens per month.
        #[arg(long)]
        max_tokens: Option<u64>,
        /// Requests per month.
        #[arg(long)]
        max_requests: Option<u64>,
        /// US dollars per month.
        #[arg(long)]
        max_cost_usd: Option<f64>,
    },
    /// Remove a team's override (the config defaults apply again).
    Clear {
        /// Team.
        #[arg(long)]
        team: String,
    },
}

/// Runs a `limits` sub-command against the configured database.
pub async fn limits(config: &Config, action: LimitsAction) -> anyhow::Result<String> {
    use crate::usage::{
        ledger,
        policy::{Balance, Caps},
        pricing::{micros_floor, usd},
        summary::month_of,
    };
    let store = Store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating")?;
    let defaults =
        crate::usage::Meter::new(None, Default::default(), &config.metering).default_caps();
    let now = chrono::Utc::now();
    let show = |team: &str, caps: Caps, b: Balance| {
        let fmt = |v: Option<i64>| v.map_or("unlimited".to_owned(), |v| v.to_string());
        format!(
            "team {team}\n  max_tokens   {}  (used {} + reserved {})\n  max_requests {}  (used {} + reserved {})\n  max_cost_usd {}  (used {:.6} + reserved {:.6})\n",
            fmt(caps.tokens),
            b.spent_tokens,
            b.reserved_tokens,
            fmt(caps.requests),
            b.spent_requests,
            b.reserved_requests,
            caps.cost_micros
                .map_or("unlimited".to_owned(), |c| format!("{:.6}", usd(c))),
            usd(b.spent_cost_micros),
            usd(b.reserved_cost_micros),
        )
    };
    let out = match action {
        LimitsAction::Show { team } => {
            let caps = ledger::caps_of(&store, &team, defaults).await?;
            let balance = ledger::balance_of(&store, &team, month_of(now).0).await?;
            show(&team, caps, balance)
        }
        LimitsAction::Set {
            team,
            max_tokens,
            max_requests,
            max_cost_usd,
        } => {
            if let Some(c) = max_cost_usd.filter(|c| !c.is_finite() || *c < 0.0) {
                anyhow::bail!("--max-cost-usd must be a non-negative number, got {c}");
            }
            let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            let caps = Caps {
                tokens: max_tokens.map(to_i64),
                requests: max_requests.map(to_i64),
                cost_micros: max_cost_usd.map(micros_floor),
            };
            ledger::set_caps(&store, &team, caps, now.timestamp_millis()).await?;
            let balance = ledger::balance_of(&store, &team, month_of(now).0).await?;
            format!("updated\n{}", show(&team, caps, balance))
        }
        LimitsAction::Clear { team } => {
            let removed = ledger::clear_caps(&store, &team).await?;
            if removed {
                format!("team {team}: override removed, config defaults apply\n")
            } else {
                format!("team {team} had no override\n")
            }
        }
    };
    store.close().await;
    Ok(out)
}
