//! Facts from `/proc`, read with the `procfs` crate: a process's CPU time
//! and memory (so the numbers are the server's alone, not the load
//! generator's), PostgreSQL backends' CPU, and the machine the run happened
//! on.

use procfs::{Current, process::Process};
use serde::{Deserialize, Serialize};

/// User + system CPU seconds of process `pid`, threads included.
pub fn cpu_seconds(pid: i32) -> anyhow::Result<f64> {
    let stat = Process::new(pid)?.stat()?;
    Ok((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
}

/// Resident memory of process `pid`, MiB: `(now, peak)` (VmRSS, VmHWM).
pub fn memory_mb(pid: i32) -> anyhow::Result<(f64, f64)> {
    let status = Process::new(pid)?.status()?;
    match (status.vmrss, status.vmhwm) {
        (Some(rss), Some(hwm)) => Ok((rss as f64 / 1024.0, hwm as f64 / 1024.0)),
        _ => anyhow::bail!("no VmRSS/VmHWM for process {pid}"),
    }
}

/// CPU seconds of the PostgreSQL backends connected to database `db` (found
/// by their process title, `postgres: user db addr state`). Background
/// writers are not included.
pub fn postgres_backends_cpu(db: &str) -> f64 {
    let Ok(all) = procfs::process::all_processes() else {
        return 0.0;
    };
    all.filter_map(Result::ok)
        .filter(|p| {
            p.cmdline().is_ok_and(|args| {
                let title = args.join(" ");
                title.starts_with("postgres:") && title.split_whitespace().any(|w| w == db)
            })
        })
        .filter_map(|p| cpu_seconds(p.pid).ok())
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

/// 1/5/15-minute load averages now (zeros when unreadable).
pub fn load_avg() -> [f64; 3] {
    procfs::LoadAverage::current().map_or([0.0; 3], |l| [l.one, l.five, l.fifteen].map(f64::from))
}

/// Facts about this machine.
pub fn machine() -> Machine {
    let cpu_model = procfs::CpuInfo::current()
        .ok()
        .and_then(|c| c.model_name(0).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    Machine {
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model,
        // The release as the kernel names it (`procfs`'s `KernelVersion`
        // keeps only its three numbers).
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned()),
        mem_total_mb: procfs::Meminfo::current()
            .map_or(0.0, |m| m.mem_total as f64 / (1024.0 * 1024.0)),
        load_avg_at_start: load_avg(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_the_machine() {
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(cpu_seconds(me).unwrap() >= 0.0);
        let (rss, hwm) = memory_mb(me).unwrap();
        assert!(rss > 0.0 && hwm >= rss);
        let m = machine();
        assert!(m.cores > 0 && m.mem_total_mb > 0.0, "{m:?}");
        assert!(cpu_seconds(i32::MAX).is_err());
        // No backend of a database that does not exist.
        assert_eq!(postgres_backends_cpu("no_such_bench_db"), 0.0);
    }
}
