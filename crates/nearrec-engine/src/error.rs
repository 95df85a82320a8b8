use nearrec_format::FormatError;

/// Errors from serving requests. Every request error names the table and, where there is one, the
/// position in the caller's array.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Format(#[from] FormatError),

    #[error(transparent)]
    Io(#[from] nearrec_io::IoError),

    #[error("unknown table {name:?}; the store has: {available}")]
    UnknownTable { name: String, available: String },

    #[error("table {table:?}: {reason}")]
    InvalidRequest { table: String, reason: String },

    #[error(
        "table {table:?}: index {value} at position {position} (bag {bag}) is out of range; \
         the table has {rows} rows"
    )]
    IndexOutOfRange {
        table: String,
        position: usize,
        bag: usize,
        value: i64,
        rows: u64,
    },

    #[error(
        "table {table:?}: key {key} at position {position} is not in the table (unknown=\"error\")"
    )]
    UnknownKey {
        table: String,
        position: usize,
        key: i64,
    },

    #[error(transparent)]
    InsufficientMemory(#[from] nearrec_format::Shortfall),

    #[error("table {table:?}: row {row} is corrupted on disk: {reason}")]
    Corrupted {
        table: String,
        row: u64,
        reason: String,
    },

    #[error("invalid engine config: {0}")]
    Config(String),

    #[error("model: {0}")]
    Model(#[from] crate::dense::ModelError),
}

impl EngineError {
    pub(crate) fn invalid(table: &str, reason: impl Into<String>) -> Self {
        Self::InvalidRequest {
            table: table.to_owned(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
