//! Opening and checking stores.
//!
//! `StoreReader::open` validates everything that is cheap — manifest magic, version and checksum,
//! every table header (magic, checksum, agreement with the manifest) and every file size — so a
//! store that opens has the shape it claims. Row orders of co-located tables are read and checked
//! whole (CRC-32C, and that they are permutations). Data bytes are checked by CRC-32C when a table
//! is read whole (`read_table`) and by `verify`.

use std::fs::File;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::aligned::AlignedBuf;
use crate::chunks::{CHUNK_BYTES, ProgressFn};
use crate::error::{FormatError, Result};
use crate::header::{HEADER_BYTES, TableHeader};
use crate::keys::KeyRow;
use crate::layout::DATA_OFFSET;
use crate::manifest::{MANIFEST_FILE, Manifest, TableMeta};
use crate::order::RowOrder;
use crate::sums::{SECTOR_BYTES, SectorSums, SumsMeta};

/// An open store: its manifest, one open file per table and the row orders of co-located tables.
#[derive(Debug)]
pub struct StoreReader {
    path: PathBuf,
    manifest: Manifest,
    files: Vec<File>,
    orders: Vec<Option<Arc<RowOrder>>>,
}

/// The outcome of checking one table's data bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCheck {
    pub table: String,
    pub bytes: u64,
    /// `None` when every byte matched its checksum.
    pub error: Option<String>,
}

