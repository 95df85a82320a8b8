//! The product's error: every layer's error, wrapped, plus what the facade itself refuses (a
//! config value, a stored model, a request that does not fit a model). [`Error::kind`] is the one
//! table from an error to what every surface calls it — Python's exception class, the storage
//! node's gRPC status and `ErrorInfo` reason — with the table and position it names.

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

    /// A cross-shard write's prepare refused: a transaction prepared before it holds one of its
    /// rows until that one commits or aborts (its coordinator tries again).
    #[error("table {table:?}: row {row} is held by prepared transaction {tx:032x}")]
    Held { table: String, row: u64, tx: u128 },

    /// A step of a cross-shard write that the transaction's state here refuses (a commit of
    /// one aborted, an abort of one committed).
    #[error("transaction {tx:032x}: {reason}")]
    Transaction { tx: u128, reason: String },

    /// A lookup pinned to a version of the store's repository that this store does not hold:
    /// neither the one it serves nor one held beside it (staged, or the one a staged swap
    /// replaced). Never answered from another version.
    #[error("version {version} of {store} is not held here: it holds {held:?}")]
    VersionNotServed {
        store: String,
        version: u64,
        held: Vec<u64>,
    },

    /// A write to a replica at another membership epoch than its sender's, or one that is no
    /// member of its shard (it is catching up); a change of membership from an epoch it does
    /// not hold. Its sender learns the shard's replicas again and tries again.
    #[error("{store}: {reason}; this replica is at epoch {epoch}, {}", if *member { "a member" } else { "not a member" })]
    MembershipChanged {
        store: String,
        epoch: u64,
        member: bool,
        reason: String,
    },

    /// A prepare refused while a replica is fenced for another's catch-up (its router tries
    /// again), or a fence that could not drain the writes prepared before it.
    #[error("{store} is fenced while a replica of its shard catches up: {reason}")]
    Fenced { store: String, reason: String },

    /// A replica whose node keeps its shard's membership in etcd, and which is not held now: it
    /// could not renew its lease there within its hold, or etcd names it no member. It serves
    /// no reads and takes no writes until it is held again (its router asks another replica).
    #[error(
        "{store} is not held by its shard's membership in etcd: {reason}; it serves no reads and \
         takes no writes until it is"
    )]
    Unheld { store: String, reason: String },

    /// A write that does not fit the delta's budget: nothing of it was applied.
    #[error(
        "the store's delta is full: {used} of {budget} bytes in use, the call needs {asked}; \
         raise delta_budget or wait for compaction"
    )]
    DeltaFull { used: u64, asked: u64, budget: u64 },

    /// A write of a new key to a keyed table that holds its cap of keys, with eviction off:
    /// nothing of the call was applied.
    #[error(
        "table {table:?}: key {key} at position {position} is new, and the table holds its cap \
         of {cap} keys (evict = \"off\"): remove keys, raise the cap, or let it evict"
    )]
    KeysFull {
        table: String,
        position: usize,
        key: u64,
        cap: u64,
    },

    /// A bug of ours (a panic caught at a thread boundary).
    #[error("internal error: {0}")]
    Internal(String),

    /// A verb of the contract ([`crate::StoreApi`]) that this implementation does not serve.
    #[error("{by} does not serve {verb}")]
    Unsupported { verb: &'static str, by: String },

    /// An error another process answered with (a storage node): its kind, the gRPC status code
    /// it came with, and the table and position it named. Its message is the answering side's.
    #[error("{message}")]
    Remote {
        kind: ErrorKind,
        code: i32,
        message: String,
        table: Option<String>,
        position: Option<usize>,
    },

    /// A shard of a sharded store failed a call: no replica of it answered within the call's
    /// deadline (`kind` `Unavailable` or `DeadlineExceeded`), or it does not fit the plan. A
    /// call that needed the shard gets this, never a partial answer.
    #[error("shard {shard} of {store}: {reason}")]
    Shard {
        store: String,
        shard: usize,
        kind: ErrorKind,
        reason: String,
    },

    #[error(transparent)]
    Engine(#[from] EngineError),

    #[error(transparent)]
    Format(#[from] FormatError),

    #[error(transparent)]
    Plan(#[from] PlanError),

    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// What kind of failure an [`Error`] is, as every surface names it: the class of
/// `nearrec.errors` Python raises ([`ErrorKind::name`]), the reason of the storage node's
/// `google.rpc.ErrorInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A malformed request or argument.
    InvalidRequest,
    /// An id negative or not below its table's rows.
    IndexOutOfRange,
    /// A key a keyed table does not hold, under its `unknown = "error"` policy.
    UnknownKey,
    /// A table the store does not have.
    UnknownTable,
    /// The operating system failed a read or write.
    StoreIo,
    /// No store where one was asked for.
    StoreNotFound,
    /// A store already where a new one was to be written.
    StoreExists,
    /// A check failed: magic, checksum, truncation.
    StoreCorrupted,
    /// A format version this build does not read.
    UnsupportedVersion,
    /// A trace file that is not one.
    InvalidTrace,
    /// A trace that does not fit the store.
    TraceMismatch,
    /// More memory than the process may take.
    InsufficientMemory,
    /// A resource other than memory refused: threads, file descriptors.
    ResourceExhausted,
    /// A write to a store opened read-only.
    StoreReadOnly,
    /// The store is open for writing elsewhere, or a prepared cross-shard write holds the row.
    StoreLocked,
    /// A write that does not fit the delta's budget.
    DeltaFull,
    /// A new key written to a keyed table at its cap, with eviction off.
    KeysFull,
    /// A lookup pinned to a version the store does not hold (a sharded store moves it to
    /// another replica, or to the version every shard serves now).
    VersionNotServed,
    /// A write sent at another membership epoch than the replica's, or to a replica catching
    /// up (a sharded store learns its shard's replicas again and retries).
    MembershipChanged,
    /// A bug of ours.
    Internal,
    /// A verb the implementation does not serve.
    Unsupported,
    /// The node knows no such token (or none was sent).
    Unauthenticated,
    /// The node's ACL does not grant the call.
    PermissionDenied,
    /// The call's deadline passed (the client's or the node's).
    DeadlineExceeded,
    /// The node's queue is full: retry.
    Overloaded,
    /// No connection to the node: retry.
    Unavailable,
    /// Anything the table above does not list.
    Other,
}

impl ErrorKind {
    /// Every kind, for tables kept in step with this one (the Python classes, the node's
    /// statuses).
    pub const ALL: [ErrorKind; 27] = [
        Self::InvalidRequest,
        Self::IndexOutOfRange,
        Self::UnknownKey,
        Self::UnknownTable,
        Self::StoreIo,
        Self::StoreNotFound,
        Self::StoreExists,
        Self::StoreCorrupted,
        Self::UnsupportedVersion,
        Self::InvalidTrace,
        Self::TraceMismatch,
        Self::InsufficientMemory,
        Self::ResourceExhausted,
        Self::StoreReadOnly,
        Self::StoreLocked,
        Self::DeltaFull,
        Self::KeysFull,
        Self::VersionNotServed,
        Self::MembershipChanged,
        Self::Internal,
        Self::Unsupported,
        Self::Unauthenticated,
        Self::PermissionDenied,
        Self::DeadlineExceeded,
        Self::Overloaded,
        Self::Unavailable,
        Self::Other,
    ];

    /// The name of the kind: the class of `nearrec.errors` that Python raises for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidRequest => "InvalidRequest",
            Self::IndexOutOfRange => "IndexOutOfRange",
            Self::UnknownKey => "UnknownKey",
            Self::UnknownTable => "UnknownTable",
            Self::StoreIo => "StoreIOError",
            Self::StoreNotFound => "StoreNotFound",
            Self::StoreExists => "StoreExists",
            Self::StoreCorrupted => "StoreCorrupted",
            Self::UnsupportedVersion => "UnsupportedVersion",
            Self::InvalidTrace => "InvalidTrace",
            Self::TraceMismatch => "TraceMismatch",
            Self::InsufficientMemory => "InsufficientMemory",
            Self::ResourceExhausted => "ResourceExhausted",
            Self::StoreReadOnly => "StoreReadOnly",
            Self::StoreLocked => "StoreLocked",
            Self::DeltaFull => "DeltaFull",
            Self::KeysFull => "KeysFull",
            Self::VersionNotServed => "VersionNotServed",
            Self::MembershipChanged => "MembershipChanged",
            Self::Internal => "InternalError",
            Self::Unsupported => "Unsupported",
            Self::Unauthenticated => "Unauthenticated",
            Self::PermissionDenied => "PermissionDenied",
            Self::DeadlineExceeded => "DeadlineExceeded",
            Self::Overloaded => "Overloaded",
            Self::Unavailable => "Unavailable",
            Self::Other => "NearrecError",
        }
    }

    /// The kind [`ErrorKind::name`] names.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A kind with the table and position it names.
type Class<'a> = (ErrorKind, Option<&'a str>, Option<usize>);

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.class().0
    }

    /// The table the error names, where it names one.
    pub fn table(&self) -> Option<&str> {
        self.class().1
    }

    /// The position in the request (an id's index in its table's ids) the error names.
    pub fn position(&self) -> Option<usize> {
        self.class().2
    }

    fn class(&self) -> Class<'_> {
        use ErrorKind as K;
        match self {
            Self::Config { .. } | Self::NoModel { .. } => (K::InvalidRequest, None, None),
            Self::InvalidRequest {
                table, position, ..
            } => (K::InvalidRequest, table.as_deref(), *position),
            Self::BadModel { .. } => (K::StoreCorrupted, None, None),
            Self::Internal(_) => (K::Internal, None, None),
            Self::Unsupported { .. } => (K::Unsupported, None, None),
            Self::Remote {
                kind,
                table,
                position,
                ..
            } => (*kind, table.as_deref(), *position),
            Self::ReadOnly { .. } => (K::StoreReadOnly, None, None),
            Self::Locked { .. } => (K::StoreLocked, None, None),
            Self::Held { table, .. } => (K::StoreLocked, Some(table.as_str()), None),
            Self::Transaction { .. } => (K::InvalidRequest, None, None),
            Self::DeltaFull { .. } => (K::DeltaFull, None, None),
            Self::KeysFull {
                table, position, ..
            } => (K::KeysFull, Some(table.as_str()), Some(*position)),
            Self::VersionNotServed { .. } => (K::VersionNotServed, None, None),
            Self::MembershipChanged { .. } => (K::MembershipChanged, None, None),
            Self::Fenced { .. } => (K::StoreLocked, None, None),
            Self::Unheld { .. } => (K::Unavailable, None, None),
            Self::Shard { kind, .. } => (*kind, None, None),
            Self::Engine(e) => engine_class(e),
            Self::Format(e) => format_class(e),
            Self::Plan(e) => plan_class(e),
            Self::Device(e) => device_class(e),
        }
    }

    /// [`Error::Unsupported`] of `verb` by `by`.
    pub fn unsupported(verb: &'static str, by: impl Into<String>) -> Self {
        Self::Unsupported {
            verb,
            by: by.into(),
        }
    }

    /// `InvalidRequest` naming no table or position: a request wrong as a whole.
    pub fn invalid(reason: impl Into<String>) -> Self {
        Self::InvalidRequest {
            table: None,
            position: None,
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn format_class(e: &FormatError) -> Class<'_> {
    use ErrorKind as K;
    match e {
        FormatError::NotFound { .. } => (K::StoreNotFound, None, None),
        FormatError::AlreadyExists { .. } => (K::StoreExists, None, None),
        FormatError::Io { .. } => (K::StoreIo, None, None),
        FormatError::OutOfMemory { .. } => (K::InsufficientMemory, None, None),
        FormatError::Corrupted { .. } => (K::StoreCorrupted, None, None),
        FormatError::CorruptedRow { table, .. } => (K::StoreCorrupted, Some(table.as_str()), None),
        FormatError::UnsupportedVersion { .. } => (K::UnsupportedVersion, None, None),
        FormatError::InvalidTable { table, .. } | FormatError::RowCount { table, .. } => {
            (K::InvalidRequest, Some(table.as_str()), None)
        }
        FormatError::UnknownDType(_) | FormatError::Repository { .. } => {
            (K::InvalidRequest, None, None)
        }
        // a delta file names a row of itself, not of a table
        FormatError::BadDelta { .. } => (K::InvalidRequest, None, None),
        _ => (K::Other, None, None),
    }
}

/// The kind of a block device's error (a failed read, a disk probe).
fn io_kind(e: &nearrec_io::IoError) -> ErrorKind {
    use nearrec_io::IoError as I;
    match e {
        // a malformed read is a bug of ours, not the device's
        I::InvalidRead { .. } => ErrorKind::Internal,
        I::Threads { .. } => ErrorKind::ResourceExhausted,
        // a disk probe with nothing to measure
        I::Probe { .. } => ErrorKind::InvalidRequest,
        I::Open { .. } | I::Read { .. } | I::ShortRead { .. } | I::Setup { .. } => {
            ErrorKind::StoreIo
        }
        _ => ErrorKind::Other,
    }
}

fn engine_class(e: &EngineError) -> Class<'_> {
    use ErrorKind as K;
    match e {
        EngineError::Format(f) => format_class(f),
        EngineError::Io(io) => (io_kind(io), None, None),
        EngineError::InsufficientMemory(_) => (K::InsufficientMemory, None, None),
        EngineError::UnknownTable { name, .. } => (K::UnknownTable, Some(name.as_str()), None),
        EngineError::IndexOutOfRange {
            table, position, ..
        } => (K::IndexOutOfRange, Some(table.as_str()), Some(*position)),
        EngineError::UnknownKey {
            table, position, ..
        } => (K::UnknownKey, Some(table.as_str()), Some(*position)),
        EngineError::Corrupted { table, .. } => (K::StoreCorrupted, Some(table.as_str()), None),
        EngineError::InvalidRequest { table, .. } => {
            (K::InvalidRequest, Some(table.as_str()), None)
        }
        EngineError::Config(_) | EngineError::Model(_) => (K::InvalidRequest, None, None),
        _ => (K::Other, None, None),
    }
}

