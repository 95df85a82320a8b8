//! Live stores (`docs/live.md`): writes and removes while the store serves, durable when they
//! return and seen by every lookup that starts after.
//!
//! A call is validated and encoded, appended to the write-ahead log (group commit: many
//! threads' calls share a sync), then applied to the tables' deltas in log order and published
//! as the next [`Snapshot`]. A lookup takes the current snapshot when it starts and reads
//! through it, so it sees each table at one version: never half of a call, never a torn row.
//! On open, the log's records are replayed into the deltas; a store opened read-only in another
//! process replays what the writer has logged when it opens and on [`crate::Store::refresh`].
//! Compaction ([`compact`]) folds the deltas into new table files and moves the base.

mod compact;
mod evicted;
mod feed;
mod follow;
mod keys;
mod settled;
mod tables;
mod txn;
mod write;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use nearrec_engine::delta::{DeltaView, ENTRY_OVERHEAD, TableDelta};
use nearrec_engine::{Engine, KEY_ROW_BYTES};
use nearrec_format::wal::{Durability, Op, Record, TailKind, Wal, WalConfig, WalStats};
use nearrec_format::{FeedCursor, FormatError, Manifest, files};

use crate::config::{DurabilityMode, StoreConfig};
use crate::error::{Error, Result};

pub use compact::Compaction;
pub(crate) use compact::{CompactionStats, Signal, spawn};
pub use feed::{Fed, gap};
pub use settled::{LastWriter, WRITERS_KEPT};
pub use txn::{Decision, Transaction};
pub use write::{OwnedValues, RowValues, RowWrite, WriteOptions, check_encoded, check_values};

/// Delta feeds by name, each with the last file it applied.
pub type Feeds = std::collections::BTreeMap<String, FeedCursor>;

/// What one lookup reads: the engine over the tables, which hold everything up to `base`, and
/// the deltas as of `version`.
#[derive(Debug)]
pub struct Snapshot {
    version: u64,
    base: u64,
    engine: Arc<Engine>,
    /// Per table of the engine (`None`: never written).
    deltas: Vec<Option<Arc<TableDelta>>>,
    /// Per keyed table of the engine, its keys given rows or let go of (`None`: none).
    keys: Vec<Option<Arc<TableDelta>>>,
    /// Each delta feed applied, with the last file it applied as of this version.
    feeds: Arc<Feeds>,
    /// The last compaction's rows, for caches above the store that last looked before it.
    folded: Option<Arc<Folded>>,
}

/// The rows one compaction folded into the tables: those written after `from` (the base it
/// moved from) up to the new base, per table id.
#[derive(Debug)]
pub(crate) struct Folded {
    pub(crate) from: u64,
    pub(crate) rows: Vec<Vec<u64>>,
}

impl Snapshot {
    /// Version `version` of tables that hold everything up to it: no delta; `feeds` as the
    /// manifest has them.
    fn fresh(engine: Arc<Engine>, version: u64, feeds: Feeds) -> Self {
        Self {
            version,
            base: version,
            deltas: vec![None; engine.tables().len()],
            keys: vec![None; engine.tables().len()],
            feeds: Arc::new(feeds),
            engine,
            folded: None,
        }
    }

    /// Each delta feed applied, with the last file it applied.
    pub fn feeds(&self) -> &Feeds {
        &self.feeds
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// The version the tables' files hold (the rest is in the deltas).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The rows of each table (by id) written or removed after `version`, or `None` when
    /// they cannot be told any more (folded by a compaction before the last one) — or a keyed
    /// table changed since (its callers' ids are keys, and a row changed says not which).
    pub fn rows_after(&self, version: u64) -> Option<Vec<Vec<u64>>> {
        if version > self.version {
            return None;
        }
        let keyed_changed = (0..self.deltas.len()).any(|id| {
            self.engine.is_keyed(id)
                && (self.deltas[id]
                    .as_ref()
                    .is_some_and(|d| !d.rows_after(version).is_empty())
                    || self.keys[id]
                        .as_ref()
                        .is_some_and(|d| !d.rows_after(version).is_empty())
                    || (version < self.base
                        && self.folded.as_ref().is_none_or(|f| !f.rows[id].is_empty())))
        });
        if keyed_changed {
            return None;
        }
        let folded = match &self.folded {
            _ if version >= self.base => None,
            Some(f) if version >= f.from => Some(f),
            _ => return None,
        };
        Some(
            (0..self.deltas.len())
                .map(|id| {
                    let mut rows = self.deltas[id]
                        .as_ref()
                        .map(|d| d.rows_after(version))
                        .unwrap_or_default();
                    if let Some(f) = folded {
                        rows.extend_from_slice(&f.rows[id]);
                        rows.sort_unstable();
                        rows.dedup();
                    }
                    rows
                })
                .collect(),
        )
    }

    /// The engine serving the tables at this version.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub(crate) fn view(&self) -> DeltaView<'_> {
        DeltaView::new(&self.deltas, &self.keys, self.base, self.version)
    }
}

