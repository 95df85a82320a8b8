//! Delta files (`docs/format.md` §17): the rows a trainer changed since its last dump, as an
//! Arrow IPC stream (or Parquet) of `(table, id, op, values)` rows named by a sequence number,
//! which a feeder applies to a store in order, each file once.
//!
//! - `read.rs`: a file read and checked against the tables it names ([`read`]): a malformed
//!   file, a wrong dim or dtype, an unknown table, a row out of range or named twice is refused,
//!   naming the file, row and column, before anything of it is applied;
//! - `write.rs`: a file written whole under its name ([`write()`]): a producer's, the evicted
//!   keys' log's, the tests';
//! - `tzrec.rs`: TorchEasyRec's delta embedding dumps, each step read as one delta
//!   ([`tzrec::read_step`]).
//!
//! A file's rows are grouped by table here ([`Changes`]); its header ([`Header`]) comes from its
//! schema's metadata.

mod read;
pub mod tzrec;
mod write;

use std::path::{Path, PathBuf};

use crate::dtype::DType;

pub use read::{header_of, read};
pub use write::write;

/// The schema metadata key holding the delta format's version (`"1"`).
pub const FORMAT_KEY: &str = "nearrec.delta";
/// The schema metadata key holding the file's sequence number (decimal).
pub const SEQUENCE_KEY: &str = "nearrec.sequence";
/// The schema metadata key holding the producer's training step (decimal; optional).
pub const STEP_KEY: &str = "nearrec.step";
/// The schema metadata key holding the producer's wall time when it wrote the file, in
/// milliseconds since the Unix epoch (decimal; optional: without it no lag is reported).
pub const WALL_TIME_KEY: &str = "nearrec.wall_time_ms";
/// The `values` field's metadata key naming the dtype of encoded rows (a binary column).
pub const DTYPE_KEY: &str = "nearrec.dtype";
/// The delta format's version this nearrec reads and writes.
pub const DELTA_VERSION: &str = "1";

/// What a delta file is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// An Arrow IPC stream (`.arrow`).
    Arrow,
    /// A Parquet file (`.parquet`).
    Parquet,
}

impl Encoding {
    pub fn extension(self) -> &'static str {
        match self {
            Encoding::Arrow => "arrow",
            Encoding::Parquet => "parquet",
        }
    }
}

/// The name of delta file `sequence` (zero-padded, so that names sort as numbers do).
pub fn file_name(sequence: u64, encoding: Encoding) -> String {
    format!("{sequence:020}.{}", encoding.extension())
}

/// The name of the dense weights that go with delta file `sequence` (a `.npz` of named
/// tensors, as a kept model's `dense.npz`).
pub fn dense_name(sequence: u64) -> String {
    format!("{sequence:020}.dense.npz")
}

/// What a file's name says: a delta file's sequence and encoding (`None`: not a delta file —
/// a producer's temporary, the dense weights, anything else beside them).
pub fn parse_name(name: &str) -> Option<(u64, Encoding)> {
    let (stem, ext) = name.rsplit_once('.')?;
    let encoding = match ext {
        "arrow" => Encoding::Arrow,
        "parquet" => Encoding::Parquet,
        _ => return None,
    };
    if stem.is_empty() || stem.len() > 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, encoding))
}

/// What delta file `path`'s name says (its sequence and encoding), or its refusal naming it.
fn named(path: &Path) -> crate::Result<(u64, Encoding)> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    parse_name(name).ok_or_else(|| crate::FormatError::BadDelta {
        path: path.to_owned(),
        row: None,
        column: None,
        reason: "its name is not <sequence>.arrow or <sequence>.parquet".into(),
    })
}

/// What an applied row does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The row (a row number, or a keyed table's key) takes the file's values.
    Upsert,
    /// The row is removed (a keyed table's key let go of); the file's values, if any, are the
    /// row as it was.
    Delete,
}

impl Op {
    /// Its code in the `op` column.
    pub fn code(self) -> i8 {
        match self {
            Op::Upsert => 0,
            Op::Delete => 1,
        }
    }
}

/// A table as the file is checked against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub rows: u64,
    pub dim: u32,
    pub dtype: DType,
    /// Its ids are keys (any 64 bits), not row numbers.
    pub keyed: bool,
}

impl Shape {
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.dim) as usize
    }
}

/// A delta file's header, from its schema's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub sequence: u64,
    /// The producer's training step.
    pub step: Option<u64>,
    /// The producer's wall time when it wrote the file (ms since the Unix epoch).
    pub wall_time_ms: Option<u64>,
}

/// The rows of one table: values as float32 (`dim` a row), or encoded in the table's dtype
/// (`row_bytes` a row), taken as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    Encoded(Vec<u8>),
}

impl Values {
    /// No rows yet, float32 or `encoded`.
    pub fn empty(encoded: bool) -> Self {
        if encoded {
            Values::Encoded(Vec::new())
        } else {
            Values::F32(Vec::new())
        }
    }
}

/// One table's rows of a delta file, in the file's order: upserted ids with their values, and
/// deleted ids (with the rows as they were, when the file holds them).
#[derive(Debug, Clone, PartialEq)]
pub struct Changes {
    pub table: String,
    pub upserts: Vec<i64>,
    /// One row per upsert.
    pub values: Values,
    pub deletes: Vec<i64>,
    /// One row per delete, when the file holds them (an evicted keys' log does); else `None`.
    pub deleted: Option<Values>,
}

impl Changes {
    /// No rows of `table` yet, its values float32 or `encoded`.
    pub fn new(table: &str, encoded: bool) -> Self {
        Self {
            table: table.to_owned(),
            upserts: Vec::new(),
            values: Values::empty(encoded),
            deletes: Vec::new(),
            deleted: None,
        }
    }

    /// How many rows the file holds of the table.
    pub fn len(&self) -> usize {
        self.upserts.len() + self.deletes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A delta file read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub path: PathBuf,
    pub header: Header,
    /// Per table, in the order the file first names them.
    pub tables: Vec<Changes>,
}

impl Delta {
    /// The file's rows, all tables together.
    pub fn rows(&self) -> usize {
        self.tables.iter().map(Changes::len).sum()
    }

    /// The dense weights file beside it, if the producer wrote one.
    pub fn dense(&self) -> Option<PathBuf> {
        let path = self.path.with_file_name(dense_name(self.header.sequence));
        path.is_file().then_some(path)
    }
}

/// The delta files of `dir`, by sequence (the dense weights and anything else beside them
/// left out); two files of one sequence (`.arrow` and `.parquet`) are refused.
pub fn list(dir: &Path) -> crate::Result<Vec<(u64, PathBuf)>> {
    let entries = std::fs::read_dir(dir).map_err(|e| crate::FormatError::io(dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| crate::FormatError::io(dir, e))?;
        let name = entry.file_name();
        if let Some((seq, _)) = name.to_str().and_then(parse_name) {
            files.push((seq, entry.path()));
        }
    }
    files.sort();
    if let Some(w) = files.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(crate::FormatError::BadDelta {
            path: w[1].1.clone(),
            row: None,
            column: None,
            reason: format!(
                "sequence {} is also {}: one file a sequence",
                w[0].0,
                w[0].1.display()
            ),
        });
    }
    Ok(files)
}
