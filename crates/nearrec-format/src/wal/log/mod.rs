//! The log itself: segment files of framed records in the store directory, appended with group
//! commit and recovered on open (`docs/format.md` §12).
//!
//! Appends from many threads meet in one buffer. The first caller that finds no write in flight
//! becomes the leader: it takes the whole buffer, writes it with one `pwrite` and, for
//! [`Durability::Sync`], makes it durable with one `fdatasync`, while later callers fill the next
//! buffer; then one of them leads the next group. A caller returns once its record is durable
//! (`Sync`) or in the kernel (`Async`; a background thread syncs within the window), so an
//! acknowledged record survives a killed process either way and a machine crash under `Sync`.
//!
//! A failed write or sync poisons the log: the kernel may have dropped the dirty pages, so
//! nothing after it can be acknowledged; every later append fails until the store is reopened
//! and recovered.

use std::fs::{self, File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{FormatError, Result};
use crate::files::{IN_STORE, open_regular};
use crate::sync::fsync_dir;
use crate::wal::record::{self, Op, Record};

mod scan;

use scan::{Scan, scan};

/// Magic of a segment file's header.
pub const WAL_MAGIC: [u8; 8] = *b"NRWAL\0\0\0";
/// Bytes of a segment's header: magic, version, reserved, first sequence number, CRC-32C.
pub const SEGMENT_HEADER: usize = 32;
const SEGMENT_VERSION: u32 = 1;
/// How far past its records the newest segment is zero-filled by default
/// ([`WalConfig::zero_ahead`]).
pub const ZERO_AHEAD: u64 = 1 << 20;

/// When an append returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Once its record is on stable storage (`fdatasync`).
    Sync,
    /// Once its record is written to the kernel: it survives the process being killed, and the
    /// log is synced at least every `window`, so a machine crash loses at most that much.
    Async { window: Duration },
}

/// What a writable open does with a bad record at the end of the newest segment (RocksDB's
/// `WALRecoveryMode`, the two of its choices this log's group commit makes sense of). Either
/// way the bad record is reported ([`Recovered::dropped`]), never dropped silently, and damage
/// followed by intact records refuses the open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WalRecovery {
    /// The record and what follows it are cut off: a group cut by a crash before its sync
    /// returned was never acknowledged.
    #[default]
    TolerateTornTail,
    /// Any bad record refuses the open (`Corrupted`), naming it and the byte to cut at: the
    /// operator decides, since a bad last record may also be an acknowledged one damaged.
    Absolute,
}

/// A bad record at the end of the log that recovery dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedTail {
    /// The segment it was in.
    pub segment: PathBuf,
    /// The sequence number it should have had.
    pub lsn: u64,
    /// Its byte offset in the segment, where the file was cut.
    pub offset: u64,
    /// The bytes dropped (up to the segment's last non-zero one).
    pub bytes: u64,
    /// Whether it looks damaged rather than torn ([`TailKind`]).
    pub kind: TailKind,
    /// Why it is not an intact record.
    pub why: String,
}

/// What a bad record at the end of the log looks like (`docs/format.md` §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailKind {
    /// Cut short, or some of its sectors never written: a write a crash interrupted.
    Torn,
    /// Whole — its length within bounds, its own number, every byte present, no sector of it
    /// left unwritten — yet its checksum fails: written whole, then changed (a flipped bit).
    /// It may have been acknowledged.
    Damaged,
}

impl TailKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Torn => "torn",
            Self::Damaged => "damaged",
        }
    }
}

/// How the log writes.
#[derive(Debug, Clone, Copy)]
pub struct WalConfig {
    pub durability: Durability,
    /// A new segment is started once the current one holds this many bytes.
    pub segment_bytes: u64,
    /// The newest segment is zero-filled this far past its records, a step at a time: a group
    /// is then written over blocks the file already has, so its `fdatasync` flushes the data
    /// without a change to the file's size or extents to journal — half the time and CPU of a
    /// sync that extends the file (ext4 on this project's virtio disks: ~100 µs instead of
    /// ~220 µs). At least one byte.
    pub zero_ahead: u64,
    /// What a bad record at the end of the log does to the open.
    pub recovery: WalRecovery,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            durability: Durability::Sync,
            segment_bytes: 64 << 20,
            zero_ahead: ZERO_AHEAD,
            recovery: WalRecovery::default(),
        }
    }
}

