//! Verbs made of other verbs, written once for every implementation: a row's digest, the
//! digests of a table's rows read through the core, and a training feed's table written where
//! it differs ([`crate::Writes::sync_table`]).

use super::{StoreApi, Writes};
use crate::error::{Error, Result};
use crate::live::{RowValues, RowWrite, WriteOptions};

/// Rows compared and written per write call of [`Writes::sync_table`].
const CHUNK_ROWS: usize = 16 << 10;

/// What [`Writes::sync_table`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synced {
    /// Rows compared.
    pub compared: u64,
    /// Rows that differed, written.
    pub written: u64,
    /// Write calls made (each atomic and durable).
    pub calls: u64,
    /// The store's version after the last of them.
    pub version: u64,
}

/// The most rows one [`StoreApi::row_digests`] call digests (a node answers 8 bytes a row).
pub const MAX_DIGEST_ROWS: u64 = 1 << 20;

/// A row's digest: xxh3-64 of its float32 values' bits, every NaN taken as one NaN and `-0.0`
/// as `0.0`, so that two rows have one digest exactly when they are equal value by value (as
/// [`Writes::sync_table`] compares them with no tolerance).
pub fn row_digest(row: &[f32]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    for &v in row {
        let canonical = if v.is_nan() {
            f32::NAN
        } else if v == 0.0 {
            0.0
        } else {
            v
        };
        hasher.update(&canonical.to_bits().to_le_bytes());
    }
    hasher.digest()
}

/// Whether rows `first .. first + count` of `table` (of `rows` rows) may be asked for their
/// digests in one call: within the table, at most [`MAX_DIGEST_ROWS`]; else `InvalidRequest`
/// naming the table. Every implementation of [`StoreApi::row_digests`] checks this.
pub fn check_digest_rows(table: &str, rows: u64, first: u64, count: u64) -> Result<()> {
    let end = first.checked_add(count).filter(|&e| e <= rows);
    if count > MAX_DIGEST_ROWS || end.is_none() {
        return Err(Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!(
                "rows {first} + {count} are not within its {rows} rows, at most {MAX_DIGEST_ROWS} a call"
            ),
        });
    }
    Ok(())
}

/// [`StoreApi::row_digests`] from the rows as `store` reads them.
pub(crate) fn row_digests<S: StoreApi + ?Sized>(
    store: &S,
    table: &str,
    first: u64,
    count: u64,
) -> Result<Vec<u64>> {
    let meta = store.table(table)?;
    check_digest_rows(table, meta.rows, first, count)?;
    let dim = meta.dim as usize;
    let ids: Vec<i64> = (first..first + count).map(|r| r as i64).collect();
    let mut rows = vec![0f32; ids.len() * dim];
    store.read_rows(table, &ids, &mut rows)?;
    Ok(rows.chunks_exact(dim.max(1)).map(row_digest).collect())
}

/// [`Writes::sync_table`] on any implementation: the rows of `table` that differ from
/// `values` (the whole table, `rows × dim` float32, as a trainer holds it) by more than
/// `tolerance` in any value are written, comparing what the store would store — each new row
/// encoded in the table's dtype — with what it serves, so that an fp16 or int8 table is not
/// rewritten for its rounding. Rows are compared by digest first ([`StoreApi::row_digests`],
/// computed where the rows are): equal digests are equal rows; with a tolerance, the rows whose
/// digests differ are read and compared value by value. The rows go in calls of 16,384 at
/// most, each atomic and durable; a call that finds the delta full waits for compaction as
/// any write does.
pub(crate) fn sync_table<S: Writes + ?Sized>(
    store: &S,
    table: &str,
    values: &[f32],
    tolerance: f32,
) -> Result<Synced> {
    let meta = store.table(table)?;
    let (rows, dim) = (meta.rows as usize, meta.dim as usize);
    if values.len() != rows * dim {
        return Err(Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!(
                "the table has {rows} rows × dim {dim} = {} values, not {}",
                rows * dim,
                values.len()
            ),
        });
    }
    if !(tolerance >= 0.0 && tolerance.is_finite()) {
        return Err(Error::invalid(format!(
            "tolerance must be a finite number ≥ 0, not {tolerance}"
        )));
    }
    let mut done = Synced {
        version: store.version()?,
        ..Synced::default()
    };
    let (mut stored, mut served) = (vec![0f32; dim], Vec::new());
    let mut encoded = vec![0u8; meta.dtype.row_bytes(meta.dim) as usize];
    for first in (0..rows).step_by(CHUNK_ROWS) {
        let count = CHUNK_ROWS.min(rows - first);
        let theirs = store.row_digests(table, first as u64, count as u64)?;
        // the rows whose digests differ, and what the store would store of each
        let (mut candidates, mut new) = (Vec::new(), Vec::new());
        for (k, &digest) in theirs.iter().enumerate() {
            let id = first + k;
            let row = &values[id * dim..][..dim];
            meta.dtype.encode_row(row, &mut encoded);
            meta.dtype.decode_row(&encoded, &mut stored);
            if row_digest(&stored) != digest {
                candidates.push(id as i64);
                new.extend_from_slice(&stored);
            }
        }
        let changed = if tolerance == 0.0 || candidates.is_empty() {
            candidates
        } else {
            served.resize(candidates.len() * dim, 0.0);
            store.read_rows(table, &candidates, &mut served)?;
            // past the tolerance, or NaN on one side only
            let differs =
                |(a, b): (&f32, &f32)| (a - b).abs() > tolerance || a.is_nan() != b.is_nan();
            candidates
                .iter()
                .enumerate()
                .filter(|&(k, _)| {
                    let (mine, now) = (&new[k * dim..][..dim], &served[k * dim..][..dim]);
                    mine.iter().zip(now).any(differs)
                })
                .map(|(_, &id)| id)
                .collect()
        };
        done.compared += count as u64;
        if !changed.is_empty() {
            let rows: Vec<f32> = changed
                .iter()
                .flat_map(|&id| &values[id as usize * dim..][..dim])
                .copied()
                .collect();
            let w = RowWrite {
                table,
                ids: &changed,
                values: Some(RowValues::F32(&rows)),
            };
            done.version = store.write_many(&[w], WriteOptions::default())?;
            done.written += changed.len() as u64;
            done.calls += 1;
        }
    }
    Ok(done)
}
