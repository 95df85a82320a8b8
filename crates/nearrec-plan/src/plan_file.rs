//! The plan file: read and written here only.
//!
//! A plan is a TOML file and, beside it, `<stem>.hot.npz`, a numpy archive with one int64 1-D
//! array of pinned rows per table:
//!
//! ```toml
//! # nearrec plan: DRAM placement of a store's tables for a trace
//! budget_bytes = 1048576
//! bytes = 1048000
//! expected_hit_ratio = 0.734120
//! trace = "t.nrtrace"
//! store = "store"
//! hot_rows_file = "plan.hot.npz"
//!
//! [tables."t0"]
//! type = "C"
//! resident = false
//! hot_rows = 120
//! cache_bytes = 65536
//! bytes = 75136
//! expected_hit_ratio = 0.612000
//! rows = 100000
//! working_set = 31000
//! locality = 0.310000
//! lookups = 40000
//! ```
//!
//! What is applied is `resident`, `cache_bytes` (bytes, or a size such as `"64MiB"`) and the hot
//! rows of the archive (whose count `hot_rows` must match where it is given); the rest is
//! for people. [`Plan::save`] writes both files atomically (the archive first); [`load_plan`]
//! reads them into the [`Placement`] the engine applies, refusing anything malformed with a
//! [`PlanError::BadPlan`] that names the file, the table and the [`PlanFileProblem`].

use std::fs::File;
use std::path::{Path, PathBuf};

use nearrec_format::files::{open_regular, read_regular};

use crate::error::{PlanError, PlanFileProblem, Result};
use crate::placement::{Placement, TablePlacement};
use crate::plan::Plan;
use crate::units::{SizeError, parse_size, size_from_int};
use nearrec_format::npz::{ArrayError, NpzReader, write_npz};

/// Where the hot rows of the plan file at `plan` go: `p.toml` → `p.hot.npz`.
pub fn hot_rows_path(plan: &Path) -> PathBuf {
    plan.with_extension("hot.npz")
}

impl Plan {
    /// The plan file's text, naming `hot_rows_file` as the archive of its hot rows (written by
    /// the `toml` crate: keys quoted and strings escaped as TOML wants them).
    pub fn toml(&self, hot_rows_file: &str) -> String {
        let int = |n: u64| toml::Value::Integer(n.min(i64::MAX as u64) as i64);
        let ratio = |x: f64| toml::Value::Float((x * 1e6).round() / 1e6);
        let mut doc = toml::Table::new();
        doc.insert("budget_bytes".into(), int(self.budget));
        doc.insert("bytes".into(), int(self.bytes()));
        doc.insert(
            "expected_hit_ratio".into(),
            ratio(self.expected_hit_ratio()),
        );
        doc.insert("trace".into(), self.trace.clone().into());
        doc.insert("store".into(), self.store.clone().into());
        doc.insert("hot_rows_file".into(), hot_rows_file.into());
        let mut tables = toml::Table::new();
        for t in &self.tables {
            let mut e = toml::Table::new();
            e.insert("type".into(), t.kind.name().into());
            e.insert("resident".into(), t.resident.into());
            e.insert("hot_rows".into(), int(t.hot_rows.len() as u64));
            e.insert("cache_bytes".into(), int(t.cache_bytes));
            e.insert("bytes".into(), int(t.bytes()));
            e.insert("expected_hit_ratio".into(), ratio(t.expected_hit_ratio));
            e.insert("rows".into(), int(t.rows));
            e.insert("working_set".into(), int(t.working_set));
            e.insert("locality".into(), ratio(t.locality));
            e.insert("lookups".into(), int(t.lookups));
            tables.insert(t.table.clone(), e.into());
        }
        doc.insert("tables".into(), tables.into());
        let body = toml::to_string(&doc).expect("a table of numbers and strings serialises");
        format!("# nearrec plan: DRAM placement of a store's tables for a trace\n{body}")
    }

    /// Writes the plan as TOML at `path`, with its hot rows in [`hot_rows_path`] beside it; each
    /// file is written under a temporary name, synced and renamed into place, the archive first.
    pub fn save(&self, path: &Path) -> Result<()> {
        let hot = hot_rows_path(path);
        let (Some(_), Some(hot_name)) = (path.file_name(), hot.file_name()) else {
            return Err(PlanError::InvalidArgument {
                what: "the plan file",
                reason: format!("must name a file, not {}", path.display()),
            });
        };
        let arrays: Vec<(&str, &[u64])> = self
            .tables
            .iter()
            .map(|t| (t.table.as_str(), t.hot_rows.as_slice()))
            .collect();
        write_atomic(&hot, |f| write_npz(f, &arrays))?;
        let text = self.toml(&hot_name.to_string_lossy());
        write_atomic(path, |f| std::io::Write::write_all(f, text.as_bytes()))
    }
}