/// Counters of a log since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records appended.
    pub records: u64,
    /// Groups written (one `pwrite` each; one `fdatasync` each under `Sync`).
    pub groups: u64,
    /// `fdatasync` calls, the background ones included.
    pub syncs: u64,
    /// Bytes in the segment files now.
    pub bytes: u64,
    /// Segment files now.
    pub segments: u64,
}

/// A segment file: its first record's sequence number, its bytes of records so far, and its
/// length (zeros past the records: [`WalConfig::zero_ahead`]).
#[derive(Debug)]
struct Segment {
    first: u64,
    file: Arc<File>,
    bytes: u64,
    len: u64,
}

#[derive(Debug)]
struct State {
    /// Framed records not yet handed to a leader.
    pending: Vec<u8>,
    /// The sequence number the next record gets.
    next: u64,
    /// The last record written to the kernel, and the last one synced.
    written: u64,
    synced: u64,
    /// A leader is writing a group.
    writing: bool,
    /// Why the log stopped, once a write or a sync failed.
    failed: Option<String>,
    /// Segments, oldest first; the last one is appended to.
    segments: Vec<Segment>,
    stats: WalStats,
    closing: bool,
}

/// The write-ahead log of one store (see the module docs).
#[derive(Debug)]
pub struct Wal {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    config: WalConfig,
    state: Mutex<State>,
    /// Signalled when a group is written or synced, and when the log closes.
    changed: Condvar,
}

/// What recovery found.
#[derive(Debug)]
pub struct Recovered {
    /// The records after the one the caller had already applied, in order.
    pub records: Vec<Record>,
    /// Bytes dropped from the end of the log: a record cut short by a crash (never acknowledged).
    pub torn_bytes: u64,
    /// The bad record at the end of the log that was dropped, if one was.
    pub dropped: Option<DroppedTail>,
}

fn segment_name(first: u64) -> String {
    format!("wal-{first:016x}.nrwal")
}

/// The first sequence number a segment's name gives, if it is a segment's name.
pub(super) fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("wal-")?.strip_suffix(".nrwal")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

