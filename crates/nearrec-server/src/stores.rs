//! The stores a node serves, by name: any implementation of the store's contract
//! ([`StoreApi`]), opened here as embedded stores.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::path::PathBuf;

use nearrec::{Store, StoreApi, StoreConfig};
use nearrec_wire::arrays::Spare;
use tonic::Status;

/// How often a node's read-only stores look for their writer's records, in ms, unless the
/// store config's `follow_ms` says.
pub const FOLLOW_MS: u64 = 1000;

/// `batch` pooled as version `at` of the store's repository answers it (a pinned lookup,
/// `Versions::lookup_version`), or as the store is now.
pub(crate) fn pooled(
    store: &dyn StoreApi,
    batch: &nearrec::Batch<'_>,
    at: Option<u64>,
) -> nearrec::Result<(nearrec::Pooled, nearrec::Read)> {
    pooled_in(store, batch, at, Spare::none())
}

/// [`pooled`]; an embedded store's answer as the store is now pooled into a vector `spare`
/// kept.
pub(crate) fn pooled_in(
    store: &dyn StoreApi,
    batch: &nearrec::Batch<'_>,
    at: Option<u64>,
    spare: &Spare,
) -> nearrec::Result<(nearrec::Pooled, nearrec::Read)> {
    let local = store.concrete().and_then(|s| s.downcast_ref::<Store>());
    match (at, local) {
        (Some(v), _) => store
            .able(store.versions(), "lookup_version")?
            .lookup_version(batch, v),
        (None, Some(local)) => local.lookup_reusing(batch, spare.take()),
        (None, None) => store.lookup(batch),
    }
}

/// The embedded store `store` is, if it is one (not a sharded store's router).
pub(crate) fn embedded(store: &Arc<dyn StoreApi>) -> Option<&Store> {
    store.concrete()?.downcast_ref::<Store>()
}

/// Before a lookup of a replica whose shard writes in two phases: waits (on a blocking thread)
/// until the transactions prepared there that hold a row of `batch`, and those of `expect`,
/// are decided — at most a second, or to the call's deadline (`docs/distributed.md`, "Reads
/// while writes go on"). At once where nothing is held, as on every store that takes no
/// writes across shards.
pub(crate) async fn settle(
    store: &Arc<dyn StoreApi>,
    batch: &nearrec::OwnedBatch,
    expect: &[u128],
    deadline: Option<std::time::Instant>,
) -> nearrec::Result<()> {
    use nearrec::AsBatch as _;
    let Some(local) = embedded(store) else {
        return Ok(());
    };
    let txns = local.awaited(&batch.as_batch(), expect);
    if txns.is_empty() {
        return Ok(());
    }
    let until = std::time::Instant::now() + SETTLE_WAIT;
    let until = deadline.map_or(until, |d| d.min(until));
    let store = store.clone();
    let settled = tokio::task::spawn_blocking(move || {
        embedded(&store).expect("embedded").settle(&txns, until)
    });
    settled
        .await
        .map_err(|e| nearrec::Error::invalid(e.to_string()))?
}

/// How long a lookup waits at most for a prepared transaction holding one of its rows.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The transactions that last wrote `batch`'s rows on an embedded store (none elsewhere).
pub(crate) fn writers(
    store: &Arc<dyn StoreApi>,
    batch: &nearrec::Batch<'_>,
) -> Vec<nearrec::LastWriter> {
    embedded(store).map_or_else(Vec::new, |s| s.writers(batch))
}

/// Stores by name; a request's empty name means the only one.
#[derive(Debug, Clone, Default)]
pub struct Stores {
    by_name: BTreeMap<String, Arc<dyn StoreApi>>,
    /// The sharded stores among them and their directories, whose `replicas.toml` a reload
    /// reads again ([`Stores::reload_replicas`]).
    sharded: Vec<(String, PathBuf, nearrec_cluster::ShardedStore)>,
}

