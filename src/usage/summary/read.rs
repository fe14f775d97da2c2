//! The three reads behind [`super::summarize`]: the rollup sums and the
//! latency histogram of whole days, and the records of a partial day.

use super::{Dimension, RollupRow, SumRow};
use crate::{
    on_store,
    store::{Store, StoreError},
};

/// The select and `GROUP BY` lists of `dims` (`day_column`: the table's UTC
/// day). Fixed strings only, never caller input.
fn dimension_sql(dims: &[Dimension], day_column: &str) -> (String, String) {
    let column = |d: &Dimension| match d {
        Dimension::Day => day_column,
        other => other.column(),
    };
    let select = dims
        .iter()
        .map(|d| format!("CAST({} AS TEXT), ", column(d)))
        .collect();
    let group_by = dims.iter().map(column).collect::<Vec<_>>().join(", ");
    (select, group_by)
}

/// The rollup sums of whole days `[first_day, end_day)`, per group.
pub(super) async fn rollups(
    store: &Store,
    team: &str,
    first_day: i64,
    end_day: i64,
    dims: &[Dimension],
) -> Result<Vec<(Vec<String>, RollupRow)>, StoreError> {
    let (select, group_by) = dimension_sql(dims, "day");
    let group_by = if group_by.is_empty() {
        String::new()
    } else {
        format!(" GROUP BY {group_by}")
    };
    let sum = |c: &str| format!("CAST(COALESCE(SUM({c}), 0) AS BIGINT)");
    let sql = format!(
        "SELECT {select}{}, {}, {}, {}, {}, {}, {} FROM usage_rollup \
         WHERE team_id = $1 AND day >= $2 AND day < $3{group_by}",
        sum("requests"),
        sum("input_tokens"),
        sum("output_tokens"),
        sum("cost_micros"),
        sum("errors"),
        sum("degraded"),
        sum("unpriced"),
    );
    let n = dims.len();
    let rows = on_store!(store, |pool| {
        use sqlx::Row;
        // Audited: the only dynamic parts are `Dimension::column` constants.
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(team)
            .bind(first_day)
            .bind(end_day)
            .fetch_all(pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let key = (0..n)
                .map(|i| row.try_get::<String, _>(i))
                .collect::<Result<Vec<_>, _>>()?;
            let sums: RollupRow = (
                row.try_get(n)?,
                row.try_get(n + 1)?,
                row.try_get(n + 2)?,
                row.try_get(n + 3)?,
                row.try_get(n + 4)?,
                row.try_get(n + 5)?,
                row.try_get(n + 6)?,
            );
            out.push((key, sums));
        }
        Ok::<_, StoreError>(out)
    })?;
    // No rollup rows: one all-zero row without groups.
    Ok(rows.into_iter().filter(|(_, sums)| sums.0 > 0).collect())
}

/// `(group, bucket floor, count)` of whole days `[first_day, end_day)`.
pub(super) async fn latency_histogram(
    store: &Store,
    team: &str,
    first_day: i64,
    end_day: i64,
    dims: &[Dimension],
) -> Result<Vec<(Vec<String>, i64, u64)>, StoreError> {
    let (select, group_by) = dimension_sql(dims, "day");
    let group_by = if group_by.is_empty() {
        "floor_ms".to_owned()
    } else {
        format!("{group_by}, floor_ms")
    };
    let sql = format!(
        "SELECT {select}floor_ms, CAST(SUM(count) AS BIGINT) FROM usage_latency_rollup \
         WHERE team_id = $1 AND day >= $2 AND day < $3 GROUP BY {group_by}"
    );
    let n = dims.len();
    let rows = on_store!(store, |pool| {
        use sqlx::Row;
        // Audited: the only dynamic parts are `Dimension::column` constants.
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(team)
            .bind(first_day)
            .bind(end_day)
            .fetch_all(pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let key = (0..n)
                .map(|i| row.try_get::<String, _>(i))
                .collect::<Result<Vec<_>, _>>()?;
            let count: i64 = row.try_get(n + 1)?;
            out.push((key, row.try_get(n)?, u64::try_from(count).unwrap_or(0)));
        }
        Ok::<_, StoreError>(out)
    })?;
    Ok(rows)
}

/// Hands `each` every record of `[start_ms, end_ms)` with its group as rows
/// arrive: a busy team's day is many records, and only sums are kept.
pub(super) async fn records(
    store: &Store,
    team: &str,
    start_ms: i64,
    end_ms: i64,
    dims: &[Dimension],
    mut each: impl FnMut(Vec<String>, SumRow),
) -> Result<(), StoreError> {
    use futures::TryStreamExt;
    let (select, _) = dimension_sql(dims, Dimension::Day.column());
    let sql = format!(
        "SELECT {select}latency_ms, input_tokens, output_tokens, CAST(COALESCE(cost_micros, 0) AS BIGINT), \
         CAST(CASE WHEN outcome = 'ok' THEN 0 ELSE 1 END AS BIGINT), degraded, \
         CAST(CASE WHEN cost_micros IS NULL THEN 1 ELSE 0 END AS BIGINT) \
         FROM usage_records WHERE team_id = $1 AND created_at_ms >= $2 AND created_at_ms < $3"
    );
    let n = dims.len();
    on_store!(store, |pool| {
        use sqlx::Row;
        // Audited: the only dynamic parts are `Dimension::column` constants.
        let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(team)
            .bind(start_ms)
            .bind(end_ms)
            .fetch(pool);
        while let Some(row) = rows.try_next().await? {
            let key = (0..n)
                .map(|i| row.try_get::<String, _>(i))
                .collect::<Result<Vec<_>, _>>()?;
            let sums: SumRow = (
                row.try_get(n)?,
                row.try_get(n + 1)?,
                row.try_get(n + 2)?,
                row.try_get(n + 3)?,
                row.try_get::<i64, _>(n + 4)?,
                row.try_get(n + 5)?,
                row.try_get::<i64, _>(n + 6)?,
            );
            each(key, sums);
        }
    });
    Ok(())
}
