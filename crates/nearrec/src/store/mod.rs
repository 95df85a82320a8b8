//! [`Store`]: an open store, served as its [`StoreConfig`] says — the engine over its tables,
//! the simulated drive when asked, the placement its plan resolves to, and the model kept with
//! it, and the contract's core over it. Cheap to clone; clones share everything, so one store
//! serves many threads and the background pipelines ([`crate::pipeline`]). `read.rs`: a batch
//! pooled at a snapshot; `serve.rs`: versions swapped ([`Versions`]); `writes.rs`: writes,
//! tables and counters ([`Writes`], [`Schema`]); `replica.rs` ([`Replica`]); `infer.rs`
//! ([`Inference`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, ArcSwapOption};

use nearrec_device::{FlashDevice, FlashStats};
use nearrec_engine::{Engine, Tier, TierReport};
use nearrec_format::{Manifest, ProgressFn, Repository, StoreReader, TableCheck, TableMeta, files};
use nearrec_io::MemDevice;

use crate::api::{Info, Rows, ShardTag, Stats, StoreApi, Submitted, TableInfo, Versioned};
use crate::batch::{AsBatch, Batch, Pooled, Read};
use crate::config::{PlanSource, StoreConfig};
use crate::error::{Error, Result};
use crate::live::{Live, Snapshot};
use crate::model::{Inferred, StoredModel};
use crate::pace::Pace;
use crate::scrub::Scrub;
use crate::versions::Located;

mod infer;
mod read;
mod replica;
mod serve;
mod writes;

/// An open store. Safe to share between threads.
#[derive(Debug, Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    /// The simulated drive the SSD tier reads through, when the config names one.
    flash: Option<Arc<FlashDevice<MemDevice>>>,
    config: StoreConfig,
    /// The store directory being served; replaced whole by [`Store::swap`].
    served: ArcSwap<Served>,
    /// Versions swapped out and being let go on threads of their own: a swap back to one
    /// waits for it to have let go of its writer lock.
    reaping: Mutex<Vec<serve::Reaping>>,
    /// The repository of versions the store is served from, when it was opened from one
    /// ([`crate::versions`]).
    repo: Option<Repository>,
    /// Versions held open beside the served one; the served one is replaced under this lock,
    /// so that a lookup pinned to a version finds it served or held, never neither.
    held: Mutex<Held>,
    /// Its membership of its shard and the fence of a catch-up (`crate::membership`).
    pub(crate) place: crate::membership::Place,
    /// The background scrub, when the config asks for one (`scrub_rate`).
    scrub: Option<Arc<Scrub>>,
}

/// The number of the version a store serves, and what it holds open beside it: one staged
/// ([`crate::Replica::stage`]) and the one a swap to a staged version replaced. A lookup pinned to any
/// of their numbers is answered from it ([`Store::lookup_version`]).
#[derive(Debug, Default)]
struct Held {
    /// The served version's number in the repository (`None`: not served from one); set with
    /// the served version, under the same lock.
    serving: Option<u64>,
    staged: Option<(u64, Arc<Served>)>,
    previous: Option<(u64, Arc<Served>)>,
}

/// What a swap serves next: a store opened for it, or a version held open beside the served
/// one.
enum Next {
    Opened(Arc<Served>),
    Held(u64),
}

impl Held {
    /// The one of version `version`, taken out.
    fn take(&mut self, version: u64) -> Option<Arc<Served>> {
        for slot in [&mut self.staged, &mut self.previous] {
            if slot.as_ref().is_some_and(|(v, _)| *v == version) {
                return slot.take().map(|(_, s)| s);
            }
        }
        None
    }

    fn versions(&self) -> impl Iterator<Item = &(u64, Arc<Served>)> {
        self.staged.iter().chain(self.previous.iter())
    }

    /// Everything held beside the served version, taken out.
    fn take_all(&mut self) -> impl Iterator<Item = Arc<Served>> + use<> {
        let (staged, previous) = (self.staged.take(), self.previous.take());
        staged.into_iter().chain(previous).map(|(_, s)| s)
    }
}

/// One store directory as served: the engine over its tables (in each snapshot), the rows
/// written since its tables' files, the writer when it is writable, and the model kept with
/// it, loaded on first use.
#[derive(Debug)]
struct Served {
    path: PathBuf,
    /// As opened (its tables as served now are the snapshots' engine's).
    manifest: Manifest,
    live: Live,
    /// Loaded on first use; replaced by an update of its weights, and let go when a writer in
    /// another process replaced them (seen by the thread following it).
    model: ArcSwapOption<Kept>,
    /// One update of the model's weights at a time.
    updating: Mutex<()>,
    /// The shard it is of a sharded store, as its manifest says now ([`crate::Replica::retag`]).
    tag: ArcSwapOption<ShardTag>,
}

