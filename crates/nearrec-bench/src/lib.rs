//! The limits a benchmark compares itself against, measured in the same run as the systems under
//! test (numbers from another day or machine are not comparable here: runs vary by ±20 %), and
//! the naive baselines that are not another project's code.

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
