//! The product's error: every layer's error, wrapped, plus what the facade itself refuses (a
//! config value, a stored model, a request that does not fit a model). Each surface maps it to
//! its own terms (Python: one table from variant to exception class, in the binding).

use nearrec_device::DeviceError;
use nearrec_engine::EngineError;
use nearrec_format::FormatError;
use nearrec_plan::PlanError;

/// Everything opening, serving or inferring from a store can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A config value out of range, an unknown key, an unreadable config file. `key` names the
    /// field (empty when the whole file is at fault).
    #[error("config: {}{reason}", if key.is_empty() { String::new() } else { format!("{key}: ") })]
    Config { key: String, reason: String },

    /// A request the facade refuses before the engine sees it (infer's lookups against the
    /// model's inputs, a sub-batch size of 0).
    #[error("{}{reason}", table.as_ref().map_or_else(String::new, |t| format!("table {t:?}: ")))]
    InvalidRequest {
        table: Option<String>,
        position: Option<usize>,
        reason: String,
    },

    /// The store keeps no model (save one with `nearrec.models.save`), or the one it keeps is
    /// not a model the engine runs.
    #[error("the store at {path} keeps no model: {reason}")]
    NoModel { path: String, reason: String },

    /// A stored model's attachments are damaged or do not describe a model.
    #[error("the store at {path}: its model attachments are not a model: {reason}")]
    BadModel { path: String, reason: String },

    /// A write to a store opened read-only.
    #[error("the store at {path} is open read-only; open it with writable=True to change it")]
    ReadOnly { path: String },

    /// Another process (or another open in this one) holds the store for writing.
    #[error("the store at {path} is open for writing elsewhere: a store has one writer at a time")]
    Locked { path: String },

    /// A write that does not fit the delta's budget: nothing of it was applied.
    #[error(
        "the store's delta is full: {used} of {budget} bytes in use, the call needs {asked}; \
         raise delta_budget or wait for compaction"
    )]
    DeltaFull { used: u64, asked: u64, budget: u64 },

    /// A bug of ours (a panic caught at a thread boundary).
    #[error("internal error: {0}")]
    Internal(String),

    #[error(transparent)]
    Engine(#[from] EngineError),

    #[error(transparent)]
    Format(#[from] FormatError),

    #[error(transparent)]
    Plan(#[from] PlanError),

    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl Error {
    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Self::InvalidRequest {
            table: None,
            position: None,
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
