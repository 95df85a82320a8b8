//! The request and its answer. A [`Batch`] of [`TableLookup`]s — per table the indices, how they
//! split into bags (offsets, lengths, or a fixed bag size), optional per-sample weights, the
//! pooling mode and a padding index — is the one representation of a lookup from the caller to
//! the kernels (the engine's own type, borrowed from the caller's buffers). The engine validates
//! it once. [`OwnedBatch`] holds its buffers, for batches handed to a background pipeline;
//! anything that can lend a `Batch` ([`AsBatch`]) can be submitted. A trace file's bags become
//! owned batches with [`OwnedBatch::from_trace`] and [`OwnedBatch::trace_batches`], so that what
//! a plan was made from can be served as it was traced.

use std::ops::Range;

use nearrec_plan::TraceFile;

use crate::error::{Error, Result};

use nearrec_engine::Stages;
pub use nearrec_engine::{Bags, Batch, Indices, OutDtype, PoolingMode, TableLookup};

/// A batch whose buffers something owns, so that it can be sent to a background pipeline
/// ([`crate::Store::submit`], [`crate::Store::stream`]): an [`OwnedBatch`], or a binding's type
/// holding its caller's arrays.
pub trait AsBatch: Send + 'static {
    fn as_batch(&self) -> Batch<'_>;
}

/// Indices of either width, owned.
#[derive(Debug, Clone, PartialEq)]
pub enum IndexVec {
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl IndexVec {
    fn view(&self) -> Indices<'_> {
        match self {
            IndexVec::I32(v) => Indices::I32(v),
            IndexVec::I64(v) => Indices::I64(v),
        }
    }
}

impl From<Vec<i64>> for IndexVec {
    fn from(v: Vec<i64>) -> Self {
        IndexVec::I64(v)
    }
}

impl From<Vec<i32>> for IndexVec {
    fn from(v: Vec<i32>) -> Self {
        IndexVec::I32(v)
    }
}

/// How an owned table lookup's indices split into bags.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedBags {
    Offsets {
        offsets: IndexVec,
        include_last_offset: bool,
    },
    Lengths(IndexVec),
    Fixed {
        batch: usize,
        bag_size: usize,
    },
}

/// One table's part of an [`OwnedBatch`].
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedLookup {
    pub table: String,
    pub indices: IndexVec,
    pub bags: OwnedBags,
    pub per_sample_weights: Option<Vec<f32>>,
    pub mode: PoolingMode,
    pub padding_idx: Option<i64>,
}

impl OwnedLookup {
    /// Sum pooling of bags given by their lengths.
    pub fn with_lengths(
        table: impl Into<String>,
        indices: impl Into<IndexVec>,
        lengths: impl Into<IndexVec>,
    ) -> Self {
        Self {
            table: table.into(),
            indices: indices.into(),
            bags: OwnedBags::Lengths(lengths.into()),
            per_sample_weights: None,
            mode: PoolingMode::Sum,
            padding_idx: None,
        }
    }

    pub fn mode(mut self, mode: PoolingMode) -> Self {
        self.mode = mode;
        self
    }

    pub fn weights(mut self, weights: Vec<f32>) -> Self {
        self.per_sample_weights = Some(weights);
        self
    }

    fn view(&self) -> TableLookup<'_> {
        TableLookup {
            table: &self.table,
            indices: self.indices.view(),
            bags: match &self.bags {
                OwnedBags::Offsets {
                    offsets,
                    include_last_offset,
                } => Bags::Offsets {
                    offsets: offsets.view(),
                    include_last_offset: *include_last_offset,
                },
                OwnedBags::Lengths(l) => Bags::Lengths(l.view()),
                OwnedBags::Fixed { batch, bag_size } => Bags::Fixed {
                    batch: *batch,
                    bag_size: *bag_size,
                },
            },
            per_sample_weights: self.per_sample_weights.as_deref(),
            mode: self.mode,
            padding_idx: self.padding_idx,
        }
    }
}

/// A batch that owns its buffers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnedBatch {
    pub tables: Vec<OwnedLookup>,
    /// The dtype of the answer ([`Batch::out`]).
    pub out: OutDtype,
}

impl OwnedBatch {
    pub fn new(tables: Vec<OwnedLookup>) -> Self {
        Self {
            tables,
            out: OutDtype::F32,
        }
    }

    /// Bags `bags` (bag numbers of the trace, `start..stop`) of every table of `trace`: one
    /// sum-pooled lookup per table, in the trace's order, its ids copied out and its bags given
    /// as lengths (a trace's offsets count from its first bag, a batch's from its own).
    pub fn from_trace(trace: &TraceFile, bags: Range<u64>) -> Result<Self> {
        let total = trace.header().bags;
        if bags.start > bags.end || bags.end > total {
            return Err(Error::invalid(format!(
                "bags {}..{} of a trace of {total} bags",
                bags.start, bags.end
            )));
        }
        let (lo, hi) = (bags.start as usize, bags.end as usize);
        let tables = (0..trace.header().tables.len())
            .map(|i| {
                let t = trace.table(i);
                // (the trace file was checked when opened: offsets rise within its indices)
                let offsets = &t.offsets[lo..=hi];
                let ids = t.indices[offsets[0] as usize..offsets[hi - lo] as usize].to_vec();
                let lengths: Vec<i64> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
                OwnedLookup::with_lengths(t.entry.name.as_str(), ids, lengths)
            })
            .collect();
        Ok(Self::new(tables))
    }

