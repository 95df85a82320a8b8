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

/// Streams the rows of one table into its file.
pub struct TableWriter {
    spec: TableSpec,
    layout: RowLayout,
    file_name: String,
    path: PathBuf,
    pipeline: WritePipeline,
    /// The chunk being filled; rows `[chunk_index * chunk_rows, ...)` of the table.
    chunk: Option<Vec<u8>>,
    chunk_rows: u64,
    chunk_bytes: usize,
    rows_written: u64,
    /// Started by [`StoreWriter::keyed_table`] for this many keys: they come at the end.
    keyed: Option<u64>,
    /// Its row 0 is a default row given by the caller, not zeros.
    default_row: bool,
    /// The encoding error of the rows given as floats so far (a lossy dtype).
    error: ErrorSum,
}

/// The encoding error summed over rows: the largest, the sum and the count of absolute errors.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ErrorSum {
    max: f32,
    sum: f64,
    values: u64,
}

impl ErrorSum {
    fn add(mut self, other: ErrorSum) -> ErrorSum {
        self.max = self.max.max(other.max);
        self.sum += other.sum;
        self.values += other.values;
        self
    }

    /// `values` against `decoded`.
    fn of(values: &[f32], decoded: &[f32]) -> ErrorSum {
        let mut e = ErrorSum {
            values: values.len() as u64,
            ..ErrorSum::default()
        };
        for (a, b) in values.iter().zip(decoded) {
            let d = (a - b).abs();
            e.max = e.max.max(d);
            e.sum += f64::from(d);
        }
        e
    }

    fn report(self) -> Option<QuantError> {
        (self.values > 0).then(|| QuantError {
            max_abs: self.max,
            mean_abs: self.sum / self.values as f64,
            values: self.values,
        })
    }
}

