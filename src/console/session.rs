//! Console logins (SPEC §17): an admin key is checked once, at the login
//! form, and the browser then holds a signed session cookie (HttpOnly,
//! SameSite=Strict) naming that key by its SHA-256, never the key. Every
//! request re-reads the key's principal, so a revoked or demoted key loses
//! the console at the next key refresh. Forms carry a CSRF token derived
//! from the session's nonce.

use crate::{
    auth::{Authenticator, Principal},
    config::ConsoleConfig,
    domain::Role,
};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::time::Duration;

/// The session cookie's name.
pub(super) const COOKIE: &str = "aio_console";
/// Where the cookie is sent: the console's pages only, never `/metrics`.
const PATH: &str = "/console";
/// Stands for the key of a session taken while authentication is off.
const NO_KEY: &str = "-";

/// Issues and opens session cookies.
#[derive(Clone)]
pub(super) struct Sessions {
    /// Keyed with the signing key; cloned for each signature.
    keyed: Hmac<Sha256>,
    ttl: Duration,
    auth: Authenticator,
}

/// A valid session.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// Who is logged in (re-read from the key on every request).
    pub principal: Principal,
    /// The session's random part, the CSRF token's seed.
    nonce: String,
}

/// Why a login failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LoginRefused {
    /// No key, or one that matches no active key.
    UnknownKey,
    /// A valid key without the admin role.
    NotAdmin,
}

impl Sessions {
    /// From `[console]`: its signing key, else a random one for this process.
    pub fn new(
        config: &ConsoleConfig,
        auth: Authenticator,
    ) -> Result<Self, hmac::digest::InvalidLength> {
        let key = match &config.session_secret {
            Some(secret) => secret.expose().as_bytes().to_vec(),
            None => rand::random::<[u8; 32]>().to_vec(),
        };
        Ok(Self {
            keyed: Hmac::<Sha256>::new_from_slice(&key)?,
            ttl: config.session_ttl,
            auth,
        })
    }

    /// Whether keys are checked (off: loopback clients only, no login).
    pub fn auth_enabled(&self) -> bool {
        self.auth.enabled()
    }

    /// Checks a key typed into the login form; a cookie value on success.
    pub fn login(&self, key: &str, now_s: i64) -> Result<String, LoginRefused> {
        let key = key.trim();
        if key.is_empty() {
            return Err(LoginRefused::UnknownKey);
        }
        let hash = Authenticator::hash(key);
        let principal = self.auth.by_hash(&hash).ok_or(LoginRefused::UnknownKey)?;
        if principal.role != Role::Admin {
            return Err(LoginRefused::NotAdmin);
        }
        Ok(self.issue(&hex::encode(hash), now_s))
    }

    /// A session for the anonymous principal (authentication off).
    pub fn anonymous(&self, now_s: i64) -> String {
        self.issue(NO_KEY, now_s)
    }

    fn issue(&self, key: &str, now_s: i64) -> String {
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        let expires = now_s.saturating_add(ttl);
        let nonce = hex::encode(rand::random::<[u8; 16]>());
        let body = format!("{expires}.{nonce}.{key}");
        let mac = hex::encode(self.mac(&body));
        format!("{body}.{mac}")
    }

    /// The session a cookie value holds: signed by us, unexpired, and its key
    /// still an active admin key (or authentication off for a keyless one).
    pub fn open(&self, cookie: &str, now_s: i64) -> Option<Session> {
        let (body, mac) = cookie.rsplit_once('.')?;
        let mac = hex::decode(mac).ok()?;
        self.verifier(body).verify_slice(&mac).ok()?;
        let mut parts = body.splitn(3, '.');
        let expires: i64 = parts.next()?.parse().ok()?;
        let nonce = parts.next()?.to_owned();
        let key = parts.next()?;
        if expires <= now_s {
            return None;
        }
        let principal = if key == NO_KEY {
            (!self.auth.enabled()).then(Principal::unauthenticated)?
        } else {
            let hash: [u8; 32] = hex::decode(key).ok()?.try_into().ok()?;
            Some(self.auth.by_hash(&hash)?)
                .filter(|p| self.auth.enabled() && p.role == Role::Admin)?
        };
        Some(Session { principal, nonce })
    }

    /// The CSRF token of `session`'s forms.
    pub fn csrf(&self, session: &Session) -> String {
        hex::encode(self.mac(&format!("csrf.{}", session.nonce)))
    }

