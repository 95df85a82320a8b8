//! [`Store`]: an open store, served as its [`StoreConfig`] says — the engine over its tables,
//! the simulated drive when asked, the placement its plan resolves to, and the model kept with
//! it. Cheap to clone; clones share everything, so one store serves many threads and the
//! background pipelines ([`crate::pipeline`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arc_swap::{ArcSwap, ArcSwapOption};

use nearrec_device::{FlashDevice, FlashStats};
use nearrec_engine::{Engine, Prepared, Stages, Tier, TierReport};
use nearrec_format::wal::Init;
use nearrec_format::{DType, Manifest, ProgressFn, Repository, StoreReader, TableMeta, files};
use nearrec_io::MemDevice;

use crate::batch::{Batch, Pooled, Read};
use crate::config::{PlanSource, StoreConfig};
use crate::error::{Error, Result};
use crate::live::{Compaction, Decision, Live, RowWrite, Snapshot, Transaction, WriteOptions};
use crate::model::{StoredModel, Tensor};
use crate::pace::Pace;
use crate::scrub::Scrub;
use crate::versions::{Located, SwapTo};

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
    /// Versions swapped out and being let go on threads of their own, by path: a swap back to
    /// one waits for it to have let go of its writer lock.
    reaping: Mutex<Vec<(PathBuf, std::thread::JoinHandle<()>)>>,
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
/// ([`Store::stage`]) and the one a swap to a staged version replaced. A lookup pinned to any
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

impl Inner {
    /// Removes the repository's versions beyond `keep_last`, if the config says, once `gone`
    /// (a version swapped out) has been let go: never one still being let go by another swap.
    fn prune(&self, gone: &Path) {
        let (Some(repo), Some(keep)) = (&self.repo, self.config.keep_last) else {
            return;
        };
        let held: Vec<u64> = lock(&self.reaping)
            .iter()
            .filter(|(p, t)| p != gone && !t.is_finished())
            .filter_map(|(p, _)| repo.version_of(p))
            .collect();
        let _ = crate::versions::prune(repo, keep as usize, &held);
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

/// The SSD tier's counters: the device, then every counter and latency percentile (µs) of
/// `nearrec_engine::IoStats`, then the DRAM tiers' totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// `"io_uring"`, `"pread"`, `"flash-model"`, ...; `"dram"` for a DRAM-resident store.
    pub device: String,
    pub direct_io: bool,
    pub block_bytes: usize,
    pub values: Vec<(String, f64)>,
}

impl Stats {
    /// The counter or percentile named `key` (`"device_reads"`, `"dram_hit_ratio"`,
    /// `"end_to_end_p99_us"`, ...), the names Python's `store.stats()` has.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
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

    /// `f` of the served store's manifest as opened (a field of it; its tables as served now
    /// are [`Store::manifest`]'s, which copies them).
    pub(crate) fn with_opened<T>(&self, f: impl FnOnce(&Manifest) -> T) -> T {
        f(&self.current().manifest)
    }

    /// The store served now, without touching its count (for one call).
    fn current(&self) -> arc_swap::Guard<Arc<Served>> {
        self.inner.served.load()
    }

    /// Serves the store at `path` (a new version built offline) from the next call on: every
    /// lookup that starts after this returns reads it, lookups under way finish on the old
    /// one, none fails. The new store's DRAM tiers load at most `compaction_rate` bytes a
    /// second while the old one serves (unpaced when its tables total at most that). With `warm`, the new store's row caches are filled
    /// first with the rows the old one's DRAM tiers hold (read from the new store's files), so
    /// that the switch does not start cold; its hot partitions come from the config's plan as
    /// at open. A writable store takes the new store's writer lock and log; the old one's are
    /// let go. Unless `force`, the new store must answer every request the old one answers
    /// (its tables, dims, dtypes, rows and model: `crate::swap`), or the swap is refused
    /// naming the difference. Returns the new store's version.
    ///
    /// A store opened from a repository swaps only to its versions (a version's directory, or
    /// [`Store::swap_to`] a version number), and the repository's pointer names the new
    /// version before it is served, so that a restart serves it too.
    pub fn swap(&self, path: impl AsRef<Path>, warm: bool, force: bool) -> Result<u64> {
        let path = path.as_ref();
        match &self.inner.repo {
            Some(_) => self.swap_to(
                &SwapTo::Path(path.to_string_lossy().into_owned()),
                warm,
                force,
            ),
            None => self.switch(path, warm, force, || Ok(())),
        }
    }