/// The kind of a planner or trace error, with the table and position it names.
fn plan_class(e: &PlanError) -> Class<'_> {
    use ErrorKind as K;
    match e {
        PlanError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            (K::StoreNotFound, None, None)
        }
        PlanError::Io { .. } => (K::StoreIo, None, None),
        PlanError::BadTrace { .. } => (K::InvalidTrace, None, None),
        PlanError::TraceMismatch {
            table, position, ..
        } => (K::TraceMismatch, Some(table.as_str()), *position),
        PlanError::InvalidArgument { .. } => (K::InvalidRequest, None, None),
        PlanError::BadPlan { table, .. } | PlanError::BadShardPlan { table, .. } => {
            (K::InvalidRequest, table.as_deref(), None)
        }
        PlanError::BadSpec { table, .. } => (K::InvalidRequest, Some(table.as_str()), None),
        PlanError::Exists { .. } => (K::StoreExists, None, None),
        PlanError::InsufficientMemory(_) => (K::InsufficientMemory, None, None),
    }
}

fn device_class(e: &DeviceError) -> Class<'_> {
    use ErrorKind as K;
    match e {
        DeviceError::Config(_) => (K::InvalidRequest, None, None),
        DeviceError::Request { table, .. } => (K::InvalidRequest, Some(table.as_str()), None),
        DeviceError::Io(io) => (io_kind(io), None, None),
        _ => (K::Other, None, None),
    }
}
