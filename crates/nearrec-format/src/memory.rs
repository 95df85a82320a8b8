//! How much memory this process may take (every layer that allocates by a caller's numbers
//! checks against it): physical memory, narrowed by its cgroup's limit (v1
//! or v2). Budgets and whole-table loads are checked against it before anything is allocated,
//! so a store too large for the host is a typed error, not an abort in the allocator.

use std::path::{Path, PathBuf};

/// This process's memory, in bytes, as the kernel reports it at the moment of the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// The most it can ever have: physical memory, or its cgroup's limit if lower.
    pub limit: u64,
    /// What it can take now: the kernel's `MemAvailable` (free plus reclaimable page cache), or
    /// what is left under the cgroup's limit (not counting reclaimable page cache) if lower.
    pub available: u64,
}

impl Memory {
    /// Reads `/proc/meminfo` and the process's memory cgroup.
    pub fn probe() -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib.saturating_mul(1024))
        };
        let physical = field("MemTotal").unwrap_or_else(physical_bytes);
        let mut memory = Self {
            limit: physical,
            available: field("MemAvailable").unwrap_or(physical),
        };
        if let Some(cg) = cgroup() {
            memory.limit = memory.limit.min(cg.limit);
            memory.available = memory
                .available
                .min(cg.limit.saturating_sub(cg.used))
                .min(memory.limit);
        }
        memory
    }

    /// `Err(Shortfall)` unless `bytes` for `what` fit what is available now.
    pub fn check(&self, what: impl FnOnce() -> String, bytes: u64) -> Result<(), Shortfall> {
        if bytes <= self.available {
            return Ok(());
        }
        Err(Shortfall {
            what: what(),
            asked: bytes,
            available: self.available,
            limit: self.limit,
        })
    }
}

/// Something needs more memory than the process can have now (each layer's error type wraps it:
/// `EngineError::InsufficientMemory`, `PlanError::InsufficientMemory`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} needs {} of memory, but {} is available now (this process may have at most {})",
    size(*asked), size(*available), size(*limit)
)]
pub struct Shortfall {
    pub what: String,
    pub asked: u64,
    pub available: u64,
    pub limit: u64,
}

/// Bytes for people: `1.5 GiB`, `512 B`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn physical_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGE_SIZE),
        )
    };
    (pages.max(0) as u64).saturating_mul(page.max(0) as u64)
}

/// A memory cgroup's limit and the memory its processes hold that cannot be reclaimed.
struct Cgroup {
    limit: u64,
    used: u64,
}

/// The memory cgroup this process is in, if it has a limit: v2 (`memory.max`) or v1
/// (`memory.limit_in_bytes`), found through `/proc/self/cgroup`.
fn cgroup() -> Option<Cgroup> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            // v2: one unified hierarchy
            if let Some(cg) = read_cgroup(&Path::new("/sys/fs/cgroup").join(rel), true) {
                return Some(cg);
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            // v1: inside a container the process's own group is often mounted as the root
            for dir in [
                Path::new("/sys/fs/cgroup/memory").join(rel),
                PathBuf::from("/sys/fs/cgroup/memory"),
            ] {
                if let Some(cg) = read_cgroup(&dir, false) {
                    return Some(cg);
                }
            }
        }
    }
    None
}

fn read_cgroup(dir: &Path, v2: bool) -> Option<Cgroup> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (limit, usage, inactive) = if v2 {
        (
            read("memory.max")?,
            read("memory.current")?,
            "inactive_file ",
        )
    } else {
        (
            read("memory.limit_in_bytes")?,
            read("memory.usage_in_bytes")?,
            "total_inactive_file ",
        )
    };
    // "max" (v2), or a page-rounded i64::MAX (v1): no limit
    let limit = limit.trim().parse::<u64>().ok()?;
    if limit >= 1 << 60 {
        return None;
    }
    let usage = usage.trim().parse::<u64>().ok()?;
    let reclaimable = read("memory.stat")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(inactive)?.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    Some(Cgroup {
        limit,
        used: usage.saturating_sub(reclaimable),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_sees_this_machine() {
        let m = Memory::probe();
        assert!(m.limit > 0 && m.available > 0 && m.available <= m.limit);
        assert!(m.limit <= physical_bytes());
    }

    #[test]
    fn a_check_above_what_is_available_names_both() {
        let m = Memory {
            limit: 8 << 30,
            available: 4 << 30,
        };
        assert!(m.check(|| "x".into(), 4 << 30).is_ok());
        let e = m
            .check(|| "loading table \"t\"".into(), 5 << 30)
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("table \"t\"") && text.contains("5.0 GiB") && text.contains("4.0 GiB")
        );
    }
}
