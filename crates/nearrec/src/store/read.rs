//! A batch pooled at one snapshot of the store: validated once (`prepare`), then executed into
//! the caller's buffer (`execute`, the Python binding's fast path) or a new one; the contract's
//! lookups are these at the current snapshot, a pinned one's at a held version's.

use std::time::Instant;

use nearrec_engine::{Prepared, Stages};

use super::Store;
use crate::batch::{Batch, Pooled, Read};
use crate::error::{Error, Result};
use crate::live::Snapshot;

impl Store {
    /// [`Store::lookup_at`] with the version `snapshot` is and where the time went: what the
    /// contract's lookups answer.
    pub(crate) fn read_at(&self, batch: &Batch<'_>, snapshot: &Snapshot) -> Result<(Pooled, Read)> {
        self.read_reusing(batch, snapshot, Vec::new())
    }

    /// [`crate::StoreApi::lookup`] into `values`, a vector kept from an earlier answer: its
    /// memory reused (resized to the output and zeroed), its contents not read. A server
    /// answering batch after batch so allocates no output (the storage node does).
    pub fn lookup_reusing(&self, batch: &Batch<'_>, values: Vec<f32>) -> Result<(Pooled, Read)> {
        self.read_reusing(batch, &self.snapshot(), values)
    }

    fn read_reusing(
        &self,
        batch: &Batch<'_>,
        snapshot: &Snapshot,
        values: Vec<f32>,
    ) -> Result<(Pooled, Read)> {
        let (pooled, stages) = self.pool_at(batch, snapshot, values)?;
        let version = snapshot.version();
        Ok((pooled, Read { version, stages }))
    }

    /// Validates `batch` (known tables, well-formed bags, weights, padding, one batch size):
    /// the output's shape, for a caller that pools into its own buffer with [`Store::execute`].
    pub fn prepare(&self, batch: &Batch<'_>) -> Result<Prepared> {
        let snapshot = self.snapshot();
        Ok(snapshot.engine().prepare_at(batch, snapshot.view())?)
    }

    /// Pools `batch` into `out`, row-major `[prepared.batch(), prepared.width()]`, as the
    /// store is now (every write that returned before is seen).
    pub fn execute(&self, batch: &Batch<'_>, prepared: &Prepared, out: &mut [f32]) -> Result<()> {
        self.execute_at(batch, prepared, out, &self.snapshot())
            .map(drop)
    }

    /// [`Store::execute`] at `snapshot` (the parts of one batch read one version). Returns where
    /// the batch's time went.
    pub fn execute_at(
        &self,
        batch: &Batch<'_>,
        prepared: &Prepared,
        out: &mut [f32],
        snapshot: &Snapshot,
    ) -> Result<Stages> {
        // held before and after: a replica paused between its check and its answer (a stop,
        // a long pause) and left out meanwhile does not answer from what it held then
        self.inner.place.check_held(|| self.name())?;
        let engine = snapshot.engine();
        let stages = if prepared.engine() != engine.id() || !prepared.resolved_at(snapshot.view()) {
            // prepared before the store's tables (or a keyed table's keys) changed: valid now
            // only for the same shape
            let again = engine.prepare_at(batch, snapshot.view())?;
            if (again.batch(), again.width()) != (prepared.batch(), prepared.width()) {
                return Err(Error::invalid(
                    "the store's tables changed between prepare and execute, and the batch's \
                     output shape with them; prepare it again",
                ));
            }
            engine.execute_at(batch, &again, out, snapshot.view())?
        } else {
            engine.execute_at(batch, prepared, out, snapshot.view())?
        };
        self.inner.place.check_held(|| self.name())?;
        Ok(stages)
    }

    /// [`crate::StoreApi::lookup`] at `snapshot`: every table read at that version (the storage node
    /// answers with it), and where the batch's time went (validating it counted as routing).
    pub fn lookup_at(&self, batch: &Batch<'_>, snapshot: &Snapshot) -> Result<(Pooled, Stages)> {
        self.pool_at(batch, snapshot, Vec::new())
    }

    /// [`Store::lookup_at`] into `values` (see [`Store::lookup_reusing`]).
    fn pool_at(
        &self,
        batch: &Batch<'_>,
        snapshot: &Snapshot,
        mut values: Vec<f32>,
    ) -> Result<(Pooled, Stages)> {
        let start = Instant::now();
        let prepared = snapshot.engine().prepare_at(batch, snapshot.view())?;
        let prepare = start.elapsed();
        let len = prepared.batch() * prepared.width();
        if values.capacity() < len {
            // fresh memory comes zeroed (calloc); a kept vector too small to reuse would be
            // grown by copying what it held, then zeroed again
            values = vec![0f32; len];
        } else {
            values.clear();
            values.resize(len, 0.0);
        }
        let mut stages = self.execute_at(batch, &prepared, &mut values, snapshot)?;
        stages.route += prepare;
        Ok((self.pooled(batch, prepared.batch(), values), stages))
    }

    /// [`Store::lookup_at`] into `out`, the caller's `[batch, Σ dim]` buffer.
    pub fn lookup_into_at(
        &self,
        batch: &Batch<'_>,
        out: &mut [f32],
        snapshot: &Snapshot,
    ) -> Result<Read> {
        let start = Instant::now();
        let prepared = snapshot.engine().prepare_at(batch, snapshot.view())?;
        let prepare = start.elapsed();
        let mut stages = self.execute_at(batch, &prepared, out, snapshot)?;
        stages.route += prepare;
        Ok(Read {
            version: snapshot.version(),
            stages,
        })
    }

    pub(crate) fn pooled(&self, batch: &Batch<'_>, bags: usize, values: Vec<f32>) -> Pooled {
        let engine = self.engine();
        let tables = batch
            .tables
            .iter()
            .map(|t| {
                let dim = engine
                    .table_id(t.table)
                    .map_or(0, |id| engine.tables()[id].dim as usize);
                (t.table.to_owned(), dim)
            })
            .collect();
        Pooled {
            values,
            batch: bags,
            tables,
        }
    }
}
