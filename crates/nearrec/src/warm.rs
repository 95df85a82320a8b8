//! Start-up warm-up: a store's DRAM tiers filled at open, before it serves, from a recorded trace
//! or from the hot set a previous run kept (`StoreConfig::warm`, `StoreConfig::hot_set_dir`), so
//! that a restarted node answers at its hit rate from its first request rather than after
//! minutes of misses (TorchEasyRec's warm-up from recorded requests; Triton's model warm-up).
//!
//! A hot set is a small JSON file, `NAME.hotset`: per table, the rows its DRAM tiers held when
//! the store closed (hot rows first, then cached ones), replaced atomically. A trace is nearrec's
//! `.nrtrace`; each table's rows are taken most requested first — a keyed table's trace holds
//! keys, ranked so and mapped to the rows they hold through the store's key index (keys it does
//! not hold are dropped). Either way a table the store does not have is skipped with a warning,
//! rows beyond a table are dropped, and each row cache takes as many rows as it holds; the rows
//! are read from the table files as the SSD tier reads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nearrec_engine::Engine;
use nearrec_engine::delta::DeltaView;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What a hot-set file says it is.
const FORMAT: &str = "nearrec-hot-set";

/// A hot set as kept on disk.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HotSet {
    format: String,
    version: u32,
    /// The store it was taken from (for a reader of the file; not checked).
    store: String,
    tables: Vec<HotTable>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HotTable {
    name: String,
    /// Most wanted first.
    rows: Vec<u64>,
}

/// One table's ids to warm, most wanted first.
#[derive(Debug)]
pub(crate) struct Wanted {
    pub table: String,
    pub ids: Vec<u64>,
    /// The ids are a keyed table's keys (from a keyed trace), not rows.
    pub keys: bool,
}

/// Where a store named `name` keeps its hot set in `dir`.
pub(crate) fn hot_set_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.hotset"))
}

/// Per table, the rows (or keys) the warm-up file at `path` names, most wanted first: a trace's
/// most requested ones (an `.nrtrace`, told by its magic), or a kept hot set's rows.
pub(crate) fn read(path: &Path) -> Result<Vec<Wanted>> {
    let unreadable = |e: std::io::Error| {
        Error::invalid(format!(
            "the warm-up file {} cannot be read: {e}",
            path.display()
        ))
    };
    // a trace is told by its magic and read by its own reader: the file once, not twice
    let mut magic = [0u8; 8];
    let mut file = nearrec_format::files::open_regular(path, 0).map_err(unreadable)?;
    let head = std::io::Read::read(&mut file, &mut magic).map_err(unreadable)?;
    if magic[..head] == nearrec_plan::file::MAGIC[..] {
        return from_trace(path);
    }
    let mut bytes = magic[..head].to_vec();
    std::io::Read::read_to_end(&mut file, &mut bytes).map_err(unreadable)?;
    let bad = |why: String| Error::invalid(format!("{} is not a hot set: {why}", path.display()));
    let set: HotSet = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if set.format != FORMAT || set.version != 1 {
        return Err(bad(format!(
            "format {:?} version {}",
            set.format, set.version
        )));
    }
    Ok(set
        .tables
        .into_iter()
        .map(|t| Wanted {
            table: t.name,
            ids: t.rows,
            keys: false,
        })
        .collect())
}

/// Each table of the trace at `path`, its rows (or a keyed table's keys, as u64) most requested
/// first (ties: lower id first).
fn from_trace(path: &Path) -> Result<Vec<Wanted>> {
    let trace = nearrec_plan::file::TraceFile::open(path)?;
    Ok((0..trace.header().tables.len())
        .map(|i| {
            let t = trace.table(i);
            let keys = t.entry.keys;
            let mut counts: HashMap<u64, u64> = HashMap::new();
            for &r in t.indices.iter().filter(|&&r| keys || r >= 0) {
                *counts.entry(r as u64).or_default() += 1;
            }
            let mut ids: Vec<(u64, u64)> = counts.into_iter().collect();
            ids.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            Wanted {
                table: t.entry.name.clone(),
                ids: ids.into_iter().map(|(r, _)| r).collect(),
                keys,
            }
        })
        .collect())
}

/// Fills `engine`'s row caches with `tables`' rows (from `from`), logging each table as it
/// is done; returns the rows loaded. Keys are mapped to the rows they hold as of the tables'
/// base (a key written since lives in the log's delta, in memory).
pub(crate) fn warm(store: &str, engine: &Engine, tables: &[Wanted], from: &Path) -> Result<u64> {
    let started = Instant::now();
    let from = from.display().to_string();
    tracing::info!(store, %from, tables = tables.len(), "warming the DRAM tiers");
    let mut loaded = 0u64;
    for (done, wanted) in tables.iter().enumerate() {
        let name = &wanted.table;
        let Ok(id) = engine.table_id(name) else {
            tracing::warn!(store, table = %name, %from, "warm-up: the store has no such table");
            continue;
        };
        let n = if !wanted.keys {
            engine.warm(id, &wanted.ids, None)?
        } else if engine.is_keyed(id) {
            let rows: Vec<u64> = (engine.key_rows_at(id, &wanted.ids, DeltaView::NONE)?)
                .into_iter()
                .flatten()
                .map(u64::from)
                .collect();
            engine.warm(id, &rows, None)?
        } else {
            tracing::warn!(
                store,
                table = %name,
                %from,
                "warm-up: the trace holds keys of a table the store addresses by row"
            );
            continue;
        };
        loaded += n;
        tracing::info!(
            store,
            table = %name,
            rows = n,
            done = done + 1,
            of = tables.len(),
            "warm-up: table loaded"
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(store, rows = loaded, seconds, "warm-up done");
    Ok(loaded)
}

/// Keeps `engine`'s hot set at `path`, atomically; returns its rows (nothing is written for
/// an engine with no DRAM tiers in front of its tables).
pub(crate) fn save(path: &Path, store: &str, engine: &Engine) -> Result<u64> {
    let held = engine.held_rows();
    if held.is_empty() {
        return Ok(0);
    }
    let rows = held.iter().map(|(_, r)| r.len() as u64).sum();
    let set = HotSet {
        format: FORMAT.into(),
        version: 1,
        store: store.into(),
        tables: held
            .into_iter()
            .map(|(name, rows)| HotTable { name, rows })
            .collect(),
    };
    let json = serde_json::to_vec(&set).expect("a hot set serializes");
    nearrec_format::replace_file(path, &json)?;
    tracing::info!(store, path = %path.display(), rows, "hot set kept");
    Ok(rows)
}