impl Stores {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `store` (any implementation of the contract) as `name`; a name served twice is
    /// refused.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        store: impl StoreApi + 'static,
    ) -> Result<(), String> {
        let name = name.into();
        if self.by_name.contains_key(&name) {
            return Err(format!(
                "two stores are named {name:?}; give each its own (PATH=NAME)"
            ));
        }
        self.by_name.insert(name, Arc::new(store));
        Ok(())
    }

    /// Opens each `PATH` or `PATH=NAME` (the name defaults to the directory's) with `config`.
    /// A read-only store follows its writer every [`FOLLOW_MS`] unless `config` says otherwise:
    /// what another process writes to it is served within about that.
    pub fn open(specs: &[String], config: &StoreConfig) -> Result<Self, String> {
        let mut config = config.clone();
        if !config.writable && config.follow_ms.is_none() {
            config.follow_ms = Some(FOLLOW_MS);
        }
        let config = &config;
        let mut stores = Self::new();
        for spec in specs {
            let (path, name) = match spec.split_once('=') {
                Some((p, n)) if !n.is_empty() => (PathBuf::from(p), n.to_owned()),
                _ => {
                    let p = PathBuf::from(spec.trim_end_matches('='));
                    let name = p
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .ok_or_else(|| format!("{spec}: name the store (PATH=NAME)"))?;
                    (p, name)
                }
            };
            let started = std::time::Instant::now();
            let store =
                Store::open(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
            tracing::info!(
                store = %name,
                path = %store.path().display(),
                served_version = store.served_version(),
                tables = store.tables().len(),
                tier = store.tier().name(),
                seconds = started.elapsed().as_secs_f64(),
                "store loaded"
            );
            stores.insert(name, store)?;
        }
        Ok(stores)
    }

    /// Opens each sharded store `DIR` or `DIR=NAME` (the name defaults to its plan's) through
    /// the router, its shards' nodes as its `replicas.toml` names them (each checked against
    /// the plan before the node serves).
    pub fn open_sharded(&mut self, specs: &[String]) -> Result<(), String> {
        for spec in specs {
            let (dir, name) = match spec.split_once('=') {
                Some((d, n)) if !n.is_empty() => (PathBuf::from(d), Some(n.to_owned())),
                _ => (PathBuf::from(spec.trim_end_matches('=')), None),
            };
            let store = nearrec_cluster::ShardedStore::open_dir(&dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let name = name.unwrap_or_else(|| store.plan().store.clone());
            tracing::info!(
                store = %name,
                path = %dir.display(),
                shards = store.plan().shards,
                tables = store.plan().tables.len(),
                "sharded store connected"
            );
            self.insert(name.clone(), store.clone())?;
            self.sharded.push((name, dir, store));
        }
        Ok(())
    }

    /// Each sharded store's `replicas.toml` read again and its shards served from the
    /// replicas it names from the next call on (a node moved, a replica added or removed):
    /// each new replica connected and checked against the plan first, one at an address
    /// already served kept as it is. The file's other settings (deadline, hedging, token,
    /// TLS) are the router's from its start. A store whose file does not load, or a shard
    /// whose replicas do not fit, is served as it was: what went wrong, by store.
    pub fn reload_replicas(&self) -> Vec<(String, Result<(), String>)> {
        (self.sharded.iter())
            .map(|(name, dir, store)| {
                let reloaded = (|| {
                    let (endpoints, _) =
                        nearrec_cluster::ReplicasFile::read(dir).map_err(|e| e.to_string())?;
                    if endpoints.len() != store.plan().shards {
                        return Err(format!(
                            "{} names replicas for {} shards; the plan has {}",
                            dir.join(nearrec_cluster::REPLICAS_FILE).display(),
                            endpoints.len(),
                            store.plan().shards
                        ));
                    }
                    for (k, shard) in endpoints.iter().enumerate() {
                        store
                            .set_replicas(k, shard)
                            .map_err(|e| format!("shard {k}: {e}"))?;
                    }
                    Ok(())
                })();
                (name.clone(), reloaded)
            })
            .collect()
    }

    /// Whether any store is sharded (a reload has replicas to read).
    pub fn has_sharded(&self) -> bool {
        !self.sharded.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn StoreApi>)> {
        self.by_name.iter().map(|(n, s)| (n.as_str(), s))
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The store a request names (`NOT_FOUND` naming the stores `visible` to the caller
    /// otherwise: an ACL's principal learns only the names of stores it holds grants on, and a
    /// store it may not see is not found).
    pub fn get(
        &self,
        name: &str,
        visible: impl Fn(&str) -> bool,
    ) -> Result<(&str, Arc<dyn StoreApi>), Status> {
        if name.is_empty() && self.by_name.len() == 1 {
            let (n, s) = self.by_name.iter().next().expect("one store");
            if visible(n) {
                return Ok((n, s.clone()));
            }
        }
        let served = || {
            let names: Vec<&str> = self.names().filter(|n| visible(n)).collect();
            if names.is_empty() {
                "none you hold a grant on".to_owned()
            } else {
                names.join(", ")
            }
        };
        // a store the caller may not see is one the node does not serve, to the caller
        match self.by_name.get_key_value(name).filter(|(n, _)| visible(n)) {
            Some((n, s)) => Ok((n, s.clone())),
            None if name.is_empty() => Err(Status::invalid_argument(format!(
                "the node serves several stores ({}): name one",
                served()
            ))),
            None => Err(Status::not_found(format!(
                "the node serves no store named {:?}; it serves: {}",
                nearrec_wire::status::clip(name, 256),
                served()
            ))),
        }
    }
}

/// The most ids a lookup may hold and still run on an async worker (about a tenth of a
/// millisecond of pooling); larger ones go to a blocking thread, so that one request never
/// holds a worker long: the async workers decode every request, and one principal's large
/// lookups held there would keep the others' waiting behind them. Measured (`nearrec bench
/// abuse`, the node on one core): beside a greedy principal's lookups of 16 Ki ids, the good
/// clients' p99 was 17× their p99 alone when up to 64 Ki ids ran inline, 1.9× with 8 Ki; with
/// the fair CPU turns, up to 15.6× with 16 Ki inline and 1,400× with 32 Ki (beside lookups of
/// 32 Ki ids), against 1.0–1.3× with 8 Ki (`bench/results/abuse-inline-ab.log`). The node's
/// `inline_lookups` (`--inline-lookups`) sets it otherwise.
pub const INLINE_LOOKUPS: usize = 1 << 13;

/// Whether a lookup of `lookups` ids on `store` runs on the async worker that decoded it:
/// when every row is in DRAM (it never waits on a device) and it is small. Handing it to a
/// blocking thread instead costs two thread switches per request — measured at a fifth of a
/// DRAM node's throughput on one core (`nearrec bench serve`, docs/serving.md).
/// `most`: the node's `inline_lookups`, [`INLINE_LOOKUPS`] unless configured.
pub fn inline(store: &dyn StoreApi, lookups: usize, most: usize) -> bool {
    store.resident() && lookups <= most
}
