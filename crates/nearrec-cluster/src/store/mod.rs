//! [`ShardedStore`]: a store cut into shards, each served by storage nodes, as one implementation
//! of the store's contract — opened here (its replicas connected and checked against the plan)
//! with how a batch is split, fanned out and merged; `contract.rs` its verbs, `writes.rs` its
//! writes routed, `counters.rs` what it reports, `replicas.rs` its `replicas.toml`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nearrec::plan::{ShardPlan, ShardedTable};
use nearrec::{Batch, Error, ErrorKind, Info, StoreApi, StoredModel, SwapTo, Versions};
use nearrec_client::{Client, ClientOptions};
use nearrec_engine::EngineError;
use rustc_hash::FxHashMap;

use crate::etcd::{EtcdOptions, ShardMap};
use crate::shard::{Hedge, Replica, Shard};
use crate::split::{HotRanks, Split};
use crate::txn::{self, Settled};
use crate::versions;
use crate::{catch_up, members};

mod contract;
mod counters;
mod infer;
mod reads;
mod replicas;
mod schema;
mod writes;

pub use replicas::{REPLICAS_FILE, ReplicasFile};

/// A replica of a shard: the node's address and the name it serves the shard's store as
/// (empty: the node's only store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: String,
    pub store: String,
}

impl Endpoint {
    /// `ADDR` or `ADDR/STORE`.
    pub fn parse(spec: &str) -> Self {
        match spec.rsplit_once('/') {
            Some((addr, store)) if !addr.is_empty() && !addr.ends_with(':') => Endpoint {
                addr: addr.to_owned(),
                store: store.to_owned(),
            },
            _ => Endpoint {
                addr: spec.to_owned(),
                store: String::new(),
            },
        }
    }
}

/// How a [`ShardedStore`] reaches its shards.
#[derive(Debug, Clone)]
pub struct ShardedOptions {
    /// Each replica's client: token, TLS, connect timeout. Its `timeout` is every call's
    /// deadline, carried to the nodes; its retries are the router's (a sub-request is started
    /// once on a replica and moved to another when it fails).
    pub client: ClientOptions,
    pub hedge: Hedge,
    /// How often the router catches up, in the background, the replicas that missed writes
    /// ([`ShardedStore::catch_up`], `catch_up.rs`); `None`: only when called.
    pub catch_up_every: Option<Duration>,
    /// Where the shards' membership is kept (`etcd/`): `None` keeps it in the replicas' own
    /// `MEMBERSHIP` files alone, which no partition-safe change can be made from
    /// (`docs/distributed.md`).
    pub etcd: Option<EtcdOptions>,
}

impl Default for ShardedOptions {
    fn default() -> Self {
        Self {
            client: ClientOptions::default(),
            hedge: Hedge::Quantile {
                q: 0.95,
                min: Hedge::MIN,
            },
            catch_up_every: Some(catch_up::EVERY),
            etcd: None,
        }
    }
}

/// A store whose tables are cut into shards ([`ShardPlan`]), each shard an ordinary store
/// served by one or more storage nodes (its replicas). Lookups are split by shard, sent to
/// every shard at once and merged exactly; see the crate's documentation for what each verb
/// does.
#[derive(Debug, Clone)]
pub struct ShardedStore {
    inner: Arc<Inner>,
}

/// The plan batches are split by, with what the router keeps of it: replaced whole when the
/// store's tables change (`schema.rs`), a batch split and merged by one.
#[derive(Debug)]
struct Layout {
    plan: ShardPlan,
    tables: FxHashMap<String, usize>,
    /// Each table's hot rows by id.
    hot: Vec<HotRanks>,
}

impl Layout {
    fn new(plan: ShardPlan) -> Self {
        let hot = plan.tables.iter().map(HotRanks::of).collect();
        let tables = (plan.tables.iter().enumerate())
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Self { plan, tables, hot }
    }

