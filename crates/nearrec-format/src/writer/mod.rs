//! Streaming, atomic store creation.
//!
//! A store is written into a hidden temporary directory beside the target and becomes visible in
//! one `rename` after every file and the directory are fsynced; a crash or kill before that leaves
//! the old store (or none) in place, never a torn one. Rows stream through fixed-size chunk buffers
//! (`CHUNK_BYTES`, `PIPELINE_DEPTH` of them) to a writer thread, so memory stays bounded whatever
//! the table size, and encoding the next chunk overlaps writing the last one.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use rayon::prelude::*;

use crate::attach::write_blob;
use crate::chunks::{CHUNK_BYTES, ProgressFn};
use crate::dtype::DType;
use crate::error::{FormatError, Result};
use crate::header::{TABLE_VERSION, TableHeader};
use crate::keys::KeyRow;
use crate::layout::{DATA_OFFSET, DEFAULT_BLOCK_BYTES, RowLayout};
use crate::manifest::Attachment;
use crate::manifest::{MANIFEST_FILE, Manifest, QuantError, TableMeta};
use crate::order::{OrderMeta, RowOrder};
use crate::sums::{SectorSums, SumsMeta};
use crate::sync::{commit_dir, fsync_dir, is_store_or_empty};

mod pipeline;
mod table;

pub(crate) use pipeline::WritePipeline;
pub use table::TableWriter;
pub(crate) use table::{seal, write_beside};

/// The rows of a keyed table, its zero row included, fit a `u32` short of its top value (the
/// readers' index marks an empty slot with it).
const KEYED_ROWS: u64 = u32::MAX as u64;
/// Chunk buffers in flight per table: one being encoded, the rest queued for the writer thread.
const PIPELINE_DEPTH: usize = 3;

/// How a store is created.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Replace an existing store at the target path (never a directory that is not a store).
    pub overwrite: bool,
    /// Free-form creation parameters recorded in the manifest.
    pub params: serde_json::Value,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            overwrite: false,
            params: serde_json::Value::Null,
        }
    }
}

/// The shape of one table to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    pub name: String,
    pub rows: u64,
    pub dim: u32,
    pub dtype: DType,
    /// Alignment unit of the row layout; a power of two ≥ 512 (default 4096).
    pub block_bytes: u32,
}

impl TableSpec {
    pub fn new(name: impl Into<String>, rows: u64, dim: u32, dtype: DType) -> Self {
        Self {
            name: name.into(),
            rows,
            dim,
            dtype,
            block_bytes: DEFAULT_BLOCK_BYTES,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |r: &str| Err(FormatError::invalid_table(&self.name, r));
        if self.name.is_empty() || self.name.len() > 255 || self.name.chars().any(char::is_control)
        {
            return bad("table names must be 1-255 printable characters");
        }
        if self.dim == 0 || self.dim > 1 << 20 {
            return bad("dim must be between 1 and 1048576");
        }
        if let Err(why) = self.dtype.check_dim(self.dim) {
            return bad(&why);
        }
        // The data region starts at file offset 4096, so blocks up to 4 KiB stay aligned in the file.
        if !self.block_bytes.is_power_of_two() || !(512..=4096).contains(&self.block_bytes) {
            return bad("block_bytes must be a power of two between 512 and 4096");
        }
        if self.rows > 1 << 48 {
            return bad("more than 2^48 rows");
        }
        Ok(())
    }

    pub fn layout(&self) -> RowLayout {
        RowLayout::new(
            self.rows,
            self.dtype.row_bytes(self.dim),
            u64::from(self.block_bytes),
        )
    }
}

/// The first key of `keys` given twice, with its first two positions.
fn repeated(keys: &[u64]) -> Option<(u64, usize, usize)> {
    let mut sorted = keys.to_vec();
    sorted.par_sort_unstable();
    let key = sorted.windows(2).find(|w| w[0] == w[1])?[0];
    let mut at = keys
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == key)
        .map(|(i, _)| i);
    Some((key, at.next()?, at.next()?))
}

