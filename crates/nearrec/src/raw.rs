//! A batch's rows instead of its pooled bags: each table's distinct ids, ascending, and their
//! rows decoded to float32, read at one version of the store — what a client that pools itself
//! gets (the storage node's `raw` lookups, EMB-SSD's host-side pooling baseline).
//!
//! The rows are read as one engine batch — table `t`'s `n_t` distinct ids as `n_t` one-row bags
//! followed by empty bags up to the largest `n` — so that every table's misses go to the device
//! in one submission, exactly as a pooled lookup's do.

use crate::api::Rows;
use crate::batch::{Bags, Batch, Indices, PoolingMode, TableLookup};
use crate::error::Result;
use crate::live::Snapshot;
use crate::store::Store;

impl Store {
    /// Each table's distinct rows `batch` reads (tables in request order; a table named twice
    /// answers twice), validated as a lookup is, at `snapshot`: the rows and its version
    /// (`StoreApi::lookup_rows`).
    pub(crate) fn lookup_rows_at(
        &self,
        batch: &Batch<'_>,
        snapshot: &Snapshot,
    ) -> Result<(Vec<Rows>, u64)> {
        self.inner.place.check_held(|| self.name())?;
        // the one validation: ids out of range are named by their position in the request
        snapshot.engine().prepare_at(batch, snapshot.view())?;
        let ids: Vec<Vec<i64>> = batch.tables.iter().map(distinct).collect();
        let most = ids.iter().map(Vec::len).max().unwrap_or(0);
        let lengths: Vec<Vec<i64>> = ids
            .iter()
            .map(|t| (0..most).map(|b| i64::from(b < t.len())).collect())
            .collect();
        let rows = Batch::new(
            batch
                .tables
                .iter()
                .zip(ids.iter().zip(&lengths))
                .map(|(t, (ids, lengths))| {
                    TableLookup::new(
                        t.table,
                        Indices::I64(ids),
                        Bags::Lengths(Indices::I64(lengths)),
                    )
                    .with_mode(PoolingMode::Sum)
                })
                .collect(),
        );
        let prepared = snapshot.engine().prepare_at(&rows, snapshot.view())?;
        let width = prepared.width();
        let mut out = vec![0f32; most * width];
        self.execute_at(&rows, &prepared, &mut out, snapshot)?;
        let engine = snapshot.engine();
        let mut at = 0;
        let mut answer = Vec::with_capacity(ids.len());
        for (t, ids) in batch.tables.iter().zip(ids) {
            let dim = engine.tables()[engine.table_id(t.table)?].dim as usize;
            let mut values = Vec::with_capacity(ids.len() * dim);
            for bag in 0..ids.len() {
                values.extend_from_slice(&out[bag * width + at..][..dim]);
            }
            at += dim;
            answer.push(Rows {
                table: t.table.to_owned(),
                dim,
                ids,
                values,
            });
        }
        Ok((answer, snapshot.version()))
    }
}

/// The distinct ids a table's lookup pools, ascending (ids past the bags' end with
/// `include_last_offset` are part of no bag and not read; the padding id is read like any).
fn distinct(t: &TableLookup<'_>) -> Vec<i64> {
    let end = match t.bags {
        Bags::Offsets {
            offsets,
            include_last_offset: true,
        } if !offsets.is_empty() => offsets.get(offsets.len() - 1) as usize,
        _ => t.indices.len(),
    };
    let mut ids: Vec<i64> = (0..end.min(t.indices.len()))
        .map(|i| t.indices.get(i))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}
