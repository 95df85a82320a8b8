//! A live store's part in a cross-shard write (`docs/format.md` §15): the transactions it has
//! prepared, and the outcomes it keeps, one file each in the store's `txn/` directory.
//!
//! `txn/<id>.<state>`, `<id>` the transaction's 128-bit id in 32 hex digits:
//! - `prepared` — the call's operations, checked and durable, not yet in the log;
//! - `committed` — decided: the operations go to the log (a crash before they are there is
//!   redone on open);
//! - `applied` — in the log; kept, without its operations, for as long as the coordinator may
//!   ask (the shard that decides a transaction keeps its outcome until told to forget it);
//! - `aborted` — refused; kept likewise, so that a prepare arriving late is refused too.
//!
//! A file is magic `NRTXN001`, the id (16 bytes, little-endian), the note's length (`u32`) and
//! the note (the coordinator's, UTF-8), the operations as one log record ([`super::encode`],
//! sequence number 0), and a CRC-32C of everything before it. Files are written under a
//! temporary name, synced, renamed into place and the directory synced
//! ([`crate::sync::replace_file`]); a state change writes the new state's file and removes the
//! old one's. Since version 9 a store's steps of a transaction are records of
//! logs — a prepare and an abort of the transactions' own log (`txn/log`), a commit of the
//! store's, with its rows — and the files a checkpoint of them (`CHECKPOINT` names how far).

use std::fs;
use std::path::{Path, PathBuf};

use super::record::{Frame, Op, decode, encode};
use crate::error::{FormatError, Result};
use crate::sync::{fsync_dir, replace_file};

/// The directory of a store that holds its transactions.
pub const TXN_DIR: &str = "txn";
const MAGIC: &[u8; 8] = b"NRTXN001";
/// `txn/CHECKPOINT`: how far the files hold every transaction the store held — the record of
/// the store's log and the record of the transactions' own log (`txn/log`: prepares and aborts)
/// — (magic `NRTXC002`, the two numbers, a CRC-32C); the steps after them are replayed over the
/// files on open.
const CHECKPOINT: &str = "CHECKPOINT";
/// The transactions' own log's directory in `txn/`.
pub const TXN_LOG_DIR: &str = "log";
const CHECKPOINT_MAGIC: &[u8; 8] = b"NRTXC002";

/// Where a transaction stands on this store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxState {
    Prepared,
    Committed,
    Applied,
    Aborted,
}

impl TxState {
    pub const ALL: [TxState; 4] = [
        Self::Prepared,
        Self::Committed,
        Self::Applied,
        Self::Aborted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Prepared => "prepared",
            Self::Committed => "committed",
            Self::Applied => "applied",
            Self::Aborted => "aborted",
        }
    }
}

/// One transaction's file, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct TxFile {
    pub tx: u128,
    pub state: TxState,
    pub note: String,
    /// Empty once applied or aborted.
    pub ops: Vec<Op>,
    /// When the file was last written or renamed (its modification time).
    pub since: std::time::SystemTime,
}

/// The path of transaction `tx`'s file in `state` in store `dir`.
pub fn tx_path(dir: &Path, tx: u128, state: TxState) -> PathBuf {
    dir.join(TXN_DIR)
        .join(format!("{tx:032x}.{}", state.name()))
}

/// Writes transaction `tx`'s file in `state`, durably.
pub fn write_tx(dir: &Path, tx: u128, state: TxState, note: &str, ops: &[Op]) -> Result<()> {
    let path = tx_path(dir, tx, state);
    let mut bytes = Vec::with_capacity(64 + note.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&tx.to_le_bytes());
    bytes.extend_from_slice(&(note.len() as u32).to_le_bytes());
    bytes.extend_from_slice(note.as_bytes());
    encode(0, ops, &mut bytes).map_err(|reason| FormatError::Corrupted {
        path: path.clone(),
        reason,
    })?;
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    made_txn_dir(dir)?;
    replace_file(&path, &bytes)
}

