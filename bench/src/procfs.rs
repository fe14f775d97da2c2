//! Facts from `/proc`: a process's CPU time and memory (so the numbers are
//! the server's alone, not the load generator's), PostgreSQL backends' CPU,
//! and the machine the run happened on.

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// User + system CPU seconds of a process (`pid` or `"self"`), threads included.
pub fn cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    stat_cpu_seconds(&stat).ok_or_else(|| anyhow::anyhow!("unexpected /proc/{pid}/stat format"))
}

fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name may contain spaces: fields start after the last ')'.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // Field 3 (state) is index 0 here; utime is field 14, stime field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_second())
}

/// Resident memory of a process, MiB: `(now, peak)` (VmRSS, VmHWM).
pub fn memory_mb(pid: &str) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    match (field("VmRSS:"), field("VmHWM:")) {
        (Some(rss), Some(hwm)) => Ok((rss, hwm)),
        _ => anyhow::bail!("no VmRSS/VmHWM in /proc/{pid}/status"),
    }
}

/// CPU seconds of the PostgreSQL backends connected to database `db` (found
/// by their process title). Background writers are not included.
pub fn postgres_backends_cpu(db: &str) -> f64 {
    let needle = format!(" {db} ");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .is_ok_and(|c| c.starts_with("postgres:") && c.contains(&needle))
        })
        .filter_map(|pid| cpu_seconds(&pid).ok())
        .sum()
}

/// The machine a run happened on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// Logical CPUs available to the process.
    pub cores: usize,
    /// `/proc/cpuinfo` model name.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Total memory, MiB.
    pub mem_total_mb: f64,
    /// 1/5/15-minute load averages when the run started.
    pub load_avg_at_start: [f64; 3],
}

/// 1/5/15-minute load averages now.
pub fn load_avg() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = text
        .split_whitespace()
        .map(|v| v.parse::<f64>().unwrap_or(0.0));
    [
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
    ]
}

/// Facts about this machine.
pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|v| v.split_once(':'))
        .map_or_else(|| "unknown".to_owned(), |(_, m)| m.trim().to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total_mb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0);
    Machine {
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned()),
        mem_total_mb,
        load_avg_at_start: load_avg(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_the_name() {
        let stat =
            "1234 (tokio runtime) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100 0 0";
        let secs = stat_cpu_seconds(stat).unwrap();
        assert!((secs - 300.0 / ticks_per_second()).abs() < 1e-9);
        assert!(cpu_seconds("self").unwrap() >= 0.0);
        let (rss, hwm) = memory_mb("self").unwrap();
        assert!(rss > 0.0 && hwm >= rss);
    }
}
