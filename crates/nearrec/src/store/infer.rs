//! The model kept with a store ([`crate::model`]): read from its attachments on first use, run
//! next to its embeddings ([`Inference::infer`], RM-SSD's whole-model offload), its dense
//! weights updated by a trainer ([`Inference::update_model`]). The bottom MLP starts beside the reads, each table's slice of
//! the first layer it feeds is multiplied as its last row lands, the rest when all are in; only
//! the model's outputs come back.

use std::sync::Arc;

use nearrec_engine::Batch;
use nearrec_engine::dense::DenseModel;
use nearrec_format::StoreReader;

use super::{Kept, Store, lock, weights_file};
use crate::api::Inference;
use crate::error::{Error, Result};
use crate::model::{Inferred, SavedModel, StoredModel, Tensor};

impl Inference for Store {
    /// Runs the model kept with the store on one batch: `dense` is the row-major `[batch,
    /// dense_width]` features (empty for models without them), `batch` one lookup per model
    /// input table in any order. Returns only the model's outputs.
    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> Result<Inferred> {
        let model = self.model()?;
        let batch = model.arrange(batch)?;
        self.infer_with(&model.dense, dense, &batch)
    }

    /// Replaces dense weights of the model kept with the store by name (a trainer's update of
    /// the dense part): each a weight the model keeps, of its shape, finite; the rest stay.
    /// The new weights are written atomically before this returns (durable, what a restart
    /// or a reader in another process reads), and every inference that starts after it runs
    /// them; those under way finish on the old ones. A store opened read-only refuses it
    /// (`ReadOnly`), one that keeps no model too (`NoModel`).
    fn update_model(&self, weights: &[Tensor<'_>]) -> Result<()> {
        let served = self.served();
        if !served.live.writable() {
            return Err(Error::ReadOnly {
                path: served.path.display().to_string(),
            });
        }
        let _one = lock(&served.updating);
        let reader = StoreReader::open(&served.path)?;
        let (npz, model) = crate::model::updated(&reader, weights)?;
        drop(reader);
        let manifest =
            nearrec_format::attach(&served.path, crate::model::WEIGHTS_ATTACHMENT, &npz)?;
        served.model.store(model.map(|model| {
            Arc::new(Kept {
                model: Arc::new(model),
                weights: weights_file(&manifest),
            })
        }));
        tracing::info!(
            store = %served.path.display(),
            weights = weights.len(),
            "model weights updated"
        );
        Ok(())
    }

    fn saved_model(&self) -> Result<SavedModel> {
        SavedModel::read(&StoreReader::open(&self.served().path)?)
    }
}

impl Store {
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

    /// Whether the store keeps a model (its attachments name one; [`Store::model`] reads it).
    pub fn keeps_model(&self) -> bool {
        let manifest = &self.served().manifest;
        [
            crate::model::CONFIG_ATTACHMENT,
            crate::model::WEIGHTS_ATTACHMENT,
        ]
        .iter()
        .all(|name| manifest.attachments.iter().any(|a| a.name == *name))
    }

    /// The model kept with the store (`nearrec.models.save`), read from its attachments on
    /// first use.
    pub fn model(&self) -> Result<Arc<StoredModel>> {
        let served = self.current();
        if let Some(kept) = &*served.model.load() {
            return Ok(kept.model.clone());
        }
        let reader = StoreReader::open(&served.path)?;
        let model = Arc::new(StoredModel::load(&reader)?);
        let kept = Kept {
            model: model.clone(),
            weights: weights_file(reader.manifest()),
        };
        // only into an empty slot: an update meanwhile has the newer weights
        served
            .model
            .compare_and_swap(&None::<Arc<Kept>>, Some(Arc::new(kept)));
        Ok(model)
    }
}