/// The model kept with a served store, and the weights file it was read from.
#[derive(Debug)]
struct Kept {
    model: Arc<StoredModel>,
    weights: Option<String>,
}

/// The file that holds the model's weights in the store `manifest` describes.
fn weights_file(manifest: &Manifest) -> Option<String> {
    let name = crate::model::WEIGHTS_ATTACHMENT;
    let found = manifest.attachments.iter().find(|a| a.name == name);
    found.map(|a| a.file.clone())
}

impl Served {
    /// Serves `reader`'s store through `engine`, as `config` says (its writer's lock and log,
    /// its background compactor; read-only, the thread following its writer).
    fn open(reader: &StoreReader, engine: Engine, config: &StoreConfig) -> Result<Arc<Self>> {
        let live = Live::open(reader.path(), Arc::new(engine), reader.manifest(), config)?;
        let compactor = live.compactor_signal();
        let served = Arc::new(Self {
            path: reader.path().to_owned(),
            manifest: reader.manifest().clone(),
            live,
            model: ArcSwapOption::empty(),
            updating: Mutex::new(()),
            tag: ArcSwapOption::new(ShardTag::of(reader.manifest()).map(Arc::new)),
        });
        if let Some(signal) = compactor {
            crate::live::spawn(signal, Arc::downgrade(&served), |s| &s.live)?;
        }
        if let Some(ms) = config.follow_ms {
            let every = std::time::Duration::from_millis(ms);
            let weak = Arc::downgrade(&served);
            served.live.follow(every, weak, |s| &s.live, Self::moved)?;
        }
        Ok(served)
    }

    /// After the writer (another process) changed the store: a model whose weights it replaced
    /// is let go of, to be read again on its next use.
    fn moved(&self) {
        let Some(kept) = self.model.load_full() else {
            return;
        };
        let manifest = std::fs::read(self.path.join(nearrec_format::MANIFEST_FILE));
        if let Ok(Ok(m)) = manifest.map(|b| Manifest::decode(&b))
            && weights_file(&m) != kept.weights
        {
            let gone = Some(kept);
            self.model.compare_and_swap(&gone, None);
        }
    }
}

/// A store's tables as it serves them at one moment (a slice of [`TableMeta`]); it keeps the
/// engine it read them from.
#[derive(Debug, Clone)]
pub struct Tables(Arc<Engine>);

impl std::ops::Deref for Tables {
    type Target = [TableMeta];

    fn deref(&self) -> &[TableMeta] {
        self.0.tables()
    }
}

/// A table's data region kept whole in DRAM (a slice of bytes, rows in row-id order); it keeps
/// the engine that holds it.
#[derive(Debug, Clone)]
pub struct TableData {
    engine: Arc<Engine>,
    id: usize,
}

impl std::ops::Deref for TableData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.engine
            .table_data(self.id)
            .expect("made only for a table in DRAM")
    }
}

/// What changed in a store since a version ([`Store::changes_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    pub version: u64,
    pub base: u64,
    /// The engine serving the store now ([`nearrec_engine::Engine::id`]).
    pub engine: u64,
    /// Per table with any, the rows written or removed since (`None`: unknown).
    pub rows: Option<Vec<(String, Vec<u64>)>>,
}

impl Store {
    /// Opens and validates the store at `path` as `config` says.
    pub fn open(path: impl AsRef<Path>, config: &StoreConfig) -> Result<Self> {
        Self::open_with_progress(path, config, None)
    }

    /// [`Store::open`], reporting bytes loaded to `progress`.
    pub fn open_with_progress(
        path: impl AsRef<Path>,
        config: &StoreConfig,
        progress: Option<&ProgressFn>,
    ) -> Result<Self> {
        Self::from_located(Located::open(path.as_ref())?, config, progress)
    }

