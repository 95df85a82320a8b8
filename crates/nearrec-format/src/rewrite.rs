//! Table files written into a live store (`docs/live.md`): [`rewrite_table`], the copy-on-write
//! of one table — a compaction folds the rows written since the table's file into a new file,
//! under a new name, and leaves the old one untouched for the readers still on it — and
//! [`write_table`], a new table (`create_table`).
//!
//! The old data region streams through in 1 MiB chunks, each checked as it is read — against the
//! table's sector sums, or its one data CRC-32C for a table older than format version 3 — so that
//! a damaged row is never carried into a file whose fresh checksums would vouch for it; the new
//! rows are patched in at their slots (a damaged sector every row of which is written anew is
//! healed, not refused), and the same writer thread a build uses checksums and writes each chunk
//! (the data region's CRC-32C and the sector sums come out of it). The new file and its sums are
//! fsynced, and so is the directory, before this returns: a manifest may name them at once.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{FormatError, Result};
use crate::files;
use crate::header::{TABLE_VERSION, TableHeader};
use crate::layout::DATA_OFFSET;
use crate::manifest::TableMeta;
use crate::order::RowOrder;
use crate::sums::{SECTOR_BYTES, SectorSums, SumsMeta};
use crate::sync::fsync_dir;
use crate::writer::{TableSpec, TableWriter, WritePipeline, seal, write_beside};

/// Bytes read and written at a time by [`rewrite_table`].
const REWRITE_CHUNK: u64 = 1 << 20;

/// Writes table `meta` of store `dir` (its rows placed by `order` when it is co-located) as a
/// new file `file` (a `.nrt` name no manifest uses yet; one left by an interrupted rewrite is
/// replaced) with `rows` — `(row, encoded bytes)`, distinct rows in any order — in place of the
/// old ones. `pace` is called with the bytes of each chunk written, and may sleep to bound the
/// rate. Returns the new table's manifest entry; the old file is not touched.
///
/// A sector of the old data that does not match its sum, and holds a row not in `rows`, fails
/// the rewrite with [`FormatError::CorruptedRow`] naming the row (a table without sector sums:
/// [`FormatError::Corrupted`] once its data CRC-32C fails), and the new file is removed.
pub fn rewrite_table(
    dir: &Path,
    meta: &TableMeta,
    order: Option<&RowOrder>,
    file: &str,
    rows: &[(u64, &[u8])],
    pace: &mut dyn FnMut(u64),
) -> Result<TableMeta> {
    if file == meta.file || !file.ends_with(".nrt") || file.contains('/') {
        return Err(FormatError::invalid_table(
            &meta.name,
            format!("{file:?} cannot be the name of a table's new file"),
        ));
    }
    let layout = meta.layout();
    let rb = meta.row_bytes as usize;
    // (byte offset in the data region, row bytes), in file order
    let mut patches: Vec<(u64, &[u8])> = Vec::with_capacity(rows.len());
    for &(row, bytes) in rows {
        if row >= meta.rows || bytes.len() != rb {
            return Err(FormatError::invalid_table(
                &meta.name,
                format!(
                    "row {row} of {} bytes is not a row of this table ({} rows of {rb} bytes)",
                    bytes.len(),
                    meta.rows
                ),
            ));
        }
        let slot = order.map_or(row, |o| o.slot(row));
        patches.push((layout.row_offset(slot), bytes));
    }
    patches.sort_unstable_by_key(|p| p.0);

    let path = dir.join(&meta.file);
    let old = Old {
        file: files::open_regular(&path, files::IN_STORE).map_err(|e| FormatError::io(&path, e))?,
        sums: match &meta.sums {
            Some(sm) => Some(crate::reader::read_sums(dir, meta, sm)?),
            None => None,
        },
        path,
        meta,
        order,
    };
    copy_patched(&old, &patches, dir, file, pace).inspect_err(|_| {
        // nothing names the new file yet: a failed copy leaves nothing behind
        let _ = std::fs::remove_file(dir.join(file));
    })
}

/// The table a rewrite copies.
struct Old<'a> {
    file: std::fs::File,
    path: std::path::PathBuf,
    meta: &'a TableMeta,
    order: Option<&'a RowOrder>,
    /// `None`: a table older than format version 3, checked by its data CRC-32C alone.
    sums: Option<SectorSums>,
}

