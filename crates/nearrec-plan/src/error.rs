use std::path::PathBuf;

/// What can go wrong generating, reading or writing a trace.
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
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;

impl PlanError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}
