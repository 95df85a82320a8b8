//! The limits a benchmark compares itself against, measured in the same run as the systems under
//! test (numbers from another day or machine are not comparable here: runs vary by ±20 %), and
//! the naive baselines that are not another project's code. No engine logic: it may link
//! nothing above `nearrec-io` (`scripts/check_layers.py`), so a limit never measures the engine
//! it bounds. Only the benchmarks' extension (`nearrec-bench-py`) links it.
//!
//! - `memory.rs`: streaming read and random row gather, on the same huge-page buffers and
//!   prefetch the engine uses;
//! - `disk.rs`: sequential write (buffered, then fsync, as the store writer writes) and random
//!   reads at a queue depth (`nearrec_io::measure_read_rate`);
//! - `naive.rs`: the naive SSD baseline, one synchronous `O_DIRECT` pread per lookup then
//!   pooling on the host (RM-SSD's C++ SLS);
//! - `mapped.rs`: RM-SSD's SSD-S, the table files memory-mapped and pooled on the host (run by
//!   `nearrec bench cache` inside a memory cgroup).

mod disk;
mod mapped;
mod memory;
mod naive;

pub use disk::{random_read, sequential_write};
pub use mapped::{MappedBags, MappedStore};
pub use memory::{gather_rows, stream_read};
pub use naive::pread_sls;

/// One measured limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// Bytes moved per second.
    pub bytes_per_s: f64,
    /// Items (rows, chunks) per second.
    pub items_per_s: f64,
    pub seconds: f64,
}