/// Store `dir`'s `txn/`, made (and its making synced) when missing.
fn made_txn_dir(dir: &Path) -> Result<PathBuf> {
    let txn = dir.join(TXN_DIR);
    if !txn.exists() {
        fs::create_dir_all(&txn).map_err(|e| FormatError::io(&txn, e))?;
        fsync_dir(dir)?;
    }
    Ok(txn)
}

/// Removes transaction `tx`'s file in `state`, durably (none there is no error).
pub fn remove_tx(dir: &Path, tx: u128, state: TxState) -> Result<()> {
    let path = tx_path(dir, tx, state);
    match fs::remove_file(&path) {
        Ok(()) => fsync_dir(&dir.join(TXN_DIR)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FormatError::io(&path, e)),
    }
}

/// Every transaction file of store `dir`, each checked whole (a temporary a crash left behind
/// is removed: it was never renamed into place, so nothing was told of it).
pub fn read_txns(dir: &Path) -> Result<Vec<TxFile>> {
    let txn = dir.join(TXN_DIR);
    let entries = match fs::read_dir(&txn) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FormatError::io(&txn, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| FormatError::io(&txn, e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.contains(".tmp-") {
            let _ = fs::remove_file(&path);
            continue;
        }
        if name == CHECKPOINT || name == TXN_LOG_DIR {
            continue;
        }
        let bad = |reason: String| FormatError::Corrupted {
            path: path.clone(),
            reason,
        };
        let (id, state) = name
            .split_once('.')
            .and_then(|(id, s)| {
                let state = TxState::ALL.into_iter().find(|t| t.name() == s)?;
                Some((u128::from_str_radix(id, 16).ok()?, state))
            })
            .ok_or_else(|| bad("not a transaction's file name (<32 hex digits>.<state>)".into()))?;
        let bytes = fs::read(&path).map_err(|e| FormatError::io(&path, e))?;
        let since = entry
            .metadata()
            .and_then(|m| m.modified())
            .map_err(|e| FormatError::io(&path, e))?;
        let file = parse(&bytes).map_err(bad)?;
        if file.0 != id {
            return Err(bad(format!("it holds transaction {:032x}", file.0)));
        }
        out.push(TxFile {
            tx: id,
            state,
            note: file.1,
            ops: file.2,
            since,
        });
    }
    out.sort_by_key(|f| f.tx);
    Ok(out)
}

/// The directory of store `dir`'s transactions' own log (`txn/log`), made (durably) when
/// `make` and missing.
pub fn txn_log_dir(dir: &Path, make: bool) -> Result<PathBuf> {
    let log = dir.join(TXN_DIR).join(TXN_LOG_DIR);
    if make && !log.exists() {
        let txn = made_txn_dir(dir)?;
        fs::create_dir(&log).map_err(|e| FormatError::io(&log, e))?;
        fsync_dir(&txn)?;
    }
    Ok(log)
}

/// Writes `txn/CHECKPOINT`: the files hold every transaction the store held as of record
/// `upto.0` of the store's log and record `upto.1` of the transactions' own, durably.
pub fn write_checkpoint(dir: &Path, upto: (u64, u64)) -> Result<()> {
    let mut bytes = Vec::with_capacity(28);
    bytes.extend_from_slice(CHECKPOINT_MAGIC);
    bytes.extend_from_slice(&upto.0.to_le_bytes());
    bytes.extend_from_slice(&upto.1.to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(&bytes).to_le_bytes());
    replace_file(&made_txn_dir(dir)?.join(CHECKPOINT), &bytes)
}

/// The records `txn/CHECKPOINT` names, of the store's log and of the transactions' own
/// (`(0, 0)` without one: the files are all there is, as in a store of an older build).
pub fn read_checkpoint(dir: &Path) -> Result<(u64, u64)> {
    let path = dir.join(TXN_DIR).join(CHECKPOINT);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(FormatError::io(&path, e)),
    };
    let bad = |reason: &str| FormatError::Corrupted {
        path: path.clone(),
        reason: reason.into(),
    };
    if bytes.len() != 28 || &bytes[..8] != CHECKPOINT_MAGIC {
        return Err(bad(
            "not a transactions' checkpoint (magic NRTXC002, 28 bytes)",
        ));
    }
    let crc = u32::from_le_bytes(bytes[24..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&bytes[..24]) != crc {
        return Err(bad("its checksum does not match"));
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Ok((word(8), word(16)))
}

fn parse(bytes: &[u8]) -> Result<(u128, String, Vec<Op>), String> {
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err("shorter than a checksum".into());
    };
    if crc32c::crc32c(body) != u32::from_le_bytes(*crc) {
        return Err("its checksum does not match".into());
    }
    let head = MAGIC.len() + 16 + 4;
    if body.len() < head || &body[..8] != MAGIC {
        return Err("not a transaction file (magic NRTXN001)".into());
    }
    let tx = u128::from_le_bytes(body[8..24].try_into().expect("16 bytes"));
    let n = u32::from_le_bytes(body[24..28].try_into().expect("4 bytes")) as usize;
    let note = body.get(head..head + n).ok_or("its note is cut short")?;
    let note = String::from_utf8(note.to_vec()).map_err(|_| "its note is not UTF-8")?;
    match decode(&body[head + n..], 0) {
        Frame::Record(r, _) => Ok((tx, note, r.ops)),
        Frame::Torn(why) => Err(format!("its operations: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_file_reads_back_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ops = vec![Op::Write {
            table: "t0".into(),
            ids: vec![3, 7],
            row_bytes: 4,
            rows: vec![1, 2, 3, 4, 5, 6, 7, 8],
        }];
        let tx = 0xfeed_u128 << 64 | 42;
        write_tx(dir.path(), tx, TxState::Prepared, "decider=0/0", &ops).unwrap();
        let read = read_txns(dir.path()).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!((read[0].tx, read[0].state), (tx, TxState::Prepared));
        assert_eq!((read[0].note.as_str(), &read[0].ops), ("decider=0/0", &ops));
        // a state change, as a checkpoint makes it: the new state's file, the old one's gone
        write_tx(dir.path(), tx, TxState::Committed, "decider=0/0", &ops).unwrap();
        remove_tx(dir.path(), tx, TxState::Prepared).unwrap();
        assert_eq!(read_txns(dir.path()).unwrap()[0].state, TxState::Committed);
        // a flipped byte anywhere is refused, naming the file
        let path = tx_path(dir.path(), tx, TxState::Committed);
        let mut bytes = fs::read(&path).unwrap();
        for at in [0, 9, 30, bytes.len() - 6] {
            bytes[at] ^= 1;
            fs::write(&path, &bytes).unwrap();
            let e = read_txns(dir.path()).unwrap_err();
            assert!(e.to_string().contains(&format!("{tx:032x}")), "{e}");
            bytes[at] ^= 1;
        }
        fs::write(&path, &bytes).unwrap();
        remove_tx(dir.path(), tx, TxState::Committed).unwrap();
        remove_tx(dir.path(), tx, TxState::Committed).unwrap();
        assert!(read_txns(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn a_checkpoint_reads_back_beside_the_files_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_checkpoint(dir.path()).unwrap(), (0, 0));
        write_checkpoint(dir.path(), (41, 3)).unwrap();
        write_checkpoint(dir.path(), (42, 7)).unwrap();
        assert_eq!(read_checkpoint(dir.path()).unwrap(), (42, 7));
        fs::create_dir_all(dir.path().join(TXN_DIR).join(TXN_LOG_DIR)).unwrap();
        assert!(
            read_txns(dir.path()).unwrap().is_empty(),
            "not a transaction"
        );
        let path = dir.path().join(TXN_DIR).join(CHECKPOINT);
        let mut bytes = fs::read(&path).unwrap();
        bytes[10] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let e = read_checkpoint(dir.path()).unwrap_err();
        assert!(e.to_string().contains("CHECKPOINT"), "{e}");
    }
}
