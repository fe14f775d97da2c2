//! A write prepared by the service that owns its table and run in another's transaction (an
//! agent turn's conversation rows in the ledger's group commit); SQL valid on both backends.

/// One argument of a [`Statement`].
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// An integer (BIGINT).
    Int(i64),
    /// Text.
    Text(String),
    /// NULL in a text column.
    Null,
    /// NULL in an integer (BIGINT) column: PostgreSQL types a bound NULL.
    NullInt,
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(v.to_owned())
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(v)
    }
}

impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Self {
        v.map_or(Arg::Null, Arg::Text)
    }
}

/// One SQL statement with its arguments, `$1` for the first.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// The SQL, valid on SQLite and PostgreSQL.
    pub sql: &'static str,
    /// `$1`, `$2`, … in order.
    pub args: Vec<Arg>,
}

impl Statement {
    /// `sql` with `args`.
    pub fn new(sql: &'static str, args: Vec<Arg>) -> Self {
        Self { sql, args }
    }
}

impl rusqlite::ToSql for Arg {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value, ValueRef};
        Ok(match self {
            Arg::Int(v) => ToSqlOutput::Owned(Value::Integer(*v)),
            Arg::Text(v) => ToSqlOutput::Borrowed(ValueRef::Text(v.as_bytes())),
            Arg::Null | Arg::NullInt => ToSqlOutput::Owned(Value::Null),
        })
    }
}

/// Binds `args` to a PostgreSQL query, in order.
pub fn bind_pg<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    args: &'q [Arg],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    for arg in args {
        q = match arg {
            Arg::Int(v) => q.bind(*v),
            Arg::Text(v) => q.bind(v.as_str()),
            Arg::Null => q.bind(None::<String>),
            Arg::NullInt => q.bind(None::<i64>),
        };
    }
    q
}
