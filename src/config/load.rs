//! Loading: the TOML file, `AIO_` variables, `DATABASE_URL`, provider keys, validation.
//! Every problem names its key and where the value came from, file or variable (an operator
//! would otherwise search the file for an injected value). A misspelled `AIO_SERVER_LISTEN`
//! is refused, not ignored, as is a non-UTF-8 variable the config reads.

use super::{Config, ConfigError, Invalid, Secret, validate};
use figment::{
    Figment, Metadata,
    providers::{Env, Format, Toml},
    value::Value,
};
use std::{ffi::OsString, path::Path};

const PREFIX: &str = "AIO_";

const SPLIT: &str = "__";

/// The top-level sections of [`Config`] (a unit test keeps it in step).
const SECTIONS: &[&str] = &[
    "server",
    "database",
    "providers",
    "tasks",
    "pricing",
    "metering",
    "retry",
    "auth",
    "telemetry",
    "tools",
    "mcp_servers",
    "mcp_endpoint",
    "tool_worker",
    "tool_limits",
    "audit",
    "agents",
    "cluster",
];

/// Where values came from, to say so in errors.
struct Origins<'a> {
    file: Option<&'a Path>,
    database_url_from_env: bool,
}

impl Origins<'_> {
    /// The origin of the value at `path`. `merged` is `find_value("")`, taken once: figment's
    /// own look-up merges every source again each time.
    fn of(&self, figment: &Figment, merged: Option<&Value>, path: &str) -> Option<String> {
        // `chain[1].provider` lives in the `chain` value.
        let key = path.split('[').next().unwrap_or(path);
        if self.database_url_from_env && key == "database.url" {
            return Some("environment variable DATABASE_URL".to_owned());
        }
        let metadata = merged
            .and_then(|root| root.find_ref(key))
            .and_then(|value| figment.get_metadata(value.tag()));
        match metadata {
            Some(md) if from_prefixed_env(md) => Some(env_origin(key)),
            _ => self.file.map(|f| f.display().to_string()),
        }
    }

    fn locate(&self, figment: &Figment, problems: &mut [Invalid]) {
        let merged = figment.find_value("").ok();
        for problem in problems {
            problem.origin = self.of(figment, merged.as_ref(), &problem.path);
        }
    }
}

fn from_prefixed_env(md: &Metadata) -> bool {
    md.name.starts_with(&format!("`{PREFIX}`"))
}

/// `environment variable AIO_SERVER__LISTEN` for `server.listen`.
fn env_origin(key: &str) -> String {
    let var: Vec<String> = key.split('.').map(|k| k.to_ascii_uppercase()).collect();
    format!("environment variable {PREFIX}{}", var.join(SPLIT))
}

