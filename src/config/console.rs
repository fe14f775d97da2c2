//! `[console]`: the ops console's web pages on the metrics listener (SPEC §17).

use super::Secret;
use serde::Deserialize;
use std::time::Duration;

/// `[console]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Serves `/console` on `server.metrics_listen`.
    pub enabled: bool,
    /// How long a login lasts.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// The environment variable holding the key that signs session cookies (at
    /// least 32 bytes). Unset: a random key per process, so a login holds on
    /// the replica that took it and ends when it restarts.
    pub session_secret_env: Option<String>,
    /// The signing key, loaded from `session_secret_env`; never from the file.
    #[serde(skip)]
    pub session_secret: Option<Secret>,
}

/// The shortest signing key accepted, bytes.
pub const MIN_SECRET_BYTES: usize = 32;

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            session_ttl: Duration::from_secs(8 * 3600),
            session_secret_env: None,
            session_secret: None,
        }
    }
}

/// The console needs the metrics listener it is served on, and a signing key
/// long enough to resist guessing.
pub(super) fn check(config: &super::Config, bad: &mut dyn FnMut(String, &str)) {
    let console = &config.console;
    if !console.enabled {
        return;
    }
    if config.server.metrics_listen.is_none() {
        bad(
            "console.enabled".into(),
            "the console is served on the metrics listener: set server.metrics_listen",
        );
    }
    if console.session_ttl.is_zero() {
        bad("console.session_ttl".into(), "must be more than 0");
    }
    if let Some(secret) = &console.session_secret
        && secret.expose().len() < MIN_SECRET_BYTES
    {
        bad(
            "console.session_secret_env".into(),
            "the signing key must be at least 32 bytes",
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use crate::config::{Config, ConfigError};

    fn load(toml: &str, secret: Option<&str>) -> Result<Config, ConfigError> {
        let secret = secret.map(str::to_owned);
        Config::from_toml_str(toml, move |name| {
            (name == "AIO_CONSOLE_KEY")
                .then(|| secret.clone())
                .flatten()
        })
    }

    #[test]
    fn off_by_default_and_needs_the_metrics_listener() {
        let default = load("", None).unwrap();
        assert!(!default.console.enabled);
        let err = load("[console]\nenabled = true\n", None).unwrap_err();
        assert!(err.to_string().contains("server.metrics_listen"), "{err}");
        let on = "[server]\nmetrics_listen = \"127.0.0.1:0\"\n[console]\nenabled = true\n";
        assert!(load(on, None).unwrap().console.session_secret.is_none());
    }

    #[test]
    fn the_signing_key_comes_from_the_environment_and_must_be_long() {
        let toml = "[server]\nmetrics_listen = \"127.0.0.1:0\"\n[console]\nenabled = true\n\
                    session_secret_env = \"AIO_CONSOLE_KEY\"\n";
        let short = load(toml, Some("short")).unwrap_err();
        assert!(short.to_string().contains("at least 32 bytes"), "{short}");
        let unset = load(toml, None).unwrap_err();
        assert!(unset.to_string().contains("AIO_CONSOLE_KEY"), "{unset}");
        let long = "k".repeat(32);
        let config = load(toml, Some(&long)).unwrap();
        assert_eq!(config.console.session_secret.unwrap().expose(), long);
    }
}
