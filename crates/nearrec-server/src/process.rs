//! The node process's own state for `/metrics`, under the names every Prometheus exporter gives
//! it (`process_resident_memory_bytes`, `process_open_fds`, ...): read from `/proc/self` at
//! each scrape, so a dashboard built for any exporter reads the node's.

use std::time::{SystemTime, UNIX_EPOCH};

/// One reading of the process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Process {
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub open_fds: f64,
    pub max_fds: f64,
    pub threads: f64,
    pub cpu_seconds: f64,
    pub start_time_seconds: f64,
}

impl Process {
    /// This process now (`None` where `/proc` cannot be read).
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // the fields after the command (which may hold spaces), from field 3 on
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        // SAFETY: sysconf has no preconditions
        let (tick, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as f64,
            )
        };
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
        });
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("Max open files"))?;
                line.split_whitespace().nth(3)?.parse::<f64>().ok()
            })
            .unwrap_or(0.0);
        Some(Self {
            cpu_seconds: (field(14)? + field(15)?) / tick,
            threads: field(20)?,
            start_time_seconds: boot.unwrap_or(0.0) + field(22)? / tick,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)? * page,
            open_fds,
            max_fds,
        })
    }
}

/// Seconds since the epoch, now.
pub fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_reads_as_ps_would() {
        let p = Process::read().expect("/proc is mounted");
        assert!(
            p.resident_bytes > 1e6 && p.virtual_bytes >= p.resident_bytes,
            "{p:?}"
        );
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let with_one_more = Process::read().unwrap().open_fds;
        drop(file);
        assert!(with_one_more >= 3.0 && p.max_fds >= with_one_more, "{p:?}");
        assert!(p.threads >= 1.0 && p.cpu_seconds >= 0.0);
        let age = now_seconds() - p.start_time_seconds;
        assert!((0.0..3600.0).contains(&age), "started {age} s ago");
    }
}
