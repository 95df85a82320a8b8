//! Compaction (`docs/live.md`): the deltas folded into new table files, and the base moved.
//!
//! 1. The rows to fold are the newest entry of every row written in `(base, c]`, `c` the
//!    version when the compaction starts; removed rows become zero rows.
//! 2. Each changed table is rewritten under a new name (`table-NNNN.<c>.nrt`, copy-on-write:
//!    the old file stays for the readers on it), at most `compaction_rate` bytes a second.
//! 3. A manifest naming the new files and `lsn = c` replaces the old one in one rename. A crash
//!    before it leaves the old manifest (the log replays every record); after it, the new one
//!    (the log's records up to `c` are skipped). The old files are removed at the end; files
//!    a crash left unnamed are removed when the store is next opened for writing.
//! 4. In memory ([`rebase`]): once no snapshot older than `c` is alive, no lookup reads the
//!    changed rows from the tiers (they all take them from their deltas), so the engine
//!    overwrites them in place and moves its SSD tier to the new files; then a snapshot on the
//!    new base is published, and once no snapshot reads the old base, the folded entries leave
//!    the deltas and their budget is freed.
//! 5. The log is released back to the previous compaction's position: a reader in another
//!    process one compaction behind still finds the records it needs ([`follow`]).
//!
//! A writable store compacts by itself ([`spawn`]) when its delta holds half its budget or a
//! call waits for room; `Store::compact` runs one at once. A compaction first lets go of keyed
//! tables' keys past their TTL (a record of its own); the background compactor also does that
//! every tenth of the shortest TTL, so that expired keys go when nothing is written.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use std::collections::HashSet;

use nearrec_engine::{Engine, decode_row};
use nearrec_format::wal::Wal;
use nearrec_format::{
    KeyRow, Manifest, StoreReader, TableMeta, files, orphans, rewrite_keys, rewrite_table,
};

use super::{Folded, Live, Snapshot, Writer, lock, lock_store_dir};
use crate::error::{Error, Result};
use crate::pace::Pace;

/// Per table, the rows a compaction folds: `(row, encoded bytes)`.
type Changed = Vec<Vec<(u64, Box<[u8]>)>>;

/// Per keyed table, the keys a compaction folds: each given its row, or let go of (`None`).
type ChangedKeys = Vec<Vec<(u64, Option<u32>)>>;

/// How long a compaction waits for the lookups on older snapshots to end.
const GRACE: Duration = Duration::from_secs(60);

/// What one compaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Compaction {
    /// The version the tables hold now (the log's records up to it are folded).
    pub version: u64,
    /// Tables rewritten.
    pub tables: usize,
    /// Rows folded into them.
    pub rows: u64,
    /// Bytes of table files written.
    pub bytes: u64,
    pub seconds: f64,
}

/// Compactions so far (run by a writer, followed by a reader).
#[derive(Debug, Default)]
pub(crate) struct CompactionStats {
    pub count: AtomicU64,
    pub rows: AtomicU64,
    pub bytes: AtomicU64,
    pub nanos: AtomicU64,
    /// Background compactions that failed (the delta keeps its rows; calls wait or are refused).
    pub errors: AtomicU64,
    /// Whether one runs now.
    pub running: AtomicBool,
}

/// Marks a compaction running while it lives.
struct Running<'a>(&'a AtomicBool);

impl<'a> Running<'a> {
    fn start(flag: &'a AtomicBool) -> Self {
        flag.store(true, Relaxed);
        Self(flag)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Relaxed);
    }
}

impl CompactionStats {
    fn add(&self, c: &Compaction) {
        self.count.fetch_add(1, Relaxed);
        self.rows.fetch_add(c.rows, Relaxed);
        self.bytes.fetch_add(c.bytes, Relaxed);
        self.nanos.fetch_add((c.seconds * 1e9) as u64, Relaxed);
    }
}

/// Between a writable store's calls and its compactor.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    /// (a compaction is wanted, the store is gone)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

#[derive(Debug, PartialEq, Eq)]
enum Work {
    Wanted,
    Idle,
    Stop,
}

impl Signal {
    /// Asks the compactor for a compaction.
    pub(crate) fn want(&self) {
        let mut s = lock(&self.state);
        if !s.0 {
            s.0 = true;
            self.changed.notify_all();
        }
    }

