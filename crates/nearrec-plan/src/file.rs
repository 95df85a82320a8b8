//! The binary trace file: one file per trace, little-endian, readable without copying from Rust
//! (`TraceFile`, a memory map) and numpy (`np.memmap` at the offsets the header gives).
//!
//! ```text
//! 0   magic "NRTRACE\0"
//! 8   u32 version (1)
//! 12  u32 header length H
//! 16  H bytes of JSON: TraceHeader (bags, batch size, seed, per table: name, rows, pooling,
//!     generator, lookups and the byte offsets of its two arrays)
//! ..  per table, each array 64-byte aligned: offsets i64 × (bags + 1), indices i64 × lookups
//! ```
//! The writer writes to a temporary name and renames, so a trace is either whole or absent.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::error::{PlanError, Result};
use crate::generate::{Generator, TableSpec, TableTrace};

pub const MAGIC: &[u8; 8] = b"NRTRACE\0";
pub const VERSION: u32 = 1;
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
}

/// A table's data to write: its description and its bags (CSR).
#[derive(Debug, Clone)]
pub struct TableData<'a> {
    pub name: &'a str,
    pub rows: u64,
    pub pooling: u32,
    pub generator: Option<Generator>,
    pub first_reference_share: Option<f64>,
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
    for t in tables {
        check_csr(t.name, t.rows, bags, t.offsets, t.indices)?;
    }
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
            })
            .collect(),
    };
    let reserve = serde_json::to_vec(&header).expect("serialisable").len() as u64;
    let mut at = align(16 + reserve);
    for (entry, t) in header.tables.iter_mut().zip(tables) {
        entry.offsets_at = at;
        at = align(at + 8 * t.offsets.len() as u64);
        entry.indices_at = at;
        at = align(at + 8 * t.indices.len() as u64);
    }
    let mut json = serde_json::to_vec(&header).expect("serialisable");
    // offsets print no longer than u64::MAX did: pad the JSON with spaces to the reserved length
    json.resize(reserve as usize, b' ');

    let tmp = tmp_path(path);
    let io = PlanError::io(&tmp);
    let result = (|| -> std::io::Result<()> {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&(json.len() as u32).to_le_bytes())?;
        w.write_all(&json)?;
        let mut written = 16 + json.len() as u64;
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

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn check_csr(table: &str, rows: u64, bags: u64, offsets: &[i64], indices: &[i64]) -> Result<()> {
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
    if let Some(p) = indices.iter().position(|&i| i < 0 || i as u64 >= rows) {
        return bad(format!(
            "index {} at position {p} is outside 0..{rows}",
            indices[p]
        ));
    }
    Ok(())
}

/// A trace file, mapped.
#[derive(Debug)]
pub struct TraceFile {
    path: PathBuf,
    map: Mmap,
    header: TraceHeader,
}

/// One table's bags in a mapped trace.
#[derive(Debug, Clone, Copy)]
pub struct TableSlices<'a> {
    pub entry: &'a TableEntry,
    pub offsets: &'a [i64],
    pub indices: &'a [i64],
}

impl TraceFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(PlanError::io(path))?;
        // SAFETY: trace files are written once (renamed into place) and never modified in place.
        let map = unsafe { Mmap::map(&file) }.map_err(PlanError::io(path))?;
        let bad = |reason: String| PlanError::BadTrace {
            path: path.into(),
            reason,
        };
        if map.len() < 16 || &map[..8] != MAGIC {
            return Err(bad("no NRTRACE magic".into()));
        }
        let version = u32::from_le_bytes(map[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this build reads {VERSION}"
            )));
        }
        let len = u32::from_le_bytes(map[12..16].try_into().expect("4 bytes")) as usize;
        let json = map
            .get(16..16 + len)
            .ok_or_else(|| bad("truncated header".into()))?;
        let header: TraceHeader =
            serde_json::from_slice(json).map_err(|e| bad(format!("header: {e}")))?;
        for t in &header.tables {
            let end_o = t.offsets_at + 8 * (header.bags + 1);
            let end_i = t.indices_at + 8 * t.lookups;
            if t.offsets_at % 8 != 0 || t.indices_at % 8 != 0 || end_o.max(end_i) > map.len() as u64
            {
                return Err(bad(format!("table {:?}: arrays outside the file", t.name)));
            }
        }
        let trace = Self {
            path: path.into(),
            map,
            header,
        };
        for i in 0..trace.header.tables.len() {
            let t = trace.table(i);
            check_csr(
                &t.entry.name,
                t.entry.rows,
                trace.header.bags,
                t.offsets,
                t.indices,
            )
            .map_err(|e| bad(e.to_string()))?;
        }
        Ok(trace)
    }

    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Table `i`'s arrays, borrowed from the mapping.
    pub fn table(&self, i: usize) -> TableSlices<'_> {
        let entry = &self.header.tables[i];
        let slice = |at: u64, n: u64| -> &[i64] {
            bytemuck::cast_slice(&self.map[at as usize..(at + 8 * n) as usize])
        };
        TableSlices {
            entry,
            offsets: slice(entry.offsets_at, self.header.bags + 1),
            indices: slice(entry.indices_at, entry.lookups),
        }
    }
}