/// Builds a store; nothing is visible at the target until `commit`.
pub struct StoreWriter {
    target: PathBuf,
    tmp: PathBuf,
    /// The temporary directory's lock, held while this writer lives: while it is held, no
    /// sweep of stale temporaries removes the directory (see [`crate::gc`]).
    _lock: File,
    options: StoreOptions,
    tables: Vec<TableMeta>,
    attachments: Vec<Attachment>,
    progress: Option<ProgressFn>,
    committed: bool,
}

impl StoreWriter {
    pub fn create(path: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        let target = absolute(path.as_ref())?;
        if target.exists() && !options.overwrite {
            return Err(FormatError::AlreadyExists { path: target });
        }
        if target.exists() && !is_store_or_empty(&target) {
            return Err(FormatError::invalid_table(
                "-",
                format!(
                    "{} exists and is not a nearrec store; refusing to replace it",
                    target.display()
                ),
            ));
        }
        let parent = target.parent().unwrap_or(Path::new("/")).to_path_buf();
        fs::create_dir_all(&parent).map_err(|e| FormatError::io(&parent, e))?;
        let base = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        crate::leftovers::sweep_temps(&parent, &mut crate::GcReport::default());
        let (tmp, lock) = locked_temp(&parent, &base)?;
        Ok(Self {
            target,
            tmp,
            _lock: lock,
            options,
            tables: Vec::new(),
            attachments: Vec::new(),
            progress: None,
            committed: false,
        })
    }

    /// Reports bytes written as they reach the writer thread.
    pub fn with_progress(mut self, progress: ProgressFn) -> Self {
        self.progress = Some(progress);
        self
    }

    pub fn path(&self) -> &Path {
        &self.target
    }

    /// Starts the next table. Rows must then be written in order, all of them, and the table
    /// handed back to [`Self::finish_table`]. One table is written at a time.
    pub fn table(&mut self, spec: TableSpec) -> Result<TableWriter> {
        spec.validate()?;
        if self.tables.iter().any(|t| t.name == spec.name) {
            return Err(FormatError::invalid_table(
                &spec.name,
                "a table of that name was already written",
            ));
        }
        let file_name = format!("table-{:04}.nrt", self.tables.len());
        if self.tmp.join(&file_name).exists() {
            return Err(FormatError::invalid_table(
                &spec.name,
                "the previous table was not finished",
            ));
        }
        TableWriter::create(&self.tmp, file_name, spec, self.progress.clone())
    }

    /// Starts a keyed table of `spec.rows` keys and room for `spare` more (`docs/format.md`
    /// §16): its zero row is written first, then the keys' rows must be written in order and
    /// the table handed back, with its keys, to [`Self::finish_table_keyed`], which adds the
    /// `spare` free rows. The store becomes format version 5.
    pub fn keyed_table(&mut self, spec: TableSpec, spare: u64) -> Result<TableWriter> {
        self.keyed_table_with_default(spec, spare, None)
    }

    /// [`Self::keyed_table`] whose row 0 — what unknown keys pool as under the `default`
    /// policy — is `default` (`dim` values) instead of zeros: a TorchRec managed-collision
    /// table's default slot.
    pub fn keyed_table_with_default(
        &mut self,
        mut spec: TableSpec,
        spare: u64,
        default: Option<&[f32]>,
    ) -> Result<TableWriter> {
        let rows = spec.rows.checked_add(spare).and_then(|r| r.checked_add(1));
        if rows.is_none_or(|r| r > KEYED_ROWS) {
            return Err(FormatError::invalid_table(
                &spec.name,
                format!(
                    "{} keys and {spare} spare rows: a keyed table has at most {} rows",
                    spec.rows,
                    KEYED_ROWS - 1
                ),
            ));
        }
        let keys = spec.rows;
        spec.rows = rows.expect("checked");
        let dim = spec.dim as usize;
        if default.is_some_and(|d| d.len() != dim || d.iter().any(|v| !v.is_finite())) {
            return Err(FormatError::invalid_table(
                &spec.name,
                format!("a default row is {dim} finite values"),
            ));
        }
        let mut table = self.table(spec)?;
        match default {
            Some(row) => table.write_f32(row)?,
            None => table.write_f32(&vec![0.0; dim])?,
        }
        table.keyed = Some(keys);
        table.default_row = default.is_some();
        Ok(table)
    }

