//! `limits`: a team's monthly caps (overrides of `metering.default_limits`) and balance.

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
    /// Override some of a team's caps. A cap not given keeps the value in
    /// force (the team's override, else the config default); `unlimited`
    /// lifts a cap.
    Set {
        /// Team.
        #[arg(long)]
        team: String,
        /// Tokens per month, or `unlimited`.
        #[arg(long, value_parser = parse_cap::<u64>)]
        max_tokens: Option<Cap<u64>>,
        /// Requests per month, or `unlimited`.
        #[arg(long, value_parser = parse_cap::<u64>)]
        max_requests: Option<Cap<u64>>,
        /// US dollars per month, or `unlimited`.
        #[arg(long, value_parser = parse_cap::<f64>)]
        max_cost_usd: Option<Cap<f64>>,
    },
    /// Remove a team's override (the config defaults apply again).
    Clear {
        /// Team.
        #[arg(long)]
        team: String,
    },
}

/// A cap given on the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cap<T> {
    At(T),
    Unlimited,
}

fn parse_cap<T: std::str::FromStr>(s: &str) -> Result<Cap<T>, String>
where
    T::Err: std::fmt::Display,
{
    if s.eq_ignore_ascii_case("unlimited") {
        return Ok(Cap::Unlimited);
    }
    s.parse()
        .map(Cap::At)
        .map_err(|e| format!("expected a number or `unlimited`: {e}"))
}

/// The cap after a `set`: the new one if given, else the one in force.
fn updated<T>(given: Option<Cap<T>>, in_force: Option<i64>, to: impl Fn(T) -> i64) -> Option<i64> {
    match given {
        None => in_force,
        Some(Cap::Unlimited) => None,
        Some(Cap::At(v)) => Some(to(v)),
    }
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
    // A team ID a request could name; another could never be matched.
    let team = match &action {
        LimitsAction::Show { team }
        | LimitsAction::Set { team, .. }
        | LimitsAction::Clear { team } => team,
    };
    crate::api::request::check_id(team, true).map_err(|why| anyhow::anyhow!("--team {why}"))?;
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
            if let Some(Cap::At(c)) = max_cost_usd.filter(|c| match c {
                Cap::At(c) => !c.is_finite() || *c < 0.0,
                Cap::Unlimited => false,
            }) {
                anyhow::bail!("--max-cost-usd must be a non-negative number, got {c}");
            }
            // An override row holds all three caps: the ones not given keep
            // their value in force, so setting one never lifts another.
            let in_force = ledger::caps_of(&store, &team, defaults).await?;
            let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            let caps = Caps {
                tokens: updated(max_tokens, in_force.tokens, to_i64),
                requests: updated(max_requests, in_force.requests, to_i64),
                cost_micros: updated(max_cost_usd, in_force.cost_micros, micros_floor),
            };
            ledger::set_caps(&store, &team, caps, now.timestamp_millis()).await?;
            let change = serde_json::json!({
                "max_tokens": caps.tokens, "max_requests": caps.requests,
                "max_cost_micros": caps.cost_micros,
            });
            super::audit_admin(&store, &team, "limits.changed", &team, &change).await?;
            let balance = ledger::balance_of(&store, &team, month_of(now).0).await?;
            let kept: Vec<&str> = [
                ("max_tokens", max_tokens.is_none() && caps.tokens.is_some()),
                (
                    "max_requests",
                    max_requests.is_none() && caps.requests.is_some(),
                ),
                (
                    "max_cost_usd",
                    max_cost_usd.is_none() && caps.cost_micros.is_some(),
                ),
            ]
            .into_iter()
            .filter_map(|(name, kept)| kept.then_some(name))
            .collect();
            let note = if kept.is_empty() {
                String::new()
            } else {
                format!(
                    "kept as in force: {} (now fixed for this team; `--<cap> unlimited` lifts one, \
                     `limits clear` returns to the config defaults)\n",
                    kept.join(", ")
                )
            };
            format!("updated\n{}{note}", show(&team, caps, balance))
        }
        LimitsAction::Clear { team } => {
            let removed = ledger::clear_caps(&store, &team).await?;
            if removed {
                let change = serde_json::json!({"cleared": true});
                super::audit_admin(&store, &team, "limits.changed", &team, &change).await?;
            }
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
