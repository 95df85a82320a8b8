//! The model kept with a sharded store, run where its tables are: on the nodes of the shard
//! that holds every table whole (whole-model offload there, only the outputs cross the
//! network), else by the router itself — the lookups split and merged as any lookup, the dense
//! part on the router's core — from the model its shards keep, read once per cluster version
//! (the `Model` verb) and read again after a swap or an update of its weights through this
//! router.

use std::sync::Arc;

use nearrec::model::{Inferred, SavedModel, StoredModel, Tensor};
use nearrec::{Batch, Error, Inference, StoreApi};

use super::{Inner, ShardedStore};

impl Inference for ShardedStore {
    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> nearrec::Result<Inferred> {
        let inner = &self.inner;
        inner.live()?;
        match inner.keeper {
            Some(k) => inner.shards[k].any(&inner.name, |c| c.infer(dense, batch)),
            None => self.infer_model(&*inner.model()?, dense, batch, false),
        }
    }

    /// On every shard that keeps the model, then read again by this router; another router
    /// reads the new weights at its next swap or connection.
    fn update_model(&self, weights: &[Tensor<'_>]) -> nearrec::Result<()> {
        let inner = &self.inner;
        inner.live()?;
        inner.kept()?;
        for &k in &inner.models {
            inner.shards[k].each(&inner.name, |c| c.update_model(weights))?;
        }
        *lock(&inner.model) = None;
        Ok(())
    }

    fn saved_model(&self) -> nearrec::Result<SavedModel> {
        let inner = &self.inner;
        inner.live()?;
        let k = inner.kept()?;
        inner.shards[k].any(&inner.name, |c| c.saved_model())
    }
}

impl Inner {
    /// A shard that keeps the model, or why none does.
    fn kept(&self) -> nearrec::Result<usize> {
        self.models.first().copied().ok_or_else(|| Error::NoModel {
            path: self.describe(),
            reason: "no shard keeps a model: save one with the store before it is cut \
                     (nearrec.models.save)"
                .into(),
        })
    }

    /// The model the router runs, as its shards keep it at the version it reads.
    fn model(&self) -> nearrec::Result<Arc<StoredModel>> {
        let pin = self.pin.load(std::sync::atomic::Ordering::Acquire);
        if let Some((at, model)) = &*lock(&self.model)
            && *at == pin
        {
            return Ok(model.clone());
        }
        let k = self.kept()?;
        let saved = self.shards[k].any(&self.name, |c| c.saved_model())?;
        let layout = self.layout();
        let model = Arc::new(saved.build(|t| Ok(layout.table(t)?.dim as usize))?);
        *lock(&self.model) = Some((pin, model.clone()));
        Ok(model)
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