    /// Serves what `to` names (a store directory, a version of the repository the store is
    /// served from, or the version served before the current one) as [`Store::swap`] does;
    /// returns the new store's version. A version swap checks the new version as any swap does
    /// (unless `force`) and writes the repository's pointer only once the version is open and
    /// checked: a refused or failed swap leaves both the served version and the pointer as
    /// they were. With the config's `keep_last`, versions beyond the newest few are removed
    /// once the last call on them has ended.
    pub fn swap_to(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64> {
        let Some(repo) = &self.inner.repo else {
            return match to {
                SwapTo::Path(p) => self.switch(Path::new(p), warm, force, || Ok(())),
                _ => Err(self.no_repository("swap by version or roll back")),
            };
        };
        let _lock = repo.lock()?;
        let served = self.served_version().unwrap_or(0);
        let (version, path, pointer) = crate::versions::target(repo, served, to)?;
        let commit = || Ok(repo.set_pointer(&pointer)?);
        // a version held open beside the served one switches at once; a staged one keeps the
        // version it replaces answering lookups pinned to it (a sharded store's switch)
        let held = lock(&self.inner.held)
            .versions()
            .any(|(v, _)| *v == version);
        match held {
            true => self.serve(Next::Held(version), commit),
            false => self.switch(&path, warm, force, commit),
        }
    }

    /// Opens version `to` of the repository the store is served from beside the served one,
    /// checked as a swap checks it (unless `force`) and warmed from it (with `warm`), without
    /// serving it: a later swap to it switches at once, and lookups pinned to its number
    /// ([`Store::lookup_version`]) are answered from it meanwhile. After that swap the
    /// version it replaced stays open for lookups pinned to it, until the next stage or swap.
    /// This is how a sharded store moves every shard to a new version without a batch that
    /// reads two: stage everywhere, switch everywhere, then pin its batches to the new one.
    /// Staging lets go of what was held before. Returns the staged version's number.
    pub fn stage(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64> {
        let Some(repo) = &self.inner.repo else {
            return Err(self.no_repository("stage a version"));
        };
        let _lock = repo.lock()?;
        let served = self.served_version().unwrap_or(0);
        let (version, path, _) = crate::versions::target(repo, served, to)?;
        if version == served {
            return Err(Error::invalid(format!(
                "version {version} is the one served; stage another"
            )));
        }
        self.release();
        let staged = self.open_version(&path, warm, force)?;
        lock(&self.inner.held).staged = Some((version, staged));
        Ok(version)
    }

    /// Lets go of the versions held open beside the served one ([`Store::stage`]): lookups
    /// pinned to them are refused from now on (`VersionNotServed`), their memory freed once
    /// the calls on them end. A sharded store releases them once every shard serves the new
    /// version, so that every router moves to it on its next batch.
    pub fn release(&self) {
        let gone = lock(&self.inner.held).take_all();
        for old in gone {
            self.retire(old);
        }
    }

    /// The versions held open beside the served one: the staged one and the one a staged
    /// swap replaced ([`Store::stage`]), by number.
    pub fn held_versions(&self) -> Vec<u64> {
        lock(&self.inner.held).versions().map(|(v, _)| *v).collect()
    }

    fn no_repository(&self, to: &str) -> Error {
        Error::invalid(format!(
            "the store at {} is not served from a repository of versions: open REPO/NAME (its \
             versions in REPO/NAME/1, 2, ...) to {to}",
            self.path().display()
        ))
    }

    /// Rolls back to the version served before the current one ([`Store::swap_to`]
    /// [`SwapTo::Previous`]).
    pub fn rollback(&self, warm: bool, force: bool) -> Result<u64> {
        self.swap_to(&SwapTo::Previous, warm, force)
    }

    /// The swap itself: the store at `path` opened and checked, then served ([`Store::serve`]).
    fn switch(
        &self,
        path: &Path,
        warm: bool,
        force: bool,
        commit: impl FnOnce() -> Result<()>,
    ) -> Result<u64> {
        let new = self.open_version(path, warm, force)?;
        self.serve(Next::Opened(new), commit)
    }

    /// The store at `path` opened to be served: checked against the served one (unless
    /// `force`: `crate::swap`), its DRAM tiers warmed from the served one's (with `warm`).
    fn open_version(&self, path: &Path, warm: bool, force: bool) -> Result<Arc<Served>> {
        if self.inner.flash.is_some() {
            return Err(Error::invalid(
                "a store served from a simulated drive cannot swap; open the new one",
            ));
        }
        let nul = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).contains(&0);
        if nul || (path.exists() && !path.is_dir()) {
            return Err(Error::invalid(format!(
                "{} is not a store directory",
                path.display()
            )));
        }
        let reader = StoreReader::open(path)?;
        let old = self.served();
        if reader.path() == old.path {
            return Err(Error::invalid(format!(
                "{} is the store being served; swap to another one",
                old.path.display()
            )));
        }
        if !force {
            let model = self.model().ok();
            crate::swap::check(&self.tables(), model.as_deref(), &reader)?;
        }
        self.reaped(reader.path());
        // a store whose tables the disk reads whole within a second of the rate is loaded
        // unpaced: pacing its row reads (each counted as 4 KiB) would stretch it to seconds
        let rate = self.inner.config.compaction_rate.0;
        let bytes: u64 = reader.manifest().tables.iter().map(|t| t.data_bytes).sum();
        let pace = if bytes <= rate { None } else { pacer(rate) };
        let (engine, _) = open_engine(&reader, &self.inner.config, pace.as_ref())?;
        if warm {
            engine.warm_from(old.live.snapshot().engine(), pace.as_ref())?;
        }
        Served::open(&reader, engine, &self.inner.config)
    }

    /// Serves `next` from the next call on, once `commit` (the repository's pointer) has
    /// succeeded — its error leaves the old one served. A version held open beside the served
    /// one ([`Store::stage`]) replaces it under the lock that lookups pinned to a version take,
    /// and the old one stays open beside it for them; a version opened for this swap lets go
    /// of the old one and whatever was held, once their calls end. Returns the new store's
    /// version.
    fn serve(&self, next: Next, commit: impl FnOnce() -> Result<()>) -> Result<u64> {
        if let Err(e) = commit() {
            if let Next::Opened(new) = next {
                self.retire(new);
            }
            return Err(e);
        }
        let mut held = lock(&self.inner.held);
        let (new, keep) = match next {
            Next::Opened(new) => (new, false),
            Next::Held(v) => match held.take(v) {
                Some(new) => (new, true),
                None => return Err(Error::Internal(format!("version {v} was held, then not"))),
            },
        };
        let version = new.live.snapshot().version();
        let number = self.version_number(&new);
        let old = self.inner.served.swap(new);
        let mut gone: Vec<Arc<Served>> = held.take_all().collect();
        match std::mem::replace(&mut held.serving, number) {
            Some(v) if keep => held.previous = Some((v, old)),
            _ => gone.push(old),
        }
        drop(held);
        for old in gone {
            self.retire(old);
        }
        Ok(version)
    }

    /// The number of `served` in the repository the store is served from.
    fn version_number(&self, served: &Served) -> Option<u64> {
        self.inner.repo.as_ref()?.version_of(&served.path)
    }

    /// Lets go of `old`, a version no longer served: on a thread of its own, once the calls on
    /// it end, not on the thread of the lookup that happens to let it go last (its tables'
    /// memory, its device, its log take milliseconds to let go); then the versions beyond
    /// `keep_last` go.
    fn retire(&self, old: Arc<Served>) {
        let old_path = old.path.clone();
        let old_engine = old.live.snapshot().engine().clone();
        let inner = Arc::downgrade(&self.inner);
        let reaper = move || {
            let gone = old.path.clone();
            last_holder(old);
            last_holder(old_engine);
            if let Some(inner) = inner.upgrade() {
                inner.prune(&gone);
            }
        };
        match std::thread::Builder::new()
            .name("nearrec-reaper".into())
            .spawn(reaper)
        {
            Ok(thread) => lock(&self.inner.reaping).push((old_path, thread)),
            Err(e) => drop(e), // no thread: the old version goes wherever its last call ends
        }
    }

    /// The snapshot of version `version` of the repository the store is served from: the
    /// served one's, or that of one held beside it; else [`Error::VersionNotServed`].
    pub(crate) fn snapshot_of(&self, version: u64) -> Result<Arc<Snapshot>> {
        let held = lock(&self.inner.held);
        if held.serving == Some(version) {
            return Ok(self.current().live.snapshot());
        }
        if let Some((_, s)) = held.versions().find(|(v, _)| *v == version) {
            return Ok(s.live.snapshot());
        }
        let mut have: Vec<u64> = held.versions().map(|(v, _)| *v).collect();
        have.extend(held.serving);
        have.sort_unstable();
        Err(Error::VersionNotServed {
            store: self.name(),
            version,
            held: have,
        })
    }

    /// [`Store::lookup`] as version `version` of the repository the store is served from
    /// answers it: the served version, or one held beside it ([`Store::stage`]); any other is
    /// refused with [`Error::VersionNotServed`], never answered from another version.
    pub fn lookup_version(&self, batch: &Batch<'_>, version: u64) -> Result<(Pooled, Read)> {
        let snapshot = self.snapshot_of(version)?;
        self.read_at(batch, &snapshot)
    }

    /// [`Store::lookup_at`] with the version `snapshot` is and where the time went: what the
    /// contract's lookups answer.
    pub(crate) fn read_at(&self, batch: &Batch<'_>, snapshot: &Snapshot) -> Result<(Pooled, Read)> {
        let (pooled, stages) = self.lookup_at(batch, snapshot)?;
        let version = snapshot.version();
        Ok((pooled, Read { version, stages }))
    }

    /// Waits until a version of `path` swapped out earlier has been let go (its calls ended,
    /// its writer lock released), so that swapping back to it finds it free.
    fn reaped(&self, path: &Path) {
        let waiting = {
            let mut reaping = lock(&self.inner.reaping);
            reaping.retain(|(_, t)| !t.is_finished());
            let (mine, rest) = std::mem::take(&mut *reaping)
                .into_iter()
                .partition::<Vec<_>, _>(|(p, _)| p == path);
            *reaping = rest;
            mine
        };
        for (_, thread) in waiting {
            let _ = thread.join();
        }
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
    pub fn verify(&self, progress: Option<&ProgressFn>) -> Result<Vec<nearrec_format::TableCheck>> {
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

    /// Table `name`, or [`nearrec_engine::EngineError::UnknownTable`] naming the others.
    pub fn table(&self, name: &str) -> Result<TableMeta> {
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

    /// Validates `batch` (known tables, well-formed bags, weights, padding, one batch size):
    /// the output's shape, for a caller that pools into its own buffer with [`Store::execute`].
    pub fn prepare(&self, batch: &Batch<'_>) -> Result<Prepared> {
        let snapshot = self.snapshot();
        Ok(snapshot.engine().prepare_at(batch, snapshot.view())?)
    }

    /// Pools `batch` into `out`, row-major `[prepared.batch(), prepared.width()]`, as the
    /// store is now (every write that returned before is seen).
    pub fn execute(&self, batch: &Batch<'_>, prepared: &Prepared, out: &mut [f32]) -> Result<()> {
        self.execute_at(batch, prepared, out, &self.snapshot())
            .map(drop)
    }

    /// [`Store::execute`] at `snapshot` (the parts of one batch read one version). Returns where
    /// the batch's time went.
    pub fn execute_at(
        &self,
        batch: &Batch<'_>,
        prepared: &Prepared,
        out: &mut [f32],
        snapshot: &Snapshot,
    ) -> Result<Stages> {
        let engine = snapshot.engine();
        if prepared.engine() != engine.id() || !prepared.resolved_at(snapshot.view()) {
            // prepared before the store's tables (or a keyed table's keys) changed: valid now
            // only for the same shape
            let again = engine.prepare_at(batch, snapshot.view())?;
            if (again.batch(), again.width()) != (prepared.batch(), prepared.width()) {
                return Err(Error::invalid(
                    "the store's tables changed between prepare and execute, and the batch's \
                     output shape with them; prepare it again",
                ));
            }
            return Ok(engine.execute_at(batch, &again, out, snapshot.view())?);
        }
        Ok(engine.execute_at(batch, prepared, out, snapshot.view())?)
    }

    /// What a lookup starting now reads: the version of every table as of the last write that
    /// returned.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current().live.snapshot()
    }

    /// The store's version: the number of the last write applied (0 before any).
    pub fn version(&self) -> u64 {
        self.snapshot().version()
    }

    /// Whether the store was opened for writing.
    pub fn writable(&self) -> bool {
        self.current().live.writable()
    }

    /// EMB_WRITE: upserts rows of several tables in one atomic call (all of its rows or none),
    /// durable when it returns; every lookup that starts after sees them. Values are float32,
    /// encoded with each table's dtype (int8 rows re-quantised row-wise). Returns the version
    /// the call made.
    pub fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> Result<u64> {
        let _admitted = self.admit(None)?;
        self.current().live.write(writes, options)
    }

    /// [`StoreApi::prepare_write`]: a cross-shard write's first phase on this store, at
    /// membership epoch `epoch` (`crate::membership`; `None`: the shard's only replica).
    pub fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
    ) -> Result<()> {
        let _admitted = self.admit(epoch)?;
        self.current().live.prepare_write(tx, writes, options, note)
    }

    /// [`Store::adopt`]'s rows, logged on the version served.
    pub(crate) fn adopt_served(
        &self,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        count: u64,
    ) -> Result<u64> {
        self.current().live.adopt(writes, options, count)
    }

    /// [`StoreApi::decide`]: a cross-shard write's second phase on this store.
    pub fn decide(&self, tx: u128, decision: Decision, keep: bool) -> Result<u64> {
        self.current().live.decide(tx, decision, keep)
    }

    /// [`StoreApi::forget`].
    pub fn forget(&self, tx: u128) -> Result<()> {
        self.current().live.forget(tx)
    }

    /// [`StoreApi::transactions`].
    pub fn transactions(&self) -> Result<Vec<Transaction>> {
        self.current().live.transactions()
    }

    /// [`Store::write_many`] of one table: rows `ids` become `values` (`ids.len() × dim`).
    pub fn write(&self, table: &str, ids: &[i64], values: &[f32]) -> Result<u64> {
        let w = RowWrite {
            table,
            ids,
            values: Some(values),
        };
        self.write_many(&[w], WriteOptions::default())
    }

    /// EMB_REMOVE of rows: until written again they pool as zero rows (and are counted,
    /// `removed_served`). Atomic and durable like [`Store::write_many`].
    pub fn remove(&self, table: &str, ids: &[i64]) -> Result<u64> {
        let w = RowWrite {
            table,
            ids,
            values: None,
        };
        self.write_many(&[w], WriteOptions::default())
    }

    /// What changed since `version` (a version this store served), for a cache kept above the
    /// store (the GPU tier) to follow it: the current version, the version its table files
    /// hold, its engine's id, and per table the rows written or removed after `version` (the
    /// last compaction's rows with them when `version` is older than the files) — `None` when
    /// they cannot be told (compacted away twice since): then everything cached must go, as
    /// it must when the engine's id changed (tables created or dropped, a store swapped in).
    pub fn changes_since(&self, version: u64) -> Changes {
        let snapshot = self.snapshot();
        let engine = snapshot.engine();
        let rows = snapshot.rows_after(version).map(|rows| {
            engine
                .tables()
                .iter()
                .zip(rows)
                .filter(|(_, rows)| !rows.is_empty())
                .map(|(t, rows)| (t.name.clone(), rows))
                .collect()
        });
        Changes {
            version: snapshot.version(),
            base: snapshot.base(),
            engine: engine.id(),
            rows,
        }
    }

    /// RM_create_table: a new table of `rows` × `dim` values stored as `dtype`, every value 0
    /// or drawn as `init` says, served from the next lookup on (on the SSD tier with no DRAM
    /// tiers in front of it). Everything written before is compacted first; calls wait
    /// meanwhile. Durable when it returns; returns the version that made it.
    pub fn create_table(
        &self,
        name: &str,
        rows: u64,
        dim: u32,
        dtype: DType,
        init: Init,
    ) -> Result<u64> {
        self.current()
            .live
            .create_table(name, rows, dim, dtype, init)
    }

    /// EMB_REMOVE of a table: lookups under way finish on it, later ones get `UnknownTable`;
    /// its files go. Compacts first, like [`Store::create_table`].
    pub fn drop_table(&self, name: &str) -> Result<u64> {
        self.current().live.drop_table(name)
    }

    /// A store opened read-only moves to the newest version its writer has logged; returns the
    /// version. (A writable store is always at its newest.)
    pub fn refresh(&self) -> Result<u64> {
        self.current().live.refresh()
    }

    /// Folds every write so far into new table files (copy-on-write) and moves the tables'
    /// base to the current version: the delta's memory is freed and the log released. A
    /// writable store also compacts by itself (`auto_compact`). Lookups go on meanwhile.
    pub fn compact(&self) -> Result<Compaction> {
        self.current().live.compact()
    }

    /// The write-ahead log's, the deltas' and compaction's counters: `version`,
    /// `base_version`, `delta_rows`, `delta_bytes`, `delta_served`, `removed_served`,
    /// `log_bytes`, `log_records`, `log_groups`, `log_syncs`, `log_segments`, `compactions`,
    /// `compacted_rows`, `compaction_bytes`, `compaction_seconds`, `compaction_errors`,
    /// `compacting` (1 while one runs), `delta_budget` (bytes; 0 read-only), a read-only
    /// store's `follow_ms`, `follow_moved`, `follow_errors`, and with a `scrub_rate` its scrub's
    /// `scrub_rate`, `scrub_passes`, `scrub_bytes`, `scrub_damaged`, `scrub_last_damaged`
    /// (`crate::scrub`).
    pub fn live_stats(&self) -> Vec<(&'static str, f64)> {
        let mut stats = self.current().live.stats();
        if let Some(scrub) = &self.inner.scrub {
            stats.extend(scrub.stats());
        }
        stats
    }

    /// Pools `batch`: one `[batch, Σ dim]` output, tables in request order.
    pub fn lookup(&self, batch: &Batch<'_>) -> Result<Pooled> {
        Ok(self.lookup_at(batch, &self.snapshot())?.0)
    }

    /// [`Store::lookup`] at `snapshot`: every table read at that version (the storage node
    /// answers with it), and where the batch's time went (validating it counted as routing).
    pub fn lookup_at(&self, batch: &Batch<'_>, snapshot: &Snapshot) -> Result<(Pooled, Stages)> {
        let start = Instant::now();
        let prepared = snapshot.engine().prepare_at(batch, snapshot.view())?;
        let prepare = start.elapsed();
        let mut values = vec![0f32; prepared.batch() * prepared.width()];
        let mut stages = self.execute_at(batch, &prepared, &mut values, snapshot)?;
        stages.route += prepare;
        Ok((self.pooled(batch, prepared.batch(), values), stages))
    }

    /// [`Store::lookup_at`] into `out`, the caller's `[batch, Σ dim]` buffer.
    pub fn lookup_into_at(
        &self,
        batch: &Batch<'_>,
        out: &mut [f32],
        snapshot: &Snapshot,
    ) -> Result<Read> {
        let start = Instant::now();
        let prepared = snapshot.engine().prepare_at(batch, snapshot.view())?;
        let prepare = start.elapsed();
        let mut stages = self.execute_at(batch, &prepared, out, snapshot)?;
        stages.route += prepare;
        Ok(Read {
            version: snapshot.version(),
            stages,
        })
    }

    /// Lets go of the writer now (a writable store): calls under way finish, the log is
    /// synced and the writer lock released before this returns, so that another open — in
    /// this process or another — may take it at once. Later writes are refused; lookups go
    /// on. With `hot_set_dir`, the store's hot set is kept there (`crate::warm`), for the next
    /// open to warm from.
    pub fn close(&self) -> Result<()> {
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

    pub(crate) fn pooled(&self, batch: &Batch<'_>, bags: usize, values: Vec<f32>) -> Pooled {
        let engine = self.engine();
        let tables = batch
            .tables
            .iter()
            .map(|t| {
                let dim = engine
                    .table_id(t.table)
                    .map_or(0, |id| engine.tables()[id].dim as usize);
                (t.table.to_owned(), dim)
            })
            .collect();
        Pooled {
            values,
            batch: bags,
            tables,
        }
    }

    /// Decodes rows `rows` of table `table` into `out` (`rows.len() × dim` floats), as the store
    /// is now (written rows as written, removed ones zeros).
    pub fn read_rows(&self, table: &str, rows: &[i64], out: &mut [f32]) -> Result<()> {
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

    /// The SSD tier's counters and the DRAM tiers' totals (`None` for a DRAM-resident store).
    /// The keyed tables' counters, summed over them (none without keyed tables): keys held
    /// (a writer's exactly; a read-only store's as of its tables' base), the indexes' DRAM,
    /// lookups of keys held (`keyed_hits`) and of keys not held answered with zeros, init rows
    /// or refused (`unknown_keys_zero`, `_init`, `_refused`), or with the table's default row
    /// (`unknown_keys_default`); live keys — new keys' writes
    /// dropped before admission (`keys_not_admitted`), keys let go of past their TTL
    /// (`keys_expired`), evicted at a cap (`keys_evicted`), new keys refused at a cap
    /// (`keys_refused_full`) — and the DRAM their touches and admission counts take
    /// (`keyed_life_bytes`).
    pub fn key_stats(&self) -> Vec<(String, f64)> {
        let reports = self.engine().key_report();
        if reports.is_empty() {
            return Vec::new();
        }
        let sum =
            |f: fn(&nearrec_engine::KeyReport) -> u64| reports.iter().map(f).sum::<u64>() as f64;
        let held = reports
            .iter()
            .map(|r| self.keys_held(&r.table).unwrap_or(r.keys))
            .sum::<u64>() as f64;
        [
            ("keyed_keys", held),
            ("keyed_index_bytes", sum(|r| r.index_bytes)),
            ("keyed_hits", sum(|r| r.hits)),
            ("unknown_keys_zero", sum(|r| r.unknown_zero)),
            ("unknown_keys_default", sum(|r| r.unknown_default)),
            ("unknown_keys_init", sum(|r| r.unknown_init)),
            ("unknown_keys_refused", sum(|r| r.unknown_refused)),
            ("keys_not_admitted", sum(|r| r.not_admitted)),
            ("keys_expired", sum(|r| r.expired)),
            ("keys_evicted", sum(|r| r.evicted)),
            ("keys_refused_full", sum(|r| r.refused_full)),
            ("keyed_life_bytes", sum(|r| r.life_bytes)),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into()
    }

    /// Keys keyed table `table` holds (`None`: not a keyed table): as its writer has decided
    /// them, or, opened read-only, as this store serves them now.
    pub fn keys_held(&self, table: &str) -> Option<u64> {
        self.current().live.keys_held(table)
    }

    /// Moves the clock keyed tables' TTLs and admission windows read `seconds` ahead (a store
    /// opened with `manual_clock`; else `InvalidRequest`); returns the time it reads now, in
    /// Unix seconds.
    pub fn advance_clock(&self, seconds: u64) -> Result<u64> {
        Ok(self.engine().advance_clock(seconds)?)
    }

    pub fn stats(&self) -> Option<Stats> {
        let engine = self.engine();
        let (io, device) = (engine.io_stats()?, engine.device()?);
        let mut values = io.snapshot();
        let reports = engine.tier_report();
        let sum = |f: fn(&TierReport) -> u64| reports.iter().map(f).sum::<u64>() as f64;
        let lookups = sum(|r| r.lookups_resident + r.lookups_hot + r.lookups_cache + r.lookups_ssd);
        let dram = sum(|r| r.lookups_resident + r.lookups_hot + r.lookups_cache);
        values.extend(
            [
                ("dram_tier_bytes", sum(|r| r.bytes)),
                ("lookups_resident", sum(|r| r.lookups_resident)),
                ("lookups_hot", sum(|r| r.lookups_hot)),
                ("lookups_cache", sum(|r| r.lookups_cache)),
                ("lookups_ssd", sum(|r| r.lookups_ssd)),
                (
                    "dram_hit_ratio",
                    if lookups > 0.0 { dram / lookups } else { 0.0 },
                ),
                ("cache_admissions", sum(|r| r.cache.admissions)),
                ("cache_rejections", sum(|r| r.cache.rejections)),
                ("cache_evictions", sum(|r| r.cache.evictions)),
                ("unprotected_tables", engine.unprotected_tables() as f64),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        Some(Stats {
            device: device.kind().to_owned(),
            direct_io: device.direct(),
            block_bytes: device.block_size(),
            values,
        })
    }

    /// Per table: what its DRAM tiers hold and served (empty for a DRAM-resident store).
    pub fn tier_report(&self) -> Vec<TierReport> {
        self.engine().tier_report()
    }

    /// What the simulated drive has done, when the store is served from one.
    pub fn flash_stats(&self) -> Option<FlashStats> {
        self.inner.flash.as_ref().map(|f| f.stats())
    }

    /// Whether the store keeps a model (its attachments name one; [`Store::model`] reads it).
    pub fn keeps_model(&self) -> bool {
        let manifest = &self.served().manifest;
        [
            crate::model::CONFIG_ATTACHMENT,
            crate::model::WEIGHTS_ATTACHMENT,
        ]
        .iter()
        .all(|name| manifest.attachments.iter().any(|a| a.name == *name))
    }

    /// The model kept with the store (`nearrec.models.save`), read from its attachments on
    /// first use.
    pub fn model(&self) -> Result<Arc<StoredModel>> {
        let served = self.current();
        if let Some(kept) = &*served.model.load() {
            return Ok(kept.model.clone());
        }
        let reader = StoreReader::open(&served.path)?;
        let model = Arc::new(StoredModel::load(&reader)?);
        let kept = Kept {
            model: model.clone(),
            weights: weights_file(reader.manifest()),
        };
        // only into an empty slot: an update meanwhile has the newer weights
        served
            .model
            .compare_and_swap(&None::<Arc<Kept>>, Some(Arc::new(kept)));
        Ok(model)
    }

    /// Replaces dense weights of the model kept with the store by name (a trainer's update of
    /// the dense part): each a weight the model keeps, of its shape, finite; the rest stay.
    /// The new weights are written atomically before this returns (durable, what a restart
    /// or a reader in another process reads), and every inference that starts after it runs
    /// them; those under way finish on the old ones. A store opened read-only refuses it
    /// (`ReadOnly`), one that keeps no model too (`NoModel`).
    pub fn update_model(&self, weights: &[Tensor<'_>]) -> Result<()> {
        let served = self.served();
        if !served.live.writable() {
            return Err(Error::ReadOnly {
                path: served.path.display().to_string(),
            });
        }
        let _one = lock(&served.updating);
        let reader = StoreReader::open(&served.path)?;
        let (npz, model) = crate::model::updated(&reader, weights)?;
        drop(reader);
        let manifest =
            nearrec_format::attach(&served.path, crate::model::WEIGHTS_ATTACHMENT, &npz)?;
        served.model.store(Some(Arc::new(Kept {
            model: Arc::new(model),
            weights: weights_file(&manifest),
        })));
        tracing::info!(
            store = %served.path.display(),
            weights = weights.len(),
            "model weights updated"
        );
        Ok(())
    }
}

/// Waits (up to a minute) until `this` is the last reference, then drops it here.
fn last_holder<T>(this: Arc<T>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while Arc::strong_count(&this) > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
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