    /// Whether `token` is `session`'s CSRF token (compared in constant time).
    pub fn csrf_matches(&self, session: &Session, token: &str) -> bool {
        let Ok(token) = hex::decode(token) else {
            return false;
        };
        self.verifier(&format!("csrf.{}", session.nonce))
            .verify_slice(&token)
            .is_ok()
    }

    /// The `Set-Cookie` value holding `value`.
    pub fn set_cookie(&self, value: &str) -> String {
        format!(
            "{COOKIE}={value}; Path={PATH}; HttpOnly; SameSite=Strict; Max-Age={}",
            self.ttl.as_secs()
        )
    }

    /// The `Set-Cookie` value that ends the session in the browser.
    pub fn clear_cookie() -> String {
        format!("{COOKIE}=; Path={PATH}; HttpOnly; SameSite=Strict; Max-Age=0")
    }

    fn verifier(&self, body: &str) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(body.as_bytes());
        mac
    }

    fn mac(&self, body: &str) -> Vec<u8> {
        self.verifier(body).finalize().into_bytes().to_vec()
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub(super) fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::config::{ApiKeyConfig, AuthConfig};

    const ADMIN: &str = "admin-key";
    const CALLER: &str = "caller-key";

    fn sessions(enabled: bool) -> Sessions {
        let key = |name: &str, key: &str, role| ApiKeyConfig {
            name: name.into(),
            sha256: hex::encode(Authenticator::hash(key)),
            teams: vec!["acme".into()],
            role,
        };
        let auth = Authenticator::new(&AuthConfig {
            enabled,
            keys: vec![
                key("ops", ADMIN, Role::Admin),
                key("app", CALLER, Role::Caller),
            ],
            ..AuthConfig::default()
        });
        Sessions::new(&ConsoleConfig::default(), auth).unwrap()
    }

    #[test]
    fn an_admin_key_logs_in_and_others_are_refused() {
        let s = sessions(true);
        let cookie = s.login(ADMIN, 1000).unwrap();
        assert!(!cookie.contains(ADMIN));
        assert_eq!(s.open(&cookie, 1001).unwrap().principal.name, "ops");
        assert_eq!(s.login(CALLER, 1000), Err(LoginRefused::NotAdmin));
        assert_eq!(s.login("nope", 1000), Err(LoginRefused::UnknownKey));
        assert_eq!(s.login(" ", 1000), Err(LoginRefused::UnknownKey));
    }

    #[test]
    fn a_forged_expired_or_foreign_cookie_opens_nothing() {
        let s = sessions(true);
        let cookie = s.login(ADMIN, 1000).unwrap();
        let ttl = 8 * 3600;
        assert!(s.open(&cookie, 1000 + ttl).is_none(), "expired");
        let (body, _) = cookie.rsplit_once('.').unwrap();
        assert!(s.open(&format!("{body}.00"), 1001).is_none(), "bad mac");
        let longer = cookie.replacen(&cookie[..4], "9999", 1);
        assert!(s.open(&longer, 1001).is_none(), "extended expiry");
        let other = sessions(true);
        assert!(other.open(&cookie, 1001).is_none(), "another signing key");
        assert!(
            s.open(&s.anonymous(1000), 1001).is_none(),
            "keyless with auth on"
        );
        assert!(s.open("garbage", 1001).is_none());
    }

    #[test]
    fn csrf_tokens_belong_to_their_session() {
        let s = sessions(true);
        let one = s.open(&s.login(ADMIN, 1000).unwrap(), 1001).unwrap();
        let two = s.open(&s.login(ADMIN, 1000).unwrap(), 1001).unwrap();
        assert!(s.csrf_matches(&one, &s.csrf(&one)));
        assert!(!s.csrf_matches(&two, &s.csrf(&one)));
        assert!(!s.csrf_matches(&one, ""));
        assert!(!s.csrf_matches(&one, "zz"));
    }

    #[test]
    fn with_auth_off_a_keyless_session_is_the_anonymous_admin() {
        let s = sessions(false);
        let session = s.open(&s.anonymous(1000), 1001).unwrap();
        assert_eq!(session.principal, Principal::unauthenticated());
    }

    #[test]
    fn cookies_are_read_by_name() {
        assert_eq!(cookie("a=1; aio_console=x.y; b=2", COOKIE), Some("x.y"));
        assert_eq!(cookie("aio_consolex=1", COOKIE), None);
    }
}
