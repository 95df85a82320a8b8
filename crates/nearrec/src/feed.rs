//! Training feeds (`docs/live.md`): a table's rows as a trainer has them now, written into a
//! live store where they differ from what it serves.

use crate::error::{Error, Result};
use crate::live::{RowWrite, WriteOptions};
use crate::store::Store;

/// Rows compared and written per write call of [`Store::sync_table`].
const CHUNK_ROWS: usize = 16 << 10;

/// What [`Store::sync_table`] did.
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

impl Store {
    /// Writes the rows of `table` that differ from `values` (the whole table, `rows × dim`
    /// float32, as a trainer holds it) by more than `tolerance` in any value, comparing what
    /// the store would store — each new row encoded in the table's dtype — with what it
    /// serves, so that an fp16 or int8 table is not rewritten for its rounding. The rows go in
    /// calls of 16,384 at most, each atomic and durable; a call that finds the delta full
    /// waits for compaction as any write does.
    pub fn sync_table(&self, table: &str, values: &[f32], tolerance: f32) -> Result<Synced> {
        let meta = self.table(table)?;
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
            version: self.version(),
            ..Synced::default()
        };
        let (mut served, mut stored) = (Vec::new(), vec![0f32; dim]);
        let mut encoded = vec![0u8; meta.row_bytes as usize];
        for first in (0..rows).step_by(CHUNK_ROWS) {
            let ids: Vec<i64> = (first..(first + CHUNK_ROWS).min(rows))
                .map(|r| r as i64)
                .collect();
            served.resize(ids.len() * dim, 0.0);
            self.read_rows(table, &ids, &mut served)?;
            let mut changed = Vec::new();
            let mut new = Vec::new();
            for (k, &id) in ids.iter().enumerate() {
                let row = &values[id as usize * dim..][..dim];
                meta.dtype.encode_row(row, &mut encoded);
                meta.dtype.decode_row(&encoded, &mut stored);
                let now = &served[k * dim..][..dim];
                // past the tolerance, or NaN on one side only
                let differs =
                    |(a, b): (&f32, &f32)| (a - b).abs() > tolerance || a.is_nan() != b.is_nan();
                if stored.iter().zip(now).any(differs) {
                    changed.push(id);
                    new.extend_from_slice(row);
                }
            }
            done.compared += ids.len() as u64;
            if !changed.is_empty() {
                let w = RowWrite {
                    table,
                    ids: &changed,
                    values: Some(&new),
                };
                done.version = self.write_many(&[w], WriteOptions::default())?;
                done.written += changed.len() as u64;
                done.calls += 1;
            }
        }
        Ok(done)
    }
}
