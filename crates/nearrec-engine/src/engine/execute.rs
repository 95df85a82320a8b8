//! Executing batches: [`Engine::prepare`] validates a request into a [`Prepared`],
//! [`Engine::execute`] / [`Engine::execute_at`] pool it into the caller's output, through the SSD
//! tier or as (table, bag-run) tasks on the worker pool; [`Engine::lookup`] does both, and
//! [`Engine::read_rows`] / [`Engine::read_rows_at`] decode single rows.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::AcqRel;
use std::time::Instant;

use nearrec_kernels::{BagsOut, IndexError, PoolJob, RowIndex, RowPatch, TableView};
use rayon::prelude::*;

use super::Engine;
use crate::cells::{Cells, Ready};
use crate::delta::DeltaView;
use crate::error::{EngineError, Result};
use crate::keyed::{self, Resolved};
use crate::request::{Bags, Batch, Checked, Indices, OutDtype, TableLookup, check_batch};
use crate::ssd::SsdJob;
use crate::stats::Stages;
use nearrec_format::Memory;
use nearrec_io::fork_gate;

/// A validated request: its batch size, output width and per-table bag bounds.
#[derive(Debug)]
pub struct Prepared {
    /// The engine that prepared it ([`Engine::id`]): table ids are that engine's.
    engine: u64,
    batch: usize,
    width: usize,
    tables: Vec<(usize, usize, Checked)>, // (table id, output column, bounds)
    lookups: usize,
    /// Per request table: a keyed table's keys resolved to rows (`None`: ids are rows).
    keyed: Vec<Option<Resolved>>,
    /// The (base, version) of the snapshot its keys were resolved at (`None`: it has none).
    keys_at: Option<(u64, u64)>,
}

impl Prepared {
    /// Whether its keys were resolved at the snapshot `view` reads (or it has none): else a
    /// live store's keys may have changed since, and it must be prepared again.
    pub fn resolved_at(&self, view: DeltaView<'_>) -> bool {
        self.keys_at
            .is_none_or(|at| at == (view.base(), view.version()))
    }

    /// The [`Engine::id`] of the engine that prepared it (whose table ids it holds).
    pub fn engine(&self) -> u64 {
        self.engine
    }

    /// Bags per table (the output's rows).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Σ dim over the requested tables (the output's columns).
    pub fn width(&self) -> usize {
        self.width
    }

    pub fn lookups(&self) -> usize {
        self.lookups
    }

    /// Where each bag of request `k` starts in its indices, and where the last ends
    /// (`batch + 1` ascending positions): what cutting a batch into sub-batches needs.
    pub fn bag_bounds(&self, k: usize) -> &[usize] {
        &self.tables[k].2.bounds
    }
}

impl Engine {
    /// Validates `req`: known tables, well-formed bags, weights and padding, one batch size; a
    /// keyed table's keys are resolved to its rows (an unknown key answered by its policy).
    pub fn prepare(&self, req: &Batch<'_>) -> Result<Prepared> {
        self.prepare_in(req, true, DeltaView::NONE)
    }

    /// [`Self::prepare`] as a live store's snapshot sees keyed tables' keys (`view`'s key
    /// deltas: keys given rows or let go of since the base).
    pub fn prepare_at(&self, req: &Batch<'_>, view: DeltaView<'_>) -> Result<Prepared> {
        self.prepare_in(req, true, view)
    }

    /// [`Self::prepare_at`]; with `by_key` unset, a keyed table's ids are its row numbers (the
    /// engine's own reads of rows it resolved).
    fn prepare_in(&self, req: &Batch<'_>, by_key: bool, view: DeltaView<'_>) -> Result<Prepared> {
        self.check_size(req)?;
        for t in &req.tables {
            if by_key && t.padding_idx.is_some() && self.keys_of(t.table).is_some() {
                return Err(EngineError::invalid(
                    t.table,
                    "padding_idx names a row, and a keyed table is looked up by key: pass none",
                ));
            }
        }
        let checked = check_batch(req, |name| Ok(self.tables[self.table_id(name)?].rows))?;
        let mut tables = Vec::with_capacity(req.tables.len());
        let mut keyed = Vec::with_capacity(req.tables.len());
        let (mut width, mut lookups) = (0usize, 0usize);
        for (t, checked) in req.tables.iter().zip(checked) {
            let id = self.table_id(t.table)?;
            let (lo, hi) = (checked.bounds[0], checked.bounds[checked.batch()]);
            lookups += hi - lo;
            keyed.push(match &self.keys[id] {
                Some(keys) if by_key => {
                    let pool = (hi - lo > self.config.inline_lookups && self.workers.threads() > 1)
                        .then(|| self.workers.get())
                        .transpose()?;
                    let delta = view.keys(id).map(|d| (d, view));
                    Some(keys.resolve(t.table, t.indices, (lo, hi), pool.as_deref(), delta)?)
                }
                _ => None,
            });
            tables.push((id, width, checked));
            width += self.tables[id].dim as usize;
        }
        let keys_at = keyed
            .iter()
            .any(Option::is_some)
            .then(|| (view.base(), view.version()));
        Ok(Prepared {
            engine: self.id,
            batch: tables.first().map_or(0, |t| t.2.batch()),
            width,
            tables,
            lookups,
            keyed,
            keys_at,
        })
    }