impl Config {
    /// Loads `path`, applies environment overrides, reads secrets, validates.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with_env(path, |name| std::env::var(name).ok())
    }

    /// Like [`Config::load`], for commands that never call a provider (`migrate`, `limits`,
    /// `prompts`, `keys`): a migration job should not hold provider keys.
    pub fn load_without_provider_keys(path: &Path) -> Result<Self, ConfigError> {
        Self::load_inner(path, |name| std::env::var(name).ok(), false)
    }

    /// Like [`Config::load`] with the lookup injected (tests); `AIO_` overrides are the process's.
    pub fn load_with_env(
        path: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::load_inner(path, env, true)
    }

    fn load_inner(
        path: &Path,
        env: impl Fn(&str) -> Option<String>,
        require_keys: bool,
    ) -> Result<Self, ConfigError> {
        // Read whole by the TOML parser: bounded before it is.
        if let Ok(meta) = std::fs::metadata(path)
            && meta.len() > validate::lists::MAX_FILE_BYTES
        {
            return Err(ConfigError::Parse {
                origin: Some(path.display().to_string()),
                path: "(the file)".into(),
                message: format!(
                    "is {} bytes; at most {} are read",
                    meta.len(),
                    validate::lists::MAX_FILE_BYTES
                ),
            });
        }
        let mut figment = Figment::new()
            .merge(Toml::file_exact(path))
            // Only `__` paths are config keys: the CLI's own variables share the prefix.
            .merge(
                Env::prefixed(PREFIX)
                    .filter(|key| key.as_str().contains(SPLIT))
                    .split(SPLIT),
            );
        let database_url = env("DATABASE_URL");
        if let Some(url) = &database_url {
            figment = figment.merge(("database.url", url.clone()));
        }
        let origins = Origins {
            file: Some(path),
            database_url_from_env: database_url.is_some(),
        };
        // `vars_os`: `std::env::vars` panics on a variable that is not UTF-8.
        let (names, mut problems) = environment(std::env::vars_os());
        let config = Self::from_figment(&figment, &env, require_keys, &origins)?;
        problems.extend(misspelled_variables(names.into_iter(), &config));
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Parses a TOML string with no environment overrides (tests, tooling).
    pub fn from_toml_str(
        toml: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let origins = Origins {
            file: None,
            database_url_from_env: false,
        };
        Self::from_figment(&Figment::from(Toml::string(toml)), &env, true, &origins)
    }

    fn from_figment(
        figment: &Figment,
        env: &impl Fn(&str) -> Option<String>,
        require_keys: bool,
        origins: &Origins<'_>,
    ) -> Result<Self, ConfigError> {
        let mut config: Config = figment
            .extract()
            .map_err(|e| parse_error(e, figment, origins))?;
        let mut problems = Vec::new();
        for (name, provider) in &mut config.providers {
            if let Some(var) = &provider.api_key_env {
                match env(var) {
                    Some(key) if !key.is_empty() => provider.api_key = Some(Secret::new(key)),
                    _ if !require_keys => {}
                    _ => problems.push(Invalid {
                        origin: None,
                        path: format!("providers.{name}.api_key_env"),
                        message: format!("environment variable {var} is not set"),
                    }),
                }
            }
        }
        for (key, tool) in &mut config.tools {
            if let Some(var) = &tool.auth_env {
                match env(var) {
                    Some(value) if !value.is_empty() => tool.auth_value = Some(Secret::new(value)),
                    _ if !require_keys => {}
                    _ => problems.push(Invalid {
                        origin: None,
                        path: format!("tools.\"{key}\".auth_env"),
                        message: format!("environment variable {var} is not set"),
                    }),
                }
            }
            if let Some(var) = &tool.callback_secret_env {
                match env(var) {
                    Some(value) if !value.is_empty() => {
                        tool.callback_secret = Some(Secret::new(value));
                    }
                    _ if !require_keys => {}
                    _ => problems.push(Invalid {
                        origin: None,
                        path: format!("tools.\"{key}\".callback_secret_env"),
                        message: format!("environment variable {var} is not set"),
                    }),
                }
            }
        }
        if let Some(var) = &config.console.session_secret_env {
            match env(var) {
                Some(value) if !value.is_empty() => {
                    config.console.session_secret = Some(Secret::new(value));
                }
                _ if !require_keys => {}
                _ => problems.push(Invalid {
                    origin: None,
                    path: "console.session_secret_env".into(),
                    message: format!("environment variable {var} is not set"),
                }),
            }
        }
        super::tools::ToolLimitsConfig::cap(&mut config);
        problems.extend(validate::check(&config));
        if problems.is_empty() {
            return Ok(config);
        }
        origins.locate(figment, &mut problems);
        Err(ConfigError::Invalid(problems))
    }
}

