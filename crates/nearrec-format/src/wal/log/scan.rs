//! Reading a log's segments back: the records after what is applied, a torn or bad tail found
//! (and, on a writer's open, cut off as its recovery says).

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use super::{DroppedTail, SEGMENT_HEADER, TailKind, WalRecovery, parse_segment_name, read_header};
use crate::error::{FormatError, Result};
use crate::files::IN_STORE;
use crate::sync::fsync_dir;
use crate::wal::record::{self, Frame, Record};

/// What the segment files hold: the records after `applied`, the bytes of a torn tail, each
/// segment's first record, path and whole bytes, and the next record's number.
pub(super) struct Scan {
    pub(super) records: Vec<Record>,
    pub(super) torn_bytes: u64,
    pub(super) dropped: Option<DroppedTail>,
    pub(super) segments: Vec<(u64, PathBuf, u64)>,
    pub(super) next: u64,
}

/// Reads the log in `dir` (see [`Wal::open`]); a writer's open (`recovery` given) cuts a torn
/// tail off the file as `recovery` says and removes a newest segment cut while being made. A
/// reader drops a bad tail without a word: the writer may be appending it now.
pub(super) fn scan(dir: &Path, applied: u64, recovery: Option<WalRecovery>) -> Result<Scan> {
    let repair = recovery.is_some();
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| FormatError::io(dir, e))? {
        let entry = entry.map_err(|e| FormatError::io(dir, e))?;
        if let Some(first) = entry.file_name().to_str().and_then(parse_segment_name) {
            found.push((first, entry.path()));
        }
    }
    found.sort();
    let corrupted = |path: &Path, reason: String| FormatError::Corrupted {
        path: path.to_path_buf(),
        reason: format!("write-ahead log: {reason}"),
    };
    let mut records = Vec::new();
    let mut segments = Vec::new();
    let mut torn_bytes = 0u64;
    let mut dropped = None;
    let mut next: Option<u64> = None;
    let last = found.len().checked_sub(1);
    for (i, (first, path)) in found.iter().enumerate() {
        let newest = Some(i) == last;
        let bytes = match crate::files::read_regular(path, IN_STORE) {
            Ok(bytes) => bytes,
            // a reader's oldest segments may be released by the writer under it
            Err(e) if !repair && next.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
                continue;
            }
            Err(e) => return Err(FormatError::io(path, e)),
        };
        let named = match read_header(&bytes) {
            Ok(n) if n == *first => n,
            Ok(n) => {
                let why = format!("segment {} says it starts at record {n}", path.display());
                return Err(corrupted(path, why));
            }
            // a crash while the newest segment was being made: it holds nothing acknowledged
            Err(_) if newest && bytes.len() <= SEGMENT_HEADER => {
                torn_bytes += bytes.len() as u64;
                if repair {
                    fs::remove_file(path).map_err(|e| FormatError::io(path, e))?;
                    fsync_dir(dir)?;
                }
                continue;
            }
            Err(why) => return Err(corrupted(path, format!("{}: {why}", path.display()))),
        };
        if next.is_none() && named > applied + 1 {
            if !repair {
                // a reader behind: the writer released these records after a compaction
                return Err(FormatError::LogReleased {
                    path: dir.to_path_buf(),
                    applied,
                    first: named,
                });
            }
            let why =
                format!("the tables hold records up to {applied}, but the log starts at {named}");
            return Err(corrupted(path, why));
        }
        if let Some(expected) = next
            && named != expected
        {
            let why = format!(
                "segment {} starts at record {named}, but the one before it ends at {}",
                path.display(),
                expected - 1
            );
            return Err(corrupted(path, why));
        }
        let mut at = SEGMENT_HEADER;
        let mut lsn = named;
        while at < bytes.len() {
            match record::decode(&bytes[at..], lsn) {
                Frame::Record(r, n) => {
                    if r.lsn > applied {
                        records.push(r);
                    }
                    at += n;
                    lsn += 1;
                }
                Frame::Torn(why) if newest => {
                    // the tail of the newest segment: zeros never written over (`zero_ahead`),
                    // or a group cut by a crash before its sync returned, so none of it was
                    // acknowledged — unless intact records with later numbers follow it: then
                    // the damage is in the middle of what was acknowledged, and cutting there
                    // would drop those writes silently
                    if let Some((found, from)) = record_after(&bytes[at..], lsn) {
                        let why = format!(
                            "record {lsn} at byte {at} of {} is damaged ({why}), but record \
                             {found} after it, at byte {}, is intact: acknowledged writes follow \
                             the damage, so the log is not cut and the store does not open. The \
                             segment is left as it is; to give up records {lsn} and later, cut it \
                             at byte {at} (`truncate -s {at}`)",
                            path.display(),
                            at + from,
                        );
                        return Err(corrupted(path, why));
                    }
                    if let Some(last) = bytes[at..].iter().rposition(|&b| b != 0) {
                        torn_bytes += (bytes.len() - at) as u64;
                        let kind = tail_kind(&bytes, at, lsn);
                        if recovery == Some(WalRecovery::Absolute) {
                            let why = format!(
                                "record {lsn} at byte {at} of {} is {} ({why}); wal_recovery = \
                                 \"absolute\" refuses any bad record, so the log is not cut \
                                 and the store does not open. To give up records {lsn} and \
                                 later, cut the segment at byte {at} (`truncate -s {at}`), or \
                                 open with wal_recovery = \"tolerate_torn_tail\"",
                                path.display(),
                                kind.name(),
                            );
                            return Err(corrupted(path, why));
                        }
                        dropped = Some(DroppedTail {
                            segment: path.clone(),
                            lsn,
                            offset: at as u64,
                            bytes: last as u64 + 1,
                            kind,
                            why,
                        });
                    }
                    if repair {
                        let file = OpenOptions::new()
                            .write(true)
                            .open(path)
                            .map_err(|e| FormatError::io(path, e))?;
                        file.set_len(at as u64)
                            .and_then(|()| file.sync_all())
                            .map_err(|e| FormatError::io(path, e))?;
                    }
                    break;
                }
                Frame::Torn(why) => {
                    let why = format!("{} at byte {at}: {why}", path.display());
                    return Err(corrupted(path, why));
                }
            }
        }
        next = Some(lsn);
        segments.push((named, path.clone(), at as u64));
    }
    // records up to `applied` may have had their segments removed already
    let next = next.unwrap_or(applied + 1).max(applied + 1);
    if let Some(r) = records.first()
        && r.lsn != applied + 1
    {
        let why = format!(
            "the tables hold records up to {applied}, but the log's next is {}",
            r.lsn
        );
        return Err(corrupted(dir, why));
    }
    Ok(Scan {
        records,
        torn_bytes,
        dropped,
        segments,
        next,
    })
}

