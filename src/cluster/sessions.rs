//! MCP endpoint sessions known to the whole fleet (SPEC §12): what a
//! session was opened with (the client's `initialize`), kept under its ID
//! so any replica can re-create it. A session carries no identity: every
//! request is authenticated by its own key, so a session restored
//! elsewhere grants nothing it did not already have.

use super::{Cluster, Unavailable};
use std::time::Duration;

/// How long a session's record outlives its last restore: a client idle
/// longer than this opens a new session (the spec's answer to a 404).
pub const SESSION_TTL: Duration = Duration::from_secs(24 * 3600);

impl Cluster {
    fn session_key(&self, id: &str) -> String {
        self.key("mcp", &format!("session:{id}"))
    }

    /// The record of session `id`, its expiry renewed; `None` if unknown.
    pub async fn load_session(&self, id: &str) -> Result<Option<String>, Unavailable> {
        let mut cmd = redis::cmd("GETEX");
        cmd.arg(self.session_key(id))
            .arg("EX")
            .arg(SESSION_TTL.as_secs());
        self.query(&cmd).await
    }

    /// Keeps `record` as session `id`'s.
    pub async fn store_session(&self, id: &str, record: &str) -> Result<(), Unavailable> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.session_key(id))
            .arg(record)
            .arg("EX")
            .arg(SESSION_TTL.as_secs());
        self.query::<String>(&cmd).await.map(drop)
    }

    /// Forgets session `id` (the client ended it).
    pub async fn delete_session(&self, id: &str) -> Result<(), Unavailable> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.session_key(id));
        self.query::<i64>(&cmd).await.map(drop)
    }
}