#[derive(Debug)]
pub(crate) struct Live {
    dir: PathBuf,
    /// Compactions run and what they did (a read-only store counts the ones it followed).
    compactions: CompactionStats,
    /// The snapshot lookups take: read without a lock (a fork can never catch one held).
    current: ArcSwap<Snapshot>,
    /// Every snapshot published, to find the oldest one still read.
    published: Mutex<Vec<Weak<Snapshot>>>,
    /// Rows to size a new delta's filter for (the budget's worth, at most the table's rows).
    delta_rows: u64,
    writer: Option<Writer>,
    /// One refresh at a time (two would apply the same records twice).
    refreshing: Mutex<()>,
    /// A read-only store following its writer: what that did.
    follows: follow::FollowStats,
    /// Bad records at the end of the log its open dropped (`wal_recovery`): 0 or 1.
    tail_dropped: u64,
}

#[derive(Debug)]
pub(super) struct Writer {
    /// The `flock` on the store's `WRITER.lock`: one writing process per store (`None` once
    /// the store is closed: [`Live::close`]).
    lock: Mutex<Option<File>>,
    /// Closed: every later call that writes is refused.
    closed: AtomicBool,
    wal: Wal,
    /// The last record applied and published; calls apply in log order.
    applied: Mutex<u64>,
    turn: Condvar,
    budget: u64,
    /// Bytes the deltas hold or calls in flight have reserved.
    used: AtomicU64,
    /// Between calls and the compactor: work wanted, room freed, stop.
    signal: Arc<Signal>,
    auto_compact: bool,
    /// Bytes per second a compaction writes at most (0: no bound).
    compaction_rate: u64,
    /// How long a call waits for room in the delta.
    wait: Duration,
    /// One compaction at a time; holds the version the previous one folded (the log is kept
    /// back to it, so that readers one compaction behind can follow).
    compacting: Mutex<u64>,
    /// Held shared by a call from its log append to its publication, and exclusively by a
    /// change of the tables (`create_table`, `drop_table`), which then has the log to itself.
    gate: RwLock<()>,
    /// Table files let go of since the last compaction (by it, or by changes of the tables
    /// since): removed, a step at a time, by the next compaction.
    retired: Mutex<Vec<String>>,
    /// The cross-shard transactions it has prepared, and the outcomes it keeps.
    txns: txn::Txns,
    /// The transactions decided here lately, kept or not (a replayed prepare is refused).
    finished: Mutex<txn::Finished>,
    /// Whether the log after the base may hold a transaction's step (one was logged, or
    /// replayed on open): until then a store that never took part in one writes no checkpoint.
    stepped: AtomicBool,
    /// The transactions' own log (`txn/log`: prepares and aborts, which are no writes and so
    /// take no number of the store's log), opened on open where it exists, else at the first
    /// step; and the configuration it opens with.
    txn_log: std::sync::OnceLock<Wal>,
    wal_config: WalConfig,
    /// Signalled as a transaction is decided: lookups waiting for one go on (`settled.rs`).
    decided: Condvar,
    /// Each row's last writer among the transactions applied lately (`settled.rs`).
    last_writers: Mutex<settled::LastWriters>,
    /// Each keyed table's keys as the log has decided them, by table name (taken under the
    /// log's lock while a call's record is appended).
    books: Mutex<HashMap<String, keys::KeyBook>>,
    /// Each delta feed's cursor as the log has decided it (taken under the log's lock while a
    /// feed's record is appended; before the books).
    cursors: Mutex<Feeds>,
    /// The format version the store's manifest is known to have (raised by `mark_format`).
    format_marked: AtomicU32,
    /// The keys its keyed tables let go of by themselves, kept (`evicted_log`).
    evicted: Option<evicted::Log>,
}

