//! `limits`: a team's or user's caps per month and per UTC day (overrides of
//! `metering.default_limits` and `metering.user_limits`) and balances.

use crate::{
    config::Config,
    store::Store,
    usage::{
        bucket::{Account, Bucket, Period, PeriodCaps, day_of},
        ledger,
        policy::{Balance, Caps},
        pricing::{micros_floor, usd},
        summary::month_of,
    },
};
use anyhow::Context;
use clap::{Args, Subcommand};

/// `limits` sub-commands.
#[derive(Debug, Subcommand)]
pub enum LimitsAction {
    /// Print the caps in force for a team (or one of its users) and this month's and today's balance.
    Show {
        #[command(flatten)]
        scope: Scope,
    },
    /// Override some caps of a team or user. A cap not given keeps the value
    /// in force (the override, else the config default); `unlimited` lifts a cap.
    Set {
        #[command(flatten)]
        scope: Scope,
        #[command(flatten)]
        caps: CapArgs,
    },
    /// Remove an override (the config defaults apply again).
    Clear {
        #[command(flatten)]
        scope: Scope,
    },
}

/// Whose caps: a team, or a user of it.
#[derive(Debug, Args)]
pub struct Scope {
    /// Team.
    #[arg(long)]
    team: String,
    /// User (`context.user_id`); absent, the team's own caps.
    #[arg(long)]
    user: Option<String>,
}

/// The caps `limits set` may change.
#[derive(Debug, Args)]
pub struct CapArgs {
    /// Tokens per month, or `unlimited`.
    #[arg(long, value_parser = parse_cap::<u64>)]
    max_tokens: Option<Cap<u64>>,
    /// Requests per month, or `unlimited`.
    #[arg(long, value_parser = parse_cap::<u64>)]
    max_requests: Option<Cap<u64>>,
    /// US dollars per month, or `unlimited`.
    #[arg(long, value_parser = parse_cap::<f64>)]
    max_cost_usd: Option<Cap<f64>>,
    /// Tokens per UTC day, or `unlimited`.
    #[arg(long, value_parser = parse_cap::<u64>)]
    max_tokens_per_day: Option<Cap<u64>>,
    /// Requests per UTC day, or `unlimited`.
    #[arg(long, value_parser = parse_cap::<u64>)]
    max_requests_per_day: Option<Cap<u64>>,
    /// US dollars per UTC day, or `unlimited`.
    #[arg(long, value_parser = parse_cap::<f64>)]
    max_cost_usd_per_day: Option<Cap<f64>>,
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

fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl CapArgs {
    /// A cost that is not a non-negative number.
    fn bad_cost(&self) -> Option<(&'static str, f64)> {
        [
            ("--max-cost-usd", self.max_cost_usd),
            ("--max-cost-usd-per-day", self.max_cost_usd_per_day),
        ]
        .into_iter()
        .find_map(|(flag, cap)| match cap {
            Some(Cap::At(c)) if !c.is_finite() || c < 0.0 => Some((flag, c)),
            _ => None,
        })
    }

    /// The caps in force with these applied.
    fn apply(&self, in_force: PeriodCaps) -> PeriodCaps {
        let (m, d) = (in_force.month, in_force.day);
        PeriodCaps {
            month: Caps {
                tokens: updated(self.max_tokens, m.tokens, count),
                requests: updated(self.max_requests, m.requests, count),
                cost_micros: updated(self.max_cost_usd, m.cost_micros, micros_floor),
            },
            day: Caps {
                tokens: updated(self.max_tokens_per_day, d.tokens, count),
                requests: updated(self.max_requests_per_day, d.requests, count),
                cost_micros: updated(self.max_cost_usd_per_day, d.cost_micros, micros_floor),
            },
        }
    }

    /// The caps not given that stay set (kept as in force).
    fn kept(&self, caps: &PeriodCaps) -> Vec<&'static str> {
        let (m, d) = (caps.month, caps.day);
        [
            (
                "max_tokens",
                self.max_tokens.is_none() && m.tokens.is_some(),
            ),
            (
                "max_requests",
                self.max_requests.is_none() && m.requests.is_some(),
            ),
            (
                "max_cost_usd",
                self.max_cost_usd.is_none() && m.cost_micros.is_some(),
            ),
            (
                "max_tokens_per_day",
                self.max_tokens_per_day.is_none() && d.tokens.is_some(),
            ),
            (
                "max_requests_per_day",
                self.max_requests_per_day.is_none() && d.requests.is_some(),
            ),
            (
                "max_cost_usd_per_day",
                self.max_cost_usd_per_day.is_none() && d.cost_micros.is_some(),
            ),
        ]
        .into_iter()
        .filter_map(|(name, kept)| kept.then_some(name))
        .collect()
    }
}

/// One cap's line: `name value  (used X + reserved Y)`.
fn line(name: &str, cap: Option<i64>, spent: i64, reserved: i64, money: bool) -> String {
    let amount = |v: i64| {
        if money {
            format!("{:.6}", usd(v))
        } else {
            v.to_string()
        }
    };
    let cap = cap.map_or("unlimited".to_owned(), amount);
    format!(
        "  {name:<12} {cap}  (used {} + reserved {})\n",
        amount(spent),
        amount(reserved)
    )
}