    /// [`Store::open_with_progress`] of a store the caller has found and whose manifest and
    /// headers it has read already (to size a progress bar, say): nothing is read twice.
    pub fn from_located(
        located: Located,
        config: &StoreConfig,
        progress: Option<&ProgressFn>,
    ) -> Result<Self> {
        config.validate()?;
        let Located { reader, repo } = located;
        let held = Held {
            serving: repo.as_ref().and_then(|r| r.version_of(reader.path())),
            ..Held::default()
        };
        let (engine, flash) = open_engine(&reader, config, progress)?;
        warm_up(&engine, &store_name(reader.path(), repo.as_ref()), config)?;
        let served = Served::open(&reader, engine, config)?;
        let home = repo.as_ref().map_or(reader.path(), |r| r.path());
        let place = crate::membership::Place::open(home, config.writable)?;
        let rate = config.scrub_rate.bytes();
        let scrub = (rate > 0).then(|| Scrub::new(rate));
        let name = store_name(reader.path(), repo.as_ref());
        let inner = Arc::new(Inner {
            flash,
            config: config.clone(),
            served: ArcSwap::new(served),
            reaping: Mutex::default(),
            repo,
            held: Mutex::new(held),
            place,
            scrub,
        });
        if let Some(scrub) = &inner.scrub {
            scrub.spawn(Arc::downgrade(&inner), name, |i| {
                i.served.load().path.clone()
            })?;
        }
        Ok(Self { inner })
    }

    /// The store directory served now.
    pub fn path(&self) -> PathBuf {
        self.served().path.clone()
    }

    /// The name it is served as: its repository's directory name, or its own.
    pub fn name(&self) -> String {
        store_name(&self.path(), self.repository())
    }

    /// The repository of versions the store is served from, if it was opened from one.
    pub fn repository(&self) -> Option<&Repository> {
        self.inner.repo.as_ref()
    }

    /// The repository's version served now (`None` for a store not opened from one).
    pub fn served_version(&self) -> Option<u64> {
        lock(&self.inner.held).serving
    }

    fn served(&self) -> Arc<Served> {
        self.inner.served.load_full()
    }

    /// The store served now, without touching its count (for one call).
    fn current(&self) -> arc_swap::Guard<Arc<Served>> {
        self.inner.served.load()
    }

    /// The manifest as the store serves it now: its tables (with those created or dropped
    /// since it was opened), attachments and how it was made.
    pub fn manifest(&self) -> Manifest {
        let served = self.served();
        let snapshot = served.live.snapshot();
        let opened = &served.manifest;
        Manifest {
            tables: snapshot.engine().tables().to_vec(),
            lsn: opened.lsn.map(|_| snapshot.base()),
            ..opened.clone()
        }
    }

    /// Checks every data byte of the store's files against their checksums, every attachment,
    /// and lists what interrupted writes left ([`crate::verify`] on this store's path).
    pub fn verify(&self, progress: Option<&ProgressFn>) -> Result<Vec<TableCheck>> {
        crate::verify(self.path(), progress)
    }

    /// The config the store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// The tables as the store serves them now.
    pub fn tables(&self) -> Tables {
        Tables(self.engine())
    }

    /// Table `name` as the engine holds it, or [`nearrec_engine::EngineError::UnknownTable`]
    /// naming the others ([`StoreApi::table`]: as the contract says it).
    pub fn table_meta(&self, name: &str) -> Result<TableMeta> {
        let engine = self.engine();
        let id = engine.table_id(name)?;
        Ok(engine.tables()[id].clone())
    }

    /// Where the store is served from: [`Tier::Dram`] or [`Tier::Ssd`] (`auto` resolved).
    pub fn tier(&self) -> Tier {
        self.engine().config().tier
    }

    pub fn threads(&self) -> usize {
        self.engine().threads()
    }

    /// The engine serving the store now, for callers that need a part of it the facade does
    /// not show.
    pub fn engine(&self) -> Arc<Engine> {
        self.snapshot().engine().clone()
    }

    /// What a lookup starting now reads: the version of every table as of the last write that
    /// returned.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current().live.snapshot()
    }

    /// Whether the store was opened for writing.
    pub fn writable(&self) -> bool {
        self.current().live.writable()
    }

    /// Table `table`'s data region when it is whole in DRAM, rows in row-id order: the tables'
    /// base (a live store's rows written since its last compaction are not in it).
    pub fn table_data(&self, table: &str) -> Result<Option<TableData>> {
        let engine = self.engine();
        let id = engine.table_id(table)?;
        Ok(engine
            .table_data(id)
            .is_some()
            .then_some(TableData { engine, id }))
    }

    /// The row each of keyed table `table`'s `keys` holds now (`None`: not held), as a lookup
    /// would resolve them but without sighting or counting any: how a keyed trace's keys become
    /// the rows a plan places. Refused, naming the table, for a table addressed by row.
    pub fn key_rows(&self, table: &str, keys: &[u64]) -> Result<Vec<Option<u32>>> {
        let snapshot = self.snapshot();
        let engine = snapshot.engine();
        let id = engine.table_id(table)?;
        Ok(engine.key_rows_at(id, keys, snapshot.view())?)
    }

    /// What the simulated drive has done, when the store is served from one.
    pub fn flash_stats(&self) -> Option<FlashStats> {
        self.inner.flash.as_ref().map(|f| f.stats())
    }
}

