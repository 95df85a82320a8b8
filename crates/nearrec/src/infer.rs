//! [`Store::infer`]: the model kept with a store ([`crate::model`]) run next to its embeddings,
//! RM-SSD's whole-model offload. The bottom MLP starts beside the reads, each table's slice of
//! the first layer it feeds is multiplied as its last row lands, the rest when all are in; only
//! the model's outputs come back.

use nearrec_engine::Batch;
use nearrec_engine::dense::DenseModel;

use crate::error::Result;
use crate::model::Inferred;
use crate::store::Store;

impl Store {
    /// Runs the model kept with the store on one batch: `dense` is the row-major `[batch,
    /// dense_width]` features (empty for models without them), `batch` one lookup per model
    /// input table in any order. Returns only the model's outputs.
    pub fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> Result<Inferred> {
        let model = self.model()?;
        let batch = model.arrange(batch)?;
        self.infer_with(&model.dense, dense, &batch)
    }

    /// Runs `model` (a dense part built by the caller) on one batch whose lookups are in the
    /// model's input order.
    pub fn infer_with(
        &self,
        model: &DenseModel,
        dense: &[f32],
        batch: &Batch<'_>,
    ) -> Result<Inferred> {
        let snapshot = self.snapshot();
        let (outputs, times) = snapshot
            .engine()
            .infer_at(model, dense, batch, snapshot.view())?;
        let width = model.outputs();
        Ok(Inferred {
            batch: outputs.len() / width.max(1),
            outputs,
            width,
            times,
        })
    }
}
