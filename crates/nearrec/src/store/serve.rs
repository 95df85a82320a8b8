//! Versions of the served store: another directory or a version of its repository swapped in
//! while it serves ([`Versions`]), lookups pinned to a version, what a swap opens, checks and
//! lets go of. A version staged beside the served one is a replica's verb (`replica.rs`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use nearrec_format::StoreReader;

use super::{Inner, Next, Served, Store, lock, open_engine, pacer};
use crate::api::Rows;
use crate::api::{Versioned, Versions};
use crate::batch::{Batch, Pooled, Read};
use crate::error::{Error, Result};
use crate::live::Snapshot;
use crate::versions::SwapTo;

/// Swaps, and lookups pinned to a version.
impl Versions for Store {
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
    /// [`Versions::swap`] to a version number), and the repository's pointer names the new
    /// version before it is served, so that a restart serves it too.
    ///
    /// What `to` names: a store directory, a version of the repository the store is served
    /// from, or the version served before the current one. A version swap checks the new version as any swap does
    /// (unless `force`) and writes the repository's pointer only once the version is open and
    /// checked: a refused or failed swap leaves both the served version and the pointer as
    /// they were. With the config's `keep_last`, versions beyond the newest few are removed
    /// once the last call on them has ended.
    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64> {
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

    /// [`crate::StoreApi::lookup`] as version `version` of the repository the store is served from
    /// answers it: the served version, or one held beside it ([`crate::Replica::stage`]); any other is
    /// refused with [`Error::VersionNotServed`], never answered from another version.
    fn lookup_version(&self, batch: &Batch<'_>, version: u64) -> Result<(Pooled, Read)> {
        let snapshot = self.snapshot_of(version)?;
        self.read_at(batch, &snapshot)
    }

    fn lookup_rows_version(&self, batch: &Batch<'_>, version: u64) -> Result<Versioned<Vec<Rows>>> {
        let snapshot = self.snapshot_of(version)?;
        self.lookup_rows_at(batch, &snapshot)
    }
}

impl Store {
    /// The versions held open beside the served one: the staged one and the one a staged
    /// swap replaced ([`crate::Replica::stage`]), by number.
    pub fn held_versions(&self) -> Vec<u64> {
        lock(&self.inner.held).versions().map(|(v, _)| *v).collect()
    }

    pub(super) fn no_repository(&self, to: &str) -> Error {
        Error::invalid(format!(
            "the store at {} is not served from a repository of versions: open REPO/NAME (its \
             versions in REPO/NAME/1, 2, ...) to {to}",
            self.path().display()
        ))
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
    pub(super) fn open_version(&self, path: &Path, warm: bool, force: bool) -> Result<Arc<Served>> {
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
    /// one ([`crate::Replica::stage`]) replaces it under the lock that lookups pinned to a version take,
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
    /// `keep_last` go, once the repository's lock is free.
    pub(super) fn retire(&self, old: Arc<Served>) {
        let path = old.path.clone();
        let engine = old.live.snapshot().engine().clone();
        let inner = Arc::downgrade(&self.inner);
        let (let_go, done) = mpsc::channel::<()>();
        let reaper = move || {
            let gone = old.path.clone();
            last_holder(old);
            last_holder(engine);
            drop(let_go);
            // the swap that retired it holds the lock until it returns, a swap in another
            // process may hold it a while: tried again until taken, the store held only while
            // trying (one let go of stops it)
            while let Some(inner) = inner.upgrade() {
                if inner.prune(&gone) {
                    return;
                }
                drop(inner);
                std::thread::sleep(PRUNE_RETRY);
            }
        };
        match std::thread::Builder::new()
            .name("nearrec-reaper".into())
            .spawn(reaper)
        {
            Ok(_) => lock(&self.inner.reaping).push(Reaping { path, done }),
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

    /// Waits until a version of `path` swapped out earlier has been let go (its calls ended,
    /// its writer lock released), so that swapping back to it finds it free.
    fn reaped(&self, path: &Path) {
        let waiting = {
            let mut reaping = lock(&self.inner.reaping);
            reaping.retain(|r| !r.let_go());
            let (mine, rest) = std::mem::take(&mut *reaping)
                .into_iter()
                .partition::<Vec<_>, _>(|r| r.path == path);
            *reaping = rest;
            mine
        };
        for r in waiting {
            let _ = r.done.recv();
        }
    }
}

/// How often a reaper tries the repository's lock again to prune.
const PRUNE_RETRY: Duration = Duration::from_millis(20);

/// A version swapped out, being let go on a reaper thread of its own.
#[derive(Debug)]
pub(super) struct Reaping {
    path: PathBuf,
    /// Disconnected once the version is let go (the reaper may prune after).
    done: mpsc::Receiver<()>,
}

impl Reaping {
    fn let_go(&self) -> bool {
        matches!(self.done.try_recv(), Err(mpsc::TryRecvError::Disconnected))
    }
}

impl Inner {
    /// Removes the repository's versions beyond `keep_last`, if the config says, now that
    /// `gone` (a version swapped out) has been let go: never one another swap still lets go.
    /// False when the repository's lock is held (by a swap, here or in another process).
    fn prune(&self, gone: &Path) -> bool {
        let (Some(repo), Some(keep)) = (&self.repo, self.config.keep_last) else {
            return true;
        };
        let held: Vec<u64> = lock(&self.reaping)
            .iter()
            .filter(|r| r.path != gone && !r.let_go())
            .filter_map(|r| repo.version_of(&r.path))
            .collect();
        // an error leaves what it could not remove for the next swap's reaper
        crate::versions::prune(repo, keep as usize, &held).unwrap_or(true)
    }
}

/// Waits (up to a minute) until `this` is the last reference, then drops it here.
fn last_holder<T>(this: Arc<T>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Arc::strong_count(&this) > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}