/// The embedded store: the core of the contract, and every capability.
impl StoreApi for Store {
    /// The dense part beside the reads (`infer.rs`), not after them.
    fn infer_model(
        &self,
        model: &StoredModel,
        dense: &[f32],
        batch: &Batch<'_>,
        in_order: bool,
    ) -> Result<Inferred> {
        self.infer_with(&model.dense, dense, &model.inputs_of(batch, in_order)?)
    }

    fn describe(&self) -> String {
        format!("the store at {}", self.path().display())
    }

    fn info(&self) -> Result<Info> {
        let path = self.path();
        Ok(Info {
            name: self.name(),
            tables: self.tables().iter().map(|t| self.table_info(t)).collect(),
            version: self.snapshot().version(),
            tier: self.tier().name().to_owned(),
            writable: self.writable(),
            model: self.keeps_model(),
            stores: Vec::new(),
            path: path.to_string_lossy().into_owned(),
            served_version: self.served_version(),
            versions: match self.repository() {
                Some(r) => r.versions()?,
                None => Vec::new(),
            },
            shard: self.shard()?,
        })
    }

    fn resident(&self) -> bool {
        self.tier() == Tier::Dram
    }

    fn location(&self) -> Option<PathBuf> {
        Some(self.path())
    }

    fn table(&self, name: &str) -> Result<TableInfo> {
        // read in place: a node asks on every lookup, a copy of the table's meta would cost
        // its names' allocations each time
        let engine = self.engine();
        Ok(self.table_info(&engine.tables()[engine.table_id(name)?]))
    }

    fn version(&self) -> Result<u64> {
        Ok(self.snapshot().version())
    }

    fn shard(&self) -> Result<Option<ShardTag>> {
        Ok(self.current().tag.load_full().map(|t| (*t).clone()))
    }

    fn lookup(&self, batch: &Batch<'_>) -> Result<(Pooled, Read)> {
        self.read_at(batch, &self.snapshot())
    }

    fn lookup_into(&self, batch: &Batch<'_>, out: &mut [f32]) -> Result<Read> {
        self.lookup_into_at(batch, out, &self.snapshot())
    }

    fn lookup_rows(&self, batch: &Batch<'_>) -> Result<Versioned<Vec<Rows>>> {
        self.lookup_rows_at(batch, &self.snapshot())
    }

    /// Decoded from the tables' bytes as the store is now, not pooled; held or not (a
    /// catch-up compares and copies the rows of a replica that is no member).
    fn read_rows(&self, table: &str, rows: &[i64], out: &mut [f32]) -> Result<()> {
        let snapshot = self.snapshot();
        let engine = snapshot.engine();
        let id = engine.table_id(table)?;
        let dim = engine.tables()[id].dim as usize;
        if out.len() != rows.len() * dim {
            return Err(Error::invalid(format!(
                "read_rows: {} rows of table {table:?} need {} floats, not {}",
                rows.len(),
                rows.len() * dim,
                out.len()
            )));
        }
        Ok(engine.read_rows_at(id, rows, out, snapshot.view())?)
    }

    fn submit(&self, batch: Box<dyn AsBatch>) -> Result<Submitted> {
        Ok(Box::new(Store::submit(self, batch)))
    }

    /// A store opened read-only moves to the newest version its writer has logged; returns the
    /// version. (A writable store is always at its newest.)
    fn refresh(&self) -> Result<u64> {
        self.current().live.refresh()
    }

    /// The table files of the version served when it begins, read as `nearrec scrub` reads
    /// them.
    fn scrub(&self, rate: u64) -> Result<Vec<TableCheck>> {
        Ok(crate::scrub(&StoreReader::open(self.path())?, rate, None))
    }

    fn stats(&self) -> Result<Stats> {
        let mut stats = self.tier_stats().unwrap_or_else(|| Stats {
            device: "dram".into(),
            direct_io: false,
            block_bytes: 0,
            values: Vec::new(),
        });
        let live = self.live_stats().into_iter();
        stats.values.extend(live.map(|(k, v)| (k.to_owned(), v)));
        stats.values.extend(self.key_stats());
        Ok(stats)
    }

    fn tier_report(&self) -> Result<Vec<TierReport>> {
        Ok(self.engine().tier_report())
    }

