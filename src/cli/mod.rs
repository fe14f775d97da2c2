//! Command line, one file per command group. Commands return their output as text for
//! `main` to print: the library never writes to stdout itself.

mod audit;
mod call;
mod connect;
mod converse;
mod healthcheck;
mod keys;
mod limits;
mod prompts;
mod serve;
mod setup;
mod tools;

pub use audit::{AuditAction, audit};
pub use call::{Call, Client, ClientTls, Output, call};
pub use keys::{KeysAction, keys};
pub use limits::{LimitsAction, limits};
pub use prompts::{PromptsAction, prompts};
pub use serve::serve;
pub use setup::{check_config, migrate};
pub use tools::{ToolsAction, tools};

use crate::{config::Config, telemetry::LogFormat};
use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// ai-orchestrator: the single gRPC entry point for every AI call.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Config file (TOML). Environment overrides: AIO_<SECTION>__<KEY>, DATABASE_URL.
    #[arg(
        long,
        short,
        global = true,
        env = "AIO_CONFIG",
        default_value = "config/local.toml"
    )]
    pub config: PathBuf,
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "AIO_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC server until SIGTERM/SIGINT.
    Serve {
        /// Listen address, overriding `server.listen`.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Create or upgrade the database schema, then exit.
    Migrate,
    /// Load and validate the config, print a summary (secrets redacted), exit non-zero on errors.
    CheckConfig,
    /// Show or set a team's monthly caps (tenant_limits overrides).
    Limits {
        #[command(subcommand)]
        action: LimitsAction,
    },
    /// Manage versioned prompts (ai_prompts), audited.
    Prompts {
        #[command(subcommand)]
        action: PromptsAction,
        /// Who is acting (recorded in the audit trail).
        #[arg(long, global = true, env = "USER", default_value = "cli")]
        actor: String,
    },
    /// Manage API keys stored in the database (api_keys); servers pick up
    /// changes within `auth.refresh_interval`.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Ask a running server whether it is SERVING (gRPC health); exits
    /// non-zero otherwise. For container health checks.
    Healthcheck {
        /// Server address, host:port or http(s)://host:port [default:
        /// 127.0.0.1 on the port of `server.listen`].
        #[arg(long, env = "AIO_ADDR")]
        addr: Option<String>,
        #[command(flatten)]
        tls: ClientTls,
        /// The health service name to check (`""`: the whole server).
        #[arg(long, default_value = "")]
        service: String,
    },
    /// Call a running server. Its flags go before or after the RPC name:
    /// `call --team t1 classify-sms "hi"` = `call classify-sms --team t1 "hi"`.
    Call {
        #[command(flatten)]
        client: Client,
        #[command(subcommand)]
        rpc: Call,
    },
    /// List and call tools on a running server (`ToolService`): `tools
    /// list`, `tools call NAME --input JSON`.
    Tools {
        #[command(flatten)]
        client: Client,
        #[command(subcommand)]
        action: ToolsAction,
    },
    /// The audit log in the configured database: `audit verify [--team T]`
    /// checks each team's hash chain.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
}

/// The audit log's principal for a change made from the command line.
pub(crate) fn cli_principal() -> String {
    let user = std::env::var("USER").unwrap_or_default();
    let user = if crate::api::request::check_id(&user, true).is_ok() {
        user
    } else {
        "unknown".to_owned()
    };
    format!("cli:{user}")
}

/// Appends an admin change to `team`'s audit chain ('' for keys, which have no team).
pub(crate) async fn audit_admin(
    store: &crate::store::Store,
    team: &str,
    action: &str,
    subject: &str,
    input: &serde_json::Value,
) -> anyhow::Result<()> {
    use crate::audit::{AuditEvent, Category};
    let event = AuditEvent::new(team, &cli_principal(), "", Category::Admin, action, subject)
        .decided("ok", "")
        .with_input(input);
    crate::audit::store::append(store, vec![event])
        .await
        .context("writing the audit event")
}

/// Runs `cli` and returns what it prints.
pub async fn run(cli: Cli) -> anyhow::Result<String> {
    if !matches!(cli.command, Command::Serve { .. }) {
        crate::telemetry::init_logging(cli.log_format, None);
    }
    let command = match cli.command {
        Command::Call { client, rpc } => return call(client, rpc).await,
        Command::Tools { client, action } => return tools(client, action).await,
        other => other,
    };
    let cli = Cli {
        command,
        config: cli.config,
        log_format: cli.log_format,
    };
    if let Command::Healthcheck { addr, tls, service } = &cli.command {
        // The config is read only for the default address.
        let addr = match addr {
            Some(addr) => addr.clone(),
            None => healthcheck::default_addr(&Config::load_without_provider_keys(&cli.config)?),
        };
        return healthcheck::healthcheck(&addr, tls, service).await;
    }
    // Commands that never call a provider need no provider keys (a
    // migration job should not hold them).
    let offline = matches!(
        cli.command,
        Command::Migrate
            | Command::Limits { .. }
            | Command::Prompts { .. }
            | Command::Keys { .. }
            | Command::Audit { .. }
    );
    let config = if offline {
        Config::load_without_provider_keys(&cli.config)
    } else {
        Config::load(&cli.config)
    }
    // The error names the file or the environment variable at fault.
    .map_err(anyhow::Error::from)?;
    match cli.command {
        Command::CheckConfig => Ok(check_config(&config)),
        Command::Migrate => migrate(&config).await,
        Command::Limits { action } => limits(&config, action).await,
        Command::Keys { action } => keys(&config, action).await,
        Command::Prompts { action, actor } => prompts(&config, action, &actor).await,
        Command::Serve { listen } => serve(config, cli.log_format, listen).await,
        Command::Audit { action } => audit(&config, action).await,
        Command::Call { .. } | Command::Tools { .. } | Command::Healthcheck { .. } => {
            Ok(String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Call, Cli, Command, setup::redact_url};
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn call_flags_go_before_or_after_the_rpc() {
        for args in [
            &[
                "aio",
                "call",
                "--team",
                "t1",
                "--trace-id",
                "tr-1",
                "classify-sms",
                "hi",
            ][..],
            &[
                "aio",
                "call",
                "classify-sms",
                "--team",
                "t1",
                "--trace-id",
                "tr-1",
                "hi",
            ],
            &[
                "aio",
                "call",
                "classify-sms",
                "hi",
                "--team",
                "t1",
                "--trace-id",
                "tr-1",
            ],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let Command::Call {
                client,
                rpc: Call::ClassifySms { message },
            } = cli.command
            else {
                panic!("not a classify-sms call: {args:?}");
            };
            assert_eq!(
                (client.team(), client.trace_id.as_deref(), message.as_str()),
                ("t1", Some("tr-1"), "hi"),
                "{args:?}"
            );
        }
    }

    #[test]
    fn database_passwords_are_hidden() {
        assert_eq!(
            redact_url("postgres://u:pw@h/db"),
            "postgres://u:[REDACTED]@h/db"
        );
        assert_eq!(redact_url("sqlite://data/x.db"), "sqlite://data/x.db");
        // The authority ends at the last `@`, as URL parsers read it.
        assert_eq!(
            redact_url("postgres://u:p@ss@h:5432/db"),
            "postgres://u:[REDACTED]@h:5432/db"
        );
        assert_eq!(
            redact_url("postgres://h/db?sslmode=require&password=s3&user=u"),
            "postgres://h/db?sslmode=require&password=[REDACTED]&user=u"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    }
}
