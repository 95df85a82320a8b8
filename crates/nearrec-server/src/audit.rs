//! The audit log (`audit_log`, `docs/security.md`): one JSON object a line for every call that
//! changes what a node serves — writes and removals, a write's transaction steps and a
//! replica's membership, tables created and dropped, swaps, model updates, compactions — and
//! for every call refused for its token or its grants: when, who (the principal its token
//! names, `-` without an ACL, `?` for a token the ACL does not know; the peer's address), what
//! (the call, its step or target, the store, each table and its rows) and how it ended (the
//! gRPC status). Never a token.
//!
//! Kept apart from the node's logs, which are sampled and may drop lines when stderr is full:
//! each line is appended and handed to the kernel before the call's answer leaves (`O_APPEND`,
//! one `write`), so a line is lost only with the machine. A line that cannot be written is
//! counted (`nearrec_audit_lines_failed_total`) and said once on stderr.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The calls that change what a node serves.
const CHANGES: [&str; 8] = [
    "Write",
    "Remove",
    "Transaction",
    "UpdateModel",
    "CreateTable",
    "DropTable",
    "Swap",
    "Compact",
];

/// The steps of a `Transaction` that change nothing (reads of what a replica holds).
const READ_STEPS: [&str; 2] = ["list", "membership"];

/// One call, as the audit log says it.
#[derive(Debug, serde::Serialize)]
pub struct Line<'a> {
    pub unix_ms: u64,
    pub call: &'a str,
    /// A transaction's step, or what a swap served.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub what: &'a str,
    pub principal: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<SocketAddr>,
    pub store: &'a str,
    /// Each table the call names and its rows.
    pub tables: &'a [(String, u64)],
    pub status: String,
}

/// The audit log's file.
#[derive(Debug)]
pub struct Audit {
    path: std::path::PathBuf,
    file: Mutex<File>,
    pub failed: AtomicU64,
}

fn open_append(path: &Path) -> Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("the audit log {}: {e}", path.display()))
}

impl Audit {
    /// The log at `path`, opened to append (made if it is not there, readable by its owner
    /// only).
    pub fn open(path: &Path) -> Result<Self, String> {
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(open_append(path)?),
            failed: AtomicU64::new(0),
        })
    }

    /// Opens the file at its path again (SIGHUP, after the old one was moved aside by a log
    /// rotation); the old file stays in use if the new one cannot be opened.
    pub fn reopen(&self) -> Result<(), String> {
        let file = open_append(&self.path)?;
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = file;
        Ok(())
    }

    /// Whether a call belongs in the log: it changes what the node serves (a transaction's
    /// `what` its step), or it was refused for its token or grants.
    pub fn wants(call: &str, what: &str, code: tonic::Code) -> bool {
        let refused = matches!(
            code,
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
        );
        refused
            || (CHANGES.contains(&call) && !(call == "Transaction" && READ_STEPS.contains(&what)))
    }

    /// Appends `line` (its `unix_ms` set now).
    pub fn record(&self, mut line: Line<'_>) {
        line.unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut bytes = serde_json::to_vec(&line).expect("an audit line serializes");
        bytes.push(b'\n');
        let written = self
            .file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(&bytes);
        if let Err(e) = written
            && self.failed.fetch_add(1, Ordering::Relaxed) == 0
        {
            tracing::error!("the audit log cannot be written ({e}): lines are being lost");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn changes_and_refusals_are_audited_reads_are_not() {
        assert!(Audit::wants("Write", "", Code::Ok));
        assert!(Audit::wants("Swap", "version 2", Code::FailedPrecondition));
        assert!(Audit::wants("Transaction", "prepare", Code::Ok));
        assert!(Audit::wants("Transaction", "adopt", Code::Ok));
        assert!(!Audit::wants("Transaction", "list", Code::Ok));
        assert!(!Audit::wants("Transaction", "membership", Code::Ok));
        assert!(!Audit::wants("Lookup", "", Code::Ok));
        assert!(!Audit::wants("Lookup", "", Code::InvalidArgument));
        assert!(Audit::wants("Lookup", "", Code::PermissionDenied));
        assert!(Audit::wants("Info", "", Code::Unauthenticated));
    }
}
