//! Many small batches as one engine batch, and its answer split back: what a node does with
//! concurrent small requests from many clients, so that they cost one pass through the engine
//! (one route, one fan-out to the workers, one set of device reads) instead of one each.
//!
//! Batches coalesce when they ask the same tables the same way ([`Shape`]: names, pooling mode,
//! padding index, weights or not, in the same order). Their bags are concatenated table by
//! table, as lengths; the pooled `[Σ batch, Σ dim]` answer splits into each batch's rows, which
//! are the rows it would have had alone. A batch that is malformed in any way does not coalesce
//! ([`coalesce`] answers `None`), so that it runs alone and its error names its own positions.

use crate::batch::{IndexVec, OwnedBags, OwnedBatch, OwnedLookup, Pooled};
use crate::{AsBatch, PoolingMode};

/// What two batches must share to run as one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape(Vec<(String, PoolingMode, Option<i64>, bool)>);

impl Shape {
    pub fn of(batch: &OwnedBatch) -> Self {
        Shape(
            batch
                .tables
                .iter()
                .map(|t| {
                    (
                        t.table.clone(),
                        t.mode,
                        t.padding_idx,
                        t.per_sample_weights.is_some(),
                    )
                })
                .collect(),
        )
    }
}

/// Batches run as one: `batch` holds `bags[i]` bags of part `i`, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Coalesced {
    pub batch: OwnedBatch,
    pub bags: Vec<usize>,
}

/// `parts` as one batch, or `None` when they do not share a [`Shape`], when one is malformed
/// (bags that do not cover its indices exactly, tables with different bag counts, weights of
/// the wrong length), or when there is nothing to merge (fewer than two parts).
pub fn coalesce(parts: &[&OwnedBatch]) -> Option<Coalesced> {
    let first = parts.first()?;
    if parts.len() < 2 || first.tables.is_empty() {
        return None;
    }
    let shape = Shape::of(first);
    if parts[1..].iter().any(|p| Shape::of(p) != shape) {
        return None;
    }
    // each part's bag lengths, table by table; and its bag count
    let mut lengths: Vec<Vec<Vec<i64>>> = Vec::with_capacity(parts.len());
    let mut bags = Vec::with_capacity(parts.len());
    for part in parts {
        let view = part.as_batch();
        let mut per_table = Vec::with_capacity(view.tables.len());
        for t in &view.tables {
            let bounds = t.bag_bounds().ok()?;
            if bounds.last() != Some(&t.indices.len())
                || t.per_sample_weights
                    .is_some_and(|w| w.len() != t.indices.len())
            {
                return None;
            }
            per_table.push(
                bounds
                    .windows(2)
                    .map(|w| (w[1] - w[0]) as i64)
                    .collect::<Vec<_>>(),
            );
        }
        let batch = per_table[0].len();
        if per_table.iter().any(|l| l.len() != batch) {
            return None;
        }
        bags.push(batch);
        lengths.push(per_table);
    }
    let tables = (0..first.tables.len())
        .map(|k| {
            let of: Vec<&OwnedLookup> = parts.iter().map(|p| &p.tables[k]).collect();
            let narrow = of.iter().all(|t| matches!(t.indices, IndexVec::I32(_)));
            let indices = if narrow {
                IndexVec::I32(
                    of.iter()
                        .flat_map(|t| match &t.indices {
                            IndexVec::I32(v) => v.iter().copied(),
                            IndexVec::I64(_) => unreachable!("every part is int32"),
                        })
                        .collect(),
                )
            } else {
                IndexVec::I64(of.iter().flat_map(|t| widen(&t.indices)).collect())
            };
            let t = &first.tables[k];
            OwnedLookup {
                table: t.table.clone(),
                indices,
                bags: OwnedBags::Lengths(IndexVec::I64(
                    lengths.iter().flat_map(|l| l[k].iter().copied()).collect(),
                )),
                per_sample_weights: t.per_sample_weights.as_ref().map(|_| {
                    of.iter()
                        .flat_map(|t| t.per_sample_weights.as_deref().unwrap_or(&[]))
                        .copied()
                        .collect()
                }),
                mode: t.mode,
                padding_idx: t.padding_idx,
            }
        })
        .collect();
    Some(Coalesced {
        batch: OwnedBatch::new(tables),
        bags,
    })
}

fn widen(v: &IndexVec) -> Box<dyn Iterator<Item = i64> + '_> {
    match v {
        IndexVec::I32(v) => Box::new(v.iter().map(|&i| i64::from(i))),
        IndexVec::I64(v) => Box::new(v.iter().copied()),
    }
}

impl Pooled {
    /// The answer of a [`Coalesced`] batch as each part's own: `bags[i]` rows each, in order.
    pub fn split(self, bags: &[usize]) -> Vec<Pooled> {
        let width = self.width();
        assert_eq!(
            bags.iter().sum::<usize>(),
            self.batch,
            "the parts' bags are not the answer's rows"
        );
        let mut at = 0;
        bags.iter()
            .map(|&b| {
                let values = self.values[at * width..(at + b) * width].to_vec();
                at += b;
                Pooled {
                    values,
                    batch: b,
                    tables: self.tables.clone(),
                }
            })
            .collect()
    }
}
