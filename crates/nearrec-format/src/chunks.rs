//! Stores stream in chunks: the writer encodes and writes a table [`CHUNK_BYTES`] at a time and
//! the reader verifies it the same way, so neither holds a table in memory, and both report each
//! chunk to a [`ProgressFn`]. (Here, below both, so that the reader does not depend on the
//! writer for two shared names.)

use std::sync::Arc;

/// Target size of one streaming chunk, in bytes.
pub const CHUNK_BYTES: u64 = 16 << 20;

/// Called with the number of bytes just written (or verified); used for progress bars.
pub type ProgressFn = Arc<dyn Fn(u64) + Send + Sync>;