/// The caps of one period and its balance.
fn period_lines(caps: &Caps, b: &Balance, suffix: &str) -> String {
    [
        line(
            &format!("max_tokens{suffix}"),
            caps.tokens,
            b.spent_tokens,
            b.reserved_tokens,
            false,
        ),
        line(
            &format!("max_requests{suffix}"),
            caps.requests,
            b.spent_requests,
            b.reserved_requests,
            false,
        ),
        line(
            &format!("max_cost_usd{suffix}"),
            caps.cost_micros,
            b.spent_cost_micros,
            b.reserved_cost_micros,
            true,
        ),
    ]
    .concat()
}

/// Who, its caps, and this month's and today's balance.
async fn show(store: &Store, team: &str, user: &str, caps: PeriodCaps) -> anyhow::Result<String> {
    let now = chrono::Utc::now();
    let account = Account {
        team_id: team,
        user_id: user,
        month_start_ms: month_of(now).0,
        day_start_ms: day_of(now.timestamp_millis()),
    };
    let own = |b: &Bucket| b.user_id == user;
    let mut out = if user.is_empty() {
        format!("team {team}\n")
    } else {
        format!("user {user} of team {team}\n")
    };
    for bucket in account.buckets().into_iter().filter(own) {
        let balance = ledger::balance_of(store, &bucket).await?;
        let suffix = match bucket.period {
            Period::Month => "",
            Period::Day => "_per_day",
        };
        out.push_str(&period_lines(&caps.of(bucket.period), &balance, suffix));
    }
    Ok(out)
}

/// Runs a `limits` sub-command against the configured database.
pub async fn limits(config: &Config, action: LimitsAction) -> anyhow::Result<String> {
    let store = Store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating")?;
    let defaults =
        crate::usage::Meter::new(None, Default::default(), &config.metering).default_caps();
    let scope = match &action {
        LimitsAction::Show { scope }
        | LimitsAction::Set { scope, .. }
        | LimitsAction::Clear { scope } => scope,
    };
    // IDs a request could name; another could never be matched.
    crate::api::request::check_id(&scope.team, true)
        .map_err(|why| anyhow::anyhow!("--team {why}"))?;
    let user = scope.user.clone().unwrap_or_default();
    if scope.user.is_some() {
        crate::api::request::check_id(&user, true)
            .map_err(|why| anyhow::anyhow!("--user {why}"))?;
    }
    let team = scope.team.clone();
    let defaults = defaults.scope(!user.is_empty());
    // The audit subject: the team, or `user:<id>`.
    let subject = if user.is_empty() {
        team.clone()
    } else {
        format!("user:{user}")
    };
    let out = match action {
        LimitsAction::Show { .. } => {
            let caps = ledger::caps_of(&store, &team, &user, defaults).await?;
            show(&store, &team, &user, caps).await?
        }
        LimitsAction::Set { caps: args, .. } => {
            if let Some((flag, c)) = args.bad_cost() {
                anyhow::bail!("{flag} must be a non-negative number, got {c}");
            }
            // An override row holds every cap: the ones not given keep
            // their value in force, so setting one never lifts another.
            let in_force = ledger::caps_of(&store, &team, &user, defaults).await?;
            let caps = args.apply(in_force);
            let now = chrono::Utc::now().timestamp_millis();
            ledger::set_caps(&store, &team, &user, caps, now).await?;
            let change = serde_json::json!({
                "user_id": user,
                "max_tokens": caps.month.tokens, "max_requests": caps.month.requests,
                "max_cost_micros": caps.month.cost_micros,
                "max_tokens_per_day": caps.day.tokens, "max_requests_per_day": caps.day.requests,
                "max_cost_micros_per_day": caps.day.cost_micros,
            });
            super::audit_admin(&store, &team, "limits.changed", &subject, &change).await?;
            let kept = args.kept(&caps);
            let note = if kept.is_empty() {
                String::new()
            } else {
                format!(
                    "kept as in force: {} (now fixed for this {}; `--<cap> unlimited` lifts one, \
                     `limits clear` returns to the config defaults)\n",
                    kept.join(", "),
                    if user.is_empty() { "team" } else { "user" },
                )
            };
            format!("updated\n{note}{}", show(&store, &team, &user, caps).await?)
        }
        LimitsAction::Clear { .. } => {
            let removed = ledger::clear_caps(&store, &team, &user).await?;
            let who = if user.is_empty() {
                format!("team {team}")
            } else {
                format!("user {user} of team {team}")
            };
            if removed {
                let change = serde_json::json!({"cleared": true, "user_id": user});
                super::audit_admin(&store, &team, "limits.changed", &subject, &change).await?;
                format!("{who}: override removed, config defaults apply\n")
            } else {
                format!("{who} had no override\n")
            }
        }
    };
    store.close().await;
    Ok(out)
}
