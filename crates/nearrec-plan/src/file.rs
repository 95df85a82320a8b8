//! The binary trace file: one file per trace, little-endian, its arrays at aligned offsets so
//! that they can be used in place (numpy views over the bytes, or a memory map on request).
//!
//! ```text
//! version 3 (a trace with a keyed table) and version 2 (one without; written since the read
//! path checks integrity):
//! 0   magic "NRTRACE\0"
//! 8   u32 version (3 or 2)
//! 12  u32 header length H
//! 16  u32 CRC-32C of the H header bytes
//! 20  u32 zero
//! 24  H bytes of JSON: TraceHeader (bags, batch size, seed, per table: name, rows, pooling,
//!     generator, lookups, the byte offsets of its two arrays and their CRC-32Cs; from version
//!     3, `keys: true` for a keyed table, whose indices are keys — a u64's bits — not rows)
//! ..  per table, each array 64-byte aligned: offsets i64 × (bags + 1), indices i64 × lookups
//!
//! A trace with a keyed table is version 3 so that a build before keyed traces refuses it rather
//! than read its keys as rows; one without stays version 2, which every build since reads.
//!
//! version 1 (still read, flagged unverified): no checksums; the JSON starts at byte 16.
//! ```
//! The writer writes to a temporary name and renames, so a trace is either whole or absent.
//!
//! [`TraceFile::open`] reads the file into memory: a memory map of a file that another process
//! truncates kills the reader with `SIGBUS`, which a server must not risk.
//! [`TraceFile::map`] maps it instead, for files nobody changes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use nearrec_format::files::open_regular;
use serde::{Deserialize, Serialize};

use crate::error::{PlanError, Result};
use crate::generate::{Generator, TableSpec, TableTrace};

pub const MAGIC: &[u8; 8] = b"NRTRACE\0";
/// The newest version written (3: with a keyed table; a trace without is written as 2).
pub const VERSION: u32 = 3;
/// The version of a trace without keyed tables.
const VERSION_ROWS: u32 = 2;
/// Where a version-2 or -3 header's JSON starts (a version-1 header's starts at 16).
const JSON_AT: usize = 24;
const ALIGN: u64 = 64;

/// What a trace file says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Bags per table (samples).
    pub bags: u64,
    /// The batch size the trace is meant to be served in (a hint; any split works).
    pub batch_size: u32,
    pub seed: u64,
    pub tables: Vec<TableEntry>,
}

/// One table of a trace file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableEntry {
    pub name: String,
    pub rows: u64,
    pub pooling: u32,
    /// How it was made (`None`: imported).
    pub generator: Option<Generator>,
    pub first_reference_share: Option<f64>,
    pub lookups: u64,
    /// Byte offsets of the `offsets` and `indices` arrays.
    pub offsets_at: u64,
    pub indices_at: u64,
    /// CRC-32C of the `offsets` and `indices` arrays (version 2; `None` in version 1 files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offsets_crc32c: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub indices_crc32c: Option<u32>,
    /// A keyed table (`docs/format.md` §16): its indices are keys (a u64's bits), not rows in
    /// `0..rows`; `rows` is the table's row count, as for any table (version 3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keys: bool,
}

/// A table's data to write: its description and its bags (CSR).
#[derive(Debug, Clone)]
pub struct TableData<'a> {
    pub name: &'a str,
    pub rows: u64,
    pub pooling: u32,
    pub generator: Option<Generator>,
    pub first_reference_share: Option<f64>,
    /// The indices are a keyed table's keys, not rows.
    pub keys: bool,
    pub offsets: &'a [i64],
    pub indices: &'a [i64],
}