impl Live {
    /// The live side of the store at `dir` served by `engine`: with `config.writable`, its lock
    /// and its log (recovered); else the log's records as they are, if it has one.
    pub(crate) fn open(
        dir: &Path,
        engine: Arc<Engine>,
        manifest: &Manifest,
        config: &StoreConfig,
    ) -> Result<Self> {
        let tables = engine.tables();
        let budget = config.delta_budget.0;
        let min_row = tables.iter().map(|t| t.row_bytes).min().unwrap_or(1).max(1);
        let delta_rows = budget / (min_row + ENTRY_OVERHEAD);
        let keyed = tables.iter().any(|t| t.is_keyed());
        // the tables hold the log's records up to the manifest's position
        let base = manifest.lsn.unwrap_or(0);
        let first = Arc::new(Snapshot::fresh(engine, base, manifest.feeds.clone()));
        let mut live = Self {
            dir: dir.to_owned(),
            compactions: CompactionStats::default(),
            published: Mutex::new(vec![Arc::downgrade(&first)]),
            current: ArcSwap::new(first),
            delta_rows,
            writer: None,
            refreshing: Mutex::new(()),
            follows: follow::FollowStats::default(),
            tail_dropped: 0,
        };
        let (records, txn_records) = if config.writable {
            let lock = writer_lock(dir)?;
            let retired = compact::prepare_dir(dir, manifest)?;
            let durability = match config.durability {
                DurabilityMode::Sync => Durability::Sync,
                DurabilityMode::Async => Durability::Async {
                    window: Duration::from_millis(config.durability_window_ms),
                },
            };
            let wal_config = WalConfig {
                durability,
                recovery: config.wal_recovery,
                ..WalConfig::default()
            };
            let (wal, recovered) = Wal::open(dir, wal_config, base)?;
            let (txn_log, txn_records) = txn::open_log(dir, wal_config)?;
            if let Some(d) = &recovered.dropped {
                live.tail_dropped = 1;
                tracing::warn!(
                    target: "nearrec::store",
                    store = %dir.display(),
                    segment = %d.segment.display(),
                    lsn = d.lsn,
                    offset = d.offset,
                    bytes = d.bytes,
                    looks = d.kind.name(),
                    "the write-ahead log's last record {} was bad ({}) and is dropped with \
                     everything after it: {}",
                    d.lsn,
                    d.why,
                    match d.kind {
                        TailKind::Torn => "a write a crash interrupted, never acknowledged",
                        TailKind::Damaged => {
                            "it was written whole and damaged since, so it may have been \
                             acknowledged (wal_recovery = \"absolute\" refuses such an open)"
                        }
                    }
                );
            }
            live.writer = Some(Writer {
                lock: Mutex::new(Some(lock)),
                closed: AtomicBool::new(false),
                wal,
                applied: Mutex::new(base),
                turn: Condvar::new(),
                budget,
                used: AtomicU64::new(0),
                signal: Arc::default(),
                auto_compact: config.auto_compact,
                compaction_rate: config.compaction_rate.0,
                wait: Duration::from_millis(config.write_wait_ms),
                compacting: Mutex::new(base),
                gate: RwLock::new(()),
                retired: Mutex::new(retired),
                txns: txn::Txns::default(),
                finished: Mutex::default(),
                stepped: AtomicBool::new(false),
                txn_log,
                wal_config,
                decided: Condvar::new(),
                last_writers: Mutex::default(),
                books: Mutex::default(),
                cursors: Mutex::default(),
                format_marked: AtomicU32::new(manifest.format_version),
                evicted: match config.evicted_log {
                    Some(bound) if keyed => Some(evicted::Log::open(dir, bound.0)?),
                    _ => None,
                },
            });
            (recovered.records, txn_records)
        } else {
            (Wal::read(dir, base)?.records, Vec::new())
        };
        match &live.writer {
            Some(w) if tables::redo(&live, w, &records)? => {}
            _ => live.replay(&records)?,
        }
        if let Some(w) = &live.writer {
            live.build_books(w);
            *lock(&w.cursors) = (*live.snapshot().feeds).clone();
            keys::over_caps(&live.snapshot().engine, &lock(&w.books))?;
            *lock(&w.applied) = live.snapshot().version;
            w.used.store(live.delta_bytes(), Relaxed);
            live.recover_txns(w, &records, &txn_records)?;
        }
        Ok(live)
    }

