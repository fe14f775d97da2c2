//! A fresh PostgreSQL database per server, so each metered run starts
//! from an empty ledger.

use anyhow::Context;

/// A fresh PostgreSQL database for one run, dropped by [`Self::drop_now`].
pub struct PgDatabase {
    admin_url: String,
    /// Database name.
    pub name: String,
    /// URL of the database.
    pub url: String,
}

impl PgDatabase {
    /// Creates `bench_<pid>_<n>` through `admin_url`.
    pub async fn create(admin_url: &str, n: usize) -> anyhow::Result<Self> {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(admin_url)
            .await
            .with_context(|| format!("connecting to PostgreSQL at {admin_url}"))?;
        let name = format!("bench_{}_{n}", std::process::id());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let base = admin_url.rsplit_once('/').map_or(admin_url, |(b, _)| b);
        Ok(Self {
            admin_url: admin_url.to_owned(),
            url: format!("{base}/{name}"),
            name,
        })
    }

    /// Drops the database.
    pub async fn drop_now(&self) {
        use sqlx::Connection;
        let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin_url).await else {
            tracing::warn!(db = %self.name, "could not drop the bench database");
            return;
        };
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
        {
            tracing::warn!(db = %self.name, error = %e, "could not drop the bench database");
        }
    }
}
