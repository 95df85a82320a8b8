//! The audit log (`audit_log`, `docs/security.md`): one JSON object a line for every call that
//! changes what a node serves (its verb's row says so, `nearrec_wire::verbs`: writes and
//! removals, a write's transaction steps and a replica's membership, tables created and
//! dropped, swaps, model updates, compactions) and
//! for every call refused for its token or its grants: when, who (the principal its token
//! names, `-` without an ACL, `?` for a token the ACL does not know; the peer's address), what
//! (the call, its step or target, the store, each table and its rows) and how it ended (the
//! gRPC status). Never a token.
//!
//! Kept apart from the node's logs, which are sampled and may drop lines when stderr is full:
//! each line is appended and handed to the kernel before the call's answer leaves (`O_APPEND`,
//! one `write`), so a line is lost only with the machine. A write that fails part-way is cut
//! back to the line's start, so no half line is left for the next to join; where even that
//! fails, the next line starts on a line of its own (a reader skips a line that does not parse:
//! the remnant of a failed write).
//!
//! By default the log fails open: a line that cannot be written is counted
//! (`nearrec_audit_lines_failed_total`), said once on stderr, and the call goes on. With
//! `audit_required`, a call that changes what the node serves is written as attempted
//! (`"phase": "attempt"`) before it runs, and refused (`UNAVAILABLE`, naming the log) with
//! nothing of it applied when that line cannot be written; its outcome line follows with the
//! same `id`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nearrec_wire::verbs::Verb;

/// Which of a call's lines a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Written before a change runs (`audit_required` only).
    Attempt,
    /// How the call ended.
    Outcome,
}

/// One call, as the audit log says it.
#[derive(Debug, serde::Serialize)]
pub struct Line<'a> {
    pub unix_ms: u64,
    /// The call's number in this node's run: its attempt and outcome lines share it.
    pub id: u64,
    pub phase: Phase,
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
    /// The gRPC status; empty on an attempt.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
}

/// A file lines are appended to, which a failed write can be cut back on.
pub trait LogFile: Write {
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Cuts the file to `len` bytes.
    fn truncate(&mut self, len: u64) -> io::Result<()>;
}

impl LogFile for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }
}

/// The log's file and whether its last write left a partial line it could not cut off.
#[derive(Debug)]
pub struct Lines<F> {
    file: F,
    torn: bool,
}

impl<F: LogFile> Lines<F> {
    pub fn new(file: F) -> Self {
        Self { file, torn: false }
    }

    /// Appends `line` (ending in a newline) whole, or leaves no part of it behind: a write that
    /// fails part-way is cut back to where it began, or, when that fails too, the next line
    /// starts on a line of its own.
    pub fn append(&mut self, line: &[u8]) -> io::Result<()> {
        let start = self.file.size();
        let written = if self.torn {
            self.file.write_all(&[b"\n", line].concat())
        } else {
            self.file.write_all(line)
        };
        match written {
            Ok(()) => self.torn = false,
            Err(_) => {
                let cut = start.and_then(|at| self.file.truncate(at));
                self.torn = self.torn || cut.is_err();
            }
        }
        written
    }

    pub fn file(&self) -> &F {
        &self.file
    }
}