    /// Flushes, fsyncs and seals `table` (writes its header) and records it in the manifest. All
    /// its rows must have been written.
    pub fn finish_table(&mut self, table: TableWriter) -> Result<()> {
        if table.keyed.is_some() {
            return Err(FormatError::invalid_table(
                &table.spec.name,
                "a keyed table is finished with its keys (finish_table_keyed)",
            ));
        }
        self.finish_table_in(table, None)
    }

    /// As [`Self::finish_table`], for a table started by [`Self::keyed_table`]: `keys[i]` is the
    /// key of the `i`-th row written after the zero row. Keys must be distinct (a repeated one
    /// is refused, naming its first two positions); their number must be the rows'. The spare
    /// rows are written (zeros) here.
    pub fn finish_table_keyed(&mut self, mut table: TableWriter, keys: &[u64]) -> Result<()> {
        let name = table.spec.name.clone();
        let Some(want) = table.keyed else {
            return Err(FormatError::invalid_table(
                &name,
                "the table was not started as a keyed table (keyed_table)",
            ));
        };
        if keys.len() as u64 != want || table.rows_written != want + 1 {
            return Err(FormatError::invalid_table(
                &name,
                format!(
                    "{} keys were given for {} rows",
                    keys.len(),
                    table.rows_written - 1
                ),
            ));
        }
        if let Some((key, first, again)) = repeated(keys) {
            return Err(FormatError::invalid_table(
                &name,
                format!("key {key} is given twice, at positions {first} and {again}"),
            ));
        }
        let spare = table.spec.rows - table.rows_written;
        table.write_with(spare, |_, out| out.fill(0.0))?;
        let entries: Vec<KeyRow> = (keys.iter().zip(1u32..)).map(|(&k, r)| (k, r)).collect();
        self.finish_keyed(table, &entries)
    }

    /// Seals a keyed table whose rows are all written, `entries` its keys and their rows
    /// (checked by the caller).
    pub(crate) fn finish_keyed(
        &mut self,
        mut table: TableWriter,
        entries: &[KeyRow],
    ) -> Result<()> {
        table.keyed = None;
        let table_default = table.default_row;
        self.finish_table_in(table, None)?;
        let meta = self.tables.last_mut().expect("just finished");
        let bytes = crate::keys::encode(entries);
        let (file, crc32c) = write_beside(&self.tmp, &meta.file, ".keys", &bytes)?;
        if let Some(p) = &self.progress {
            p(bytes.len() as u64);
        }
        meta.keys = Some(crate::KeysMeta {
            file,
            crc32c,
            count: entries.len() as u64,
            default: table_default,
        });
        Ok(())
    }

    /// As [`Self::finish_table`], for a table whose rows were written in slot order: the rows at
    /// slots `0, 1, ...` were rows `order.rows_by_slot()`. Lookups keep using row ids; the store
    /// becomes format version 2.
    pub fn finish_table_ordered(&mut self, table: TableWriter, order: &RowOrder) -> Result<()> {
        if table.keyed.is_some() {
            return Err(FormatError::invalid_table(
                &table.spec.name,
                "a keyed table cannot be co-located",
            ));
        }
        if order.rows() != table.spec.rows {
            return Err(FormatError::invalid_table(
                &table.spec.name,
                format!(
                    "the row order has {} rows, the table {}",
                    order.rows(),
                    table.spec.rows
                ),
            ));
        }
        self.finish_table_in(table, Some(order))
    }