/// UTF-8 variable names in `vars` (for [`misspelled_variables`]), and a problem for each
/// variable the config reads (`AIO_` with a `__` path, `DATABASE_URL`) that is not UTF-8:
/// figment and `std::env::var` skip it silently, losing the override unseen.
fn environment(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> (Vec<String>, Vec<Invalid>) {
    let mut names = Vec::new();
    let mut problems = Vec::new();
    for (name, value) in vars {
        let shown = name.to_string_lossy().into_owned();
        let what = match (name.into_string(), value.to_str().is_some()) {
            (Ok(name), true) => {
                names.push(name);
                continue;
            }
            (Ok(name), false) => {
                names.push(name);
                "its value"
            }
            (Err(_), _) => "its name",
        };
        if let Some(path) = key_read_from(&shown) {
            problems.push(Invalid {
                origin: Some(format!("environment variable {shown}")),
                path,
                message: format!("{what} is not valid UTF-8, so it would be ignored"),
            });
        }
    }
    problems.sort_by(|a, b| a.origin.cmp(&b.origin));
    (names, problems)
}

/// The key the variable `name` sets (`AIO_SERVER__LISTEN`: `server.listen`), if one is read.
fn key_read_from(name: &str) -> Option<String> {
    if name == "DATABASE_URL" {
        return Some("database.url".to_owned());
    }
    let lower = name.to_ascii_lowercase();
    let rest = lower.strip_prefix(&PREFIX.to_ascii_lowercase())?;
    rest.contains(SPLIT)
        .then(|| rest.split(SPLIT).collect::<Vec<_>>().join("."))
}

/// `AIO_` variables meant for the config but mapping to no key (`AIO_SERVER_LISTEN`); those
/// the config names (a provider's `api_key_env`) are someone's secret, not a typo.
fn misspelled_variables(names: impl Iterator<Item = String>, config: &Config) -> Vec<Invalid> {
    let named: Vec<&str> = config
        .providers
        .values()
        .filter_map(|p| p.api_key_env.as_deref())
        .collect();
    let mut out = Vec::new();
    for name in names {
        let upper = name.to_ascii_uppercase();
        let Some(rest) = upper.strip_prefix(PREFIX) else {
            continue;
        };
        if rest.contains(SPLIT) || named.contains(&name.as_str()) {
            continue;
        }
        let lower = rest.to_ascii_lowercase();
        let Some(section) = SECTIONS
            .iter()
            .find(|s| lower.strip_prefix(**s).is_some_and(|r| r.starts_with('_')))
        else {
            continue;
        };
        let key = &rest[section.len() + 1..];
        out.push(Invalid {
            origin: Some(format!("environment variable {name}")),
            path: (*section).to_owned(),
            message: format!(
                "maps to no config key: path segments are separated by `{SPLIT}` \
                 (did you mean {PREFIX}{}{SPLIT}{key}?)",
                section.to_ascii_uppercase()
            ),
        });
    }
    out.sort_by(|a, b| a.origin.cmp(&b.origin));
    out
}

fn parse_error(err: figment::Error, figment: &Figment, origins: &Origins<'_>) -> ConfigError {
    // The first of figment's chained errors names the first bad key; indexes as `keys[0]`.
    let mut path = String::new();
    for segment in &err.path {
        if segment.parse::<usize>().is_ok() && !path.is_empty() {
            path.push_str(&format!("[{segment}]"));
        } else {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(segment);
        }
    }
    if let figment::error::Kind::UnknownField(field, _) = &err.kind
        && !path.ends_with(field.as_str())
    {
        path = if path.is_empty() {
            field.clone()
        } else {
            format!("{path}.{field}")
        };
    }
    let origin = match &err.metadata {
        _ if origins.database_url_from_env && path == "database.url" => {
            Some("environment variable DATABASE_URL".to_owned())
        }
        // An unknown key exists only in its source: the variable's name.
        Some(md) if from_prefixed_env(md) => Some(env_origin(&path)),
        Some(md) => md
            .source
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| origins.of(figment, figment.find_value("").ok().as_ref(), &path)),
        None => origins.of(figment, figment.find_value("").ok().as_ref(), &path),
    };
    if path.is_empty() {
        path = "<root>".into();
    }
    ConfigError::Parse {
        origin,
        path,
        message: err.kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn sections_are_the_configs_top_level_keys() {
        let probe = SECTIONS
            .iter()
            .map(|s| match *s {
                // The sections with a required key.
                "mcp_endpoint" => "[mcp_endpoint]\nlisten = \"127.0.0.1:0\"\n".to_owned(),
                "cluster" => "[cluster]\nredis_url = \"redis://127.0.0.1:6379/0\"\n".to_owned(),
                s => format!("[{s}]\n"),
            })
            .collect::<String>();
        // Every listed section parses (an unknown one would be refused)...
        Config::from_toml_str(&probe, |_| None).unwrap();
        // ...and a key that is not one is refused, so the list is the set.
        let err = Config::from_toml_str("[nonsense]\n", |_| None).unwrap_err();
        assert_eq!(err.paths(), ["nonsense"]);
    }

    #[test]
    fn a_single_underscore_after_a_section_is_a_typo_but_other_variables_are_not() {
        let config = Config::from_toml_str(
            "[providers.openai]\nkind = \"openai\"\napi_key_env = \"AIO_OPENAI_KEY\"\n",
            |_| Some("sk-test".into()),
        )
        .unwrap();
        let names = [
            "AIO_SERVER_LISTEN",
            "AIO_SERVER__LISTEN",
            "AIO_CONFIG",
            "AIO_LOG_FORMAT",
            "AIO_TEST_POSTGRES_URL",
            "AIO_OPENAI_KEY",
            "AIO_PROVIDERS_OPENAI__TIMEOUT",
            "aio_metering_enabled",
            "PATH",
        ]
        .map(String::from);
        let typos = misspelled_variables(names.into_iter(), &config);
        let shown: Vec<String> = typos.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "environment variable AIO_SERVER_LISTEN: server: maps to no config key: path \
                 segments are separated by `__` (did you mean AIO_SERVER__LISTEN?)",
                "environment variable aio_metering_enabled: metering: maps to no config key: \
                 path segments are separated by `__` (did you mean AIO_METERING__ENABLED?)",
            ]
        );
    }

    #[cfg(unix)]
    #[test]
    fn variables_that_are_not_utf8_never_panic_and_are_named_when_the_config_reads_them() {
        use std::os::unix::ffi::OsStringExt;
        fn raw(b: &[u8]) -> OsString {
            OsString::from_vec(b.to_vec())
        }
        let vars = [
            (raw(b"PATH"), raw(b"/usr/bin")),
            // Other programs' variables, and the CLI's own: skipped.
            (raw(b"OTHER"), raw(b"\xff")),
            (raw(b"\xffNAME"), raw(b"x")),
            (raw(b"AIO_CONFIG"), raw(b"/etc/\xff.toml")),
            // Read by the config: each named.
            (raw(b"AIO_SERVER__LISTEN"), raw(b"\xff")),
            (raw(b"aio_x\xff__y"), raw(b"1")),
            (raw(b"DATABASE_URL"), raw(b"sqlite://\xff")),
        ];
        let (names, problems) = environment(vars);
        assert_eq!(
            names,
            [
                "PATH",
                "OTHER",
                "AIO_CONFIG",
                "AIO_SERVER__LISTEN",
                "DATABASE_URL"
            ]
        );
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "environment variable AIO_SERVER__LISTEN: server.listen: its value is not \
                 valid UTF-8, so it would be ignored",
                "environment variable DATABASE_URL: database.url: its value is not valid \
                 UTF-8, so it would be ignored",
                "environment variable aio_x\u{fffd}__y: x\u{fffd}.y: its name is not valid \
                 UTF-8, so it would be ignored",
            ]
        );
    }

    #[test]
    fn env_origins_name_the_variable() {
        assert_eq!(
            env_origin("providers.openai.timeout"),
            "environment variable AIO_PROVIDERS__OPENAI__TIMEOUT"
        );
    }
}