/// [`rewrite_table`]'s copy: `old`'s data region, checked, with `patches` — `(byte offset in
/// the data region, row bytes)`, in file order — written as `file` of store `dir`, sealed, with
/// its sums.
fn copy_patched(
    old: &Old<'_>,
    patches: &[(u64, &[u8])],
    dir: &Path,
    file: &str,
    pace: &mut dyn FnMut(u64),
) -> Result<TableMeta> {
    let meta = old.meta;
    let path = dir.join(file);
    let layout = meta.layout();
    let rb = meta.row_bytes as usize;
    let new = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| FormatError::io(&path, e))?;
    let mut pipeline = WritePipeline::start_with(new, path.clone(), None, true);
    // small chunks: the disk alternates between them and the lookups' reads (a 16 MiB read
    // or write holds it for milliseconds)
    let chunk = (REWRITE_CHUNK / layout.span_bytes()).max(1) * layout.span_bytes();
    let mut next = 0usize; // the first patch not yet applied
    let mut at = 0u64;
    let mut old_crc = 0u32; // of a table without sector sums
    while at < meta.data_bytes {
        let len = chunk.min(meta.data_bytes - at) as usize;
        let mut buf = pipeline.empty_buffer(chunk as usize);
        old.file
            .read_exact_at(&mut buf[..len], DATA_OFFSET + at)
            .map_err(|e| FormatError::io(&old.path, e))?;
        match &old.sums {
            Some(sums) => check_chunk(old, sums, patches, at, &buf[..len])?,
            None => old_crc = crc32c::crc32c_append(old_crc, &buf[..len]),
        }
        // read once: leave the page cache to what is read again
        // SAFETY: advice on an open descriptor, nothing else
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(
                old.file.as_raw_fd(),
                (DATA_OFFSET + at) as i64,
                len as i64,
                libc::POSIX_FADV_DONTNEED,
            );
        }
        while let Some(&(off, bytes)) = patches.get(next)
            && off < at + len as u64
        {
            let o = (off - at) as usize;
            buf[o..o + rb].copy_from_slice(bytes);
            next += 1;
        }
        pipeline.send(buf, len)?;
        pace(len as u64);
        at += len as u64;
    }
    if old.sums.is_none() && old_crc != meta.data_crc32c {
        return Err(FormatError::corrupted(
            &old.path,
            format!(
                "table {:?}: its data does not match its checksum (stored {:#010x}, read \
                 {old_crc:#010x}); a store older than format version 3 keeps no sector sums to \
                 say which row",
                meta.name, meta.data_crc32c
            ),
        ));
    }
    let (new, data_crc32c, sums) = pipeline.join()?;
    let header = TableHeader {
        version: TABLE_VERSION,
        dtype: meta.dtype,
        dim: meta.dim,
        block_bytes: meta.block_bytes,
        rows: meta.rows,
        row_bytes: meta.row_bytes,
        data_offset: DATA_OFFSET,
        data_bytes: meta.data_bytes,
        data_crc32c,
    };
    seal(&new, &path, &header)?;
    let (sums_file, crc32c) = write_beside(dir, file, ".sums", &sums.encode())?;
    fsync_dir(dir)?;
    Ok(TableMeta {
        file: file.to_owned(),
        data_crc32c,
        sums: Some(SumsMeta {
            file: sums_file,
            crc32c,
        }),
        ..meta.clone()
    })
}

/// Checks `data`, read at byte `at` of `meta`'s data region, against its sector sums: a damaged
/// sector is refused, naming its first row that `patches` (sorted by offset) does not replace;
/// one that holds only replaced rows, or only padding, is left to the new sums.
fn check_chunk(
    old: &Old<'_>,
    sums: &SectorSums,
    patches: &[(u64, &[u8])],
    at: u64,
    data: &[u8],
) -> Result<()> {
    let meta = old.meta;
    let layout = meta.layout();
    let (span, per) = (layout.span_bytes(), layout.rows_per_span());
    let mut from = 0usize;
    while let Err(sector) = sums.check(at + from as u64, &data[from..]) {
        let start = sector * SECTOR_BYTES;
        from = (start + SECTOR_BYTES - at) as usize;
        // the slots the sector's bytes overlap (a sector never straddles a span)
        let (first, within) = ((start / span) * per, start % span);
        let slots = (within / meta.row_bytes).min(per)
            ..((within + SECTOR_BYTES).div_ceil(meta.row_bytes)).min(per);
        // the rows it holds that no patch replaces (a sector's sum says that one of its bytes
        // is wrong, not which)
        let by_slot = old.order.map(RowOrder::rows_by_slot);
        let unpatched: Vec<u64> = slots
            .map(|k| first + k)
            .filter(|&s| s < meta.rows)
            .filter(|&s| {
                let off = layout.row_offset(s);
                patches.binary_search_by_key(&off, |p| p.0).is_err()
            })
            .map(|slot| by_slot.as_ref().map_or(slot, |r| r[slot as usize].into()))
            .collect();
        if let Some(&row) = unpatched.iter().min() {
            return Err(FormatError::CorruptedRow {
                path: old.path.clone(),
                table: meta.name.clone(),
                row,
                reason: format!(
                    "sector {sector} of its data, which holds rows {unpatched:?}, does not \
                     match its checksum; a compaction does not copy a damaged row"
                ),
            });
        }
        if from >= data.len() {
            break;
        }
    }
    Ok(())
}