fn write_atomic(path: &Path, write: impl FnOnce(&mut File) -> std::io::Result<()>) -> Result<()> {
    let tmp = crate::file::tmp_path(path);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        write(&mut f)?;
        f.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(PlanError::io(&tmp)(e));
    }
    std::fs::rename(&tmp, path).map_err(PlanError::io(path))?;
    // the rename itself lasts once the directory is synced (best effort: not every file system
    // lets a directory be opened and synced)
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Ok(d) = File::open(dir.unwrap_or(Path::new("."))) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads the plan file at `path` and its hot rows into the placement the engine applies.
/// The file (and the archive) must be regular files: a FIFO is refused at once, not waited on
/// ([`PlanError::Io`], kind `InvalidInput`; a missing plan file is kind `NotFound`). Anything
/// wrong inside is a [`PlanError::BadPlan`].
pub fn load_plan(path: &Path) -> Result<Placement> {
    let bad = |table: Option<&str>, problem| PlanError::BadPlan {
        path: path.to_owned(),
        table: table.map(str::to_owned),
        problem,
    };
    let bytes = read_regular(path, 0).map_err(PlanError::io(path))?;
    let text =
        String::from_utf8(bytes).map_err(|e| bad(None, PlanFileProblem::NotToml(e.to_string())))?;
    let doc: toml::Table = toml::from_str(&text).map_err(|e| {
        bad(
            None,
            PlanFileProblem::NotToml(e.to_string().trim_end().into()),
        )
    })?;
    let empty = toml::Value::Table(toml::Table::new());
    let tables: Vec<(&String, &toml::Table)> = match doc.get("tables").unwrap_or(&empty) {
        toml::Value::Table(t) => t
            .iter()
            .map(|(name, settings)| settings.as_table().map(|s| (name, s)))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(None, PlanFileProblem::TablesNotTables))?,
        _ => return Err(bad(None, PlanFileProblem::TablesNotTables)),
    };
    let hot_name = match doc.get("hot_rows_file") {
        Some(toml::Value::String(s)) if !s.is_empty() => s.as_str(),
        _ => return Err(bad(None, PlanFileProblem::NoHotRowsFile)),
    };
    let unreadable = |table: Option<&str>, reason: String| {
        bad(
            table,
            PlanFileProblem::HotRowsUnreadable {
                file: hot_name.to_owned(),
                reason,
            },
        )
    };
    let hot_path = path.parent().unwrap_or(Path::new("")).join(hot_name);
    let file = open_regular(&hot_path, 0).map_err(|e| unreadable(None, e.to_string()))?;
    let mut npz = NpzReader::new(file).map_err(|e| unreadable(None, e))?;
    let mut out = Placement::default();
    for (name, settings) in tables {
        let fail = |problem| bad(Some(name), problem);
        let rows = match npz.array(name) {
            Ok(rows) => rows.unwrap_or(nearrec_format::npz::Ints::Signed(Vec::new())),
            Err(ArrayError::Unreadable(reason)) => return Err(unreadable(Some(name), reason)),
            Err(ArrayError::NotIntegers { dtype, shape }) => {
                // Python reads the array, checks the settings, then the array's type
                entry(settings).map_err(fail)?;
                return Err(fail(PlanFileProblem::HotRowsNotIntegers { dtype, shape }));
            }
        };
        let mut entry = entry(settings).map_err(fail)?;
        if let Some(toml::Value::Integer(listed)) = settings.get("hot_rows")
            && u64::try_from(*listed).ok() != Some(rows.len() as u64)
        {
            return Err(fail(PlanFileProblem::HotRowsCount {
                listed: *listed,
                held: rows.len() as u64,
            }));
        }
        entry.hot_rows = rows
            .into_ids()
            .map_err(|(position, row)| fail(PlanFileProblem::NegativeHotRow { row, position }))?;
        out.tables.insert(name.clone(), entry);
    }
    Ok(out)
}

/// A table's `resident` and `cache_bytes`, their types checked.
fn entry(settings: &toml::Table) -> Result<TablePlacement, PlanFileProblem> {
    let resident = match settings.get("resident") {
        None => false,
        Some(toml::Value::Boolean(b)) => *b,
        Some(v) => return Err(PlanFileProblem::ResidentNotBool(v.to_string())),
    };
    let cache_bytes = match settings.get("cache_bytes") {
        None => Ok(0),
        Some(toml::Value::Integer(n)) => size_from_int(i128::from(*n)),
        Some(toml::Value::String(s)) => parse_size(s),
        Some(toml::Value::Boolean(b)) => Err(SizeError::Bool(*b)),
        Some(v) => Err(SizeError::NotBytes(v.to_string())),
    }
    .map_err(PlanFileProblem::CacheBytes)?;
    Ok(TablePlacement {
        resident,
        hot_rows: Vec::new(),
        cache_bytes,
    })
}
