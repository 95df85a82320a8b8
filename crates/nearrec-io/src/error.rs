use std::path::PathBuf;

/// Everything that can go wrong reading blocks. Each variant names the file (and offset) or the
/// offending read, so the one-line `Display` says what to look at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    #[error("cannot open {path} for reading: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("read of {len} bytes at offset {offset} of {path} failed: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "read of {len} bytes at offset {offset} of {path} returned {got} bytes: the file is \
         shorter than its header says. Run `nearrec verify`"
    )]
    ShortRead {
        path: PathBuf,
        offset: u64,
        len: usize,
        got: usize,
    },

    /// A malformed read request (a caller bug, not a device failure).
    #[error("read {op}: {reason}")]
    InvalidRead { op: usize, reason: String },

    #[error("cannot start a pool of {threads} threads: {reason}")]
    Threads { threads: usize, reason: String },

    /// A random-read probe that cannot measure anything (no reads, no whole block to read).
    #[error("cannot probe random reads: {reason}")]
    Probe { reason: String },

    #[error("cannot set up {device}: {reason}")]
    Setup {
        device: &'static str,
        reason: String,
    },
}

pub type Result<T, E = IoError> = std::result::Result<T, E>;