/// Writes keyed table `meta`'s keys anew as the keys file beside table file name `file` (its
/// `.nrt` replaced by `.keys`; one left by an interrupted compaction is replaced): `entries`,
/// each key with its row, distinct keys and rows in `1..rows`, listed in row order. File and
/// directory are fsynced. Returns the table's manifest entry naming it; its data file is
/// untouched.
pub fn rewrite_keys(
    dir: &Path,
    meta: &TableMeta,
    file: &str,
    entries: &mut [crate::KeyRow],
) -> Result<TableMeta> {
    if !meta.is_keyed() || !file.ends_with(".nrt") || file.contains('/') {
        return Err(FormatError::invalid_table(
            &meta.name,
            format!("{file:?} cannot name a keyed table's new keys file"),
        ));
    }
    entries.sort_unstable_by_key(|e| e.1);
    if let Some(bad) = entries
        .iter()
        .find(|e| e.1 == 0 || u64::from(e.1) >= meta.rows)
    {
        return Err(FormatError::invalid_table(
            &meta.name,
            format!(
                "key {} given row {}, not a key's row of {} rows",
                bad.0, bad.1, meta.rows
            ),
        ));
    }
    if let Some(w) = entries.windows(2).find(|w| w[0].1 == w[1].1) {
        return Err(FormatError::invalid_table(
            &meta.name,
            format!("row {} given to keys {} and {}", w[0].1, w[0].0, w[1].0),
        ));
    }
    let (keys_file, crc32c) = write_beside(dir, file, ".keys", &crate::keys::encode(entries))?;
    fsync_dir(dir)?;
    Ok(TableMeta {
        keys: Some(crate::KeysMeta {
            file: keys_file,
            crc32c,
            count: entries.len() as u64,
            default: meta.keys.as_ref().is_some_and(|k| k.default),
        }),
        ..meta.clone()
    })
}

/// Writes a new table `spec` as file `file` (a `.nrt` name no manifest uses yet; one left by
/// an interrupted write is replaced) of store `dir`, row `r`'s values from `fill(r, row)`, with
/// its sector sums beside it; file, sums and directory are fsynced. Returns its manifest entry.
pub fn write_table(
    dir: &Path,
    file: &str,
    spec: TableSpec,
    fill: impl Fn(u64, &mut [f32]) + Sync,
) -> Result<TableMeta> {
    spec.validate()?;
    if !file.ends_with(".nrt") || file.contains('/') {
        return Err(FormatError::invalid_table(
            &spec.name,
            format!("{file:?} cannot be the name of a table's file"),
        ));
    }
    let path = dir.join(file);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(FormatError::io(&path, e));
        }
        _ => {}
    }
    // a table the disk cannot hold is refused before a byte is written, not half-way through
    let layout = spec.layout();
    // in 128 bits: 2^48 rows of 2^20 values do not fit in 64
    let data = u128::from(layout.spans()) * u128::from(layout.span_bytes());
    let needed = u128::from(DATA_OFFSET) + data + data.div_ceil(u128::from(SECTOR_BYTES)) * 4;
    let free = files::free_bytes(dir).map_err(|e| FormatError::io(dir, e))?;
    if needed > u128::from(free) {
        return Err(FormatError::invalid_table(
            &spec.name,
            format!(
                "the table needs {needed} bytes and the file system holding the store has \
                 {free} free; free space or make the table smaller"
            ),
        ));
    }
    let name = spec.name.clone();
    let written = write_new(dir, file, spec, fill);
    if written.is_err() {
        // nothing names the file yet: a failed write (the disk filled meanwhile) leaves
        // nothing behind
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(dir.join(file.replace(".nrt", ".sums")));
    }
    written.map_err(|e| match e {
        FormatError::Io { path, source } if source.raw_os_error() == Some(libc::ENOSPC) => {
            FormatError::invalid_table(
                &name,
                format!(
                    "the disk filled while {} was written: {source}",
                    path.display()
                ),
            )
        }
        e => e,
    })
}