    /// A request's shape is its caller's: a fixed batch of 2³¹ empty bags is a few bytes of
    /// request but gigabytes of bag bounds and output. Past 64 MiB, what preparing and answering
    /// it takes is checked against what the process may have first — a typed error, not an abort
    /// in the allocator (smaller requests are not checked: the probe reads /proc).
    fn check_size(&self, req: &Batch<'_>) -> Result<()> {
        const CHECKED: u64 = 64 << 20;
        let bags = req
            .tables
            .iter()
            .map(TableLookup::declared_bags)
            .max()
            .unwrap_or(0) as u64;
        let width: u64 = req
            .tables
            .iter()
            .filter_map(|t| self.table_id(t.table).ok())
            .map(|id| u64::from(self.tables[id].dim))
            .sum();
        let bounds = (bags + 1).saturating_mul(8 * req.tables.len() as u64);
        let bytes = bounds.saturating_add(bags.saturating_mul(width).saturating_mul(4));
        if bytes > CHECKED {
            Memory::probe().check(
                || format!("a batch of {bags} bags over {width} columns"),
                bytes,
            )?;
        }
        Ok(())
    }

    /// Pools `req` into `out`, a row-major `[batch, width]` matrix (`prepared` from [`Self::prepare`]
    /// on the same request). Returns where the batch's time went.
    pub fn execute(&self, req: &Batch<'_>, prepared: &Prepared, out: &mut [f32]) -> Result<Stages> {
        self.execute_at(req, prepared, out, DeltaView::NONE)
    }

    /// [`Self::execute`] as a live store's snapshot sees it: each row the `deltas` hold for it
    /// (written or removed since this engine's tables) stands in for the table's.
    pub fn execute_at(
        &self,
        req: &Batch<'_>,
        prepared: &Prepared,
        out: &mut [f32],
        deltas: DeltaView<'_>,
    ) -> Result<Stages> {
        let _inside = fork_gate();
        let stages = self.run(req, prepared, out, None, deltas)?;
        if req.out != OutDtype::F32 {
            nearrec_kernels::out::round(out, &self.widths(prepared), req.out);
        }
        Ok(stages)
    }

    /// Each request table's columns in the output, in request order.
    pub fn widths(&self, prepared: &Prepared) -> Vec<usize> {
        (prepared.tables.iter())
            .map(|(id, ..)| self.tables()[*id].dim as usize)
            .collect()
    }

    /// [`Self::execute`], handing each table's pooled `[batch, dim]` block to `ready` (with the
    /// table's position in the request) the moment its last bag is final, from whichever thread
    /// finished it: the SSD tier's as its last read lands, a pooling task's on the DRAM path.
    pub(crate) fn run(
        &self,
        req: &Batch<'_>,
        prepared: &Prepared,
        out: &mut [f32],
        ready: Option<&Ready<'_>>,
        deltas: DeltaView<'_>,
    ) -> Result<Stages> {
        assert_eq!(
            out.len(),
            prepared.batch * prepared.width,
            "output has the wrong size"
        );
        if prepared.engine != self.id {
            return Err(EngineError::Config(
                "the batch was prepared by another engine (the store's tables changed between \
                 prepare and execute)"
                    .into(),
            ));
        }
        assert_eq!(
            req.tables.len(),
            prepared.tables.len(),
            "prepared for another request"
        );
        if prepared.batch == 0 || prepared.width == 0 {
            return Ok(Stages::default());
        }
        // keyed tables' lookups read the rows their keys resolved to
        let lookups: Vec<TableLookup<'_>> = req
            .tables
            .iter()
            .zip(&prepared.keyed)
            .map(|(t, keyed)| keyed.as_ref().map_or(*t, |r| keyed::with_rows(t, &r.rows)))
            .collect();
        let init = prepared.keyed.iter().flatten().any(|r| !r.init.is_empty());
        if !init {
            return self.run_tiers(&lookups, prepared, out, ready, deltas);
        }
        // bags with init keys are pooled again once every bag is: tables are handed on after
        let stages = self.run_tiers(&lookups, prepared, out, None, deltas)?;
        self.pool_init(&lookups, prepared, out, deltas)?;
        if let Some(ready) = ready {
            let cells = Cells::new(out, prepared.batch, prepared.width);
            for (k, (id, col, _)) in prepared.tables.iter().enumerate() {
                // SAFETY: every task is done; nothing writes the output during the copy.
                ready(k, unsafe {
                    cells.block(*col, self.tables[*id].dim as usize)
                });
            }
        }
        Ok(stages)
    }

