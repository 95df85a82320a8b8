//! Always-on accounting: counters and latency histograms, cheap enough for every batch
//! (relaxed atomics; a histogram record is one `fetch_add`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A latency histogram over microseconds: log2 buckets split 8 ways (≤ 12.5 % relative error),
/// from 1 µs to ~1 hour.
#[derive(Debug)]
pub struct Histogram {
    buckets: Vec<AtomicU64>,
}

const SUB: u64 = 8;
const LOG2_SUB: u32 = 3;

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: (0..(SUB * 34)).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Histogram {
    fn bucket(us: u64) -> usize {
        if us < SUB {
            return us as usize;
        }
        let exp = 63 - us.leading_zeros(); // ≥ LOG2_SUB
        let sub = (us >> (exp - LOG2_SUB)) - SUB;
        (((exp - LOG2_SUB + 1) as u64) * SUB + sub) as usize
    }

    /// The largest value in bucket `b` (what a percentile in that bucket reports).
    fn upper(b: usize) -> u64 {
        let b = b as u64;
        if b < SUB {
            return b;
        }
        let exp = b / SUB - 1 + u64::from(LOG2_SUB);
        let sub = b % SUB;
        ((SUB + sub + 1) << (exp - u64::from(LOG2_SUB))) - 1
    }

    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        let b = Self::bucket(us).min(self.buckets.len() - 1);
        self.buckets[b].fetch_add(1, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// The `q`-quantile (0..=1) in microseconds, or 0 with no samples.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::upper(b);
            }
        }
        Self::upper(counts.len() - 1)
    }
}

/// Where one batch's wall time went, as its caller saw it (the storage node times each request's
/// stages with it; [`IoStats`] keeps the SSD tier's across batches).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stages {
    /// Validation, de-duplication and read planning.
    pub route: Duration,
    /// Waiting for the device (zero when no row was read from it).
    pub io_wait: Duration,
    /// Pooling: the DRAM tiers' rows and the device's as they land.
    pub pool: Duration,
}

impl std::ops::Add for Stages {
    type Output = Stages;
    fn add(self, other: Stages) -> Stages {
        Stages {
            route: self.route + other.route,
            io_wait: self.io_wait + other.io_wait,
            pool: self.pool + other.pool,
        }
    }
}

/// Counters of the SSD tier since the store was opened.
#[derive(Debug, Default)]
pub struct IoStats {
    pub batches: AtomicU64,
    /// Lookups served from the SSD tier (padding excluded).
    pub lookups: AtomicU64,
    /// Distinct rows fetched (after de-duplication across bags and tables).
    pub unique_rows: AtomicU64,
    pub device_reads: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Bytes of the rows themselves: `unique_rows × row_bytes`.
    pub useful_bytes: AtomicU64,
    /// Reads avoided by de-duplication: `lookups − unique_rows`.
    pub reads_saved_dedup: AtomicU64,
    /// Reads avoided by merging rows that share or neighbour a block: `unique_rows − device_reads`.
    pub reads_saved_merge: AtomicU64,
    /// The most reads one batch issued. A batch submits all its reads at once, so the device
    /// queue holds `min(this, io_queue_depth)` of them in flight.
    pub max_batch_reads: AtomicU64,
    /// Reads whose bytes failed their sector checksum (each failed its batch with
    /// `EngineError::Corrupted`).
    pub corrupt_reads: AtomicU64,
    /// Validation, de-duplication and read planning.
    pub route: Histogram,
    /// Waiting for the device (the read call less the pooling done inside it).
    pub io_wait: Histogram,
    /// Pooling the rows as they land.
    pub pool: Histogram,
    /// A whole SSD batch.
    pub end_to_end: Histogram,
}

impl IoStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Every counter and each histogram's p50 / p95 / p99 / p99.9 in µs, by name.
    pub fn snapshot(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = [
            ("batches", &self.batches),
            ("lookups", &self.lookups),
            ("unique_rows", &self.unique_rows),
            ("device_reads", &self.device_reads),
            ("bytes_read", &self.bytes_read),
            ("useful_bytes", &self.useful_bytes),
            ("reads_saved_dedup", &self.reads_saved_dedup),
            ("reads_saved_merge", &self.reads_saved_merge),
            ("max_batch_reads", &self.max_batch_reads),
            ("corrupt_reads", &self.corrupt_reads),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.load(Relaxed) as f64))
        .collect();
        let (bytes, useful) = (
            self.bytes_read.load(Relaxed) as f64,
            self.useful_bytes.load(Relaxed) as f64,
        );
        out.push((
            "read_amplification".into(),
            if useful > 0.0 { bytes / useful } else { 0.0 },
        ));
        for (name, h) in [
            ("route", &self.route),
            ("io_wait", &self.io_wait),
            ("pool", &self.pool),
            ("end_to_end", &self.end_to_end),
        ] {
            for (q, label) in [(0.5, "p50"), (0.95, "p95"), (0.99, "p99"), (0.999, "p999")] {
                out.push((format!("{name}_{label}_us"), h.quantile_us(q) as f64));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_their_values_within_an_eighth() {
        for us in (0..5000u64).chain([1 << 20, 123_456_789]) {
            let b = Histogram::bucket(us);
            assert!(Histogram::upper(b) >= us, "{us}");
            assert!(b == 0 || Histogram::upper(b - 1) < us, "{us}");
            assert!(
                Histogram::upper(b) as f64 <= us as f64 * 1.125 + 1.0,
                "{us}"
            );
        }
    }

    #[test]
    fn quantiles() {
        let h = Histogram::default();
        assert_eq!(h.quantile_us(0.5), 0);
        for us in 1..=100 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.count(), 100);
        let p50 = h.quantile_us(0.5);
        assert!((50..=56).contains(&p50), "{p50}");
        let p99 = h.quantile_us(0.99);
        assert!((99..=111).contains(&p99), "{p99}");
    }
}
