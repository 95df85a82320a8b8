//! The request and its answer. A [`Batch`] of [`TableLookup`]s — per table the indices, how they
//! split into bags (offsets, lengths, or a fixed bag size), optional per-sample weights, the
//! pooling mode and a padding index — is the one representation of a lookup from the caller to
//! the kernels (the engine's own type, borrowed from the caller's buffers). The engine validates
//! it once. [`OwnedBatch`] holds its buffers, for batches handed to a background pipeline;
//! anything that can lend a `Batch` ([`AsBatch`]) can be submitted.

pub use nearrec_engine::{Bags, Batch, Indices, PoolingMode, TableLookup};

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
}

impl OwnedBatch {
    pub fn new(tables: Vec<OwnedLookup>) -> Self {
        Self { tables }
    }
}

impl AsBatch for OwnedBatch {
    fn as_batch(&self) -> Batch<'_> {
        Batch::new(self.tables.iter().map(OwnedLookup::view).collect())
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

    /// Bag `bag`'s pooled vector of request `k` (its position in the batch).
    pub fn get(&self, bag: usize, k: usize) -> &[f32] {
        let at: usize = self.tables[..k].iter().map(|t| t.1).sum();
        let width = self.width();
        &self.values[bag * width + at..][..self.tables[k].1]
    }
}