impl TableWriter {
    /// A writer of table `spec` into a new file `file_name` of directory `dir`.
    pub(crate) fn create(
        dir: &Path,
        file_name: String,
        spec: TableSpec,
        progress: Option<ProgressFn>,
    ) -> Result<Self> {
        let path = dir.join(&file_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| FormatError::io(&path, e))?;
        let layout = spec.layout();
        let spans_per_chunk = (CHUNK_BYTES / layout.span_bytes()).max(1);
        let chunk_bytes = (spans_per_chunk * layout.span_bytes()) as usize;
        let pipeline = WritePipeline::start(file, path.clone(), progress);
        Ok(TableWriter {
            spec,
            layout,
            file_name,
            path,
            pipeline,
            chunk: None,
            chunk_rows: spans_per_chunk * layout.rows_per_span(),
            chunk_bytes,
            rows_written: 0,
            keyed: None,
            default_row: false,
            error: ErrorSum::default(),
        })
    }

    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    /// Takes `error` as the table's encoding error (rows copied from a table built with it).
    pub(crate) fn keep_error(&mut self, error: Option<QuantError>) {
        self.error = error.map_or_else(ErrorSum::default, |q| ErrorSum {
            max: q.max_abs,
            sum: q.mean_abs * q.values as f64,
            values: q.values,
        });
    }

    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// Appends rows given as a row-major `[n, dim]` fp32 array, encoding them to the table's dtype.
    pub fn write_f32(&mut self, values: &[f32]) -> Result<()> {
        let dim = self.spec.dim as usize;
        if !values.len().is_multiple_of(dim) {
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "got {} values, not a whole number of rows of dim {dim}",
                    values.len()
                ),
            ));
        }
        let first = self.rows_written;
        if self.spec.dtype.is_quantized()
            && let Some(at) = values.iter().position(|v| !v.is_finite())
        {
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "row {} value {} is {}: {} rows hold finite values only",
                    first + (at / dim) as u64,
                    at % dim,
                    values[at],
                    self.spec.dtype
                ),
            ));
        }
        self.write_with((values.len() / dim) as u64, |row, out| {
            let i = (row - first) as usize * dim;
            out.copy_from_slice(&values[i..i + dim]);
        })
    }

    /// Appends rows already encoded in the table's dtype, back to back (`row_bytes` each). A
    /// row-wise quantised row's scale and bias must be finite.
    pub fn write_encoded(&mut self, bytes: &[u8]) -> Result<()> {
        let rb = self.layout.row_bytes as usize;
        if !bytes.len().is_multiple_of(rb) {
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "got {} bytes, not a whole number of {rb}-byte rows",
                    bytes.len()
                ),
            ));
        }
        let first = self.rows_written;
        let (dtype, dim) = (self.spec.dtype, self.spec.dim as usize);
        if dtype.code_bits().is_some()
            && let Some((k, row)) = bytes.chunks_exact(rb).enumerate().find(|(_, row)| {
                let (scale, bias) = dtype.scale_bias(row, dim);
                !(scale.is_finite() && bias.is_finite())
            })
        {
            let (scale, bias) = dtype.scale_bias(row, dim);
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "row {}: scale {scale} and bias {bias}; a {dtype} row's are finite",
                    first + k as u64
                ),
            ));
        }
        self.write_rows((bytes.len() / rb) as u64, |row, out, _| {
            let i = (row - first) as usize * rb;
            out.copy_from_slice(&bytes[i..i + rb]);
            ErrorSum::default()
        })
    }

    /// Appends `n` rows produced by `fill(row, values)` (fp32, encoded here), in parallel. A
    /// lossy dtype's encoding error is measured as the rows are encoded (the table's
    /// [`QuantError`]).
    pub fn write_with(&mut self, n: u64, fill: impl Fn(u64, &mut [f32]) + Sync) -> Result<()> {
        let (dtype, dim) = (self.spec.dtype, self.spec.dim as usize);
        self.write_rows(n, |row, out, scratch| {
            match bytemuck::try_cast_slice_mut::<u8, f32>(out) {
                // fp32 rows are filled in place (chunks are 4-byte aligned, rows 4-byte multiples).
                Ok(values) if dtype == DType::Fp32 => {
                    fill(row, values);
                    ErrorSum::default()
                }
                _ => {
                    let (values, decoded) = scratch.split_at_mut(dim);
                    fill(row, values);
                    dtype.encode_row(values, out);
                    dtype.decode_row(out, decoded);
                    ErrorSum::of(values, decoded)
                }
            }
        })
    }

    /// Places rows `rows_written..rows_written + n` with `place(row, encoded_row, fp32_scratch)`
    /// (the scratch is `2 * dim` long; `place` returns the row's encoding error), spans in
    /// parallel, handing each full chunk to the writer thread.
    pub(crate) fn write_rows(
        &mut self,
        n: u64,
        place: impl Fn(u64, &mut [u8], &mut [f32]) -> ErrorSum + Sync,
    ) -> Result<()> {
        let end = self.rows_written + n;
        if end > self.spec.rows {
            return Err(FormatError::RowCount {
                table: self.spec.name.clone(),
                expected: self.spec.rows,
                written: end,
            });
        }
        let (layout, dim) = (self.layout, self.spec.dim as usize);
        let rps = layout.rows_per_span();
        let rb = layout.row_bytes as usize;
        while self.rows_written < end {
            let chunk_first = self.rows_written / self.chunk_rows * self.chunk_rows;
            let stop = end.min(chunk_first + self.chunk_rows);
            let lo = self.rows_written;
            let mut chunk = match self.chunk.take() {
                Some(c) => c,
                None => self.pipeline.empty_buffer(self.chunk_bytes),
            };
            let error = chunk
                .par_chunks_mut(layout.span_bytes() as usize)
                .enumerate()
                .map_init(
                    || vec![0f32; 2 * dim],
                    |scratch, (s, span)| {
                        let span_first = chunk_first + s as u64 * rps;
                        let mut error = ErrorSum::default();
                        for row in span_first.max(lo)..(span_first + rps).min(stop) {
                            let at = ((row - span_first) as usize) * rb;
                            error = error.add(place(row, &mut span[at..at + rb], scratch));
                        }
                        error
                    },
                )
                .reduce(ErrorSum::default, ErrorSum::add);
            self.error = self.error.add(error);
            self.rows_written = stop;
            if stop == chunk_first + self.chunk_rows {
                self.pipeline.send(chunk, self.chunk_bytes)?;
            } else {
                self.chunk = Some(chunk);
            }
        }
        Ok(())
    }

    /// Seals the table file; returns its manifest entry (without `sums`, which the store writer
    /// fills in when it has written them) and its sector sums.
    pub(crate) fn finish(mut self) -> Result<(TableMeta, SectorSums)> {
        if self.rows_written != self.spec.rows {
            return Err(FormatError::RowCount {
                table: self.spec.name.clone(),
                expected: self.spec.rows,
                written: self.rows_written,
            });
        }
        let total = self.layout.data_bytes();
        if let Some(chunk) = self.chunk.take() {
            let chunk_first = (self.rows_written - 1) / self.chunk_rows * self.chunk_rows;
            let start = self.layout.row_offset(chunk_first);
            self.pipeline.send(chunk, (total - start) as usize)?;
        }
        let (file, data_crc32c, sums) = self.pipeline.join()?;
        let header = TableHeader {
            version: TABLE_VERSION,
            dtype: self.spec.dtype,
            dim: self.spec.dim,
            block_bytes: self.spec.block_bytes,
            rows: self.spec.rows,
            row_bytes: self.layout.row_bytes,
            data_offset: DATA_OFFSET,
            data_bytes: total,
            data_crc32c,
        };
        seal(&file, &self.path, &header)?;
        let meta = TableMeta {
            name: self.spec.name.clone(),
            file: self.file_name.clone(),
            rows: self.spec.rows,
            dim: self.spec.dim,
            dtype: self.spec.dtype,
            row_bytes: self.layout.row_bytes,
            block_bytes: self.spec.block_bytes,
            data_bytes: total,
            data_crc32c,
            order: None,
            sums: None,
            keys: None,
            quant_error: self.error.report(),
        };
        Ok((meta, sums))
    }
}

