//! Keys of keyed tables (format version 5): the raw 64-bit feature ids a table's rows hold.
//!
//! A keyed table's rows are addressed by keys, not by position. Its data file holds a row of
//! zeros first (row 0: what a key the table does not hold pools as under the `"zero"` policy),
//! then the keys' rows, and possibly rows no key holds yet (room for keys to come: a live store
//! gives a new key a free row). `table-NNNN.keys` lists each key with its row — `count`
//! entries of a little-endian `u64` key and `u32` row, no header; the manifest's `keys` gives
//! the file's CRC-32C and `count`. Keys are distinct, and so are their rows, each in
//! `1..rows`. Readers build their index of keys to rows from the file at open
//! (`nearrec_cache::KeyIndex`); lookups name keys, and row numbers stay inside.

use serde::{Deserialize, Serialize};

/// How the manifest names a keyed table's keys file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysMeta {
    /// File name relative to the store directory.
    pub file: String,
    pub crc32c: u32,
    /// Keys the table holds (entries in the file).
    pub count: u64,
    /// Row 0 is the table's default row as given by its builder (a TorchRec managed-collision
    /// module's default slot), not zeros.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

/// The row a keyed table keeps zeros in.
pub const ZERO_ROW: u64 = 0;
/// Bytes of one entry of a keys file: the key, then its row.
pub const ENTRY_BYTES: usize = 12;

/// One key and the row that holds it.
pub type KeyRow = (u64, u32);

/// `entries` as the keys file holds them.
pub fn encode(entries: &[KeyRow]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for &(key, row) in entries {
        out.extend_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&row.to_le_bytes());
    }
    out
}

/// The entries of a keys file's bytes of a table of `rows` rows: `Err` says why they are not
/// (a size that is not whole entries, a row out of `1..rows`).
pub fn decode(bytes: &[u8], rows: u64) -> Result<Vec<KeyRow>, String> {
    if !bytes.len().is_multiple_of(ENTRY_BYTES) {
        return Err(format!(
            "the keys file is {} bytes, not whole {ENTRY_BYTES}-byte entries",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(ENTRY_BYTES)
        .enumerate()
        .map(|(i, e)| {
            let key = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
            let row = u32::from_le_bytes(e[8..].try_into().expect("4 bytes"));
            if row == 0 || u64::from(row) >= rows {
                return Err(format!(
                    "entry {i} gives key {key} row {row}, not a key's row of {rows} rows"
                ));
            }
            Ok((key, row))
        })
        .collect()
}
