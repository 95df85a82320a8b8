use nearrec_io::IoError;

/// Everything the device model can refuse or fail at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("{0}")]
    Config(String),
    /// A lookup names a row outside its table, or a batch is malformed.
    #[error("table {table}: {reason}")]
    Request { table: String, reason: String },
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;
