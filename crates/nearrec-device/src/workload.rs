//! What the simulated drive serves: a model's tables (where each row lives) and dense layers, and
//! batches of lookups in the engine's CSR form.

use nearrec_format::{DATA_OFFSET, DType, RowLayout};
use serde::{Deserialize, Serialize};

use crate::error::{DeviceError, Result};

/// One embedding table as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "TableShapeSpec")]
pub struct TableShape {
    pub name: String,
    pub rows: u64,
    pub dim: u32,
    /// How each row is encoded: it sets the row's bytes, hence rows per page and bytes moved.
    pub dtype: DType,
    /// Bytes of one stored row: the dtype's encoding (`DType::row_bytes`) unless a workload
    /// gives more (a row padded to a larger size).
    pub row_bytes: u32,
}

impl TableShape {
    /// A table of `rows` rows of `dim` values encoded as `dtype`.
    pub fn new(name: impl Into<String>, rows: u64, dim: u32, dtype: DType) -> Self {
        Self {
            name: name.into(),
            rows,
            dim,
            dtype,
            row_bytes: dtype.row_bytes(dim) as u32,
        }
    }
}

/// A table as a workload file gives it: `dtype` defaults to fp32, `row_bytes` to the dtype's.
#[derive(Deserialize)]
struct TableShapeSpec {
    name: String,
    rows: u64,
    dim: u32,
    #[serde(default)]
    dtype: Option<DType>,
    #[serde(default)]
    row_bytes: Option<u32>,
}

impl TryFrom<TableShapeSpec> for TableShape {
    type Error = String;

    fn try_from(s: TableShapeSpec) -> std::result::Result<Self, String> {
        let mut t = TableShape::new(s.name, s.rows, s.dim, s.dtype.unwrap_or(DType::Fp32));
        if let Some(b) = s.row_bytes {
            if u64::from(b) < t.dtype.row_bytes(t.dim) {
                return Err(format!(
                    "table {}: {b} bytes a row cannot hold {} {} values ({} bytes)",
                    t.name,
                    t.dim,
                    t.dtype,
                    t.dtype.row_bytes(t.dim)
                ));
            }
            t.row_bytes = b;
        }
        Ok(t)
    }
}

/// How rows sit in a table file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RowPlacement {
    /// nearrec's store layout: rows packed into 4 KiB blocks after a 4 KiB header.
    #[default]
    Packed,
    /// One row per flash page, as RecSSD's evaluation assumes ("a single embedding vector per
    /// SSD page of 16KB").
    OnePerPage,
}

/// A model as the drive sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub tables: Vec<TableShape>,
    /// Bottom MLP widths, input first (empty: none).
    pub bottom: Vec<usize>,
    /// Top MLP widths, its input (the interaction's output) first.
    pub top: Vec<usize>,
    #[serde(default)]
    pub placement: RowPlacement,
}

impl Workload {
    pub fn validate(&self) -> Result<()> {
        if self.tables.is_empty() {
            return Err(DeviceError::Config(
                "a workload needs at least one table".into(),
            ));
        }
        for t in &self.tables {
            if t.rows == 0 || t.dim == 0 || t.row_bytes == 0 {
                return Err(DeviceError::Config(format!(
                    "table {}: rows, dim and row bytes must be positive",
                    t.name
                )));
            }
        }
        Ok(())
    }

    fn layout(&self, t: &TableShape) -> RowLayout {
        RowLayout::new(t.rows, u64::from(t.row_bytes), 4096)
    }

    /// Byte offset of `row` of table `table` in its file.
    pub fn row_offset(&self, table: usize, row: u64, page_bytes: u64) -> u64 {
        let t = &self.tables[table];
        match self.placement {
            RowPlacement::Packed => DATA_OFFSET + self.layout(t).row_offset(row),
            RowPlacement::OnePerPage => DATA_OFFSET.max(page_bytes) + row * page_bytes,
        }
    }

    /// Bytes of each table's file.
    pub fn file_lens(&self, page_bytes: u64) -> Vec<u64> {
        self.tables
            .iter()
            .map(|t| match self.placement {
                RowPlacement::Packed => DATA_OFFSET + self.layout(t).data_bytes(),
                RowPlacement::OnePerPage => DATA_OFFSET.max(page_bytes) + t.rows * page_bytes,
            })
            .collect()
    }