impl<'a> TableData<'a> {
    /// A generated table, described by its spec.
    pub fn generated(spec: &'a TableSpec, trace: &'a TableTrace) -> Self {
        Self {
            name: &spec.name,
            rows: spec.rows,
            pooling: spec.pooling,
            generator: Some(spec.generator.clone()),
            first_reference_share: trace.first_reference_share,
            keys: false,
            offsets: &trace.offsets,
            indices: &trace.indices,
        }
    }
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Writes a trace file atomically; returns its header.
pub fn write_trace(
    path: &Path,
    batch_size: u32,
    seed: u64,
    tables: &[TableData<'_>],
    overwrite: bool,
) -> Result<TraceHeader> {
    if !overwrite && path.exists() {
        return Err(PlanError::Exists { path: path.into() });
    }
    let bags = tables
        .first()
        .map_or(0, |t| t.offsets.len().saturating_sub(1) as u64);
    for (i, t) in tables.iter().enumerate() {
        if tables[..i].iter().any(|u| u.name == t.name) {
            return Err(PlanError::BadSpec {
                table: t.name.to_owned(),
                reason: "appears twice in the trace".into(),
            });
        }
        check_csr(
            t.name,
            (!t.keys).then_some(t.rows),
            bags,
            t.offsets,
            t.indices,
        )?;
    }
    let version = if tables.iter().any(|t| t.keys) {
        VERSION
    } else {
        VERSION_ROWS
    };
    // two passes: the header's length depends on the offsets it holds
    let mut header = TraceHeader {
        bags,
        batch_size,
        seed,
        tables: tables
            .iter()
            .map(|t| TableEntry {
                name: t.name.to_owned(),
                rows: t.rows,
                pooling: t.pooling,
                generator: t.generator.clone(),
                first_reference_share: t.first_reference_share,
                lookups: t.indices.len() as u64,
                offsets_at: u64::MAX,
                indices_at: u64::MAX,
                offsets_crc32c: Some(u32::MAX),
                indices_crc32c: Some(u32::MAX),
                keys: t.keys,
            })
            .collect(),
    };
    let reserve = serde_json::to_vec(&header).expect("serialisable").len() as u64;
    let mut at = align(JSON_AT as u64 + reserve);
    for (entry, t) in header.tables.iter_mut().zip(tables) {
        entry.offsets_at = at;
        at = align(at + 8 * t.offsets.len() as u64);
        entry.indices_at = at;
        at = align(at + 8 * t.indices.len() as u64);
        entry.offsets_crc32c = Some(crc32c::crc32c(bytemuck::cast_slice(t.offsets)));
        entry.indices_crc32c = Some(crc32c::crc32c(bytemuck::cast_slice(t.indices)));
    }
    let mut json = serde_json::to_vec(&header).expect("serialisable");
    // numbers print no longer than the maxima did: pad the JSON with spaces to the reserved length
    json.resize(reserve as usize, b' ');

    let tmp = tmp_path(path);
    let io = PlanError::io(&tmp);
    let result = (|| -> std::io::Result<()> {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        w.write_all(MAGIC)?;
        w.write_all(&version.to_le_bytes())?;
        w.write_all(&(json.len() as u32).to_le_bytes())?;
        w.write_all(&crc32c::crc32c(&json).to_le_bytes())?;
        w.write_all(&[0u8; 4])?;
        w.write_all(&json)?;
        let mut written = (JSON_AT + json.len()) as u64;
        for (entry, t) in header.tables.iter().zip(tables) {
            for (at, data) in [(entry.offsets_at, t.offsets), (entry.indices_at, t.indices)] {
                w.write_all(&vec![0u8; (at - written) as usize])?;
                for v in data {
                    w.write_all(&v.to_le_bytes())?;
                }
                written = at + 8 * data.len() as u64;
            }
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    std::fs::rename(&tmp, path).map_err(PlanError::io(path))?;
    Ok(header)
}

/// A trace path that is not a regular file is not a trace.
fn not_regular(path: &Path) -> impl FnOnce(std::io::Error) -> PlanError {
    move |e| match e.kind() {
        std::io::ErrorKind::InvalidInput => PlanError::BadTrace {
            path: path.into(),
            reason: e.to_string(),
        },
        _ => PlanError::Io {
            path: path.into(),
            source: e,
        },
    }
}

/// Where a file is written before it is renamed into place: `name.tmp` beside it.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// A table's bags well formed, and its indices rows in `0..rows` (any key where `rows` is `None`).
fn check_csr(
    table: &str,
    rows: Option<u64>,
    bags: u64,
    offsets: &[i64],
    indices: &[i64],
) -> Result<()> {
    let bad = |reason: String| {
        Err(PlanError::BadSpec {
            table: table.to_owned(),
            reason,
        })
    };
    if offsets.len() as u64 != bags + 1 {
        return bad(format!(
            "{} bags, the first table has {bags}",
            offsets.len() - 1
        ));
    }
    if offsets.first() != Some(&0) || *offsets.last().unwrap_or(&0) != indices.len() as i64 {
        return bad("offsets must start at 0 and end at the number of indices".into());
    }
    if let Some(b) = offsets.windows(2).position(|w| w[0] > w[1]) {
        return bad(format!("offsets decrease at bag {b}"));
    }
    let Some(rows) = rows else {
        return Ok(());
    };
    if let Some(p) = indices.iter().position(|&i| i < 0 || i as u64 >= rows) {
        return bad(format!(
            "index {} at position {p} is outside 0..{rows}",
            indices[p]
        ));
    }
    Ok(())
}

/// A trace file, validated: read into memory ([`TraceFile::open`]) or mapped
/// ([`TraceFile::map`]).
#[derive(Debug)]
pub struct TraceFile {
    path: PathBuf,
    bytes: Bytes,
    header: TraceHeader,
    verified: bool,
}

/// A trace file's bytes: owned (8-byte aligned, so arrays can be borrowed as `i64`) or mapped.
#[derive(Debug)]
enum Bytes {
    Owned { words: Vec<u64>, len: usize },
    Mapped(Mmap),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
            Self::Mapped(map) => map,
        }
    }
}

/// One table's bags in a trace.
#[derive(Debug, Clone, Copy)]
pub struct TableSlices<'a> {
    pub entry: &'a TableEntry,
    pub offsets: &'a [i64],
    pub indices: &'a [i64],
}

impl TraceFile {
    /// Reads the trace file at `path` into memory and validates it (checksums included).
    pub fn open(path: &Path) -> Result<Self> {
        let mut file = open_regular(path, 0).map_err(not_regular(path))?;
        let len = file.metadata().map_err(PlanError::io(path))?.len() as usize;
        let mut words = vec![0u64; len.div_ceil(8)];
        std::io::Read::read_exact(&mut file, &mut bytemuck::cast_slice_mut(&mut words)[..len])
            .map_err(PlanError::io(path))?;
        Self::parse(path, Bytes::Owned { words, len })
    }

    /// Maps the trace file at `path` and validates it (checksums included). Only for files that
    /// nobody changes while they are mapped: if another process truncates it, the next access
    /// to the lost pages kills this process with `SIGBUS`.
    pub fn map(path: &Path) -> Result<Self> {
        let file = open_regular(path, 0).map_err(not_regular(path))?;
        // SAFETY: the caller promises the file is not truncated or written while mapped (trace
        // files are written once, under a temporary name, and renamed into place).
        let map = unsafe { Mmap::map(&file) }.map_err(PlanError::io(path))?;
        Self::parse(path, Bytes::Mapped(map))
    }

    fn parse(path: &Path, bytes: Bytes) -> Result<Self> {
        let bad = |reason: String| PlanError::BadTrace {
            path: path.into(),
            reason,
        };
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err(bad("no NRTRACE magic".into()));
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let version = word(8);
        let len = word(12) as usize;
        let json = match version {
            1 => bytes.get(16..16 + len),
            VERSION_ROWS | VERSION => bytes.get(JSON_AT..JSON_AT + len),
            _ => {
                return Err(bad(format!(
                    "version {version}, this build reads 1 to {VERSION}"
                )));
            }
        }
        .ok_or_else(|| bad("truncated header".into()))?;
        let checked = version >= VERSION_ROWS;
        if checked && crc32c::crc32c(json) != word(16) {
            return Err(bad("the header fails its checksum".into()));
        }
        let header: TraceHeader =
            serde_json::from_slice(json).map_err(|e| bad(format!("header: {e}")))?;
        let mut names = std::collections::HashSet::new();
        for t in &header.tables {
            if !names.insert(t.name.as_str()) {
                return Err(bad(format!("table {:?} appears twice", t.name)));
            }
            // an array of `n` i64s at byte `at` lies inside the file, aligned (no overflow)
            let inside = |at: u64, n: Option<u64>| {
                n.and_then(|n| n.checked_mul(8))
                    .and_then(|b| b.checked_add(at))
                    .is_some_and(|end| at.is_multiple_of(8) && end <= bytes.len() as u64)
            };
            if !inside(t.offsets_at, header.bags.checked_add(1))
                || !inside(t.indices_at, Some(t.lookups))
            {
                return Err(bad(format!("table {:?}: arrays outside the file", t.name)));
            }
            if checked && (t.offsets_crc32c.is_none() || t.indices_crc32c.is_none()) {
                return Err(bad(format!("table {:?}: no checksums", t.name)));
            }
            if t.keys && version < VERSION {
                return Err(bad(format!(
                    "table {:?}: keys in a version-{version} file (keyed traces are version \
                     {VERSION})",
                    t.name
                )));
            }
        }
        let trace = Self {
            path: path.into(),
            bytes,
            header,
            verified: checked,
        };
        for i in 0..trace.header.tables.len() {
            let t = trace.table(i);
            for (what, data, crc) in [
                ("offsets", t.offsets, t.entry.offsets_crc32c),
                ("indices", t.indices, t.entry.indices_crc32c),
            ] {
                if let Some(want) = crc
                    && crc32c::crc32c(bytemuck::cast_slice(data)) != want
                {
                    return Err(bad(format!(
                        "table {:?}: its {what} fail their checksum",
                        t.entry.name
                    )));
                }
            }
            check_csr(
                &t.entry.name,
                (!t.entry.keys).then_some(t.entry.rows),
                trace.header.bags,
                t.offsets,
                t.indices,
            )
            .map_err(|e| bad(e.to_string()))?;
        }
        Ok(trace)
    }

    /// Whether the file carried checksums and they matched (false for version-1 files, which
    /// have none).
    pub fn verified(&self) -> bool {
        self.verified
    }

    /// The file's bytes (the arrays sit at the header's offsets).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Table `i`'s arrays, borrowed from the file's bytes.
    pub fn table(&self, i: usize) -> TableSlices<'_> {
        let entry = &self.header.tables[i];
        let slice = |at: u64, n: u64| -> &[i64] {
            bytemuck::cast_slice(&self.bytes[at as usize..(at + 8 * n) as usize])
        };
        TableSlices {
            entry,
            offsets: slice(entry.offsets_at, self.header.bags + 1),
            indices: slice(entry.indices_at, entry.lookups),
        }
    }
}