    /// The store is gone: the compactor ends.
    pub(crate) fn stop(&self) {
        lock(&self.state).1 = true;
        self.changed.notify_all();
    }

    /// A call waiting for room: until a compaction frees some, or `timeout`.
    pub(crate) fn wait_room(&self, timeout: Duration) {
        let s = lock(&self.state);
        let _ = self.changed.wait_timeout(s, timeout);
    }

    fn room_freed(&self) {
        self.changed.notify_all();
    }

    fn wait_work(&self, timeout: Duration) -> Work {
        let mut s = lock(&self.state);
        if !s.0 && !s.1 {
            s = self
                .changed
                .wait_timeout(s, timeout)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if s.1 {
            return Work::Stop;
        }
        let wanted = std::mem::take(&mut s.0);
        if wanted { Work::Wanted } else { Work::Idle }
    }
}

/// Starts the background compactor of `store` (whose live side `live` finds),
/// which waits on `signal`. It holds the store only while it compacts, and ends when the store
/// is dropped.
pub(crate) fn spawn<T: Send + Sync + 'static>(
    signal: Arc<Signal>,
    store: Weak<T>,
    live: fn(&T) -> &Live,
) -> Result<()> {
    let run = move || {
        let mut expired_at = Instant::now();
        loop {
            let work = signal.wait_work(Duration::from_secs(1));
            if work == Work::Stop {
                return;
            }
            let Some(inner) = store.upgrade() else {
                return;
            };
            let live = live(&inner);
            // keys past their TTL let go of within a tenth of it, compaction or not
            if let Some(every) = live.expiry_every()
                && expired_at.elapsed() >= every
            {
                expired_at = Instant::now();
                if let Err(e) = live.expire() {
                    tracing::warn!(store = %live.dir.display(), "letting expired keys go failed: {e}");
                }
            }
            if (work == Work::Wanted || live.half_full())
                && let Err(e) = live.compact()
            {
                live.compactions.errors.fetch_add(1, Relaxed);
                tracing::warn!(store = %live.dir.display(), "compaction failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    std::thread::Builder::new()
        .name("nearrec-compact".into())
        .spawn(run)
        .map(drop)
        .map_err(|e| Error::Internal(format!("cannot start the compaction thread: {e}")))
}

/// A writable open of the store at `dir`: a store without a log position gets one (format
/// version 4, which older readers that would ignore the log refuse), and table files that an
/// interrupted compaction left unnamed are removed. Returns the table files earlier
/// compactions replaced, for this writer's first compaction to remove.
pub(crate) fn prepare_dir(dir: &std::path::Path, opened: &Manifest) -> Result<Vec<String>> {
    let _dir = lock_store_dir(dir)?;
    let reader = StoreReader::open(dir)?;
    let manifest = reader.manifest();
    if manifest.tables != opened.tables {
        return Err(Error::invalid(format!(
            "the store at {} changed while it was opened; open it again",
            dir.display()
        )));
    }
    if manifest.lsn.is_none() {
        let mut m = manifest.clone();
        m.lsn = Some(0);
        m.format_version = m.needed_version();
        m.publish(dir)?;
    }
    // under the directory's lock no manifest is being published, so a manifest's temporary
    // is a dead writer's (a compaction killed before its rename), like an unnamed table file
    let temp = format!(".{}.tmp-", nearrec_format::MANIFEST_FILE);
    let left: Vec<String> = orphans(dir, manifest)
        .into_iter()
        .filter(|o| o.ours)
        .filter_map(|o| o.path.file_name()?.to_str().map(str::to_owned))
        .filter(|name| name.starts_with("table-") || name.starts_with(&temp))
        .collect();
    remove_paced(dir, &left, 0);
    // what an earlier writer's compactions replaced goes with this one's first compaction
    Ok(nearrec_format::retired(dir, manifest)
        .into_iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect())
}

impl Live {
    /// How often the background compactor lets expired keys go: a tenth of the shortest TTL
    /// of a keyed table, at least a second (`None`: no table's keys expire).
    fn expiry_every(&self) -> Option<Duration> {
        let snap = self.snapshot();
        let engine = &snap.engine;
        (0..engine.tables().len())
            .filter_map(|id| engine.key_life(id)?.limits.ttl_s)
            .min()
            .map(|ttl| Duration::from_secs((ttl as u64 / 10).max(1)))
    }

    /// Whether the deltas hold half their budget.
    fn half_full(&self) -> bool {
        self.writer
            .as_ref()
            .is_some_and(|w| w.used.load(Relaxed) >= w.budget / 2)
    }

    /// Folds everything written so far into new table files and moves the base (see the module
    /// docs); one at a time. Returns what it did.
    pub(crate) fn compact(&self) -> Result<Compaction> {
        let w = self.writer()?;
        // keys past their TTL go in a record before the fold (taken before the compaction's
        // lock: a change of the tables holds the gate the record needs, then waits for it)
        if self.expiry_every().is_some() {
            self.expire()?;
        }
        let mut previous = lock(&w.compacting);
        // LFU counts age
        let snap = self.snapshot();
        for id in 0..snap.engine.tables().len() {
            if let Some(life) = snap.engine.key_life(id) {
                life.age();
            }
        }
        drop(snap);
        self.compact_locked(w, &mut previous)
    }

    /// [`Live::compact`], by the caller that holds `w.compacting` (`previous`).
    pub(super) fn compact_locked(&self, w: &Writer, previous: &mut u64) -> Result<Compaction> {
        let start = Instant::now();
        let (c, changed, keys, engine, feeds) = {
            let snap = self.snapshot();
            (
                snap.version,
                changed_rows(&snap),
                changed_keys(&snap),
                snap.engine.clone(),
                snap.feeds.clone(),
            )
        };
        let mut done = Compaction {
            version: c,
            ..Compaction::default()
        };
        if c == self.snapshot().base {
            return Ok(done);
        }
        let _running = Running::start(&self.compactions.running);
        tracing::info!(store = %self.dir.display(), version = c, "compaction started");
        // the transactions held, in files, before the tables move past the records that hold
        // them (taken before the directory's lock: a commit holds them while it may take that)
        self.checkpoint_txns(w)?;
        // the directory's short lock: no attach or gc while the new files are unnamed
        let dir = lock_store_dir(&self.dir)?;
        let old = StoreReader::open(&self.dir)?;
        let mut manifest = old.manifest().clone();
        let pace = Pace::new(w.compaction_rate);
        for (t, rows) in changed.iter().enumerate() {
            let file = format!("table-{t:04}.{c:016x}.nrt");
            if !rows.is_empty() {
                let rows: Vec<(u64, &[u8])> = rows.iter().map(|(r, b)| (*r, &b[..])).collect();
                let order = old.order(t).map(AsRef::as_ref);
                manifest.tables[t] =
                    rewrite_table(&self.dir, &old.tables()[t], order, &file, &rows, &mut |n| {
                        pace.take(n)
                    })?;
                fail::fail_point!("compact::table", |_| std::process::abort());
            }
            if !keys[t].is_empty() {
                let mut entries = keys_at(&engine, t, &keys[t]);
                manifest.tables[t] =
                    rewrite_keys(&self.dir, &manifest.tables[t], &file, &mut entries)?;
                fail::fail_point!("compact::keys", |_| std::process::abort());
            }
        }
        // the evicted keys' log holds every key let go of up to `c` before the tables move
        // past it (replay adds only the ones after)
        if let Some(log) = &w.evicted {
            log.flush()?;
        }
        manifest.lsn = Some(c);
        manifest.feeds = (*feeds).clone();
        // never lowered: the log after `c` may hold what only the version read
        manifest.format_version = manifest.needed_version().max(manifest.format_version);
        fail::fail_point!("compact::manifest", |_| std::process::abort());
        manifest.publish(&self.dir)?;
        fail::fail_point!("compact::published", |_| std::process::abort());
        let new = StoreReader::open(&self.dir)?;
        drop(dir);
        rebase(self, &engine, &new, (c, c), &changed, &keys)?;
        w.wal.release(*previous)?;
        *previous = c;
        // the files this compaction replaced stay until the next one (a reader in another
        // process one compaction behind may still open them); the previous ones go now
        w.retire(&self.dir, unnamed(old.manifest(), &manifest));
        done.bytes = pace.bytes();
        done.tables = changed
            .iter()
            .zip(&keys)
            .filter(|(r, k)| !r.is_empty() || !k.is_empty())
            .count();
        done.rows = changed.iter().map(|r| r.len() as u64).sum();
        done.seconds = start.elapsed().as_secs_f64();
        self.compactions.add(&done);
        tracing::info!(
            store = %self.dir.display(),
            version = c,
            tables = done.tables,
            rows = done.rows,
            bytes = done.bytes,
            seconds = done.seconds,
            "compaction finished"
        );
        w.signal.room_freed();
        Ok(done)
    }
}

/// A read-only store's refresh: the records its writer logged since this store's version,
/// and the writer's compactions and changes of the tables since its base, followed.
pub(crate) fn follow(live: &Live) -> Result<()> {
    let mut tries = 0;
    let (reader, records) = loop {
        tries += 1;
        // the manifest before the log: the log holds every record after the manifest's position
        let read = StoreReader::open(&live.dir)
            .map_err(Error::from)
            .and_then(|reader| Ok((reader, Wal::read(&live.dir, live.snapshot().version)?)));
        match read {
            Ok((reader, log)) => break (reader, log.records),
            // a newer compaction removed the files this manifest named: read the newer one
            Err(_) if tries < 8 => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e),
        }
    };
    let c = reader.manifest().lsn.unwrap_or(0);
    let snap = live.snapshot();
    if records.iter().any(|r| r.lsn <= c && r.changes_tables()) {
        // the writer created or dropped tables: this reader takes the manifest's tables whole
        let engine = &snap.engine;
        if !engine.reopenable() {
            return Err(Error::invalid(
                "a store served from a simulated drive cannot follow its writer's changes of \
                 the tables; open it again",
            ));
        }
        let engine = Arc::new(Engine::from_reader(&reader, engine.config().clone(), None)?);
        drop(snap);
        live.publish(Snapshot::fresh(engine, c, reader.manifest().feeds.clone()));
        live.replay(
            &records
                .into_iter()
                .filter(|r| r.lsn > c)
                .collect::<Vec<_>>(),
        )?;
        live.compactions.count.fetch_add(1, Relaxed);
        return Ok(());
    }
    drop(snap);
    live.replay(&records)?;
    let snap = live.snapshot();
    if c <= snap.base {
        return Ok(());
    }
    let start = Instant::now();
    let changed = changed_rows(&snap);
    let keys = changed_keys(&snap);
    // the changes folded go up to the version replayed, past `c`
    let upto = snap.version;
    let engine = snap.engine.clone();
    drop(snap);
    rebase(live, &engine, &reader, (c, upto), &changed, &keys)?;
    live.compactions.add(&Compaction {
        version: c,
        tables: changed.iter().filter(|r| !r.is_empty()).count(),
        rows: changed.iter().map(|r| r.len() as u64).sum(),
        bytes: 0,
        seconds: start.elapsed().as_secs_f64(),
    });
    Ok(())
}

/// Per table, the newest entry of each row written after `snap`'s base up to its version, as
/// encoded rows (a removed row is a zero row).
pub(super) fn changed_rows(snap: &Snapshot) -> Changed {
    snap.engine
        .tables()
        .iter()
        .zip(&snap.deltas)
        .map(|(meta, delta)| {
            let Some(delta) = delta else {
                return Vec::new();
            };
            let mut zero = vec![0u8; meta.row_bytes as usize];
            meta.dtype
                .encode_row(&vec![0f32; meta.dim as usize], &mut zero);
            delta
                .newest(snap.base, snap.version)
                .into_iter()
                .map(|(row, bytes)| (row, bytes.unwrap_or_else(|| zero.clone().into())))
                .collect()
        })
        .collect()
}

/// Per keyed table, its keys' newest changes after `snap`'s base up to its version.
pub(super) fn changed_keys(snap: &Snapshot) -> ChangedKeys {
    snap.keys
        .iter()
        .map(|delta| {
            delta
                .as_ref()
                .map(|d| {
                    d.newest(snap.base, snap.version)
                        .into_iter()
                        .map(|(key, row)| (key, row.map(|b| decode_row(&b))))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// Keyed table `t`'s keys and rows once `changes` are folded into its index's.
fn keys_at(engine: &Engine, t: usize, changes: &[(u64, Option<u32>)]) -> Vec<KeyRow> {
    let changed: HashSet<u64> = changes.iter().map(|c| c.0).collect();
    let mut entries: Vec<KeyRow> = Vec::new();
    engine.for_each_key(t, |key, row| {
        if !changed.contains(&key) {
            entries.push((key, row));
        }
    });
    entries.extend(changes.iter().filter_map(|&(key, row)| Some((key, row?))));
    entries
}

/// Moves `live` to base `c`, whose tables are `reader`'s and hold `changed` and `keys` — the
/// rows and keys changed up to version `upto` (at least `c`: a reader that follows folds what
/// it replayed past the writer's compaction too); see the module docs, step 4.
pub(super) fn rebase(
    live: &Live,
    engine: &Engine,
    reader: &StoreReader,
    (c, upto): (u64, u64),
    changed: &Changed,
    keys: &ChangedKeys,
) -> Result<()> {
    // no snapshot older than the changes may read the tiers or the index they change
    wait_until(|| live.oldest() >= upto, upto, "version")?;
    let rows: Vec<Vec<(u64, &[u8])>> = changed
        .iter()
        .map(|rows| rows.iter().map(|(r, b)| (*r, &b[..])).collect())
        .collect();
    // SAFETY: every live snapshot is at `c` or later, so it reads each changed row from its
    // delta (which holds the row's entry up to `c`), never from the tiers; the base moves in
    // the snapshot published below, after this returns.
    unsafe { engine.rebase(reader, &rows)? };
    // likewise, every snapshot reads the changed keys from its key delta
    for (t, changes) in keys.iter().enumerate() {
        if !changes.is_empty() {
            engine.fold_keys(t, changes)?;
        }
    }
    if let Some(w) = &live.writer {
        for book in lock(&w.books).values_mut() {
            book.prune(c);
        }
    }
    live.publishing(|| {
        let current = live.snapshot();
        live.publish(Snapshot {
            version: current.version,
            base: c,
            engine: current.engine.clone(),
            deltas: current.deltas.clone(),
            keys: current.keys.clone(),
            feeds: current.feeds.clone(),
            folded: Some(Arc::new(Folded {
                from: current.base,
                rows: changed
                    .iter()
                    .map(|rows| rows.iter().map(|(r, _)| *r).collect())
                    .collect(),
            })),
        });
    });
    wait_until(|| live.oldest_base() >= c, c, "base")?;
    live.publishing(|| {
        let oldest = live.oldest();
        let before = live.delta_bytes();
        let snap = live.snapshot();
        for d in snap.deltas.iter().chain(&snap.keys).flatten() {
            d.fold(c, oldest, c);
        }
        let freed = before.saturating_sub(live.delta_bytes());
        if let Some(w) = &live.writer {
            w.used.fetch_sub(freed, Relaxed);
        }
    });
    Ok(())
}

impl Live {
    /// Runs `f`, which publishes a snapshot, with no write applying meanwhile (a read-only
    /// store's refresh holds its own lock).
    pub(super) fn publishing<R>(&self, f: impl FnOnce() -> R) -> R {
        let _applied = self.writer.as_ref().map(|w| lock(&w.applied));
        f()
    }
}

/// Waits for the lookups on snapshots older than `c` to end.
fn wait_until(done: impl Fn() -> bool, c: u64, what: &str) -> Result<()> {
    let deadline = Instant::now() + GRACE;
    while !done() {
        if Instant::now() > deadline {
            return Err(Error::Internal(format!(
                "a snapshot at a {what} before {c} has been held for {GRACE:?}; the compaction \
                 to {c} waits for it to end (a lookup that does not end?)"
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The files `old` named and `new` does not (the tables' replaced or dropped files).
pub(super) fn unnamed(old: &Manifest, new: &Manifest) -> Vec<String> {
    let named = |m: &Manifest| -> Vec<String> {
        m.tables
            .iter()
            .flat_map(TableMeta::files)
            .map(str::to_owned)
            .collect()
    };
    let keep = named(new);
    named(old)
        .into_iter()
        .filter(|f| !keep.contains(f))
        .collect()
}

/// Bytes a second old table files are removed at when compactions are not paced.
const REMOVE_RATE: u64 = 1 << 30;

/// Removes `files` of store `dir` a step at a time, at most `rate` bytes a second (see
/// [`files::remove_gradually`]); what cannot be removed is left to the next writable open.
pub(super) fn remove_paced(dir: &std::path::Path, files: &[String], rate: u64) {
    let pace = Pace::new(if rate == 0 { REMOVE_RATE } else { rate });
    for f in files {
        let _ = files::remove_gradually(&dir.join(f), 16 << 20, &mut |n| pace.take(n));
    }
}