/// The audit log's file.
#[derive(Debug)]
pub struct Audit {
    path: PathBuf,
    lines: Mutex<Lines<File>>,
    /// Changes are refused when their attempt cannot be written (`audit_required`).
    pub required: bool,
    calls: AtomicU64,
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
    /// only); `required`: see the module's doc.
    pub fn open(path: &Path, required: bool) -> Result<Self, String> {
        Ok(Self {
            path: path.to_path_buf(),
            lines: Mutex::new(Lines::new(open_append(path)?)),
            required,
            calls: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// Opens the file at its path again (SIGHUP, after the old one was moved aside by a log
    /// rotation); the old file stays in use if the new one cannot be opened.
    pub fn reopen(&self) -> Result<(), String> {
        let file = open_append(&self.path)?;
        *self.lines.lock().unwrap_or_else(|p| p.into_inner()) = Lines::new(file);
        Ok(())
    }

    /// Whether a call belongs in the log: its verb changes what the node serves
    /// (`nearrec_wire::verbs`), or it was refused for its token or grants.
    pub fn wants(verb: &Verb, code: tonic::Code) -> bool {
        let refused = matches!(
            code,
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
        );
        refused || verb.changes
    }

    /// A new call's number, for [`Line::id`].
    pub fn next_id(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::Relaxed)
    }

    /// Appends `line` (its `unix_ms` set now). A line that cannot be written is counted and
    /// said once on stderr, and its error returned.
    pub fn record(&self, mut line: Line<'_>) -> Result<(), String> {
        line.unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut bytes = serde_json::to_vec(&line).expect("an audit line serializes");
        bytes.push(b'\n');
        let written = (self.lines.lock().unwrap_or_else(|p| p.into_inner())).append(&bytes);
        written.map_err(|e| {
            if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::error!("the audit log cannot be written ({e}): lines are being lost");
            }
            format!(
                "the audit log {} cannot be written: {e}",
                self.path.display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    /// A disk with `room` bytes left: a write past it is short, then fails; cutting the file
    /// back fails when `cut_fails`.
    struct Full {
        data: Vec<u8>,
        room: usize,
        cut_fails: bool,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.room.saturating_sub(self.data.len()));
            if n == 0 && !buf.is_empty() {
                return Err(io::Error::from_raw_os_error(28)); // ENOSPC
            }
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl LogFile for Full {
        fn size(&self) -> io::Result<u64> {
            Ok(self.data.len() as u64)
        }

        fn truncate(&mut self, len: u64) -> io::Result<()> {
            if self.cut_fails {
                return Err(io::Error::from_raw_os_error(5)); // EIO
            }
            self.data.truncate(len as usize);
            Ok(())
        }
    }

    /// Issue 62, item 2: a short write left half a JSON line, and the next line appended
    /// joined it. Every line the file holds parses, or is the remnant of a failed write alone
    /// on its line.
    #[test]
    fn a_short_write_never_leaves_a_half_line_for_the_next_to_join() {
        let line = |k: u32| format!("{{\"call\":\"Write\",\"n\":{k}}}\n").into_bytes();
        for cut_fails in [false, true] {
            let mut lines = Lines::new(Full {
                data: Vec::new(),
                room: 30,
                cut_fails,
            });
            lines.append(&line(1)).unwrap();
            assert!(
                lines.append(&line(2)).is_err(),
                "past the room: short, then full"
            );
            lines.file.room = 1 << 10; // space freed
            lines.append(&line(3)).unwrap();
            let text = String::from_utf8(lines.file().data.clone()).unwrap();
            let parsed: Vec<u32> = (text.lines())
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .map(|v| v["n"].as_u64().unwrap() as u32)
                .collect();
            assert_eq!(parsed, [1, 3], "cut_fails {cut_fails}: {text:?}");
            let remnants = text.lines().count() - parsed.len();
            assert_eq!(remnants, usize::from(cut_fails), "{text:?}");
        }
    }

    #[test]
    fn changes_and_refusals_are_audited_reads_are_not() {
        use nearrec_wire::verbs::*;
        assert!(Audit::wants(WRITE, Code::Ok));
        assert!(Audit::wants(SWAP, Code::FailedPrecondition));
        assert!(Audit::wants(PREPARE, Code::Ok));
        assert!(Audit::wants(ADOPT, Code::Ok));
        assert!(!Audit::wants(LIST, Code::Ok));
        assert!(!Audit::wants(MEMBERSHIP, Code::Ok));
        assert!(!Audit::wants(LOOKUP, Code::Ok));
        assert!(!Audit::wants(LOOKUP, Code::InvalidArgument));
        assert!(Audit::wants(LOOKUP, Code::PermissionDenied));
        assert!(Audit::wants(INFO, Code::Unauthenticated));
    }
}
