//! Tables created and dropped while the store serves (RM-SSD's RM_create_table, EMB-SSD's
//! EMB_REMOVE of a table; `docs/live.md`).
//!
//! A change of the tables has the log to itself: it takes the writer's gate exclusively (calls
//! wait meanwhile), folds everything written so far into the tables (a compaction), and then:
//!
//! 1. `create_table` writes the new table's file (`table-NNNN.<L>.nrt`, `L` the record's
//!    sequence number), fsynced, before anything names it;
//! 2. the change is appended to the log as record `L` (durable);
//! 3. a manifest with the change and `lsn = L` replaces the old one;
//! 4. an engine over the new tables — the others' tiers shared with the old engine — is
//!    published as version `L`; lookups under way finish on the old one.
//!
//! A crash before 2 leaves an unnamed file (removed at the next writable open); after 2, the
//! writable open finds the record after the manifest's position and does 1 and 3 again
//! ([`redo`]): the new table's rows are a function of the record.

use std::sync::Arc;

use nearrec_format::wal::{Init, Op, Record};
use nearrec_format::{
    DType, FormatError, StoreReader, TableMeta, TableSpec, UniformInit, write_table,
};

use super::compact::unnamed;
use super::{Live, Snapshot, Writer, lock, lock_store_dir};
use crate::error::{Error, Result};

impl Live {
    /// Creates table `name` of `rows` × `dim` values in `dtype`, started as `init` says; returns
    /// the version that made it.
    pub(crate) fn create_table(
        &self,
        name: &str,
        rows: u64,
        dim: u32,
        dtype: DType,
        init: Init,
    ) -> Result<u64> {
        TableSpec::new(name, rows, dim, dtype).validate()?;
        self.change(Op::CreateTable {
            table: name.to_owned(),
            rows,
            dim,
            dtype,
            init,
        })
    }

    /// Drops table `name`; returns the version that dropped it. Lookups under way finish on it;
    /// later ones get `UnknownTable`.
    pub(crate) fn drop_table(&self, name: &str) -> Result<u64> {
        self.snapshot().engine.table_id(name)?;
        self.change(Op::DropTable {
            table: name.to_owned(),
        })
    }

    /// The manifest's `params` changed by `f` (a shard's tag, [`crate::Replica::retag`]),
    /// atomically, under the directory's lock every manifest change takes, so that none
    /// replaces it with an older one; nothing written where `f` refuses. A writer's call.
    pub(crate) fn change_params<T>(
        &self,
        f: impl FnOnce(&mut serde_json::Value) -> Result<T>,
    ) -> Result<T> {
        self.writer()?;
        let dir = lock_store_dir(&self.dir)?;
        let mut manifest = StoreReader::open(&self.dir)?.manifest().clone();
        let done = f(&mut manifest.params)?;
        manifest.publish(&self.dir)?;
        drop(dir);
        Ok(done)
    }

    fn change(&self, op: Op) -> Result<u64> {
        let w = self.writer()?;
        let _gate = w.gate.write().unwrap_or_else(|p| p.into_inner());
        let w = self.writer()?;
        let mut previous = lock(&w.compacting);
        if let Op::CreateTable { table, .. } = &op
            && self.snapshot().engine.table_id(table).is_ok()
        {
            return Err(Error::InvalidRequest {
                table: Some(table.clone()),
                position: None,
                reason: "the store has a table of that name already".into(),
            });
        }
        // (which keeps the transactions held in files: the table change is the only record
        // past the base it moves, the gate held whole)
        self.compact_locked(w, &mut previous)?;
        // no call can append meanwhile: the record gets the next number
        let lsn = w.wal.next_lsn();
        let created = create_file(self, &op, lsn)?;
        let logged = w.wal.append(std::slice::from_ref(&op))?;
        if logged != lsn {
            return Err(Error::Internal(format!(
                "the log numbered a change of the tables {logged}, not {lsn}"
            )));
        }
        fail::fail_point!("tables::logged", |_| std::process::abort());
        publish(self, Some(w), &op, lsn, created)?;
        Ok(lsn)
    }
}