    /// Follows the writer every `every` (a read-only store), for as long as `store` lives;
    /// `moved(store)` after each refresh that found the directory changed.
    pub(crate) fn follow<T: Send + Sync + 'static>(
        &self,
        every: Duration,
        store: Weak<T>,
        live: fn(&T) -> &Live,
        moved: fn(&T),
    ) -> Result<()> {
        if self.writer.is_some() {
            return Ok(());
        }
        self.follows
            .every_ms
            .store(every.as_millis() as u64, Relaxed);
        follow::spawn(store, live, moved, every)
    }

    /// What the background compactor waits on (`None`: the store does not compact by itself).
    pub(crate) fn compactor_signal(&self) -> Option<Arc<Signal>> {
        self.writer
            .as_ref()
            .filter(|w| w.auto_compact)
            .map(|w| w.signal.clone())
    }

    /// The writer, or `ReadOnly` (also once it is closed).
    fn writer(&self) -> Result<&Writer> {
        self.open_writer().ok_or_else(|| Error::ReadOnly {
            path: self.dir.display().to_string(),
        })
    }

    /// The writer, if the store has one still open: for a read's question whose answer on a
    /// store without one is "nothing" (no error made and dropped on every lookup).
    fn open_writer(&self) -> Option<&Writer> {
        self.writer.as_ref().filter(|w| !w.closed.load(Relaxed))
    }

    /// Lets go of the writer now: the compactor stops, calls and a compaction under way
    /// finish, the log is synced and the writer lock released, so that another open may take
    /// it at once. Later writes are refused (`ReadOnly`); lookups go on.
    pub(crate) fn close(&self) -> Result<()> {
        let Some(w) = &self.writer else {
            return Ok(());
        };
        w.signal.stop();
        // the order a change of the tables takes them in: the gate, then the compaction's
        let _calls = w.gate.write().unwrap_or_else(|p| p.into_inner());
        let _compaction = lock(&w.compacting);
        if w.closed.swap(true, Relaxed) {
            return Ok(());
        }
        let synced = (w.wal.sync())
            .and_then(|()| w.txn_log.get().map_or(Ok(()), Wal::sync))
            .map_err(Error::from);
        let kept = w.evicted.as_ref().map_or(Ok(()), evicted::Log::flush);
        // the forgets since the last checkpoint, which the log does not hold
        let txns = self.checkpoint_txns(w);
        lock(&w.lock).take();
        synced.and(kept).and(txns)
    }

    /// The current snapshot: what a lookup starting now reads.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub(crate) fn writable(&self) -> bool {
        self.writer
            .as_ref()
            .is_some_and(|w| !w.closed.load(Relaxed))
    }

    /// The oldest version a live snapshot reads (the current one's when none other is held).
    fn oldest(&self) -> u64 {
        self.oldest_by(|s| s.version)
    }

    /// The oldest base a live snapshot reads.
    fn oldest_base(&self) -> u64 {
        self.oldest_by(|s| s.base)
    }

    fn oldest_by(&self, key: impl Fn(&Snapshot) -> u64) -> u64 {
        let current = key(&self.snapshot());
        let mut published = lock(&self.published);
        published.retain(|w| w.strong_count() > 0);
        published
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| key(&s))
            .min()
            .unwrap_or(current)
            .min(current)
    }

    fn delta_bytes(&self) -> u64 {
        let snap = self.snapshot();
        snap.deltas
            .iter()
            .chain(&snap.keys)
            .flatten()
            .map(|d| d.bytes())
            .sum()
    }

    /// Keys keyed table `table` holds (`None`: not keyed): as the writer has decided them, or,
    /// on a reader, as its snapshot serves them — the base's keys, less those its key delta
    /// moved or let go of, plus those the delta gives a row.
    pub(crate) fn keys_held(&self, table: &str) -> Option<u64> {
        if let Some(w) = &self.writer {
            return lock(&w.books).get(table).map(keys::KeyBook::held);
        }
        let snap = self.snapshot();
        let engine = &snap.engine;
        let id = engine
            .table_id(table)
            .ok()
            .filter(|&id| engine.is_keyed(id))?;
        let base = engine.tables()[id].entries();
        let Some(delta) = snap.keys[id].as_deref() else {
            return Some(base);
        };
        let changed = delta.newest(snap.base, snap.version);
        let gone = (changed.iter())
            .filter(|(key, _)| engine.base_row_of(id, *key).is_some())
            .count() as u64;
        let given = changed.iter().filter(|(_, row)| row.is_some()).count() as u64;
        Some(base - gone + given)
    }

    /// Every keyed table's book, from its index and its key delta (the writer, at open and
    /// after a change of the tables).
    fn build_books(&self, w: &Writer) {
        let snap = self.snapshot();
        let engine = &snap.engine;
        let books = (0..engine.tables().len())
            .filter(|&id| engine.is_keyed(id))
            .map(|id| {
                let book = keys::KeyBook::build(
                    engine,
                    id,
                    snap.keys[id].as_deref(),
                    snap.base,
                    snap.version,
                );
                (engine.tables()[id].name.clone(), book)
            })
            .collect();
        *lock(&w.books) = books;
    }

    /// Makes `next` the snapshot lookups take from now on (and one whose readers compactions
    /// wait for).
    fn publish(&self, next: Snapshot) {
        let next = Arc::new(next);
        lock(&self.published).push(Arc::downgrade(&next));
        self.current.store(next);
    }

    /// Applies `records` in order, up to the first that changes the tables: that one is the
    /// writer's to publish (a reader moves past it when the manifest shows it, on refresh).
    fn replay(&self, records: &[Record]) -> Result<()> {
        for r in records.iter().take_while(|r| !r.changes_tables()) {
            self.apply(r.lsn, &r.ops)?;
        }
        Ok(())
    }

    /// A read-only store: replays what the log holds beyond the current version, and follows
    /// the writer's compactions to its new table files.
    pub(crate) fn refresh(&self) -> Result<u64> {
        if self.writer.is_none() {
            let _one = lock(&self.refreshing);
            compact::follow(self)?;
        }
        Ok(self.snapshot().version)
    }

    /// The log's and the deltas' counters.
    pub(crate) fn stats(&self) -> Vec<(&'static str, f64)> {
        let snap = self.snapshot();
        let deltas = snap.deltas.iter().flatten();
        let (served, removed) = deltas.clone().fold((0, 0), |(a, b), d| {
            let (x, y) = d.served();
            (a + x, b + y)
        });
        let log = self
            .writer
            .as_ref()
            .map_or_else(WalStats::default, |w| w.wal.stats());
        let c = &self.compactions;
        vec![
            ("version", snap.version as f64),
            ("base_version", snap.base as f64),
            (
                "delta_rows",
                deltas.clone().map(|d| d.rows()).sum::<u64>() as f64,
            ),
            ("delta_bytes", deltas.map(|d| d.bytes()).sum::<u64>() as f64),
            ("delta_served", served as f64),
            ("removed_served", removed as f64),
            ("log_bytes", log.bytes as f64),
            ("log_records", log.records as f64),
            ("log_groups", log.groups as f64),
            ("log_syncs", log.syncs as f64),
            ("log_segments", log.segments as f64),
            ("compactions", c.count.load(Relaxed) as f64),
            ("compacted_rows", c.rows.load(Relaxed) as f64),
            ("compaction_bytes", c.bytes.load(Relaxed) as f64),
            ("compaction_seconds", c.nanos.load(Relaxed) as f64 * 1e-9),
            ("compaction_errors", c.errors.load(Relaxed) as f64),
            ("compacting", f64::from(u8::from(c.running.load(Relaxed)))),
            (
                "delta_budget",
                self.writer.as_ref().map_or(0, |w| w.budget) as f64,
            ),
            ("follow_ms", self.follows.every_ms.load(Relaxed) as f64),
            ("follow_moved", self.follows.moved.load(Relaxed) as f64),
            ("follow_errors", self.follows.errors.load(Relaxed) as f64),
            ("wal_tail_dropped", self.tail_dropped as f64),
        ]
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(w) = &self.writer {
            w.signal.stop();
            // what is pending of the evicted keys' log (the log's records would give it again)
            if let Some(Err(e)) = w.evicted.as_ref().map(evicted::Log::flush) {
                tracing::warn!(target: "nearrec::store", store = %self.dir.display(),
                    error = %e, "the evicted keys' log could not write what it held");
            }
        }
    }
}

