//! Keys of keyed tables (format version 5): the raw 64-bit feature id of each row.
//!
//! A keyed table's rows are addressed by keys, not by position. Its data file holds a row of
//! zeros first (row 0: what a key the table does not hold pools as under the `"zero"` policy),
//! then one row per key; `table-NNNN.keys` holds the keys of rows `1 ..= rows - 1` in order,
//! little-endian `u64`s, no header — the manifest's `keys.crc32c` is the file's CRC-32C and its
//! size is fixed by `rows`. Keys are distinct. Readers build their index of keys to rows from
//! the file at open (`nearrec_cache::KeyIndex`); lookups name keys, and row numbers stay inside.

use serde::{Deserialize, Serialize};

/// How the manifest names a keyed table's keys file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysMeta {
    /// File name relative to the store directory.
    pub file: String,
    pub crc32c: u32,
}

/// The row a keyed table keeps zeros in (its keys' rows follow it).
pub const ZERO_ROW: u64 = 0;

/// `keys` as the keys file holds them.
pub fn encode(keys: &[u64]) -> Vec<u8> {
    keys.iter().flat_map(|k| k.to_le_bytes()).collect()
}

/// The keys a keys file's bytes hold (`bytes.len()` a multiple of 8, checked by the caller).
pub fn decode(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}