impl StoreReader {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mpath = path.join(MANIFEST_FILE);
        let bytes =
            crate::files::read_regular(&mpath, crate::files::IN_STORE).map_err(|e| {
                match e.kind() {
                    std::io::ErrorKind::NotFound => FormatError::NotFound {
                        path: path.clone(),
                        source: e,
                    },
                    _ => FormatError::io(&mpath, e),
                }
            })?;
        let manifest = Manifest::decode(&bytes).map_err(|e| match e {
            Ok(found) => FormatError::UnsupportedVersion {
                path: path.clone(),
                found,
                supported: crate::manifest::FORMAT_VERSION,
            },
            Err(reason) => FormatError::corrupted(&mpath, reason),
        })?;
        let mut files = Vec::with_capacity(manifest.tables.len());
        for (i, meta) in manifest.tables.iter().enumerate() {
            if manifest.tables[..i].iter().any(|t| t.name == meta.name) {
                return Err(FormatError::corrupted(
                    &mpath,
                    format!("table {:?} is listed twice", meta.name),
                ));
            }
            files.push(open_table(&path, meta)?);
        }
        let orders = manifest
            .tables
            .iter()
            .map(|meta| open_order(&path, meta))
            .collect::<Result<_>>()?;
        for a in &manifest.attachments {
            check_attachment(&path, a)?;
        }
        Ok(Self {
            path,
            manifest,
            files,
            orders,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn tables(&self) -> &[TableMeta] {
        &self.manifest.tables
    }

    /// The open data file of table `i` (the data region starts at `DATA_OFFSET`).
    pub fn file(&self, i: usize) -> &File {
        &self.files[i]
    }

    /// Where table `i`'s rows sit in its file, when it is co-located (`None`: row `r` at slot `r`).
    pub fn order(&self, i: usize) -> Option<&Arc<RowOrder>> {
        self.orders[i].as_ref()
    }

    /// The store's attachments, as the manifest lists them.
    pub fn attachments(&self) -> &[crate::Attachment] {
        &self.manifest.attachments
    }

    /// Attachment `name`'s bytes, checked against their CRC-32C (`None`: no such attachment).
    pub fn read_attachment(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let Some(a) = self.manifest.attachments.iter().find(|a| a.name == name) else {
            return Ok(None);
        };
        let path = self.path.join(&a.file);
        let bytes = crate::files::read_regular(&path, crate::files::IN_STORE)
            .map_err(|e| FormatError::io(&path, e))?;
        let crc = crc32c::crc32c(&bytes);
        if bytes.len() as u64 != a.bytes || crc != a.crc32c {
            return Err(FormatError::corrupted(
                path,
                format!(
                    "attachment {name:?} is {} bytes with checksum {crc:#010x}, the manifest says \
                     {} bytes, {:#010x}",
                    bytes.len(),
                    a.bytes,
                    a.crc32c
                ),
            ));
        }
        Ok(Some(bytes))
    }

    /// Every table's row order, in table order.
    pub fn orders(&self) -> &[Option<Arc<RowOrder>>] {
        &self.orders
    }

    /// Keyed table `i`'s keys with their rows (`docs/format.md` §16), read from its keys file
    /// and checked (`None`: a table addressed by position).
    pub fn keys(&self, i: usize) -> Result<Option<Vec<KeyRow>>> {
        let meta = &self.manifest.tables[i];
        let Some(km) = &meta.keys else {
            return Ok(None);
        };
        read_keys(&self.path, meta, km).map(Some)
    }

    /// Table `i`'s sector checksums, read from its sums file and checked (`None`: a table of
    /// a store older than format version 3, unprotected on the read path).
    pub fn sector_sums(&self, i: usize) -> Result<Option<SectorSums>> {
        let meta = &self.manifest.tables[i];
        let Some(sm) = &meta.sums else {
            return Ok(None);
        };
        read_sums(&self.path, meta, sm).map(Some)
    }

    /// Reads table `i`'s data region into an aligned buffer, rows in row-id order (a co-located
    /// table's rows are put back in place), checking its CRC-32C on the way when `check` is set
    /// (cheap next to the read itself).
    pub fn read_table(
        &self,
        i: usize,
        check: bool,
        progress: Option<&ProgressFn>,
    ) -> Result<AlignedBuf> {
        let meta = &self.manifest.tables[i];
        let len = usize::try_from(meta.data_bytes).map_err(|_| {
            FormatError::invalid_table(
                &meta.name,
                "table is larger than this machine's address space",
            )
        })?;
        let mut buf = AlignedBuf::try_zeroed(len).ok_or_else(|| FormatError::OutOfMemory {
            what: format!("table {:?}", meta.name),
            bytes: meta.data_bytes,
        })?;
        let mut crc = 0u32;
        match self.orders[i].as_deref() {
            None => {
                for (k, chunk) in buf
                    .as_mut_slice()
                    .chunks_mut(CHUNK_BYTES as usize)
                    .enumerate()
                {
                    let at = DATA_OFFSET + k as u64 * CHUNK_BYTES;
                    self.files[i]
                        .read_exact_at(chunk, at)
                        .map_err(|e| self.read_error(i, e))?;
                    if check {
                        crc = crc32c::crc32c_append(crc, chunk);
                    }
                    if let Some(p) = progress {
                        p(chunk.len() as u64);
                    }
                }
            }
            Some(order) => {
                // Chunks hold whole spans, so each chunk's rows are put back in place as it lands.
                let layout = meta.layout();
                let rows_by_slot = order.rows_by_slot();
                let span = layout.span_bytes() as usize;
                let chunk_bytes = (CHUNK_BYTES as usize / span).max(1) * span;
                let mut staging = vec![0u8; chunk_bytes];
                let rb = meta.row_bytes as usize;
                let out = buf.as_mut_slice();
                let slots_per_chunk = (chunk_bytes / span) as u64 * layout.rows_per_span();
                for k in 0..len.div_ceil(chunk_bytes) {
                    let n = chunk_bytes.min(len - k * chunk_bytes);
                    let at = DATA_OFFSET + (k * chunk_bytes) as u64;
                    self.files[i]
                        .read_exact_at(&mut staging[..n], at)
                        .map_err(|e| self.read_error(i, e))?;
                    if check {
                        crc = crc32c::crc32c_append(crc, &staging[..n]);
                    }
                    let first = k as u64 * slots_per_chunk;
                    for slot in first..(first + slots_per_chunk).min(meta.rows) {
                        let from = (layout.row_offset(slot) - (k * chunk_bytes) as u64) as usize;
                        let to = layout.row_offset(u64::from(rows_by_slot[slot as usize]));
                        out[to as usize..][..rb].copy_from_slice(&staging[from..][..rb]);
                    }
                    if let Some(p) = progress {
                        p(n as u64);
                    }
                }
            }
        }
        if check && crc != meta.data_crc32c {
            return Err(self.crc_error(i, crc));
        }
        Ok(buf)
    }

    /// Rows `ids` of table `i` as stored (encoded, `row_bytes` each, back to back) into `out`,
    /// each sector they are read from checked against the table's sector sums (`sums`, from
    /// [`Self::sector_sums`]; `None`: unchecked). Runs of rows next to each other on disk are
    /// read in one call, in bounded memory: a caller streams a table through it in chunks.
    pub fn read_rows_encoded(
        &self,
        i: usize,
        ids: &[u64],
        sums: Option<&SectorSums>,
        out: &mut [u8],
    ) -> Result<()> {
        let meta = &self.manifest.tables[i];
        let (layout, rb) = (meta.layout(), meta.row_bytes as usize);
        if out.len() != ids.len() * rb {
            return Err(FormatError::invalid_table(
                &meta.name,
                format!("{} bytes for {} rows of {rb}", out.len(), ids.len()),
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id >= meta.rows) {
            return Err(FormatError::invalid_table(
                &meta.name,
                format!("row {bad} is past its {} rows", meta.rows),
            ));
        }
        let slot = |id: u64| self.orders[i].as_ref().map_or(id, |o| o.slot(id));
        let mut staging = Vec::new();
        let mut k = 0;
        while k < ids.len() {
            // a run of ids in consecutive slots, at most a chunk's bytes
            let first = slot(ids[k]);
            let mut n = 1;
            while k + n < ids.len()
                && slot(ids[k + n]) == first + n as u64
                && layout.row_offset(first + n as u64) - layout.row_offset(first) < CHUNK_BYTES
            {
                n += 1;
            }
            let start = layout.row_offset(first) / SECTOR_BYTES * SECTOR_BYTES;
            let end = (layout.row_offset(first + n as u64 - 1) + rb as u64)
                .next_multiple_of(SECTOR_BYTES)
                .min(meta.data_bytes);
            staging.resize((end - start) as usize, 0);
            self.files[i]
                .read_exact_at(&mut staging, DATA_OFFSET + start)
                .map_err(|e| self.read_error(i, e))?;
            if let Some(sums) = sums
                && let Err(sector) = sums.check(start, &staging)
            {
                return Err(FormatError::corrupted(
                    self.path.join(&meta.file),
                    format!(
                        "table {:?}: sector {sector} does not match its checksum",
                        meta.name
                    ),
                ));
            }
            for r in 0..n {
                let at = (layout.row_offset(first + r as u64) - start) as usize;
                out[(k + r) * rb..][..rb].copy_from_slice(&staging[at..][..rb]);
            }
            k += n;
        }
        Ok(())
    }

    /// Checks every data byte of every table against its CRC-32C and its sector sums, streaming
    /// in bounded memory, then every attachment (reported as `attachment NAME`), then lists
    /// what interrupted writes left in the store (`orphan PATH`, see [`crate::gc`]).
    pub fn verify(&self, progress: Option<&ProgressFn>) -> Vec<TableCheck> {
        let mut checks = self.verify_tables(progress);
        checks.extend(
            (self.manifest.tables.iter().enumerate())
                .filter(|(_, t)| t.is_keyed())
                .map(|(i, t)| TableCheck {
                    table: format!("keys of {}", t.name),
                    bytes: t.entries() * crate::keys::ENTRY_BYTES as u64,
                    error: self.keys(i).err().map(|e| e.to_string()),
                }),
        );
        checks.extend(self.manifest.attachments.iter().map(|a| TableCheck {
            table: format!("attachment {}", a.name),
            bytes: a.bytes,
            error: self.read_attachment(&a.name).err().map(|e| e.to_string()),
        }));
        // Files the manifest does not name; not while a writer holds the store (its new blob is
        // not named yet).
        if let Ok(Some(_lock)) = crate::files::lock_dir(&self.path, false) {
            let orphans = crate::leftovers::orphans(&self.path, &self.manifest);
            checks.extend(orphans.into_iter().filter(|o| o.ours).map(|o| TableCheck {
                table: format!("orphan {}", o.path.display()),
                bytes: o.bytes,
                error: Some(o.reason),
            }));
        }
        checks
    }

    fn verify_tables(&self, progress: Option<&ProgressFn>) -> Vec<TableCheck> {
        let mut each = |n: u64| {
            if let Some(p) = progress {
                p(n);
            }
            ControlFlow::Continue(())
        };
        self.check_tables(CHUNK_BYTES as usize, false, &mut each)
    }

    /// [`StoreReader::verify`]'s check of the tables' data alone, as a scrub makes it:
    /// `chunk` bytes read at a time, each range's cached pages let go of first, so that it is
    /// read from the device (a page cached before the damage would hide it) and the pass leaves
    /// none of its own pages in the cache; `each(n)` is told of every chunk read — it paces the
    /// pass, and stops it with `ControlFlow::Break`, the checks then covering the tables
    /// finished.
    pub fn scrub_tables(
        &self,
        chunk: usize,
        each: &mut dyn FnMut(u64) -> ControlFlow<()>,
    ) -> Vec<TableCheck> {
        self.check_tables(chunk.max(SECTOR_BYTES as usize), true, each)
    }

    fn check_tables(
        &self,
        chunk: usize,
        uncached: bool,
        each: &mut dyn FnMut(u64) -> ControlFlow<()>,
    ) -> Vec<TableCheck> {
        let chunk = chunk as u64 / SECTOR_BYTES * SECTOR_BYTES;
        let mut buf = vec![0u8; chunk as usize];
        let mut checks = Vec::with_capacity(self.files.len());
        for i in 0..self.files.len() {
            let meta = &self.manifest.tables[i];
            let mut crc = 0u32;
            let mut at = 0u64;
            let (sums, mut error) = match self.sector_sums(i) {
                Ok(sums) => (sums, None),
                Err(e) => (None, Some(e.to_string())),
            };
            while at < meta.data_bytes {
                let n = chunk.min(meta.data_bytes - at) as usize;
                if uncached {
                    drop_cached(&self.files[i], DATA_OFFSET + at, n);
                }
                if let Err(e) = self.files[i].read_exact_at(&mut buf[..n], DATA_OFFSET + at) {
                    error = Some(self.read_error(i, e).to_string());
                    break;
                }
                crc = crc32c::crc32c_append(crc, &buf[..n]);
                if let Some(Err(sector)) = sums.as_ref().map(|s| s.check(at, &buf[..n]))
                    && error.is_none()
                {
                    error = Some(format!(
                        "table {:?}: sector {sector} (bytes {} of the data region) does not \
                         match its checksum",
                        meta.name,
                        sector * SECTOR_BYTES
                    ));
                }
                at += n as u64;
                if uncached {
                    drop_cached(&self.files[i], DATA_OFFSET + at - n as u64, n);
                }
                if each(n as u64).is_break() {
                    return checks;
                }
            }
            if at >= meta.data_bytes && error.is_none() && crc != meta.data_crc32c {
                error = Some(self.crc_error(i, crc).to_string());
            }
            checks.push(TableCheck {
                table: meta.name.clone(),
                bytes: meta.data_bytes,
                error,
            });
        }
        checks
    }

    fn read_error(&self, i: usize, e: std::io::Error) -> FormatError {
        let meta = &self.manifest.tables[i];
        let path = self.path.join(&meta.file);
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FormatError::corrupted(path, format!("table {:?} is truncated", meta.name))
        } else {
            FormatError::io(path, e)
        }
    }

    fn crc_error(&self, i: usize, crc: u32) -> FormatError {
        let meta = &self.manifest.tables[i];
        FormatError::corrupted(
            self.path.join(&meta.file),
            format!(
                "table {:?} data checksum mismatch (stored {:#010x}, computed {crc:#010x})",
                meta.name, meta.data_crc32c
            ),
        )
    }
}

/// `Err(reason)` when a file name the manifest gives would leave the store directory.
fn inside_store(file: &str) -> Result<(), String> {
    if file.contains('/') || file.starts_with('.') || file.is_empty() {
        Err(format!("file name {file:?} escapes the store directory"))
    } else {
        Ok(())
    }
}

/// Checks that an attachment's file is where and as large as the manifest says.
fn check_attachment(root: &Path, a: &crate::Attachment) -> Result<()> {
    let path = root.join(&a.file);
    let bad = |reason: String| {
        FormatError::corrupted(&path, format!("attachment {:?}: {reason}", a.name))
    };
    inside_store(&a.file).map_err(bad)?;
    match std::fs::symlink_metadata(&path) {
        Ok(m) if !m.is_file() => Err(bad(
            "is not a regular file inside the store (a link, a directory or a device)".into(),
        )),
        Ok(m) if m.len() == a.bytes => Ok(()),
        Ok(m) => Err(bad(format!(
            "file is {} bytes, the manifest says {}",
            m.len(),
            a.bytes
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(bad("file is missing".into())),
        Err(e) => Err(FormatError::io(&path, e)),
    }
}

/// Reads and checks a co-located table's order file.
fn open_order(root: &Path, meta: &TableMeta) -> Result<Option<Arc<RowOrder>>> {
    let Some(om) = &meta.order else {
        return Ok(None);
    };
    read_beside(root, meta, &om.file, "row order", |bytes| {
        RowOrder::decode(bytes, meta.rows, om)
    })
    .map(|o| Some(Arc::new(o)))
}

/// The keys of keyed table `meta` in store `root` with their rows, read and checked (size,
/// CRC-32C, rows in range; that keys and rows are distinct is checked by the index built from
/// them).
fn read_keys(root: &Path, meta: &TableMeta, km: &crate::KeysMeta) -> Result<Vec<KeyRow>> {
    read_beside(root, meta, &km.file, "keys", |bytes| {
        let want = km.count.checked_mul(crate::keys::ENTRY_BYTES as u64);
        if want != Some(bytes.len() as u64) {
            return Err(format!(
                "the keys file is {} bytes; {} keys need {}",
                bytes.len(),
                km.count,
                want.map_or("more".into(), |w| w.to_string())
            ));
        }
        let crc = crc32c::crc32c(bytes);
        if crc != km.crc32c {
            return Err(format!(
                "keys checksum mismatch (stored {:#010x}, computed {crc:#010x})",
                km.crc32c
            ));
        }
        crate::keys::decode(bytes, meta.rows)
    })
}

/// The sector sums `sm` of table `meta` in store `root`, read and checked.
pub(crate) fn read_sums(root: &Path, meta: &TableMeta, sm: &SumsMeta) -> Result<SectorSums> {
    read_beside(root, meta, &sm.file, "sector sums", |bytes| {
        SectorSums::decode(bytes, meta.data_bytes, sm)
    })
}

/// Reads `file`, kept beside table `meta` (its row order, its sector sums), and decodes it: a
/// name outside the store, a missing file or bytes that do not decode are a corrupted store.
fn read_beside<T>(
    root: &Path,
    meta: &TableMeta,
    file: &str,
    what: &str,
    decode: impl FnOnce(&[u8]) -> std::result::Result<T, String>,
) -> Result<T> {
    let path = root.join(file);
    let bad = |reason: String| {
        FormatError::corrupted(&path, format!("table {:?} {what}: {reason}", meta.name))
    };
    inside_store(file).map_err(bad)?;
    let bytes =
        crate::files::read_regular(&path, crate::files::IN_STORE).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => bad(format!("{what} file is missing")),
            _ => FormatError::io(&path, e),
        })?;
    decode(&bytes).map_err(bad)
}

fn open_table(root: &Path, meta: &TableMeta) -> Result<File> {
    let bad = |reason: String| {
        FormatError::corrupted(
            root.join(&meta.file),
            format!("table {:?}: {reason}", meta.name),
        )
    };
    inside_store(&meta.file).map_err(bad)?;
    let fpath = root.join(&meta.file);
    let file =
        crate::files::open_regular(&fpath, crate::files::IN_STORE).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => bad("table file is missing".into()),
            _ => FormatError::io(&fpath, e),
        })?;
    let mut head = [0u8; HEADER_BYTES];
    file.read_exact_at(&mut head, 0)
        .map_err(|_| bad("table file is shorter than its header".into()))?;
    let h = TableHeader::decode(&head).map_err(bad)?;
    let agree = h.dtype == meta.dtype
        && h.dim == meta.dim
        && h.rows == meta.rows
        && h.row_bytes == meta.row_bytes
        && h.block_bytes == meta.block_bytes
        && h.data_bytes == meta.data_bytes
        && h.data_crc32c == meta.data_crc32c
        && h.data_offset == DATA_OFFSET;
    if !agree {
        return Err(bad("table header disagrees with the manifest".into()));
    }
    if h.version != crate::header::TABLE_VERSION {
        return Err(bad(format!("table version {} is not supported", h.version)));
    }
    if !h.block_bytes.is_power_of_two() || h.block_bytes < 512 || h.dim == 0 {
        return Err(bad("invalid block size or dim".into()));
    }
    if meta.dtype.row_bytes(meta.dim) != meta.row_bytes
        || meta.layout().data_bytes() != meta.data_bytes
    {
        return Err(bad(
            "row size or data size does not match rows, dim and dtype".into(),
        ));
    }
    let len = file
        .metadata()
        .map_err(|e| FormatError::io(&fpath, e))?
        .len();
    if len != DATA_OFFSET + meta.data_bytes {
        return Err(bad(format!(
            "table file is {len} bytes, expected {} (truncated or extended)",
            DATA_OFFSET + meta.data_bytes
        )));
    }
    Ok(file)
}

/// Lets go of the page cache's copy of `len` bytes of `file` at `at` (advice: nothing fails if
/// the kernel does not take it).
fn drop_cached(file: &std::fs::File, at: u64, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on a range of a descriptor this reader holds open
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            at as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}
