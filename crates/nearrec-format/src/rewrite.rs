//! Table files written into a live store (`docs/live.md`): [`rewrite_table`], the copy-on-write
//! of one table — a compaction folds the rows written since the table's file into a new file,
//! under a new name, and leaves the old one untouched for the readers still on it — and
//! [`write_table`], a new table (`create_table`).
//!
//! The old data region streams through in 1 MiB chunks, the new rows are patched in
//! at their slots, and the same writer thread a build uses checksums and writes each chunk (the
//! data region's CRC-32C and the sector sums come out of it). The new file and its sums are
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
use crate::sums::SumsMeta;
use crate::sync::fsync_dir;
use crate::writer::{TableSpec, TableWriter, WritePipeline, seal, write_beside};

/// Bytes read and written at a time by [`rewrite_table`].
const REWRITE_CHUNK: u64 = 1 << 20;

/// Writes table `meta` of store `dir` (its rows placed by `order` when it is co-located) as a
/// new file `file` (a `.nrt` name no manifest uses yet; one left by an interrupted rewrite is
/// replaced) with `rows` — `(row, encoded bytes)`, distinct rows in any order — in place of the
/// old ones. `pace` is called with the bytes of each chunk written, and may sleep to bound the
/// rate. Returns the new table's manifest entry; the old file is not touched.
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

    let old_path = dir.join(&meta.file);
    let old = files::open_regular(&old_path, files::IN_STORE)
        .map_err(|e| FormatError::io(&old_path, e))?;
    let path = dir.join(file);
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
    while at < meta.data_bytes {
        let len = chunk.min(meta.data_bytes - at) as usize;
        let mut buf = pipeline.empty_buffer(chunk as usize);
        old.read_exact_at(&mut buf[..len], DATA_OFFSET + at)
            .map_err(|e| FormatError::io(&old_path, e))?;
        // read once: leave the page cache to what is read again
        // SAFETY: advice on an open descriptor, nothing else
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(
                old.as_raw_fd(),
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
