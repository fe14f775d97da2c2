//! Cold start: process start → first SERVING answer of
//! `grpc.health.v1.Health/Check`, on a new SQLite file (created and
//! migrated during start-up), then on the same file again.

use crate::{bench::Bench, report::ColdStart, server::Metering};

/// `--coldstart-runs` launches of each kind.
pub async fn run(bench: &mut Bench) {
    let mut times = ColdStart::default();
    for i in 0..bench.settings.coldstart_runs {
        let file = bench.settings.dir.join(format!("coldstart-{i}.db"));
        for fresh in [true, false] {
            let purpose = if fresh {
                "cold start (new db)"
            } else {
                "cold start (existing db)"
            };
            let Some(live) = bench
                .start(Metering::Sqlite, 0, purpose, Some(file.clone()))
                .await
            else {
                continue;
            };
            let ms = live.server.cold_start.as_secs_f64() * 1000.0;
            if fresh {
                times.fresh_db_ms.push(ms);
            } else {
                times.existing_db_ms.push(ms);
            }
            bench.stop(live).await;
        }
    }
    bench.results.cold_start = times;
}