    fn find(&self, name: &str) -> Result<usize, EngineError> {
        self.tables
            .get(name)
            .copied()
            .ok_or_else(|| EngineError::UnknownTable {
                name: name.to_owned(),
                available: (self.plan.tables.iter())
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn table(&self, name: &str) -> nearrec::Result<&ShardedTable> {
        Ok(&self.plan.tables[self.find(name)?])
    }
}

#[derive(Debug)]
struct Inner {
    /// The store's name (its plans'), its replicas per shard: what no change of its tables
    /// changes.
    name: String,
    replicas: usize,
    layout: arc_swap::ArcSwap<Layout>,
    /// One change of the tables at a time from this router.
    changing: std::sync::Mutex<()>,
    location: Option<PathBuf>,
    /// Shared with the threads that commit a write's other replicas after it answered.
    shards: Arc<[Shard]>,
    /// The shard that keeps the store's model and holds every table whole (whole-model
    /// offload on its nodes).
    keeper: Option<usize>,
    /// The shards whose nodes keep the model (every shard of a cut since issue 64; before,
    /// the keeper alone).
    models: Vec<usize>,
    /// The model the router runs itself when no shard holds every table, and the cluster
    /// version it was read at (`infer.rs`).
    model: std::sync::Mutex<Option<(u64, Arc<StoredModel>)>>,
    /// Every replica takes writes.
    writable: bool,
    options: ShardedOptions,
    runtime: tokio::runtime::Runtime,
    closed: AtomicBool,
    /// The cluster version every batch reads at (`versions.rs`); 0: the shards are not
    /// served from repositories, each read takes what is served.
    pin: AtomicU64,
    /// Held by a write; taken whole while a swap switches the shards' versions, so that no
    /// write of this router lands on one replica's old version and another's new one.
    switching: std::sync::RwLock<()>,
    batches: AtomicU64,
    spread_bags: AtomicU64,
    split_bags: AtomicU64,
    bag_shards: AtomicU64,
    bags: AtomicU64,
    /// Shards' shares read again, their answers not agreeing on a write across shards
    /// (`reads.rs`).
    reads_again: AtomicU64,
}

impl ShardedStore {
    /// The sharded store in `dir`: its plan (`shards.json`) and its shards' nodes and the way
    /// to reach them (`replicas.toml`, [`ReplicasFile`]).
    pub fn open_dir(dir: &Path) -> nearrec::Result<Self> {
        let (endpoints, options) = ReplicasFile::read(dir)?;
        Self::open(dir, &endpoints, options)
    }

    /// The sharded store whose plan is in `dir` (`shards.json`), its shard `k` served at
    /// `replicas[k]`.
    pub fn open(
        dir: &Path,
        replicas: &[Vec<Endpoint>],
        options: ShardedOptions,
    ) -> nearrec::Result<Self> {
        let plan = ShardPlan::read(dir)?;
        Self::connect(plan, Some(dir.to_path_buf()), replicas, options)
    }

    /// The sharded store of `plan`, its shard `k` served at `replicas[k]`: every replica
    /// connected and checked against the plan (its tables, their rows, dims and dtypes), or a
    /// typed error naming the shard and the table that does not fit.
    pub fn connect(
        plan: ShardPlan,
        location: Option<PathBuf>,
        replicas: &[Vec<Endpoint>],
        options: ShardedOptions,
    ) -> nearrec::Result<Self> {
        if replicas.len() != plan.shards || replicas.iter().any(Vec::is_empty) {
            let given: Vec<usize> = replicas.iter().map(Vec::len).collect();
            return Err(invalid(
                None,
                format!(
                    "the plan has {} shards; replicas were given for {} (counts {given:?}), and \
                     every shard needs one",
                    plan.shards,
                    replicas.len()
                ),
            ));
        }
        let client = client_options(&options);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nearrec-router")
            .enable_time()
            .enable_io()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the router's runtime: {e}")))?;
        let etcd = match &options.etcd {
            Some(etcd) => Some(runtime.block_on(ShardMap::connect(
                etcd,
                &plan.store,
                plan.root(),
                runtime.handle().clone(),
            ))?),
            None => None,
        };
        // a change of the tables since the plan was read: etcd has the plan made by it
        let plan = match &etcd {
            Some(map) => schema::newest_plan(map, plan),
            None => plan,
        };
        let mut shards = Vec::with_capacity(plan.shards);
        // each replica's (repository version served, count of writes), by shard
        let mut served = Vec::with_capacity(plan.shards);
        let (mut keeper, mut models, mut writable) = (None, Vec::new(), true);
        for (k, endpoints) in replicas.iter().enumerate() {
            // a shard that holds every table whole serves the model it keeps
            let whole = plan.shard_tables(k).len() == plan.tables.len()
                && plan.tables.iter().all(|t| t.parts.len() == 1);
            let mut held = Vec::with_capacity(endpoints.len());
            let mut versions = Vec::with_capacity(endpoints.len());
            let mut brought = Vec::new();
            for e in endpoints {
                let (replica, info, moved) = connect_replica(&plan, k, e, &client)?;
                if moved {
                    brought.push(held.len());
                }
                writable &= info.writable;
                if info.model && whole {
                    keeper.get_or_insert(k);
                }
                if info.model && models.last() != Some(&k) {
                    models.push(k);
                }
                held.push(replica);
                versions.push((info.served_version, info.version));
            }
            shards.push(Shard::new(k, held, etcd.clone()));
            served.push((versions, brought));
        }
        let pinned: Vec<Vec<Option<u64>>> = (served.iter())
            .map(|(s, _)| s.iter().map(|v| v.0).collect())
            .collect();
        let pin = versions::pin_of(&pinned);
        for (shard, (versions, brought)) in shards.iter().zip(&served) {
            // reads start from the newest count any replica of the shard holds at the version
            // read
            let at_pin = |v: &Option<u64>| v.unwrap_or(0) == pin;
            let newest = (versions.iter())
                .filter(|(v, _)| at_pin(v))
                .map(|(_, count)| *count)
                .max()
                .unwrap_or(0);
            shard.seen.repin(pin, newest);
            // a replica behind its shard's others missed writes (it was down), one that is no
            // member is catching up: it serves no reads and takes no writes until caught up
            members::learn_anew(shard, pin);
            members::check_ids(&plan.store, shard)?;
            leave_out(shard, pin, brought);
        }
        let every = options.catch_up_every;
        let store = Self {
            inner: Arc::new(Inner {
                name: plan.store.clone(),
                replicas: plan.replicas,
                layout: arc_swap::ArcSwap::from_pointee(Layout::new(plan)),
                changing: std::sync::Mutex::new(()),
                location,
                shards: shards.into(),
                keeper,
                models,
                model: std::sync::Mutex::default(),
                writable,
                options,
                runtime,
                closed: AtomicBool::new(false),
                pin: AtomicU64::new(pin),
                switching: std::sync::RwLock::new(()),
                batches: AtomicU64::new(0),
                spread_bags: AtomicU64::new(0),
                reads_again: AtomicU64::new(0),
                split_bags: AtomicU64::new(0),
                bag_shards: AtomicU64::new(0),
                bags: AtomicU64::new(0),
            }),
        };
        if let Some(every) = every {
            // the thread holds the store only while a pass runs, and ends with it
            let weak = Arc::downgrade(&store.inner);
            let pass = move || {
                let inner = weak.upgrade()?;
                let store = ShardedStore { inner };
                if store.inner.closed.load(Ordering::Relaxed) {
                    return None;
                }
                Some((store.catch_up(catch_up::LEASE), store.members()))
            };
            let name = store.inner.name.clone();
            catch_up::spawn(name, every, store.members(), pass)?;
        }
        Ok(store)
    }

    /// Each shard's replicas that take writes, and all of them.
    fn members(&self) -> Vec<(usize, usize)> {
        (self.inner.shards.iter())
            .map(|s| (s.live_replicas().len(), s.all_replicas().len()))
            .collect()
    }

    /// The plan batches are split by now (a change of the tables replaces it).
    pub fn plan(&self) -> ShardPlan {
        self.inner.layout().plan.clone()
    }

    /// Settles the cross-shard writes older than `older_than` that routers left prepared on
    /// the replicas (a router that died between the two phases): each committed or aborted
    /// everywhere as its deciding replica says (`txn/`). A write that meets one settles it
    /// by itself; this is for an operator, or a router starting.
    pub fn settle(&self, older_than: Duration) -> Settled {
        txn::settle(&self.inner.shards, older_than)
    }

    /// Catches up every replica that is stale but answers — a node that was down, restarted
    /// behind its shard's others, or one that missed a write — from a member of its shard, and
    /// admits it again (`members/`): what each catch-up did, or why it failed, by shard and
    /// address. Learns every shard's membership first (a change another router made, a fence
    /// a catch-up left past its lease). The members of a shard are fenced for at most `lease`
    /// while a replica's last pass is copied; their writes wait meanwhile.
    pub fn catch_up(
        &self,
        lease: Duration,
    ) -> Vec<(usize, String, nearrec::Result<crate::CaughtUp>)> {
        let pin = self.inner.pin.load(Ordering::Relaxed);
        let plan = self.inner.layout();
        let mut done = Vec::new();
        for shard in self.inner.shards.iter() {
            // one left out of a change of the tables (down): brought to the plan first
            for r in shard.all_replicas().iter().filter(|r| r.is_stale()) {
                let _ = schema::conform(&r.client, shard.index, &plan.plan, false);
            }
            let mut learned = members::settle_fences(shard, pin);
            // one left out during a swap serves the old version: it catches up at the new
            let behind: Vec<_> = (shard.all_replicas().iter().zip(&learned.answers))
                .filter(|(_, a)| a.is_none() && pin != 0)
                .filter_map(|(r, _)| {
                    let info = r.client.info().ok()?;
                    (info.served_version != Some(pin)).then(|| r.clone())
                })
                .collect();
            for r in &behind {
                let _ = (r.client).swap(&SwapTo::Version(pin), false, false);
            }
            if !behind.is_empty() {
                learned = members::learn(shard, pin, false);
            }
            for (r, replica) in shard.all_replicas().iter().enumerate() {
                if replica.is_stale() && learned.answers[r].is_some() {
                    let result = members::catch_up(&self.inner.name, shard, pin, r, lease);
                    done.push((shard.index, replica.addr.clone(), result));
                }
            }
        }
        done
    }

    /// Each shard's replicas' addresses, as they are served now.
    pub fn replicas(&self) -> Vec<Vec<String>> {
        self.inner.shards.iter().map(Shard::addresses).collect()
    }

    /// Serves shard `shard` from the replicas at `endpoints` from the next call on — a node
    /// restarted at another address, a replica added — each new one connected and checked
    /// against the plan first (a replica at an address it had is kept as it is). A new one
    /// that is no member of the shard, or behind its members, missed writes: it is stale (no
    /// reads, no writes) until it has caught up ([`ShardedStore::catch_up`]).
    pub fn set_replicas(&self, shard: usize, endpoints: &[Endpoint]) -> nearrec::Result<()> {
        let inner = &self.inner;
        let Some(s) = inner.shards.get(shard) else {
            return Err(invalid(
                None,
                format!("shard {shard} of a plan of {} shards", inner.shards.len()),
            ));
        };
        if endpoints.is_empty() {
            return Err(invalid(None, format!("shard {shard} needs a replica")));
        }
        let mut replicas = Vec::with_capacity(endpoints.len());
        let mut brought = Vec::new();
        for e in endpoints {
            if let Some(kept) = s.replica(&e.addr) {
                replicas.push(kept);
                continue;
            }
            let plan = &inner.layout().plan;
            let (replica, _, moved) = connect_replica(plan, shard, e, &inner.client_options())?;
            if moved {
                brought.push(replicas.len());
            }
            // stale until its membership is learned: behind what the shard served, it missed
            // writes while it was away
            replica.set_stale(true);
            replicas.push(Arc::new(replica));
        }
        let before = s.all_replicas();
        s.set_replicas(replicas);
        let pin = inner.pin.load(Ordering::Relaxed);
        members::learn_anew(s, pin);
        if let Err(e) = members::check_ids(&inner.name, s) {
            s.set_replicas(before.to_vec());
            members::learn(s, pin, false);
            return Err(e);
        }
        leave_out(s, pin, &brought);
        Ok(())
    }
}

/// A replica's client options: one try a call (the router moves a failed sub-request to
/// another replica).
fn client_options(options: &ShardedOptions) -> ClientOptions {
    let mut client = options.client.clone();
    client.retry.attempts = 1;
    client
}

fn invalid(table: Option<&str>, reason: String) -> Error {
    Error::InvalidRequest {
        table: table.map(str::to_owned),
        position: None,
        reason,
    }
}

/// A replica of shard `k` of `plan` at `e`, connected (brought to the plan where it is behind
/// it) and checked against the plan: the replica, what its node says of the store (whether it
/// keeps a model, takes writes), and whether it was brought to the plan (it missed writes).
fn connect_replica(
    plan: &ShardPlan,
    k: usize,
    e: &Endpoint,
    options: &ClientOptions,
) -> nearrec::Result<(Replica, Info, bool)> {
    let options = ClientOptions {
        shard: Some((plan.id.clone(), k)),
        ..options.clone()
    };
    let client = Client::connect(&e.addr, &e.store, options).map_err(|err| Error::Shard {
        store: plan.store.clone(),
        shard: k,
        kind: err.kind(),
        reason: format!("replica {}: {err}", e.addr),
    })?;
    // behind the plan (left out of a change of the tables): brought to it, and stale until
    // caught up; one that cannot be is refused by the check below
    let moved = schema::conform(&client, k, plan, false).unwrap_or(false);
    let info = check_replica(plan, k, &client)?;
    Ok((Replica::new(client, e.addr.clone()), info, moved))
}

/// Leaves the replicas of `shard` at `moved` (brought to the plan: they missed writes) out of
/// its members, stale until caught up.
fn leave_out(shard: &Shard, pin: u64, moved: &[usize]) {
    let replicas = shard.all_replicas();
    let ids: Vec<u64> = (moved.iter())
        .filter_map(|&r| {
            replicas[r].set_stale(true);
            nearrec::Replica::membership(&replicas[r].client)
                .ok()
                .map(|m| m.replica)
        })
        .collect();
    if !ids.is_empty() {
        let _ = members::exclude(shard, pin, &ids, None);
    }
}

/// The store behind `client`, if it is shard `k` of `plan`; else a typed error naming the
/// shard and what does not fit.
fn check_replica(plan: &ShardPlan, k: usize, client: &Client) -> nearrec::Result<Info> {
    let at = client.describe();
    let info = client.info().map_err(|e| Error::Shard {
        store: plan.store.clone(),
        shard: k,
        kind: e.kind(),
        reason: format!("{at}: {e}"),
    })?;
    match &info.shard {
        Some(tag) if tag.plan == plan.id && tag.shard == k => {}
        other => {
            let is = match other {
                Some(tag) => format!("shard {} of plan {}", tag.shard, tag.plan),
                None => "no shard of any plan".into(),
            };
            return Err(Error::Shard {
                store: plan.store.clone(),
                shard: k,
                kind: ErrorKind::InvalidRequest,
                reason: format!("{at} does not fit plan {}: it serves {is}", plan.id),
            });
        }
    }
    for (t, p) in plan.shard_tables(k) {
        let want = &plan.tables[t];
        let misfit = |what: String| Error::Shard {
            store: plan.store.clone(),
            shard: k,
            kind: ErrorKind::InvalidRequest,
            reason: format!(
                "{at} does not fit plan {}: table {:?} {what}",
                plan.id, want.name
            ),
        };
        let Some(got) = info.tables.iter().find(|x| x.name == want.name) else {
            return Err(misfit("is missing".into()));
        };
        if want.keyed {
            // a keyed part holds its keys (and room), whatever its nominal rows
            if got.keys.is_none() || (got.dim, got.dtype) != (want.dim, want.dtype) {
                return Err(misfit(format!(
                    "is not a keyed table of dim {} {}",
                    want.dim,
                    want.dtype.name()
                )));
            }
            continue;
        }
        let rows = want.shard_rows(p);
        if (got.rows, got.dim, got.dtype) != (rows, want.dim, want.dtype) {
            return Err(misfit(format!(
                "has {} rows × dim {} {}, the plan {} rows × dim {} {}",
                got.rows,
                got.dim,
                got.dtype.name(),
                rows,
                want.dim,
                want.dtype.name()
            )));
        }
    }
    Ok(info)
}

impl Inner {
    fn client_options(&self) -> ClientOptions {
        client_options(&self.options)
    }

    fn live(&self) -> nearrec::Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::Remote {
                kind: ErrorKind::Unavailable,
                code: 14,
                message: format!("{} was closed", self.describe()),
                table: None,
                position: None,
            });
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        format!(
            "the sharded store {} ({} × {})",
            self.name,
            plural(self.shards.len(), "shard"),
            plural(self.replicas, "replica")
        )
    }

    /// The plan and what the router keeps of it, now.
    fn layout(&self) -> Arc<Layout> {
        self.layout.load_full()
    }

    /// `batch` split by `layout`.
    fn split(&self, batch: &Batch<'_>, layout: &Layout) -> nearrec::Result<Split> {
        self.live()?;
        let split = Split::new(
            batch,
            &layout.plan.tables,
            &layout.hot,
            self.shards.len(),
            |n| layout.find(n),
        )?;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.spread_bags
            .fetch_add(split.spread_bags, Ordering::Relaxed);
        self.split_bags
            .fetch_add(split.split_bags, Ordering::Relaxed);
        self.bag_shards
            .fetch_add(split.bag_shards, Ordering::Relaxed);
        self.bags.fetch_add(split.batch as u64, Ordering::Relaxed);
        Ok(split)
    }

    fn deadline(&self) -> Option<Instant> {
        self.options.client.timeout.map(|t| Instant::now() + t)
    }

    /// The shards' versions, summed: the number of writes every shard has applied (this
    /// router's among them: asked once their commits have landed).
    fn version(&self) -> nearrec::Result<u64> {
        self.live()?;
        let mut total = 0;
        for s in self.shards.iter() {
            s.committing.landed(crate::txn::COMMITS_AWAITED);
            let v = s.any(&self.name, |c| c.version())?;
            s.seen.raise(v);
            total += v;
        }
        Ok(total)
    }
}