/// A writable open whose log holds a change of the tables after the manifest's position (the
/// writer stopped between its log append and its manifest): the change done again. `records`
/// are the log's records after the tables' position; a change of the tables can only be the
/// one record there.
pub(super) fn redo(live: &Live, w: &Writer, records: &[Record]) -> Result<bool> {
    let Some(r) = records.iter().find(|r| r.changes_tables()) else {
        return Ok(false);
    };
    if records.len() != 1 || r.ops.len() != 1 {
        return Err(FormatError::Corrupted {
            path: live.dir.clone(),
            reason: format!(
                "write-ahead log: record {} changes the tables but is not alone after the \
                 tables' position",
                r.lsn
            ),
        }
        .into());
    }
    let created = create_file(live, &r.ops[0], r.lsn)?;
    publish(live, Some(w), &r.ops[0], r.lsn, created)?;
    Ok(true)
}

/// The new table's file, for a `CreateTable` logged (or to be logged) as `lsn`.
fn create_file(live: &Live, op: &Op, lsn: u64) -> Result<Option<TableMeta>> {
    let Op::CreateTable {
        table,
        rows,
        dim,
        dtype,
        init,
    } = op
    else {
        return Ok(None);
    };
    let position = live.snapshot().engine.tables().len();
    let file = format!("table-{position:04}.{lsn:016x}.nrt");
    let spec = TableSpec::new(table.clone(), *rows, *dim, *dtype);
    let meta = match *init {
        Init::Zeros => write_table(&live.dir, &file, spec, |_, out| out.fill(0.0))?,
        Init::Uniform { seed } => {
            let init = UniformInit::new(seed, position as u64, *rows);
            write_table(&live.dir, &file, spec, |r, out| init.fill(r, out))?
        }
    };
    Ok(Some(meta))
}

/// Steps 3 and 4 of the module docs for `op`, logged as `lsn`, after everything before it is in
/// the tables.
fn publish(
    live: &Live,
    w: Option<&Writer>,
    op: &Op,
    lsn: u64,
    created: Option<TableMeta>,
) -> Result<()> {
    let dir = lock_store_dir(&live.dir)?;
    let old = StoreReader::open(&live.dir)?;
    let mut manifest = old.manifest().clone();
    match (op, created) {
        (Op::CreateTable { .. }, Some(meta)) => manifest.tables.push(meta),
        (Op::DropTable { table }, _) => manifest.tables.retain(|t| &t.name != table),
        _ => {
            return Err(Error::Internal(
                "a change of the tables without its table".into(),
            ));
        }
    }
    manifest.lsn = Some(lsn);
    manifest.feeds = (*live.snapshot().feeds).clone();
    manifest.format_version = manifest.needed_version().max(manifest.format_version);
    manifest.publish(&live.dir)?;
    let reader = StoreReader::open(&live.dir)?;
    drop(dir);
    let current = live.snapshot();
    let keep: Vec<Option<usize>> = reader
        .tables()
        .iter()
        .map(|t| current.engine.table_id(&t.name).ok())
        .collect();
    let engine = Arc::new(current.engine.derive(&reader, &keep)?);
    let deltas = keep
        .iter()
        .map(|k| k.and_then(|old| current.deltas[old].clone()))
        .collect();
    let keys = keep
        .iter()
        .map(|k| k.and_then(|old| current.keys[old].clone()))
        .collect();
    let current_feeds = current.feeds.clone();
    drop(current);
    live.publishing(|| {
        live.publish(Snapshot {
            version: lsn,
            base: lsn,
            engine,
            deltas,
            keys,
            feeds: current_feeds,
            folded: None,
        });
    });
    if let Some(w) = w {
        *lock(&w.applied) = lsn;
        w.turn.notify_all();
    }
    if let Some(w) = w {
        w.retire_more(unnamed(old.manifest(), &manifest));
        if let Op::DropTable { table } = op {
            lock(&w.books).remove(table);
        }
    }
    Ok(())
}
