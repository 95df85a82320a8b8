use std::path::PathBuf;

/// What can go wrong generating, reading or writing a trace, or planning from one.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid trace file: {reason}")]
    BadTrace { path: PathBuf, reason: String },
    #[error("table {table:?}: {reason}")]
    BadSpec { table: String, reason: String },
    #[error("{path} already exists (pass overwrite to replace it)")]
    Exists { path: PathBuf },
    #[error(transparent)]
    InsufficientMemory(#[from] nearrec_format::Shortfall),
    /// A trace does not fit the store it is planned for: a table the store lacks, another row
    /// count, or a row id past the table (`position`: where in the table's indices).
    #[error("{reason}")]
    TraceMismatch {
        table: String,
        position: Option<usize>,
        reason: String,
    },
    /// An argument outside its range (such as `steps` of 0).
    #[error("{what} {reason}")]
    InvalidArgument { what: &'static str, reason: String },
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;

impl PlanError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}