fn header(first: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(&WAL_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&first.to_le_bytes());
    let crc = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The first sequence number a segment's header names, or why it is not a valid header.
pub(super) fn read_header(bytes: &[u8]) -> std::result::Result<u64, String> {
    if bytes.len() < SEGMENT_HEADER {
        return Err(format!("{} bytes, short of a header", bytes.len()));
    }
    let h = &bytes[..SEGMENT_HEADER];
    if h[..8] != WAL_MAGIC {
        return Err("not a log segment (bad magic)".into());
    }
    let crc = u32::from_le_bytes(h[24..28].try_into().expect("4"));
    if crc32c::crc32c(&h[..24]) != crc {
        return Err("its header's checksum does not match".into());
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4"));
    if version != SEGMENT_VERSION {
        return Err(format!("segment version {version} is not supported"));
    }
    Ok(u64::from_le_bytes(h[16..24].try_into().expect("8")))
}

impl Wal {
    /// Opens the log in store directory `dir` (making its first segment if there is none) and
    /// recovers it: returns the records after `applied` (the last one already folded into the
    /// tables), in order. A record cut short or damaged at the end of the newest segment is a
    /// write that was never acknowledged: it is cut off the file. Damage anywhere else is
    /// [`FormatError::Corrupted`].
    pub fn open(dir: &Path, config: WalConfig, applied: u64) -> Result<(Wal, Recovered)> {
        let Scan {
            records,
            torn_bytes,
            dropped,
            segments,
            next,
        } = scan(dir, applied, Some(config.recovery))?;
        let mut segments = segments
            .into_iter()
            .map(|(first, path, bytes)| {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(|e| FormatError::io(&path, e))?;
                let len = file
                    .metadata()
                    .map_err(|e| FormatError::io(&path, e))?
                    .len();
                Ok(Segment {
                    first,
                    file: Arc::new(file),
                    bytes,
                    len,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if segments.is_empty() {
            segments.push(create_segment(dir, next)?);
        }
        let stats = WalStats {
            bytes: segments.iter().map(|s| s.bytes).sum(),
            segments: segments.len() as u64,
            ..WalStats::default()
        };
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            config,
            state: Mutex::new(State {
                pending: Vec::new(),
                next,
                written: next - 1,
                synced: next - 1,
                writing: false,
                failed: None,
                segments,
                stats,
                closing: false,
            }),
            changed: Condvar::new(),
        });
        let flusher = match config.durability {
            Durability::Sync => None,
            Durability::Async { window } => {
                let shared = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("nearrec-wal-sync".into())
                        .spawn(move || shared.flush_every(window))
                        .map_err(|e| FormatError::io(dir, e))?,
                )
            }
        };
        Ok((
            Wal { shared, flusher },
            Recovered {
                records,
                torn_bytes,
                dropped,
            },
        ))
    }

    /// The records after `applied` as the log holds them now, without writing anything: what
    /// a reader in another process replays (the writer may be appending meanwhile; a record it
    /// has not finished is not read). Damage is refused as [`Wal::open`] refuses it.
    pub fn read(dir: &Path, applied: u64) -> Result<Recovered> {
        let scan = scan(dir, applied, None)?;
        Ok(Recovered {
            records: scan.records,
            torn_bytes: scan.torn_bytes,
            dropped: scan.dropped,
        })
    }

    /// Appends one record of `ops` and returns its sequence number once it is as durable as
    /// the log's [`Durability`] says. All of the record is recovered after a crash, or none of
    /// it (then it was never acknowledged).
    pub fn append(&self, ops: &[Op]) -> Result<u64> {
        self.shared
            .append(None, |_| Ok::<_, FormatError>(Some(ops)))
            .map(|(lsn, _)| lsn)
    }

    /// Appends the record `build` makes, called with the record's sequence number while no
    /// other record can be appended: what it decides is decided in log order (a keyed table's
    /// rows for new keys). Returns the number and the operations once the record is as
    /// durable as [`Self::append`]'s. An `Err` from `build` appends nothing, and so do no
    /// operations (the number returned is then 0).
    pub fn append_with<E: From<FormatError>>(
        &self,
        build: impl FnOnce(u64) -> std::result::Result<Vec<Op>, E>,
    ) -> std::result::Result<(u64, Vec<Op>), E> {
        self.shared
            .append(None, |lsn| {
                let ops = build(lsn)?;
                Ok(if ops.is_empty() { None } else { Some(ops) })
            })
            .map(|(lsn, ops)| ops.map_or((0, Vec::new()), |ops| (lsn, ops)))
    }

    /// Appends `ops` as record `lsn` (at least the next record's number), the numbers between
    /// taken by records of no operations, all of them one group: a replica adopting its shard's
    /// count of writes as it catches up (each empty record is a 16-byte frame).
    pub fn append_at(&self, lsn: u64, ops: &[Op]) -> Result<u64> {
        self.shared
            .append(Some(lsn), |_| Ok::<_, FormatError>(Some(ops)))
            .map(|(lsn, _)| lsn)
    }

    /// Waits until every record appended so far is on stable storage.
    pub fn sync(&self) -> Result<()> {
        self.shared.sync_all()
    }

    /// Removes the segments whose records are all at or before `applied` (folded into the
    /// tables). The segment being appended to stays.
    pub fn release(&self, applied: u64) -> Result<()> {
        let s = &self.shared;
        let mut state = s.lock();
        let mut removed = false;
        while state.segments.len() > 1 && state.segments[1].first <= applied + 1 {
            let old = state.segments.remove(0);
            let path = s.dir.join(segment_name(old.first));
            fs::remove_file(&path).map_err(|e| FormatError::io(&path, e))?;
            state.stats.bytes -= old.bytes;
            state.stats.segments -= 1;
            removed = true;
        }
        drop(state);
        if removed {
            fsync_dir(&s.dir)?;
        }
        Ok(())
    }

    /// The sequence number the next record will get.
    pub fn next_lsn(&self) -> u64 {
        self.shared.lock().next
    }

    pub fn stats(&self) -> WalStats {
        self.shared.lock().stats
    }

    pub fn config(&self) -> WalConfig {
        self.shared.config
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.closing = true;
        }
        self.shared.changed.notify_all();
        if let Some(f) = self.flusher.take() {
            let _ = f.join();
        }
        // what async appends left unsynced is synced now (a clean close loses nothing)
        let _ = self.shared.sync_all();
    }
}

/// Makes segment `first`: header written and synced, then the directory synced, before any
/// record goes in (so a segment that is not whole holds nothing acknowledged).
fn create_segment(dir: &Path, first: u64) -> Result<Segment> {
    let path = dir.join(segment_name(first));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| FormatError::io(&path, e))?;
    file.write_all_at(&header(first), 0)
        .and_then(|()| file.sync_all())
        .map_err(|e| FormatError::io(&path, e))?;
    fsync_dir(dir)?;
    // open_regular's checks, for symmetry with every other file of the store
    drop(open_regular(&path, IN_STORE).map_err(|e| FormatError::io(&path, e))?);
    Ok(Segment {
        first,
        file: Arc::new(file),
        bytes: SEGMENT_HEADER as u64,
        len: SEGMENT_HEADER as u64,
    })
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self, why: &str) -> FormatError {
        FormatError::io(
            &self.dir,
            std::io::Error::other(format!(
                "the write-ahead log stopped after a failed write ({why}); reopen the store"
            )),
        )
    }

    /// Appends the record `build` makes (`None`: nothing is appended).
    fn append<O: AsRef<[Op]>, E: From<FormatError>>(
        &self,
        at: Option<u64>,
        build: impl FnOnce(u64) -> std::result::Result<Option<O>, E>,
    ) -> std::result::Result<(u64, Option<O>), E> {
        let mut state = self.lock();
        if let Some(why) = &state.failed {
            return Err(self.failed(why).into());
        }
        let lsn = at.unwrap_or(state.next);
        if lsn < state.next {
            let next = state.next;
            return Err(FormatError::InvalidTable {
                table: String::new(),
                reason: format!("record {lsn} is behind the log, whose next record is {next}"),
            }
            .into());
        }
        let Some(ops) = build(lsn)? else {
            return Ok((lsn, None));
        };
        let invalid = |reason| FormatError::InvalidTable {
            table: ops
                .as_ref()
                .first()
                .and_then(Op::table)
                .unwrap_or_default()
                .to_owned(),
            reason,
        };
        let start = state.pending.len();
        for empty in state.next..lsn {
            record::encode(empty, &[], &mut state.pending).expect("an empty record encodes");
        }
        if let Err(reason) = record::encode(lsn, ops.as_ref(), &mut state.pending) {
            state.pending.truncate(start);
            return Err(invalid(reason).into());
        }
        state.stats.records += lsn + 1 - state.next;
        state.next = lsn + 1;
        let sync = self.config.durability == Durability::Sync;
        loop {
            if let Some(why) = &state.failed {
                return Err(self.failed(why).into());
            }
            let done = if sync { state.synced } else { state.written };
            if done >= lsn {
                return Ok((lsn, Some(ops)));
            }
            if state.writing {
                state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            state = self.lead(state, sync);
        }
    }

    /// Writes (and with `sync`, syncs) everything pending as one group, the lock released
    /// meanwhile; returns with the lock held again.
    fn lead<'a>(&'a self, mut state: MutexGuard<'a, State>, sync: bool) -> MutexGuard<'a, State> {
        let group = std::mem::take(&mut state.pending);
        let last = state.next - 1;
        state.writing = true;
        let result = (|| -> std::io::Result<(Arc<File>, u64, Option<Range<u64>>)> {
            let full = state.segments.last().is_some_and(|s| {
                s.bytes > SEGMENT_HEADER as u64
                    && s.bytes + group.len() as u64 > self.config.segment_bytes
            });
            if full {
                // the old segment is cut to its records (its zeros go) and synced before the
                // next one starts: only the newest segment ends in zeros
                let old = state.segments.last().expect("a segment");
                old.file.set_len(old.bytes)?;
                old.file.sync_all()?;
                let first = state.written + 1;
                let seg = create_segment(&self.dir, first).map_err(std::io::Error::other)?;
                state.segments.push(seg);
                state.stats.segments += 1;
                state.stats.bytes += SEGMENT_HEADER as u64;
                state.stats.syncs += 1;
            }
            state.stats.bytes += group.len() as u64;
            let seg = state.segments.last_mut().expect("a segment");
            let at = seg.bytes;
            seg.bytes += group.len() as u64;
            // past the zeros: the file grows by whole steps of them, beyond the group
            let zeros = (seg.bytes > seg.len).then(|| {
                let step = self.config.zero_ahead.max(1);
                let to = (seg.bytes / step + 1) * step;
                let from = std::mem::replace(&mut seg.len, to).max(seg.bytes);
                from..to
            });
            Ok((seg.file.clone(), at, zeros))
        })();
        drop(state);
        let result = result.and_then(|(file, at, zeros)| {
            if let Some(z) = zeros {
                file.write_all_at(&vec![0; (z.end - z.start) as usize], z.start)?;
            }
            fail::fail_point!("wal::write", |_| Err(std::io::Error::from_raw_os_error(
                libc::ENOSPC
            )));
            file.write_all_at(&group, at)?;
            if sync {
                fail::fail_point!("wal::sync", |_| Err(std::io::Error::from_raw_os_error(
                    libc::EIO
                )));
                file.sync_data()?;
            }
            Ok(())
        });
        let mut state = self.lock();
        state.writing = false;
        match result {
            Ok(()) => {
                state.written = last;
                state.stats.groups += 1;
                if sync {
                    state.synced = last;
                    state.stats.syncs += 1;
                }
            }
            Err(e) => state.failed = Some(e.to_string()),
        }
        self.changed.notify_all();
        state
    }

    /// Syncs every record appended before the call (writing what is pending first). Records
    /// appended meanwhile are left to their own callers: under a steady stream of appends a
    /// sync that chased them would never end (and would sync every group).
    fn sync_all(&self) -> Result<()> {
        let mut state = self.lock();
        let target = state.next - 1;
        loop {
            if let Some(why) = &state.failed {
                return Err(self.failed(why));
            }
            if state.synced >= target {
                return Ok(());
            }
            if state.writing {
                state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if state.written < target {
                // some of ours are still pending: write them (and whatever joined them), synced
                state = self.lead(state, true);
                continue;
            }
            let upto = state.written;
            let file = state.segments.last().expect("a segment").file.clone();
            drop(state);
            let result = file.sync_data();
            state = self.lock();
            match result {
                Ok(()) => {
                    state.synced = state.synced.max(upto);
                    state.stats.syncs += 1;
                }
                Err(e) => state.failed = Some(e.to_string()),
            }
            self.changed.notify_all();
        }
    }

    /// The background sync of an `Async` log: what was written is synced at least every
    /// `window`.
    fn flush_every(&self, window: Duration) {
        let mut last_sync = Instant::now();
        let mut state = self.lock();
        loop {
            let left = window.saturating_sub(last_sync.elapsed());
            if !left.is_zero() {
                state = self
                    .changed
                    .wait_timeout(state, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if state.closing || state.failed.is_some() {
                return;
            }
            if last_sync.elapsed() < window {
                continue;
            }
            last_sync = Instant::now();
            if state.synced < state.written {
                drop(state);
                let _ = self.sync_all();
                state = self.lock();
            }
        }
    }
}
