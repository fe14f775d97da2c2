//! A string that never prints: provider API keys and other credentials.

use std::fmt;

/// A secret value (an API key): `Debug` and `Display` print `[REDACTED]`, so it never leaks.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send it (a provider's auth header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([REDACTED])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// Read as a plain string (`[cluster] redis_url` may hold a password); printed redacted.
impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_the_value() {
        let s = Secret::new("sk-canary-123");
        assert!(!format!("{s:?}").contains("canary"));
        assert!(!format!("{s}").contains("canary"));
        assert_eq!(s.expose(), "sk-canary-123");
    }
}
