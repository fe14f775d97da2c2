//! MCP sessions known to the whole fleet (SPEC §12, ADR 0025), so any replica can re-create one.
//! A session is no credential: every request brings its own key.

use super::{Cluster, Unavailable};
use std::time::Duration;

/// How long a session outlives its last restore; an idle client then opens a new one.
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