    /// The whole of `trace` in batches of `batch_size` bags (the last one shorter), in order:
    /// what [`crate::Store::stream`] takes. `batch_size` 0 means the trace's own batch size.
    pub fn trace_batches(
        trace: &TraceFile,
        batch_size: u64,
    ) -> Result<impl Iterator<Item = OwnedBatch> + '_> {
        let size = match batch_size {
            0 => u64::from(trace.header().batch_size),
            n => n,
        };
        if size == 0 {
            return Err(Error::invalid(
                "batch_size must be at least 1 (the trace names none)",
            ));
        }
        let total = trace.header().bags;
        Ok((0..total.div_ceil(size)).map(move |k| {
            let bags = k * size..((k + 1) * size).min(total);
            Self::from_trace(trace, bags).expect("the batches lie inside the trace")
        }))
    }
}

impl AsBatch for OwnedBatch {
    fn as_batch(&self) -> Batch<'_> {
        Batch::new(self.tables.iter().map(OwnedLookup::view).collect()).with_out(self.out)
    }
}

/// The pooled output of a batch: `values` is the row-major `[batch, Σ dim]` matrix, tables in
/// request order (TorchRec's `KeyedTensor`); `tables` names each block and gives its width.
#[derive(Debug, Clone, PartialEq)]
pub struct Pooled {
    pub values: Vec<f32>,
    pub batch: usize,
    pub tables: Vec<(String, usize)>,
}

impl Pooled {
    /// Σ dim: the output's columns.
    pub fn width(&self) -> usize {
        self.tables.iter().map(|t| t.1).sum()
    }

    /// The values as `out` gives them back (`nearrec_kernels::out::round`), where they were
    /// pooled in fp32: what a router answers after merging its shards' answers.
    pub fn round_to(&mut self, out: OutDtype) {
        let widths: Vec<usize> = self.tables.iter().map(|t| t.1).collect();
        nearrec_kernels::out::round(&mut self.values, &widths, out);
    }

    /// Bag `bag`'s pooled vector of request `k` (its position in the batch).
    pub fn get(&self, bag: usize, k: usize) -> &[f32] {
        let at: usize = self.tables[..k].iter().map(|t| t.1).sum();
        let width = self.width();
        &self.values[bag * width + at..][..self.tables[k].1]
    }
}

/// A lookup's answer beside its values: the version every table was read at, and where the
/// time went where the implementation can tell (zero where it cannot: a remote store's is the
/// node's to count).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Read {
    pub version: u64,
    pub stages: Stages,
}

#[cfg(test)]
mod tests {
    use super::*;
    use nearrec_plan::{TableData, write_trace};

    /// A trace of 5 bags over two tables, bag `b` of table `t` holding `b % 3` ids.
    fn trace(dir: &std::path::Path) -> TraceFile {
        let mut data = Vec::new();
        for t in 0..2i64 {
            let (mut offsets, mut ids) = (vec![0i64], Vec::new());
            for b in 0..5i64 {
                ids.extend((0..b % 3).map(|j| 10 * t + b + j));
                offsets.push(ids.len() as i64);
            }
            data.push((offsets, ids));
        }
        let names = ["a", "b"];
        let tables: Vec<TableData<'_>> = data
            .iter()
            .zip(names)
            .map(|((offsets, ids), name)| TableData {
                name,
                rows: 100,
                pooling: 2,
                generator: None,
                first_reference_share: None,
                keys: false,
                offsets,
                indices: ids,
            })
            .collect();
        let path = dir.join("t.nrtrace");
        write_trace(&path, 2, 0, &tables, false).unwrap();
        TraceFile::open(&path).unwrap()
    }

    #[test]
    fn a_trace_range_becomes_its_bags_as_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace(dir.path());
        let b = OwnedBatch::from_trace(&trace, 1..4).unwrap();
        assert_eq!(b.tables.len(), 2);
        // bags 1, 2, 3 hold 1, 2, 0 ids; table b's ids are table a's plus 10
        assert_eq!(
            b.tables[0],
            OwnedLookup::with_lengths("a", vec![1i64, 2, 3], vec![1i64, 2, 0])
        );
        assert_eq!(b.tables[1].indices, IndexVec::I64(vec![11, 12, 13]));
        assert_eq!(b.as_batch().tables[1].table, "b");
        let empty = OwnedBatch::from_trace(&trace, 5..5).unwrap();
        assert_eq!(
            empty.tables[0].bags,
            OwnedBags::Lengths(IndexVec::I64(vec![]))
        );
        // past the trace's end, and backwards
        for (start, end) in [(3, 6), (4, 2)] {
            assert!(matches!(
                OwnedBatch::from_trace(&trace, start..end),
                Err(Error::InvalidRequest { .. })
            ));
        }
    }

    #[test]
    fn trace_batches_cover_the_trace_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let trace = trace(dir.path());
        // (batch size 0: the trace's own, 2)
        for (size, bounds) in [(2, &[0, 2, 4, 5][..]), (0, &[0, 2, 4, 5]), (9, &[0, 5])] {
            let got: Vec<OwnedBatch> = OwnedBatch::trace_batches(&trace, size).unwrap().collect();
            let want: Vec<OwnedBatch> = bounds
                .windows(2)
                .map(|w| OwnedBatch::from_trace(&trace, w[0]..w[1]).unwrap())
                .collect();
            assert_eq!(got, want, "batch size {size}");
        }
    }
}