/// Whether the bad record at byte `at` of a segment's `bytes`, which should be record `lsn`,
/// looks torn or damaged. A crash leaves some of a group's sectors (or, for a write cut short,
/// its end) unwritten, and the newest segment is zero-filled ahead, so what was not written
/// reads as zeros. A record whose frame is whole (its length within bounds, its own number,
/// all its bytes present), that does not end in 16 zero bytes and none of whose sectors'
/// shares of 64 bytes or more is all zeros, was written whole and changed since. A flip in the
/// length or number fields, or damage to a record whose last 16 bytes or a sector's share are
/// zeros anyway (rows of zeros), reads as torn.
pub(super) fn tail_kind(bytes: &[u8], at: usize, lsn: u64) -> TailKind {
    const SECTOR: usize = 512;
    let zeros = |r: &[u8]| r.iter().all(|&b| b == 0);
    let tail = &bytes[at..];
    if tail.len() < record::FRAME_BYTES {
        return TailKind::Torn;
    }
    let len = u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")) as usize;
    let found = u64::from_le_bytes(tail[8..16].try_into().expect("8 bytes"));
    let end = at + record::FRAME_BYTES + len;
    if len > record::MAX_PAYLOAD || found != lsn || end > bytes.len() {
        return TailKind::Torn;
    }
    if zeros(&bytes[end.saturating_sub(16).max(at)..end]) {
        return TailKind::Torn;
    }
    let mut from = at;
    while from < end {
        let to = ((from / SECTOR + 1) * SECTOR).min(end);
        if to - from >= 64 && zeros(&bytes[from..to]) {
            return TailKind::Torn;
        }
        from = to;
    }
    TailKind::Damaged
}

/// The first intact record numbered after `lsn` in `tail` (the bytes from a damaged record
/// `lsn` to the end of its segment), and its offset in `tail`. Only the bytes up to the last
/// non-zero one are searched: a tail of zeros never written over holds nothing.
pub(super) fn record_after(tail: &[u8], lsn: u64) -> Option<(u64, usize)> {
    let end = tail.iter().rposition(|&b| b != 0)? + 1;
    // a record numbered past this many frames could not fit in the tail
    let most = lsn + (end / record::FRAME_BYTES) as u64 + 1;
    (1..=end.saturating_sub(record::FRAME_BYTES)).find_map(|from| {
        let found = u64::from_le_bytes(tail[from + 8..from + 16].try_into().expect("8 bytes"));
        if found <= lsn || found > most {
            return None;
        }
        match record::decode(&tail[from..], found) {
            Frame::Record(..) => Some((found, from)),
            Frame::Torn(_) => None,
        }
    })
}