    /// Pools `lookups` (ids are rows) from the tiers into `out`, handing each table to `ready`
    /// as it is final.
    fn run_tiers(
        &self,
        lookups: &[TableLookup<'_>],
        prepared: &Prepared,
        out: &mut [f32],
        ready: Option<&Ready<'_>>,
        deltas: DeltaView<'_>,
    ) -> Result<Stages> {
        let mut stages = Stages::default();
        if let Some(ssd) = &self.ssd {
            // tables kept whole in DRAM go through the DRAM path below; the rest read from SSD
            let jobs: Vec<SsdJob<'_>> = prepared
                .tables
                .iter()
                .zip(lookups)
                .enumerate()
                .filter(|(_, ((id, _, _), _))| self.resident(*id).is_none())
                .map(|(k, ((id, col, checked), t))| SsdJob {
                    k,
                    id: *id,
                    meta: &self.tables[*id],
                    col: *col,
                    req: t,
                    checked,
                    deltas,
                })
                .collect();
            if !jobs.is_empty() {
                let workers =
                    (prepared.lookups > self.config.inline_lookups).then_some(&*self.workers);
                stages = ssd.execute(&jobs, prepared.batch, prepared.width, out, workers, ready)?;
            }
        }
        // Tasks: runs of bags of one table, about `task_lookups` lookups each.
        let mut tasks = Vec::new();
        for (k, (id, _, checked)) in prepared.tables.iter().enumerate() {
            if self.resident(*id).is_none() {
                continue;
            }
            if let Some(ssd) = &self.ssd {
                let (lo, hi) = (checked.bounds[0], checked.bounds[prepared.batch]);
                let t = &lookups[k];
                let padding = checked.padding.map_or(0, |p| {
                    (lo..hi).filter(|&i| t.indices.get(i) == p as i64).count()
                });
                ssd.count_resident(*id, (hi - lo - padding) as u64);
            }
            let per_bag = (checked.bounds[prepared.batch] / prepared.batch).max(1);
            let step = (self.config.task_lookups / per_bag).clamp(1, prepared.batch);
            tasks.extend(
                (0..prepared.batch)
                    .step_by(step)
                    .map(|b0| (k, b0, (b0 + step).min(prepared.batch))),
            );
        }
        // per table, its tasks not yet done (the last one hands the table to `ready`)
        let mut left: Vec<AtomicUsize> = (0..prepared.tables.len())
            .map(|_| AtomicUsize::new(0))
            .collect();
        for &(k, _, _) in &tasks {
            *left[k].get_mut() += 1;
        }
        let cells = Cells::new(out, prepared.batch, prepared.width);
        let pooling = Instant::now();
        let run = |&(k, b0, b1): &(usize, usize, usize)| {
            let (id, col, checked) = &prepared.tables[k];
            let dim = self.tables[*id].dim as usize;
            // SAFETY: tasks cover disjoint (table, bag) cells: each table owns columns
            // [col, col + dim) and each task of that table owns rows [b0, b1). `out` outlives the
            // tasks, and its length was checked above.
            let mut bags =
                unsafe { BagsOut::from_raw(cells.ptr(b0, *col), prepared.width, dim, b1 - b0) };
            self.pool(&lookups[k], checked, *id, b0..b1, &mut bags, deltas)?;
            if let Some(ready) = ready
                && left[k].fetch_sub(1, AcqRel) == 1
            {
                // SAFETY: every task of table k is done (the AcqRel count orders their writes
                // before this read) and no task writes its columns again; the others write only
                // their own columns.
                ready(k, unsafe { cells.block(*col, dim) });
            }
            Ok::<_, EngineError>(())
        };
        if prepared.lookups <= self.config.inline_lookups
            || self.workers.threads() == 1
            || tasks.len() <= 1
        {
            tasks.iter().try_for_each(run)?;
        } else {
            self.workers
                .get()?
                .install(|| tasks.par_iter().try_for_each(run))?;
        }
        if !tasks.is_empty() {
            stages.pool += pooling.elapsed();
        }
        Ok(stages)
    }

    /// Validates and pools `req` into a new `[batch, width]` vector.
    pub fn lookup(&self, req: &Batch<'_>) -> Result<(Prepared, Vec<f32>)> {
        let prepared = self.prepare(req)?;
        let mut out = vec![0f32; prepared.batch * prepared.width];
        self.execute(req, &prepared, &mut out)?;
        Ok((prepared, out))
    }

    fn pool(
        &self,
        t: &crate::request::TableLookup<'_>,
        checked: &Checked,
        id: usize,
        bags: std::ops::Range<usize>,
        out: &mut BagsOut<'_>,
        deltas: DeltaView<'_>,
    ) -> Result<()> {
        let (b0, b1) = (bags.start, bags.end);
        let view = self.view(id);
        let (lo, hi) = (checked.bounds[b0], checked.bounds[b1]);
        let patch = deltas.patch(id, t.indices, lo..hi, view.rows());
        fn job<'a, I: RowIndex>(
            indices: &'a [I],
            t: &crate::request::TableLookup<'a>,
            bounds: &'a [usize],
            padding: Option<u64>,
        ) -> PoolJob<'a, I> {
            PoolJob {
                indices,
                bounds,
                weights: t.per_sample_weights,
                mode: t.mode,
                padding_idx: padding,
            }
        }
        let bounds = &checked.bounds[b0..=b1];
        // a task that reads rows written since the table's file pools them from its patch
        fn pool<I: RowIndex>(
            view: &TableView<'_>,
            job: &PoolJob<'_, I>,
            out: &mut BagsOut<'_>,
            patch: Option<&RowPatch>,
        ) -> std::result::Result<(), IndexError> {
            match patch {
                None => nearrec_kernels::pool_bags(view, job, out),
                Some(p) => nearrec_kernels::pool_bags_patched(view, job, out, p),
            }
        }
        let patch = patch.as_ref();
        let res = match t.indices {
            Indices::I32(ix) => pool(&view, &job(ix, t, bounds, checked.padding), out, patch),
            Indices::I64(ix) => pool(&view, &job(ix, t, bounds, checked.padding), out, patch),
        };
        res.map_err(
            |IndexError { position, value }| EngineError::IndexOutOfRange {
                table: t.table.to_owned(),
                position,
                bag: checked
                    .bounds
                    .partition_point(|&s| s <= position)
                    .saturating_sub(1),
                value,
                rows: view.rows(),
            },
        )
    }

    fn view(&self, id: usize) -> TableView<'_> {
        let t = &self.tables[id];
        TableView::new(
            self.resident(id)
                .expect("pooled from DRAM only when resident"),
            t.layout(),
            t.dtype,
            t.dim,
        )
        .expect("loaded table matches its layout")
    }

    /// Decodes rows `rows` of table `id` into `out` (`rows.len() * dim` floats), for callers that
    /// need the rows themselves (inspection, reference checks). Errors name the first bad position.
    pub fn read_rows(&self, id: usize, rows: &[i64], out: &mut [f32]) -> Result<()> {
        self.read_rows_at(id, rows, out, DeltaView::NONE)
    }

    /// The row each of keyed table `id`'s `keys` holds as a live store's snapshot sees them
    /// (`None`: the table does not hold it); reads only — no key is sighted, admitted or
    /// counted. Refused for a table addressed by row.
    pub fn key_rows_at(
        &self,
        id: usize,
        keys: &[u64],
        deltas: DeltaView<'_>,
    ) -> Result<Vec<Option<u32>>> {
        let Some(k) = &self.keys[id] else {
            return Err(EngineError::invalid(
                &self.tables[id].name,
                "the table is addressed by row, not by key",
            ));
        };
        let delta = deltas.keys(id).map(|d| (d, deltas));
        let found = k.rows_of(keys, None, delta);
        Ok(found
            .into_iter()
            .map(|r| (r != nearrec_cache::MISSING).then_some(r))
            .collect())
    }

    /// [`Self::read_rows`] as a live store's snapshot sees them (a written row is the delta's,
    /// a removed one zeros). A keyed table's `rows` are keys.
    pub fn read_rows_at(
        &self,
        id: usize,
        rows: &[i64],
        out: &mut [f32],
        deltas: DeltaView<'_>,
    ) -> Result<()> {
        let Some(keys) = &self.keys[id] else {
            return self.read_slots_at(id, rows, out, deltas);
        };
        let meta = &self.tables[id];
        let dim = meta.dim as usize;
        let delta = deltas.keys(id).map(|d| (d, deltas));
        let resolved =
            keys.resolve(&meta.name, Indices::I64(rows), (0, rows.len()), None, delta)?;
        self.read_slots_at(id, &resolved.rows, out, deltas)?;
        for &(position, key) in &resolved.init {
            keys.init_row(key, &mut out[position * dim..][..dim]);
        }
        Ok(())
    }

    /// Bags of `lookups` holding keys answered with init rows, pooled again from their rows
    /// read one by one and those init rows (`docs/format.md` §16).
    fn pool_init(
        &self,
        lookups: &[TableLookup<'_>],
        prepared: &Prepared,
        out: &mut [f32],
        deltas: DeltaView<'_>,
    ) -> Result<()> {
        for (k, resolved) in prepared.keyed.iter().enumerate() {
            let Some(resolved) = resolved.as_ref().filter(|r| !r.init.is_empty()) else {
                continue;
            };
            let (id, col, checked) = &prepared.tables[k];
            let keys = self.keys[*id].as_ref().expect("a keyed table");
            let dim = self.tables[*id].dim as usize;
            let t = &lookups[k];
            let mut init = resolved.init.iter().peekable();
            while let Some(&&(first, _)) = init.peek() {
                let bag = checked.bounds.partition_point(|&s| s <= first) - 1;
                let (lo, hi) = (checked.bounds[bag], checked.bounds[bag + 1]);
                let rows: Vec<i64> = (lo..hi).map(|p| t.indices.get(p)).collect();
                let mut values = vec![0f32; rows.len() * dim];
                self.read_slots_at(*id, &rows, &mut values, deltas)?;
                while let Some(&(position, key)) = init.next_if(|(p, _)| *p < hi) {
                    keys.init_row(key, &mut values[(position - lo) * dim..][..dim]);
                }
                let cell = &mut out[bag * prepared.width + col..][..dim];
                keyed::pool_bag(t, lo, &values, dim, cell);
            }
        }
        Ok(())
    }

    /// [`Self::read_rows_at`] by row number, whatever the table.
    fn read_slots_at(
        &self,
        id: usize,
        rows: &[i64],
        out: &mut [f32],
        deltas: DeltaView<'_>,
    ) -> Result<()> {
        let _inside = fork_gate();
        let meta = &self.tables[id];
        let dim = meta.dim as usize;
        assert_eq!(out.len(), rows.len() * dim, "output has the wrong size");
        if self.ssd.is_some() {
            // One-row sum bags: the row itself (0 + v, so only -0.0 comes back as +0.0).
            let req = Batch::new(vec![TableLookup::new(
                &meta.name,
                Indices::I64(rows),
                Bags::Fixed {
                    batch: rows.len(),
                    bag_size: 1,
                },
            )]);
            let prepared = self.prepare_in(&req, false, DeltaView::NONE)?;
            return self.run(&req, &prepared, out, None, deltas).map(drop);
        }
        let view = self.view(id);
        let patch = deltas.patch(id, Indices::I64(rows), 0..rows.len(), meta.rows);
        for (position, (&r, dst)) in rows.iter().zip(out.chunks_exact_mut(dim)).enumerate() {
            if r < 0 || r as u64 >= meta.rows {
                return Err(EngineError::IndexOutOfRange {
                    table: meta.name.clone(),
                    position,
                    bag: position,
                    value: r,
                    rows: meta.rows,
                });
            }
            let row = patch.as_ref().and_then(|p| p.get(r as u64));
            meta.dtype
                .decode_row(row.unwrap_or_else(|| view.row(r as u64)), dst);
        }
        Ok(())
    }
}