impl std::fmt::Debug for TableWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableWriter")
            .field("spec", &self.spec)
            .field("rows_written", &self.rows_written)
            .finish()
    }
}

/// Writes and fsyncs a file kept beside table file `table` in `dir` (its name with `ext` for
/// `.nrt`); returns its name and CRC-32C.
pub(crate) fn write_beside(
    dir: &Path,
    table: &str,
    ext: &str,
    bytes: &[u8],
) -> Result<(String, u32)> {
    let file = table.replace(".nrt", ext);
    let path = dir.join(&file);
    let mut f = File::create(&path).map_err(|e| FormatError::io(&path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| FormatError::io(&path, e))?;
    Ok((file, crc32c::crc32c(bytes)))
}

/// Seals a table file whose data region is written: its header, its length, fsynced.
pub(crate) fn seal(file: &File, path: &Path, header: &TableHeader) -> Result<()> {
    let io = |e| FormatError::io(path, e);
    file.write_all_at(&header.encode(), 0).map_err(io)?;
    file.set_len(DATA_OFFSET + header.data_bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

/// What a table's writer thread leaves: the file, the data region's CRC-32C and its sector sums.
type Written = (File, u32, SectorSums);

/// A writer thread fed with full chunks; it checksums and appends them in order and hands the
/// buffers back for reuse.
pub(crate) struct WritePipeline {
    full: Option<SyncSender<(Vec<u8>, usize)>>,
    empty: Receiver<Vec<u8>>,
    spare: usize,
    thread: Option<JoinHandle<std::io::Result<Written>>>,
    path: PathBuf,
}

impl WritePipeline {
    pub(crate) fn start(file: File, path: PathBuf, progress: Option<ProgressFn>) -> Self {
        Self::start_with(file, path, progress, false)
    }

    /// [`Self::start`]; with `steady`, each chunk's writeback starts as soon as it is written
    /// and the chunk before it is waited for, so that at most two chunks are ever dirty: the
    /// disk sees a steady stream instead of the kernel's bursts and a flush of everything at
    /// the end (a live store's compaction, beside lookups that read the same disk), and the
    /// written pages leave the page cache.
    pub(crate) fn start_with(
        file: File,
        path: PathBuf,
        progress: Option<ProgressFn>,
        steady: bool,
    ) -> Self {
        let (full_tx, full_rx) = sync_channel::<(Vec<u8>, usize)>(PIPELINE_DEPTH - 1);
        let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(PIPELINE_DEPTH);
        let thread = std::thread::Builder::new()
            .name("nearrec-writer".into())
            .spawn(move || {
                let mut crc = 0u32;
                let mut sums = SectorSums::of(&[]);
                let mut at = DATA_OFFSET;
                let mut previous: Option<(u64, u64)> = None;
                for (mut buf, len) in full_rx {
                    let data = &buf[..len];
                    crc = crc32c::crc32c_append(crc, data);
                    sums.extend(data);
                    fail::fail_point!("table::write", |_| Err(std::io::Error::from_raw_os_error(
                        libc::ENOSPC
                    )));
                    file.write_all_at(data, at)?;
                    if steady {
                        crate::sync::write_back(&file, at, len as u64, previous)?;
                        previous = Some((at, len as u64));
                    }
                    at += len as u64;
                    if let Some(p) = &progress {
                        p(len as u64);
                    }
                    buf.fill(0);
                    let _ = empty_tx.try_send(buf);
                }
                Ok((file, crc, sums))
            })
            .expect("spawn writer thread");
        Self {
            full: Some(full_tx),
            empty: empty_rx,
            spare: PIPELINE_DEPTH,
            thread: Some(thread),
            path,
        }
    }

    /// A zeroed chunk buffer: a recycled one, or a new one while fewer than `PIPELINE_DEPTH` exist.
    pub(crate) fn empty_buffer(&mut self, bytes: usize) -> Vec<u8> {
        if self.spare > 0 {
            self.spare -= 1;
            return vec![0u8; bytes];
        }
        // The writer thread returns every buffer it is sent; if it died, start a fresh one and
        // let `send` report its error.
        self.empty.recv().unwrap_or_else(|_| vec![0u8; bytes])
    }

    pub(crate) fn send(&mut self, buf: Vec<u8>, len: usize) -> Result<()> {
        let ok = self
            .full
            .as_ref()
            .is_some_and(|tx| tx.send((buf, len)).is_ok());
        if ok { Ok(()) } else { self.join().map(|_| ()) }
    }

    pub(crate) fn join(&mut self) -> Result<Written> {
        self.full = None;
        let handle = self.thread.take().ok_or_else(|| {
            FormatError::io(
                &self.path,
                std::io::Error::other("table writer already finished"),
            )
        })?;
        match handle.join() {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err(FormatError::io(&self.path, e)),
            Err(_) => Err(FormatError::io(
                &self.path,
                std::io::Error::other("writer thread panicked"),
            )),
        }
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
