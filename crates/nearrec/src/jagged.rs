//! A `KeyedJaggedTensor`-shaped request (TorchRec's layout: one values array for every key,
//! `keys × batch` lengths, optional weights) as a [`Batch`] that borrows it: each output block's
//! ids, lengths and weights are slices of the caller's arrays, nothing is copied. Python's
//! `EmbeddingBagCollection` hands its KJTs over this way; a KJT-shaped client of the storage
//! node can too.

use crate::batch::{Bags, Batch, Indices, PoolingMode, TableLookup};
use crate::error::{Error, Result};

/// One output block of a jagged batch: the table it pools, the position of its key among the
/// request's keys (features may share a table, and keys no table uses are skipped) and how.
#[derive(Debug, Clone, Copy)]
pub struct JaggedBlock<'a> {
    pub table: &'a str,
    pub key: usize,
    pub mode: PoolingMode,
}

/// The batch of `blocks` over a jagged request of `keys` keys: `values` holds every key's ids
/// one key after another, `lengths` every key's `batch` bag sizes, `weights` one per value.
pub fn jagged<'a>(
    blocks: &[JaggedBlock<'a>],
    keys: usize,
    values: Indices<'a>,
    lengths: Indices<'a>,
    weights: Option<&'a [f32]>,
) -> Result<Batch<'a>> {
    // where each key's values start (and the last ends)
    let per_key = lengths.len().checked_div(keys).unwrap_or(0);
    let mut starts = Vec::with_capacity(keys + 1);
    let batch = scan(keys, lengths, values.len(), |i, at| {
        if per_key == 0 || i.is_multiple_of(per_key) {
            starts.push(at);
        }
    })?;
    starts.resize(keys + 1, 0); // an empty batch: every key starts and ends at 0
    if let Some(w) = weights
        && w.len() != values.len()
    {
        return Err(Error::invalid(format!(
            "weights has {} values but there are {} values",
            w.len(),
            values.len()
        )));
    }
    let tables = blocks
        .iter()
        .map(|b| {
            if b.key >= keys {
                return Err(Error::invalid(format!(
                    "table {:?}: key position {} of {keys} keys",
                    b.table, b.key
                )));
            }
            let (lo, hi) = (starts[b.key] as usize, starts[b.key + 1] as usize);
            Ok(TableLookup {
                table: b.table,
                indices: values.slice(lo..hi),
                bags: Bags::Lengths(lengths.slice(b.key * batch..(b.key + 1) * batch)),
                per_sample_weights: weights.map(|w| &w[lo..hi]),
                mode: b.mode,
                padding_idx: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Batch::new(tables))
}

/// Where each bag of a jagged request of `keys` keys starts in its values, and where the last
/// ends: `lengths.len() + 1` positions. The lengths must split into `keys` equal runs, be
/// non-negative and add up to `values`.
pub fn bounds(keys: usize, lengths: Indices<'_>, values: usize) -> Result<Vec<i64>> {
    let mut bounds = Vec::with_capacity(lengths.len() + 1);
    scan(keys, lengths, values, |_, at| bounds.push(at))?;
    Ok(bounds)
}

/// Checks a jagged request's lengths (see [`bounds`]) and calls `mark(i, at)` with where each
/// bag `i` starts, then `mark(lengths.len(), values)`; returns the batch (bags per key).
fn scan(
    keys: usize,
    lengths: Indices<'_>,
    values: usize,
    mut mark: impl FnMut(usize, i64),
) -> Result<usize> {
    if keys == 0 {
        return Err(Error::invalid("the KeyedJaggedTensor has no keys"));
    }
    if !lengths.len().is_multiple_of(keys) {
        return Err(Error::invalid(format!(
            "lengths has {} entries, not a multiple of {keys} keys",
            lengths.len()
        )));
    }
    let mut at = 0i64;
    for i in 0..lengths.len() {
        mark(i, at);
        let l = lengths.get(i);
        if l < 0 {
            return Err(Error::InvalidRequest {
                table: None,
                position: Some(i),
                reason: format!("lengths[{i}] = {l} is negative"),
            });
        }
        at = at.saturating_add(l);
    }
    mark(lengths.len(), at);
    if at != values as i64 {
        return Err(Error::invalid(format!(
            "lengths add up to {at} but there are {values} values"
        )));
    }
    Ok(lengths.len() / keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_slices_of_their_keys() {
        // two keys, batch 2: key 0 bags [1, 2] [3], key 1 bags [] [4, 5, 6]
        let values = [1i64, 2, 3, 4, 5, 6];
        let lengths = [2i64, 1, 0, 3];
        let weights = [0.5f32, 1.0, 1.5, 2.0, 2.5, 3.0];
        let blocks = [
            JaggedBlock {
                table: "b",
                key: 1,
                mode: PoolingMode::Sum,
            },
            JaggedBlock {
                table: "a",
                key: 0,
                mode: PoolingMode::Mean,
            },
        ];
        let batch = jagged(
            &blocks,
            2,
            Indices::I64(&values),
            Indices::I64(&lengths),
            Some(&weights),
        )
        .unwrap();
        let (b, a) = (&batch.tables[0], &batch.tables[1]);
        assert_eq!((b.table, a.table), ("b", "a"));
        assert_eq!((b.indices.get(0), b.indices.len()), (4, 3));
        assert_eq!((a.indices.get(0), a.indices.len()), (1, 3));
        assert_eq!(b.per_sample_weights, Some(&weights[3..]));
        assert!(matches!(a.bags, Bags::Lengths(l) if l.get(0) == 2 && l.len() == 2));
        assert_eq!(a.mode, PoolingMode::Mean);
    }

    #[test]
    fn malformed_requests_are_named() {
        let v = [1i64, 2, 3];
        let block = [JaggedBlock {
            table: "a",
            key: 0,
            mode: PoolingMode::Sum,
        }];
        let err = |keys, lengths: &[i64], weights: Option<&[f32]>, blocks: &[JaggedBlock<'_>]| {
            jagged(
                blocks,
                keys,
                Indices::I64(&v),
                Indices::I64(lengths),
                weights,
            )
            .unwrap_err()
            .to_string()
        };
        assert!(err(0, &[3], None, &block).contains("no keys"));
        assert!(err(2, &[3], None, &block).contains("not a multiple"));
        assert!(err(1, &[4, -1], None, &block).contains("negative"));
        assert!(err(1, &[2], None, &block).contains("add up to 2"));
        assert!(err(1, &[3], Some(&[1.0]), &block).contains("weights has 1"));
        let far = [JaggedBlock {
            table: "a",
            key: 1,
            mode: PoolingMode::Sum,
        }];
        assert!(err(1, &[3], None, &far).contains("key position 1"));
    }

    #[test]
    fn bounds_are_every_bags_start_and_an_empty_batch_has_empty_keys() {
        let lengths = [2i64, 1, 0, 3];
        assert_eq!(
            bounds(2, Indices::I64(&lengths), 6).unwrap(),
            [0, 2, 3, 3, 6]
        );
        assert_eq!(bounds(3, Indices::I32(&[]), 0).unwrap(), [0]);
        let blocks = [JaggedBlock {
            table: "a",
            key: 2,
            mode: PoolingMode::Sum,
        }];
        let batch = jagged(&blocks, 3, Indices::I64(&[]), Indices::I64(&[]), None).unwrap();
        assert_eq!(batch.tables[0].indices.len(), 0);
    }
}
