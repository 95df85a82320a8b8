//! The request type shared by every tier and placement, and its validation.
//!
//! A [`Batch`] holds, per table, the indices of a batch of bags, how the indices split into bags
//! (offsets, lengths, or a fixed bag size for 2-D input), optional per-sample weights and the
//! pooling. Validation turns each into bag bounds the kernels use, or an error that names the table
//! and the position.

pub use nearrec_kernels::PoolingMode;
pub use nearrec_kernels::out::OutDtype;

use crate::error::{EngineError, Result};

/// Borrowed indices of either integer width (as numpy / torch callers hold them).
#[derive(Debug, Clone, Copy)]
pub enum Indices<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl<'a> Indices<'a> {
    pub fn len(&self) -> usize {
        match self {
            Indices::I32(s) => s.len(),
            Indices::I64(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Indices `range` of these.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Indices<'a> {
        match *self {
            Indices::I32(s) => Indices::I32(&s[range]),
            Indices::I64(s) => Indices::I64(&s[range]),
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> i64 {
        match self {
            Indices::I32(s) => i64::from(s[i]),
            Indices::I64(s) => s[i],
        }
    }
}

/// How a table's indices split into bags (as `torch.nn.EmbeddingBag` and TorchRec express it).
#[derive(Debug, Clone, Copy)]
pub enum Bags<'a> {
    /// Start position of each bag; with `include_last_offset` one more entry closes the last bag
    /// (indices after it are not part of any bag, as in PyTorch).
    Offsets {
        offsets: Indices<'a>,
        include_last_offset: bool,
    },
    /// Number of indices in each bag; they must add up to the number of indices.
    Lengths(Indices<'a>),
    /// `batch` bags of `bag_size` indices each (2-D `[batch, bag_size]` input; `bag_size` 0 is
    /// `batch` empty bags, as in PyTorch).
    Fixed { batch: usize, bag_size: usize },
}

/// The part of a request that concerns one table.
#[derive(Debug, Clone, Copy)]
pub struct TableLookup<'a> {
    pub table: &'a str,
    pub indices: Indices<'a>,
    pub bags: Bags<'a>,
    /// One weight per index; only with [`PoolingMode::Sum`].
    pub per_sample_weights: Option<&'a [f32]>,
    pub mode: PoolingMode,
    /// Rows equal to this are skipped (and not counted for mean). Negative counts from the end.
    pub padding_idx: Option<i64>,
}

impl<'a> TableLookup<'a> {
    /// A sum-pooled request with `offsets` (PyTorch's defaults otherwise).
    pub fn new(table: &'a str, indices: Indices<'a>, bags: Bags<'a>) -> Self {
        Self {
            table,
            indices,
            bags,
            per_sample_weights: None,
            mode: PoolingMode::Sum,
            padding_idx: None,
        }
    }

    pub fn with_mode(mut self, mode: PoolingMode) -> Self {
        self.mode = mode;
        self
    }

    pub fn with_weights(mut self, weights: &'a [f32]) -> Self {
        self.per_sample_weights = Some(weights);
        self
    }

    pub fn with_padding_idx(mut self, padding_idx: i64) -> Self {
        self.padding_idx = Some(padding_idx);
        self
    }

    /// Each bag's start in `indices`, and after the last the end of the last bag (`batch + 1`
    /// ascending positions): the bags as the engine reads them, or an error naming what is
    /// malformed (negative lengths, decreasing offsets, offsets past the end, …).
    pub fn bag_bounds(&self) -> Result<Vec<usize>> {
        let name = self.table;
        let n = self.indices.len();
        Ok(match self.bags {
            Bags::Fixed { batch, bag_size } => {
                if batch.checked_mul(bag_size) != Some(n) {
                    return Err(EngineError::invalid(
                        name,
                        format!("{n} indices are not {batch} bags of {bag_size}"),
                    ));
                }
                (0..=batch).map(|b| b * bag_size).collect()
            }
            Bags::Lengths(lengths) => {
                let mut bounds = Vec::with_capacity(lengths.len() + 1);
                let mut at = 0usize;
                bounds.push(0);
                for i in 0..lengths.len() {
                    let l = lengths.get(i);
                    if l < 0 {
                        return Err(EngineError::invalid(
                            name,
                            format!("lengths[{i}] = {l} is negative"),
                        ));
                    }
                    at = at.saturating_add(l as usize);
                    bounds.push(at);
                }
                if at != n {
                    return Err(EngineError::invalid(
                        name,
                        format!("lengths add up to {at} but there are {n} indices"),
                    ));
                }
                bounds
            }
            Bags::Offsets {
                offsets,
                include_last_offset,
            } => {
                let m = offsets.len();
                if include_last_offset && m == 0 {
                    return Err(EngineError::invalid(
                        name,
                        "include_last_offset needs at least one offset",
                    ));
                }
                let mut bounds = Vec::with_capacity(m + 1);
                let mut prev = 0i64;
                for i in 0..m {
                    let o = offsets.get(i);
                    if i == 0 && o != 0 {
                        return Err(EngineError::invalid(
                            name,
                            format!("offsets[0] must be 0, got {o}"),
                        ));
                    }
                    if o < prev {
                        return Err(EngineError::invalid(
                            name,
                            format!(
                                "offsets must not decrease: offsets[{i}] = {o} < offsets[{}] = {prev}",
                                i - 1
                            ),
                        ));
                    }
                    if o as u64 > n as u64 {
                        return Err(EngineError::invalid(
                            name,
                            format!("offsets[{i}] = {o} is past the end of the {n} indices"),
                        ));
                    }
                    bounds.push(o as usize);
                    prev = o;
                }
                if !include_last_offset {
                    bounds.push(n);
                }
                if bounds.is_empty() {
                    bounds.push(0);
                }
                bounds
            }
        })
    }

    /// The bags this lookup declares, before anything is checked: the output's rows if it is
    /// valid (what a caller's few bytes of request would make the engine allocate).
    pub fn declared_bags(&self) -> usize {
        match self.bags {
            Bags::Fixed { batch, .. } => batch,
            Bags::Lengths(lengths) => lengths.len(),
            Bags::Offsets {
                offsets,
                include_last_offset,
            } => offsets.len() - usize::from(include_last_offset && !offsets.is_empty()),
        }
    }
}

/// One batch: the same number of bags (samples) for every table. The output is
/// `[batch, Σ dim]` fp32, tables in request order, each value as `out` gives it back (pooled
/// in fp32, then rounded once: `nearrec_kernels::out`).
#[derive(Debug, Clone, Default)]
pub struct Batch<'a> {
    pub tables: Vec<TableLookup<'a>>,
    pub out: OutDtype,
}

impl<'a> Batch<'a> {
    pub fn new(tables: Vec<TableLookup<'a>>) -> Self {
        Self {
            tables,
            out: OutDtype::F32,
        }
    }

    /// The batch answered in `out`.
    pub fn with_out(self, out: OutDtype) -> Self {
        Self { out, ..self }
    }
}

/// A validated table request: bag bounds as positions into the indices.
#[derive(Debug)]
pub struct Checked {
    /// `batch + 1` ascending positions.
    pub bounds: Vec<usize>,
    /// `padding_idx` normalised into `0..rows`.
    pub padding: Option<u64>,
}

impl Checked {
    pub fn batch(&self) -> usize {
        self.bounds.len() - 1
    }
}

/// Validates `req` — every table known (`rows_of` its rows, or `UnknownTable`), bags, weights
/// and padding well-formed, one batch size — as the engine does before it pools: what a router
/// splitting a batch over shards checks first, so that its errors are the engine's. Index
/// values are not checked here (the kernels check them as they pool).
pub fn check_batch(
    req: &Batch<'_>,
    mut rows_of: impl FnMut(&str) -> Result<u64>,
) -> Result<Vec<Checked>> {
    let mut out: Vec<Checked> = Vec::with_capacity(req.tables.len());
    for t in &req.tables {
        let checked = check(t, rows_of(t.table)?)?;
        if let Some(first) = out.first()
            && first.batch() != checked.batch()
        {
            return Err(EngineError::invalid(
                t.table,
                format!(
                    "has {} bags but table {:?} has {}; every table needs one bag per sample",
                    checked.batch(),
                    req.tables[0].table,
                    first.batch()
                ),
            ));
        }
        out.push(checked);
    }
    Ok(out)
}

/// Validates one table request against a table of `rows` rows. Index values are range-checked by
/// the kernels as they pool (one pass over the indices, not two).
pub fn check(req: &TableLookup<'_>, rows: u64) -> Result<Checked> {
    let name = req.table;
    let n = req.indices.len();
    if let Some(w) = req.per_sample_weights {
        if req.mode != PoolingMode::Sum {
            return Err(EngineError::invalid(
                name,
                format!(
                    "per_sample_weights are only supported with mode='sum', not mode='{}'",
                    req.mode.name()
                ),
            ));
        }
        if w.len() != n {
            return Err(EngineError::invalid(
                name,
                format!(
                    "per_sample_weights has {} values but there are {n} indices",
                    w.len()
                ),
            ));
        }
    }
    let padding = match req.padding_idx {
        None => None,
        Some(p) => {
            let r = rows as i64;
            if p < -r || p >= r {
                return Err(EngineError::invalid(
                    name,
                    format!("padding_idx {p} is out of range for {rows} rows"),
                ));
            }
            Some(if p < 0 { (p + r) as u64 } else { p as u64 })
        }
    };
    let bounds = req.bag_bounds()?;
    Ok(Checked { bounds, padding })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets<'a>(idx: &'a [i64], off: &'a [i64], last: bool) -> TableLookup<'a> {
        TableLookup::new(
            "t",
            Indices::I64(idx),
            Bags::Offsets {
                offsets: Indices::I64(off),
                include_last_offset: last,
            },
        )
    }

    #[test]
    fn offsets_make_bounds() {
        let idx = [1, 2, 3, 4];
        assert_eq!(
            check(&offsets(&idx, &[0, 1, 1], false), 10).unwrap().bounds,
            vec![0, 1, 1, 4]
        );
        assert_eq!(
            check(&offsets(&idx, &[0, 1, 2], true), 10).unwrap().bounds,
            vec![0, 1, 2]
        );
        assert_eq!(check(&offsets(&[], &[], false), 10).unwrap().batch(), 0);
    }

    #[test]
    fn bad_offsets_are_named() {
        let idx = [1, 2, 3, 4];
        for (off, last, want) in [
            (&[1i64, 2][..], false, "offsets[0] must be 0"),
            (&[0, 3, 1][..], false, "must not decrease"),
            (&[0, 5][..], true, "past the end"),
            (&[][..], true, "at least one offset"),
        ] {
            let e = check(&offsets(&idx, off, last), 10)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("\"t\""), "{e}");
        }
    }

    #[test]
    fn lengths_and_fixed() {
        let idx = [1i64, 2, 3, 4];
        let r = TableLookup::new(
            "t",
            Indices::I64(&idx),
            Bags::Lengths(Indices::I32(&[1, 0, 3])),
        );
        assert_eq!(check(&r, 10).unwrap().bounds, vec![0, 1, 1, 4]);
        let r = TableLookup::new(
            "t",
            Indices::I64(&idx),
            Bags::Lengths(Indices::I32(&[1, 2])),
        );
        assert!(
            check(&r, 10)
                .unwrap_err()
                .to_string()
                .contains("add up to 3")
        );
        let fixed = |batch, bag_size| {
            TableLookup::new("t", Indices::I64(&idx), Bags::Fixed { batch, bag_size })
        };
        assert_eq!(check(&fixed(2, 2), 10).unwrap().bounds, vec![0, 2, 4]);
        assert!(check(&fixed(3, 2), 10).is_err());
        let none = TableLookup::new(
            "t",
            Indices::I64(&[]),
            Bags::Fixed {
                batch: 3,
                bag_size: 0,
            },
        );
        assert_eq!(check(&none, 10).unwrap().bounds, vec![0, 0, 0, 0]);
    }

    #[test]
    fn weights_and_padding() {
        let idx = [1i64, 2];
        let w = [1.0f32, 2.0];
        let base = offsets(&idx, &[0], false);
        assert!(check(&base.with_weights(&w[..1]), 10).is_err());
        assert!(check(&base.with_weights(&w).with_mode(PoolingMode::Mean), 10).is_err());
        assert!(check(&base.with_weights(&w), 10).is_ok());
        assert_eq!(
            check(&base.with_padding_idx(-1), 10).unwrap().padding,
            Some(9)
        );
        assert!(check(&base.with_padding_idx(10), 10).is_err());
    }
}