/// How long a writable open waits for the store's writer lock before it refuses.
const WRITER_LOCK_WAIT: Duration = Duration::from_secs(2);

/// The `flock` on `dir`'s `WRITER.lock`, or `Locked`. A writer of this process that is going
/// lets go a moment after its store was dropped or swapped out (a background thread — the
/// compactor checking for work — may hold the store a moment longer): the lock is tried again
/// for up to [`WRITER_LOCK_WAIT`] before another process is taken to hold it.
fn writer_lock(dir: &Path) -> Result<File> {
    let path = dir.join(files::WRITER_LOCK);
    let until = std::time::Instant::now() + WRITER_LOCK_WAIT;
    loop {
        let held = files::lock_file(&path, false).map_err(|source| FormatError::Io {
            path: dir.to_owned(),
            source,
        })?;
        match held {
            Some(lock) => return Ok(lock),
            None if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            None => {
                return Err(Error::Locked {
                    path: dir.display().to_string(),
                });
            }
        }
    }
}

/// The store directory's short lock, held while its manifest changes (attach and gc take it
/// too); waits for it.
fn lock_store_dir(dir: &Path) -> Result<Option<File>> {
    files::lock_dir(dir, true).map_err(|source| {
        FormatError::Io {
            path: dir.to_owned(),
            source,
        }
        .into()
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