    /// Pooled floats per sample (Σ dim).
    pub fn pooled_width(&self) -> usize {
        self.tables.iter().map(|t| t.dim as usize).sum()
    }

    /// Multiply-adds of the dense layers for one sample.
    pub fn mlp_macs(&self) -> u64 {
        let pairs = |w: &[usize]| w.windows(2).map(|p| (p[0] * p[1]) as u64).sum::<u64>();
        pairs(&self.bottom) + pairs(&self.top)
    }

    /// Bytes of the dense layers' fp32 weights.
    pub fn mlp_weight_bytes(&self) -> u64 {
        4 * self.mlp_macs()
    }

    /// Dense layers (bottom and top), for fixed per-call costs.
    pub fn mlp_layers(&self) -> usize {
        self.bottom.len().saturating_sub(1) + self.top.len().saturating_sub(1)
    }
}

/// One table's lookups in a batch: `offsets` (bags + 1, ascending) into `indices`.
#[derive(Debug, Clone, Copy)]
pub struct TableBatch<'a> {
    pub indices: &'a [i64],
    pub offsets: &'a [i64],
}

impl TableBatch<'_> {
    pub fn bags(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
}

/// Checks a batch against the workload: one entry per table, equal bag counts, offsets that
/// describe `indices`, every index a row of its table. Errors name the table and position.
pub fn check_batch(w: &Workload, batch: &[TableBatch<'_>]) -> Result<usize> {
    let bad = |t: usize, reason: String| {
        Err(DeviceError::Request {
            table: w
                .tables
                .get(t)
                .map_or_else(|| format!("#{t}"), |s| s.name.clone()),
            reason,
        })
    };
    if batch.len() != w.tables.len() {
        return bad(
            batch.len().min(w.tables.len()),
            format!(
                "the batch has {} tables, the workload {}",
                batch.len(),
                w.tables.len()
            ),
        );
    }
    let bags = batch[0].bags();
    for (t, b) in batch.iter().enumerate() {
        if b.bags() != bags {
            return bad(t, format!("{} bags where table 0 has {bags}", b.bags()));
        }
        let ok_offsets = b.offsets.first() == Some(&0)
            && b.offsets
                .last()
                .is_some_and(|&e| e as usize == b.indices.len())
            && b.offsets.windows(2).all(|p| p[0] <= p[1]);
        if !ok_offsets {
            return bad(
                t,
                "offsets must rise from 0 to the number of indices".into(),
            );
        }
        let rows = w.tables[t].rows;
        if let Some(i) = b.indices.iter().position(|&r| r < 0 || r as u64 >= rows) {
            return bad(
                t,
                format!(
                    "index {} at position {i} is outside 0..{rows}",
                    b.indices[i]
                ),
            );
        }
    }
    Ok(bags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(json: &str) -> std::result::Result<TableShape, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn a_row_takes_its_dtypes_bytes_unless_given_more() {
        let t = table(r#"{"name": "t", "rows": 10, "dim": 32}"#).unwrap();
        assert_eq!((t.dtype, t.row_bytes), (DType::Fp32, 128));
        let t = table(r#"{"name": "t", "rows": 10, "dim": 32, "dtype": "int8"}"#).unwrap();
        assert_eq!((t.dtype, t.row_bytes), (DType::Int8, 40));
        let t = table(r#"{"name": "t", "rows": 10, "dim": 32, "dtype": "fp16"}"#).unwrap();
        assert_eq!(t.row_bytes, 64);
        let t = table(r#"{"name": "t", "rows": 10, "dim": 32, "row_bytes": 256}"#).unwrap();
        assert_eq!(t.row_bytes, 256);
        let err = table(r#"{"name": "emb", "rows": 10, "dim": 32, "row_bytes": 100}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("table emb") && err.contains("128 bytes"),
            "{err}"
        );
        // what a workload writes, it reads back
        let t = TableShape::new("t", 10, 24, DType::Bf16);
        assert_eq!(table(&serde_json::to_string(&t).unwrap()).unwrap(), t);
    }
}
