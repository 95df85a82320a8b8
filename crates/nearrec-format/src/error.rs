use std::path::PathBuf;

/// Everything that can go wrong creating, opening or checking a store.
///
/// Each variant names the store path and, where there is one, the table, so the one-line
/// `Display` tells the user what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("no nearrec store at {path}: {source}")]
    NotFound {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("a store already exists at {path}; pass overwrite=True to replace it")]
    AlreadyExists { path: PathBuf },

    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("store at {path} is corrupted: {reason}. Rebuild it or restore it from a copy")]
    Corrupted { path: PathBuf, reason: String },

    /// A row whose stored bytes do not match their sector checksum, found by a reader that
    /// copies rows (a compaction), which refuses to carry it into a freshly checksummed file.
    #[error(
        "store at {path}: table {table:?}: row {row} is corrupted on disk: {reason}. Write the row \
         again, or restore the store from a copy"
    )]
    CorruptedRow {
        path: PathBuf,
        table: String,
        row: u64,
        reason: String,
    },

    #[error(
        "store at {path} has format version {found}; this nearrec reads versions up to {supported}. \
         Upgrade nearrec"
    )]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error("cannot allocate {bytes} bytes of memory for {what}")]
    OutOfMemory { what: String, bytes: u64 },

    #[error("table {table:?}: {reason}")]
    InvalidTable { table: String, reason: String },

    #[error("table {table:?}: expected {expected} rows, {written} were written")]
    RowCount {
        table: String,
        expected: u64,
        written: u64,
    },

    /// A reader of a live store asked for log records its writer has released: it fell more
    /// than one compaction behind.
    #[error(
        "the write-ahead log of the store at {path} starts at record {first}, after the {applied} \
         this reader holds: the writer compacted and released what came between. Reopen the store"
    )]
    LogReleased {
        path: PathBuf,
        applied: u64,
        first: u64,
    },

    /// A delta file (`docs/format.md` §17) that cannot be applied: malformed, not the tables'
    /// shape, out of its feed's sequence. Nothing of it is applied.
    #[error(
        "delta file {}{}{}: {reason}",
        path.display(),
        row.map_or_else(String::new, |r| format!(", row {r}")),
        column.as_ref().map_or_else(String::new, |c| format!(", column {c:?}"))
    )]
    BadDelta {
        path: PathBuf,
        row: Option<u64>,
        column: Option<String>,
        reason: String,
    },

    /// A repository of versions refused a call: the directory, and why.
    #[error("the repository at {path}: {reason}")]
    Repository { path: PathBuf, reason: String },

    #[error("unknown dtype {0:?}; expected one of fp32, fp16, bf16, int8, int4, int2, fp8")]
    UnknownDType(String),
}

impl FormatError {
    /// An I/O error on `path`; a store file that is not a regular file (see
    /// [`crate::files::open_regular`]) is a corrupted store.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::InvalidInput {
            return Self::corrupted(path, source.to_string());
        }
        Self::Io { path, source }
    }

    pub fn corrupted(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Corrupted {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid_table(table: &str, reason: impl Into<String>) -> Self {
        Self::InvalidTable {
            table: table.to_owned(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