/// [`write_table`]'s write, once the space is there.
fn write_new(
    dir: &Path,
    file: &str,
    spec: TableSpec,
    fill: impl Fn(u64, &mut [f32]) + Sync,
) -> Result<TableMeta> {
    let rows = spec.rows;
    let mut table = TableWriter::create(dir, file.to_owned(), spec, None)?;
    table.write_with(rows, fill)?;
    let (mut meta, sums) = table.finish()?;
    let (sums_file, crc32c) = write_beside(dir, file, ".sums", &sums.encode())?;
    meta.sums = Some(SumsMeta {
        file: sums_file,
        crc32c,
    });
    fsync_dir(dir)?;
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, StoreOptions, StoreReader, StoreWriter, TableSpec};

    /// A store of one table `t`, 10 rows of 4 ones.
    fn small_store(dir: &Path) -> std::path::PathBuf {
        let store = dir.join("s");
        let mut w = StoreWriter::create(&store, StoreOptions::default()).unwrap();
        let mut t = w.table(TableSpec::new("t", 10, 4, DType::Fp32)).unwrap();
        t.write_with(10, |_, out| out.fill(1.0)).unwrap();
        w.finish_table(t).unwrap();
        w.commit().unwrap();
        store
    }

    #[test]
    fn a_rewritten_table_has_the_new_rows_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut w = StoreWriter::create(&store, StoreOptions::default()).unwrap();
        // enough rows for several chunks' worth of spans, and a short last chunk
        let rows = 3 * REWRITE_CHUNK / 64 + 77;
        let mut t = w.table(TableSpec::new("t", rows, 16, DType::Fp32)).unwrap();
        t.write_with(rows, |r, out| out.fill(r as f32)).unwrap();
        w.finish_table(t).unwrap();
        w.commit().unwrap();
        let reader = StoreReader::open(&store).unwrap();
        let meta = reader.tables()[0].clone();
        let changed: Vec<(u64, Vec<u8>)> = [rows - 1, 0, REWRITE_CHUNK / 64, 5]
            .iter()
            .map(|&r| {
                let mut b = vec![0u8; 64];
                DType::Fp32.encode_row(&[-(r as f32); 16], &mut b);
                (r, b)
            })
            .collect();
        let borrowed: Vec<(u64, &[u8])> = changed.iter().map(|(r, b)| (*r, &b[..])).collect();
        let mut paced = 0;
        let new = rewrite_table(
            &store,
            &meta,
            None,
            "table-0000.0000000000000007.nrt",
            &borrowed,
            &mut |n| paced += n,
        )
        .unwrap();
        assert_eq!(paced, meta.data_bytes);
        assert_ne!(new.data_crc32c, meta.data_crc32c);
        let mut m = reader.manifest().clone();
        m.tables[0] = new;
        m.publish(&store).unwrap();
        drop(reader);
        let reader = StoreReader::open(&store).unwrap();
        let checks = reader.verify(None);
        assert_eq!(checks[0].error, None);
        // the old file is untouched, and no longer named: the compaction removes it
        assert!(checks[1].table.ends_with(&meta.file) && checks[1].error.is_some());
        let data = reader.read_table(0, true, None).unwrap();
        let layout = meta.layout();
        let row = |r: u64| {
            let mut out = [0f32; 16];
            let at = layout.row_offset(r) as usize;
            DType::Fp32.decode_row(&data.as_slice()[at..at + 64], &mut out);
            out[0]
        };
        for r in [0, 5, REWRITE_CHUNK / 64, rows - 1] {
            assert_eq!(row(r), -(r as f32));
        }
        for r in [1, 6, REWRITE_CHUNK / 64 + 1, rows - 2] {
            assert_eq!(row(r), r as f32);
        }
    }

    #[test]
    fn a_new_table_joins_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = small_store(dir.path());
        let spec = TableSpec::new("new", 300, 8, DType::Int8);
        let meta = write_table(&store, "table-0001.0000000000000003.nrt", spec, |r, out| {
            out.fill(r as f32 * 0.5)
        })
        .unwrap();
        let mut m = StoreReader::open(&store).unwrap().manifest().clone();
        m.tables.push(meta);
        m.publish(&store).unwrap();
        let reader = StoreReader::open(&store).unwrap();
        assert!(reader.verify(None).iter().all(|c| c.error.is_none()));
        let data = reader.read_table(1, true, None).unwrap();
        let t = &reader.tables()[1];
        let mut row = [0f32; 8];
        let at = t.layout().row_offset(299) as usize;
        t.dtype
            .decode_row(&data.as_slice()[at..][..t.row_bytes as usize], &mut row);
        assert!((row[0] - 149.5).abs() < 1.0, "{row:?}");
    }

    /// Flips one bit of row `row` of table 0 (rows in row-id order) in its file.
    fn flip_bit(store: &Path, row: u64) {
        let meta = StoreReader::open(store).unwrap().tables()[0].clone();
        let path = store.join(&meta.file);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let at = DATA_OFFSET + meta.layout().row_offset(row) + 1;
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, at).unwrap();
        file.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    }

    #[test]
    fn a_damaged_row_is_not_copied_into_a_checksummed_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        let mut w = StoreWriter::create(&store, StoreOptions::default()).unwrap();
        let mut t = w.table(TableSpec::new("t", 1000, 16, DType::Fp32)).unwrap();
        t.write_with(1000, |r, out| out.fill(r as f32)).unwrap();
        w.finish_table(t).unwrap();
        w.commit().unwrap();
        flip_bit(&store, 100);
        let meta = StoreReader::open(&store).unwrap().tables()[0].clone();
        let new = "table-0000.0000000000000002.nrt";
        let other = [0u8; 64];
        let err = rewrite_table(&store, &meta, None, new, &[(7, &other)], &mut |_| {}).unwrap_err();
        // a sector of 512 B holds rows 96..104 (64 B each); its sum says one of them is bad
        assert!(
            matches!(&err, FormatError::CorruptedRow { table, row: 96, .. } if table == "t"),
            "{err}"
        );
        assert!(err.to_string().contains("100"), "{err}");
        assert!(
            !store.join(new).exists(),
            "a failed rewrite leaves its file"
        );
        // every one of them written anew heals it
        let fresh: Vec<(u64, Vec<u8>)> = (96..104).map(|r| (r, vec![0u8; 64])).collect();
        let rows: Vec<(u64, &[u8])> = fresh.iter().map(|(r, b)| (*r, &b[..])).collect();
        let err = rewrite_table(&store, &meta, None, new, &rows[1..], &mut |_| {}).unwrap_err();
        assert!(
            matches!(err, FormatError::CorruptedRow { row: 96, .. }),
            "{err}"
        );
        assert!(!err.to_string().contains("97"), "{err}");
        let healed = rewrite_table(&store, &meta, None, new, &rows, &mut |_| {}).unwrap();
        let mut m = StoreReader::open(&store).unwrap().manifest().clone();
        m.tables[0] = healed;
        m.publish(&store).unwrap();
        let reader = StoreReader::open(&store).unwrap();
        assert_eq!(reader.verify(None)[0].error, None);
    }

    #[test]
    fn a_damaged_row_of_a_co_located_table_is_named_by_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = small_store(dir.path());
        flip_bit(&store, 3);
        let meta = StoreReader::open(&store).unwrap().tables()[0].clone();
        let order = RowOrder::from_rows_by_slot(&(0..10).rev().collect::<Vec<u32>>()).unwrap();
        let err = rewrite_table(
            &store,
            &meta,
            Some(&order),
            "table-0000.1.nrt",
            &[],
            &mut |_| {},
        )
        .unwrap_err();
        // one sector holds all ten rows of 16 B, named by their ids as the slots hold them
        assert!(
            matches!(err, FormatError::CorruptedRow { row: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("[9, 8, 7"), "{err}");
    }

    #[test]
    fn a_table_larger_than_the_free_disk_is_refused_before_a_byte_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = small_store(dir.path());
        let free = files::free_bytes(&store).unwrap();
        let file = "table-0001.0000000000000003.nrt";
        for rows in [free / 64 + 1, 1 << 48] {
            let spec = TableSpec::new("huge", rows, 16, DType::Fp32);
            let err = write_table(&store, file, spec, |_, out| out.fill(0.0)).unwrap_err();
            assert!(
                matches!(&err, FormatError::InvalidTable { table, reason }
                    if table == "huge" && reason.contains("free")),
                "{err}"
            );
            assert!(!store.join(file).exists());
        }
    }

    #[test]
    fn rows_outside_the_table_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = small_store(dir.path());
        let meta = StoreReader::open(&store).unwrap().tables()[0].clone();
        let row = [0u8; 16];
        let err = rewrite_table(
            &store,
            &meta,
            None,
            "table-0000.1.nrt",
            &[(10, &row)],
            &mut |_| {},
        )
        .unwrap_err();
        assert!(err.to_string().contains("row 10"), "{err}");
        let err = rewrite_table(&store, &meta, None, &meta.file, &[], &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("new file"), "{err}");
    }
}