    /// Lets go of the writer now (a writable store): calls under way finish, the log is
    /// synced and the writer lock released before this returns, so that another open — in
    /// this process or another — may take it at once. Later writes are refused; lookups go
    /// on. With `hot_set_dir`, the store's hot set is kept there (`crate::warm`), for the next
    /// open to warm from.
    fn close(&self) -> Result<()> {
        if let Some(scrub) = &self.inner.scrub {
            scrub.stop();
        }
        let closed = self.current().live.close();
        if let Some(dir) = &self.inner.config.hot_set_dir {
            let name = self.name();
            let path = crate::warm::hot_set_path(dir, &name);
            crate::warm::save(&path, &name, &self.engine())?;
        }
        closed
    }

    fn concrete(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    crate::capable!(writes, schema, versions, replica, inference);
}

impl Store {
    /// `t`'s info, a keyed table's keys as its writer has decided them (a reader's as it
    /// serves them).
    fn table_info(&self, t: &TableMeta) -> TableInfo {
        TableInfo {
            keys: t
                .is_keyed()
                .then(|| self.keys_held(&t.name).unwrap_or(t.entries())),
            ..TableInfo::from(t)
        }
    }
}

/// A progress callback that sleeps to keep the bytes reported under `rate` a second (`None`
/// for 0: no bound): what paces a swap's loading beside the lookups it must not starve.
fn pacer(rate: u64) -> Option<ProgressFn> {
    (rate > 0).then(|| {
        let pace = Pace::new(rate);
        Arc::new(move |bytes: u64| pace.take(bytes)) as ProgressFn
    })
}

/// The engine over `reader`'s tables as `config` says (its plan resolved), and the simulated
/// drive it reads through when the config names one.
fn open_engine(
    reader: &StoreReader,
    config: &StoreConfig,
    progress: Option<&ProgressFn>,
) -> Result<(Engine, Option<Arc<FlashDevice<MemDevice>>>)> {
    let placement = match &config.plan {
        None => None,
        Some(PlanSource::Placement(p)) => Some(p.clone()),
        Some(PlanSource::File(file)) => Some(nearrec_plan::load_plan(file)?),
    };
    let engine_config = config.engine(placement);
    let (engine, flash) = match &config.device {
        None => (Engine::from_reader(reader, engine_config, progress)?, None),
        Some(device) => {
            let device = device.resolve()?;
            let tables = reader
                .tables()
                .iter()
                .map(|t| files::read_regular(&reader.path().join(&t.file), files::IN_STORE))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| nearrec_format::FormatError::Io {
                    path: reader.path().to_owned(),
                    source: e,
                })?;
            let flash = Arc::new(FlashDevice::new(MemDevice::new(tables, 512), device));
            let engine = Engine::with_device(reader, engine_config, Box::new(flash.clone()))?;
            (engine, Some(flash))
        }
    };
    Ok((engine, flash))
}

/// The name of the store at `path`: its repository's directory name, or its own.
fn store_name(path: &Path, repo: Option<&Repository>) -> String {
    let named = repo.map_or(path, |r| r.path());
    named
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Fills `engine`'s DRAM tiers before the store named `name` serves: from `config.warm`, or
/// else from the hot set kept in `config.hot_set_dir` when there is one. A `warm` file that
/// cannot be read fails the open; a kept hot set that cannot is only a warning (the store then
/// starts cold).
fn warm_up(engine: &Engine, name: &str, config: &StoreConfig) -> Result<()> {
    if let Some(from) = &config.warm {
        let rows = crate::warm::read(from)?;
        crate::warm::warm(name, engine, &rows, from)?;
        return Ok(());
    }
    let Some(dir) = &config.hot_set_dir else {
        return Ok(());
    };
    let kept = crate::warm::hot_set_path(dir, name);
    if !kept.exists() {
        tracing::info!(store = name, path = %kept.display(), "no hot set kept yet: starting cold");
        return Ok(());
    }
    match crate::warm::read(&kept) {
        Ok(rows) => crate::warm::warm(name, engine, &rows, &kept).map(drop),
        Err(e) => {
            tracing::warn!(
                store = name,
                "the kept hot set is not read, starting cold: {e}"
            );
            Ok(())
        }
    }
}

/// A lock whose holder's panic left plain data behind (no invariant to break).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::Stats;

    #[test]
    fn stats_are_read_by_name() {
        let stats = Stats {
            device: "pread".into(),
            direct_io: false,
            block_bytes: 4096,
            values: vec![("device_reads".into(), 7.0), ("dram_hit_ratio".into(), 0.5)],
        };
        assert_eq!(stats.get("device_reads"), Some(7.0));
        assert_eq!(stats.get("dram_hit_ratio"), Some(0.5));
        assert_eq!(stats.get("device_read"), None);
    }
}
