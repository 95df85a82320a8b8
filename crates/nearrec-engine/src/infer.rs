//! Whole-model offload (RM-SSD): a batch's embeddings and its dense layers run in the engine and
//! only the model's outputs leave. The dense features' work (the bottom MLP and its slice of the
//! first top layer) starts at once on the worker pool, beside the reads; each table's slice of the
//! first layer it feeds is multiplied the moment its pooled vectors are final, while other
//! tables' reads are still out; the rest runs when everything is in. With every table in DRAM
//! there are no reads to overlap, and models whose first layer takes the tables side by side
//! multiply it once over all of them instead of once per table's narrow slice.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cells::Ready;
use crate::delta::DeltaView;
use crate::dense::{DenseModel, Early, ModelError};
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::request::Batch;
use crate::stats::Stages;

/// Where the time of one [`Engine::infer`] went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InferTimes {
    /// Wall time of the call.
    pub total: Duration,
    /// Until every table's pooled vectors were final (reads and pooling).
    pub embeddings: Duration,
    /// Thread time of the work on the dense features alone (bottom MLP and its slice of the
    /// first top layer), overlapped with the embeddings.
    pub dense: Duration,
    /// Thread time of the tables' slices of their first layers, overlapped with outstanding
    /// reads.
    pub blocks: Duration,
    /// Wall time after the last block: the interaction where it needs every table, and the
    /// layers above the first.
    pub finish: Duration,
    /// Where the embeddings' time went (validating the request counted as routing).
    pub stages: Stages,
}

impl Engine {
    /// Runs `model` on one batch: `dense` holds `[batch, model.dense_width()]` features and
    /// `req` one table per model input, in the model's order. Returns `[batch, model.outputs()]`
    /// and where the time went.
    pub fn infer(
        &self,
        model: &DenseModel,
        dense: &[f32],
        req: &Batch<'_>,
    ) -> Result<(Vec<f32>, InferTimes)> {
        self.infer_at(model, dense, req, DeltaView::NONE)
    }

    /// [`Self::infer`] as a live store's snapshot sees the tables (see [`Self::execute_at`]).
    pub fn infer_at(
        &self,
        model: &DenseModel,
        dense: &[f32],
        req: &Batch<'_>,
        deltas: DeltaView<'_>,
    ) -> Result<(Vec<f32>, InferTimes)> {
        let _inside = nearrec_io::fork_gate();
        let start = Instant::now();
        let prepared = self.prepare(req)?;
        let prepare = start.elapsed();
        let batch = prepared.batch();
        self.check_model(model, req, dense.len(), batch)?;
        let mut pooled = vec![0f32; batch * prepared.width()];
        let mut out = Vec::new();
        if batch == 0 {
            return Ok((out, InferTimes::default()));
        }
        let parts: Vec<Mutex<Option<Vec<f32>>>> =
            req.tables.iter().map(|_| Mutex::new(None)).collect();
        let early: Mutex<Early> = Mutex::default();
        let spent = Mutex::new((Duration::ZERO, Duration::ZERO)); // (dense, blocks)
        let (parts, early_ref, spent_ref) = (&parts, &early, &spent);
        let pool = self.workers.get()?;
        let embeddings = pool.scope(|s| {
            s.spawn(move |_| {
                let t = Instant::now();
                *lock(early_ref) = model.early_dense(dense, batch);
                lock(spent_ref).0 += t.elapsed();
            });
            let ready = move |k: usize, block: Vec<f32>| {
                s.spawn(move |_| {
                    let t = Instant::now();
                    *lock(&parts[k]) = model.early_table(k, &block, batch);
                    lock(spent_ref).1 += t.elapsed();
                });
            };
            // each table's share as its rows land, where rows land over time or pooling is
            // long enough to hide it; else one product over every table in `finish`
            let dims = model.table_dims();
            let adds = prepared.lookups() * dims.iter().sum::<usize>() / dims.len().max(1);
            let on_ssd = self.io_stats().is_some();
            let early_shares = on_ssd || !model.whole_first_layer(adds / batch);
            let hook = early_shares.then_some(&ready as &Ready<'_>);
            let res = self.run(req, &prepared, &mut pooled, hook, deltas);
            (res, start.elapsed())
        });
        let (res, embeddings) = embeddings;
        let mut stages = res?;
        stages.route += prepare;
        let last = Instant::now();
        let parts = parts.iter().map(|p| lock(p).take()).collect();
        let early = std::mem::take(&mut *lock(&early));
        pool.install(|| out = model.finish(early, parts, &pooled, batch));
        let (dense_t, blocks) = *lock(&spent);
        Ok((
            out,
            InferTimes {
                total: start.elapsed(),
                embeddings,
                dense: dense_t,
                blocks,
                finish: last.elapsed(),
                stages,
            },
        ))
    }

    /// The request and dense features fit the model: one table per input, each of the model's
    /// dim, and `[batch, dense_width]` features.
    fn check_model(
        &self,
        model: &DenseModel,
        req: &Batch<'_>,
        dense_len: usize,
        batch: usize,
    ) -> Result<()> {
        let dims = model.table_dims();
        if req.tables.len() != dims.len() {
            return Err(EngineError::Model(ModelError(format!(
                "the model takes {} tables; the request has {}",
                dims.len(),
                req.tables.len()
            ))));
        }
        for (k, (t, &dim)) in req.tables.iter().zip(&dims).enumerate() {
            let have = self.tables()[self.table_id(t.table)?].dim as usize;
            if have != dim {
                return Err(EngineError::invalid(
                    t.table,
                    format!("is the model's input {k}, which needs dim {dim}, but has dim {have}"),
                ));
            }
        }
        let want = batch * model.dense_width();
        if dense_len != want {
            return Err(EngineError::Model(ModelError(format!(
                "dense features: {dense_len} values for a batch of {batch}; the model takes {} \
                 per sample ({want} in all)",
                model.dense_width()
            ))));
        }
        Ok(())
    }
}

/// A lock that a panicked holder did not poison for us (the data is plain numbers).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