    fn finish_table_in(&mut self, table: TableWriter, order: Option<&RowOrder>) -> Result<()> {
        if table.path.parent() != Some(self.tmp.as_path()) {
            return Err(FormatError::invalid_table(
                &table.spec.name,
                "table belongs to another store writer",
            ));
        }
        let (mut meta, sums) = table.finish()?;
        let (file, crc32c) = self.write_beside(&meta, ".sums", &sums.encode())?;
        meta.sums = Some(SumsMeta { file, crc32c });
        if let Some(order) = order {
            let (file, crc32c) = self.write_beside(&meta, ".order", &order.encode())?;
            meta.order = Some(OrderMeta { file, crc32c });
        }
        self.tables.push(meta);
        Ok(())
    }

    /// Writes and fsyncs a file kept beside `meta`'s table file (its name with `ext` for
    /// `.nrt`); returns its name and CRC-32C.
    fn write_beside(&self, meta: &TableMeta, ext: &str, bytes: &[u8]) -> Result<(String, u32)> {
        let done = write_beside(&self.tmp, &meta.file, ext, bytes)?;
        if let Some(p) = &self.progress {
            p(bytes.len() as u64);
        }
        Ok(done)
    }

    /// Keeps `bytes` with the store as attachment `name` (see [`crate::attach`]).
    pub fn attach(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        if self.attachments.iter().any(|a| a.name == name) {
            return Err(FormatError::invalid_table(name, "attached twice"));
        }
        let a = write_blob(&self.tmp, &self.attachments, name, bytes)?;
        self.attachments.push(a);
        Ok(())
    }

    /// Writes the manifest and makes the store visible atomically.
    pub fn commit(mut self) -> Result<Manifest> {
        let mut manifest = Manifest {
            format_version: 0,
            created_by: format!("nearrec {}", env!("CARGO_PKG_VERSION")),
            params: self.options.params.clone(),
            tables: std::mem::take(&mut self.tables),
            attachments: std::mem::take(&mut self.attachments),
            lsn: None,
            feeds: Default::default(),
        };
        manifest.format_version = manifest.needed_version();
        let mpath = self.tmp.join(MANIFEST_FILE);
        let mut f = File::create(&mpath).map_err(|e| FormatError::io(&mpath, e))?;
        f.write_all(&manifest.encode())
            .and_then(|()| f.sync_all())
            .map_err(|e| FormatError::io(&mpath, e))?;
        drop(f);
        fsync_dir(&self.tmp)?;
        commit_dir(&self.tmp, &self.target, self.options.overwrite)?;
        self.committed = true;
        Ok(manifest)
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

impl std::fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWriter")
            .field("target", &self.target)
            .field("tables", &self.tables.len())
            .finish()
    }
}

/// A fresh temporary directory for a build of `base` in `parent`, and its lock. A sweep that
/// took the lock between our `mkdir` and our `flock` has removed the directory: then try again
/// under another name.
fn locked_temp(parent: &Path, base: &str) -> Result<(PathBuf, File)> {
    loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tmp = parent.join(format!(
            ".{base}{}{}-{nanos}",
            crate::leftovers::TEMP_INFIX,
            std::process::id()
        ));
        let io = |e| FormatError::io(&tmp, e);
        fs::create_dir(&tmp).map_err(io)?;
        let lock = match crate::files::lock_dir(&tmp, true) {
            Ok(Some(lock)) => lock,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // swept already
            Ok(None) => unreachable!("a waiting lock is taken or fails"),
            Err(e) => return Err(io(e)),
        };
        if lock.metadata().map_err(io)?.nlink() > 0 {
            return Ok((tmp, lock));
        }
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).map_err(|e| FormatError::io(p, e))
}
