//! A sharded store's membership kept in etcd (`docs/distributed.md`, "Membership in etcd"): the
//! keys, the transactions that change them, and the hold a replica's node keeps there.
//!
//! Under the store's prefix (`/nearrec/<id of the plan it was cut by>` unless given):
//!
//! - `served`: the store's record ([`StoreRecord`]: the plan its batches are split by, and the
//!   cluster version they read), JSON. Changed only by a transaction that compares its revision
//!   ([`ShardMap::change_store`]): a change of the tables (a new plan) and a swap (a new version)
//!   are each decided there, so that of two routers making either at once one wins and the other
//!   learns, and a router learns the plan there rather than from a file.
//! - `changing`: the id of the plan a router is moving the shards to (a change of the tables
//!   under way, `store/schema.rs`), on that router's lease: put only where there is none, so one
//!   change at a time; gone with the router, and what it staged is then undone by the next.
//! - `shards/<k>`: shard `k`'s record ([`ShardRecord`]: epoch, members by id, hold time), JSON.
//!   Changed only by a transaction that compares its revision with the one the change was
//!   decided from ([`ShardMap::change`]): of two routers changing one epoch, one wins and the
//!   other learns, so no two memberships are ever installed at one epoch.
//! - `shards/<k>/replicas/<id>`: each replica its node holds, on the node's lease (its address),
//!   gone when the lease is.
//! - `shards/<k>/fence`: a catch-up's fence of the shard's members ([`Fence`]), on a lease of
//!   the fence's own: put only where there is none and the shard's record is as the catch-up
//!   read it, so that one catch-up at a time fences a shard; gone when the catch-up admits its
//!   replica or gives up, or with its lease.
//! - `shards/<k>/fresh`: a change that left replicas out without their word ([`Fresh`]), on a
//!   lease of one hold from when it was made: while it lives, a replica it left out may still
//!   be held.
//!
//! A replica's node runs [`hold`]: every quarter of the hold time it renews its lease and reads
//! its shard's record, and holds the replica (`nearrec::Store::hold`) for the hold time from
//! when that round began. A router that leaves a replica out without its word waits one hold
//! time after its change before the members take a write the replica lacks
//! ([`ShardMap::wait_out`]): by then the replica serves nothing. A router that learns the
//! record while the change is fresh — its maker gone, or still waiting — and cannot tell those
//! replicas itself waits until the change is no longer fresh.

mod hold;
mod store;

use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use nearrec::{Error, ErrorKind};

pub use hold::{Held, hold};
pub use store::{Changing, SeenStore, StoreRecord};

/// How long a replica is held for each renewal, unless the router's options say otherwise.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(2);

/// Where a sharded store's membership is kept: etcd's client endpoints (`host:port`, or URLs),
/// the prefix of its keys, the hold time of a shard record this router creates, and each
/// call's deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// `None`: `/nearrec/<plan id>`.
    pub prefix: Option<String>,
    pub hold: Duration,
    pub timeout: Duration,
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdOptions {
            endpoints,
            prefix: None,
            hold: DEFAULT_HOLD,
            timeout: Duration::from_secs(2),
        }
    }
}

/// A shard's membership as etcd keeps it, under `shards/<k>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardRecord {
    pub epoch: u64,
    /// Replica ids, ascending.
    pub members: Vec<u64>,
    /// How long a replica is held for each renewal of its lease, milliseconds: its node holds
    /// it so long, and a router that leaves it out without its word waits so long.
    pub hold_ms: u64,
}

impl ShardRecord {
    pub fn hold(&self) -> Duration {
        Duration::from_millis(self.hold_ms)
    }
}

/// A change of a shard's record that left replicas out without their word, kept beside it for
/// one hold (and a tenth) from when it was made, under `shards/<k>/fresh`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fresh {
    /// The epoch the change made.
    pub epoch: u64,
    /// The replicas it left out, by id.
    pub left: Vec<u64>,
}

/// A catch-up's fence of a shard's members, kept under `shards/<k>/fence`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fence {
    /// The epoch its members are fenced at.
    pub epoch: u64,
    /// The replica being caught up, by id.
    pub replica: u64,
}

/// A shard's record as read, with the revision a change of it compares (0: there is none yet).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Seen {
    pub record: Option<ShardRecord>,
    pub revision: i64,
}

/// One sharded store's keys in one etcd cluster.
#[derive(Clone)]
pub struct ShardMap {
    client: etcd_client::Client,
    /// The sharded store's name, for errors.
    store: String,
    prefix: String,
    /// Named in errors: the endpoints as given.
    endpoints: String,
    pub(crate) hold: Duration,
    timeout: Duration,
    /// The runtime a blocking caller's calls run on.
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for ShardMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMap")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl ShardMap {
    /// The keys of sharded store `store`, cut as plan `plan_id`, in the etcd `options` names,
    /// its blocking callers' calls run on `runtime`. Connects lazily: an etcd down now is an
    /// error of the first call, not of this.
    pub async fn connect(
        options: &EtcdOptions,
        store: &str,
        plan_id: &str,
        runtime: tokio::runtime::Handle,
    ) -> nearrec::Result<Self> {
        if options.endpoints.is_empty() {
            return Err(Error::Config {
                key: "etcd".into(),
                reason: "no endpoints given".into(),
            });
        }
        if options.hold < Duration::from_millis(100) {
            return Err(Error::Config {
                key: "etcd_hold".into(),
                reason: format!("{:?} is below 100 ms", options.hold),
            });
        }
        let prefix = (options.prefix.clone())
            .unwrap_or_else(|| format!("/nearrec/{plan_id}"))
            .trim_end_matches('/')
            .to_owned();
        let connect = ConnectOptions::new()
            .with_connect_timeout(options.timeout)
            .with_timeout(options.timeout)
            .with_keep_alive(Duration::from_secs(1), options.timeout)
            // a member cut off from the quorum refuses at once rather than waiting
            .with_require_leader(true);
        let client = etcd_client::Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(|e| Error::Config {
                key: "etcd".into(),
                reason: format!("{}: {e}", options.endpoints.join(",")),
            })?;
        Ok(ShardMap {
            client,
            store: store.to_owned(),
            prefix,
            endpoints: options.endpoints.join(","),
            hold: options.hold,
            timeout: options.timeout,
            runtime,
        })
    }

    /// `f` run to its end from a thread outside the runtime (a router's caller).
    pub(crate) fn blocking<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// The sharded store's name.
    pub fn store(&self) -> &str {
        &self.store
    }

    fn shard_key(&self, shard: usize) -> String {
        format!("{}/shards/{shard}", self.prefix)
    }

    fn fence_key(&self, shard: usize) -> String {
        format!("{}/shards/{shard}/fence", self.prefix)
    }

    fn fresh_key(&self, shard: usize) -> String {
        format!("{}/shards/{shard}/fresh", self.prefix)
    }

    fn replica_key(&self, shard: usize, replica: u64) -> String {
        format!("{}/shards/{shard}/replicas/{replica:016x}", self.prefix)
    }

    /// `Unavailable`, naming etcd and shard `shard`.
    pub(crate) fn unavailable(&self, shard: usize, why: impl std::fmt::Display) -> Error {
        Error::Shard {
            store: self.store.clone(),
            shard,
            kind: ErrorKind::Unavailable,
            reason: format!(
                "etcd at {} did not answer ({why}): a change of the shard's membership needs its \
                 quorum",
                self.endpoints
            ),
        }
    }

    async fn bounded<T>(
        &self,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }

    /// [`Self::read`] from a caller outside the runtime. A read etcd refused at once is sent once
    /// more after [`REFUSED_PAUSE`]: a member just lost refuses connections until the client's
    /// balancer drops it, and the next read likely goes to another. A read that went
    /// unanswered for half the timeout or more is not sent again.
    pub(crate) fn read_now(&self, shard: usize) -> Result<Seen, String> {
        let start = Instant::now();
        match self.blocking(self.read(shard)) {
            Err(why) if start.elapsed() < self.timeout / 2 => {
                std::thread::sleep(REFUSED_PAUSE);
                (self.blocking(self.read(shard)))
                    .map_err(|again| format!("{why}; read again: {again}"))
            }
            got => got,
        }
    }

    /// Shard `shard`'s record, read linearizably (through the quorum).
    pub async fn read(&self, shard: usize) -> Result<Seen, String> {
        let mut kv = self.client.kv_client();
        let got = self.bounded(kv.get(self.shard_key(shard), None)).await?;
        let Some(kv) = got.kvs().first() else {
            return Ok(Seen::default());
        };
        let record = serde_json::from_slice(kv.value()).map_err(|e| {
            format!(
                "the record at {} is not a shard's: {e}",
                self.shard_key(shard)
            )
        })?;
        Ok(Seen {
            record: Some(record),
            revision: kv.mod_revision(),
        })
    }

    /// Makes `next` shard `shard`'s record if it is still as `from` saw it (a compare of its
    /// revision, then a put, in one transaction): `Ok(false)` when another change got there
    /// first. `fresh`: the change leaves replicas out without their word, kept fresh on that
    /// lease ([`Self::fresh_lease`]) in the same transaction.
    pub async fn change(
        &self,
        shard: usize,
        from: &Seen,
        next: &ShardRecord,
        fresh: Option<(&Fresh, i64)>,
    ) -> Result<bool, String> {
        let key = self.shard_key(shard);
        let compare = still(&key, from.revision);
        let value = serde_json::to_vec(next).expect("a shard record serializes");
        let mut puts = vec![TxnOp::put(key, value, None)];
        if let Some((fresh, lease)) = fresh {
            let value = serde_json::to_vec(fresh).expect("a fresh change serializes");
            let on = PutOptions::new().with_lease(lease);
            puts.push(TxnOp::put(self.fresh_key(shard), value, Some(on)));
        }
        let txn = Txn::new().when([compare]).and_then(puts);
        let mut kv = self.client.kv_client();
        Ok(self.bounded(kv.txn(txn)).await?.succeeded())
    }

    /// [`Self::change`] from a caller outside the runtime, made sure of: a change etcd did not
    /// answer is sent again and judged by the record after ([`outcome`]).
    pub(crate) fn change_surely(
        &self,
        shard: usize,
        from: &Seen,
        next: &ShardRecord,
        fresh: Option<(&Fresh, i64)>,
    ) -> Result<bool, String> {
        outcome(
            next,
            self.blocking(self.change(shard, from, next, fresh)),
            || self.blocking(self.change(shard, from, next, fresh)),
            || self.read_now(shard).map(|s| s.record),
        )
    }

    /// A lease for a change kept fresh for `hold` and a tenth (whole seconds, at least one:
    /// etcd's leases count seconds).
    pub async fn fresh_lease(&self, hold: Duration) -> Result<i64, String> {
        let ttl = (hold + hold / 10).as_secs_f64().ceil().max(1.0) as i64;
        let mut client = self.client.clone();
        Ok(self.bounded(client.lease_grant(ttl, None)).await?.id())
    }

    /// Takes shard `shard`'s fence for `lease` (whole seconds, at least one), if no catch-up
    /// holds it and the shard's record is still as `from` saw it: the fence's lease, to let go
    /// of with [`Self::settled`]. `Ok(None)`: another catch-up holds it, or the record moved.
    pub async fn fence(
        &self,
        shard: usize,
        from: &Seen,
        fence: &Fence,
        lease: Duration,
    ) -> Result<Option<i64>, String> {
        let ttl = lease.as_secs_f64().ceil().max(1.0) as i64;
        let mut client = self.client.clone();
        let id = self.bounded(client.lease_grant(ttl, None)).await?.id();
        let key = self.fence_key(shard);
        let value = serde_json::to_vec(fence).expect("a fence serializes");
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(self.shard_key(shard), CompareOp::Equal, from.revision),
            ])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(id)),
            )]);
        let mut kv = self.client.kv_client();
        if self.bounded(kv.txn(txn)).await?.succeeded() {
            return Ok(Some(id));
        }
        let _ = self.bounded(client.lease_revoke(id)).await;
        Ok(None)
    }

    /// The fence a catch-up holds on shard `shard`, if any.
    pub async fn fenced(&self, shard: usize) -> Result<Option<Fence>, String> {
        self.get_json(self.fence_key(shard), "a fence").await
    }

    /// The change of shard `shard`'s record kept fresh now, if any.
    pub async fn fresh(&self, shard: usize) -> Result<Option<Fresh>, String> {
        self.get_json(self.fresh_key(shard), "a fresh change").await
    }

    /// The JSON value at `key` (`what` it is, for errors), if there is one.
    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: String,
        what: &str,
    ) -> Result<Option<T>, String> {
        let mut kv = self.client.kv_client();
        let got = self.bounded(kv.get(key.clone(), None)).await?;
        let Some(kv) = got.kvs().first() else {
            return Ok(None);
        };
        serde_json::from_slice(kv.value())
            .map(Some)
            .map_err(|e| format!("the key {key} is not {what}: {e}"))
    }

    /// Ends a change's freshness (its router told the replicas it left out, or waited them
    /// out: no router learning it waits any more), or a fence (its catch-up is done), before its
    /// lease does. Best effort: the lease runs out by itself.
    pub async fn settled(&self, lease: i64) {
        let mut client = self.client.clone();
        let _ = self.bounded(client.lease_revoke(lease)).await;
    }

    /// Waits one hold time from `since` (a change that left replicas out without their word):
    /// a replica held before it is held no longer.
    pub fn wait_out(&self, since: Instant, hold: Duration) {
        // a tenth more: the two sides' clocks run at rates that may differ a little
        let until = since + hold + hold / 10;
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
    }
}

/// The compare of a record's key `key` with the revision it was read at (0: there was none,
/// so it must still not exist).
fn still(key: &str, revision: i64) -> Compare {
    if revision == 0 {
        Compare::create_revision(key, CompareOp::Equal, 0)
    } else {
        Compare::mod_revision(key, CompareOp::Equal, revision)
    }
}

/// How long a call etcd refused waits before it is sent again: time for the client's balancer
/// to drop a member that was just lost (seen in the suite: a change sent again at once to the
/// member a test had killed, refused twice).
pub(crate) const REFUSED_PAUSE: Duration = Duration::from_millis(200);

/// Whether a change making `ours` a record (a shard's, the store's) was made (`Ok(false)`: another change was
/// made first), from etcd's answer to it (`first`). Without one the transaction may have been
/// applied all the same (a leader lost with it in flight, an answer past the deadline): it is
/// sent `again`, after [`REFUSED_PAUSE`], with the same compare, so that at most one of the two
/// is applied; refused, the record `read` after says whether it is ours (the first was applied)
/// or another's. `Err`: etcd answered neither.
fn outcome<R: PartialEq>(
    ours: &R,
    first: Result<bool, String>,
    again: impl FnOnce() -> Result<bool, String>,
    read: impl FnOnce() -> Result<Option<R>, String>,
) -> Result<bool, String> {
    let Err(why) = first else {
        return first;
    };
    std::thread::sleep(REFUSED_PAUSE);
    match again() {
        Ok(true) => Ok(true),
        Ok(false) => match read() {
            Ok(now) => Ok(now.as_ref() == Some(ours)),
            Err(e) => Err(format!("{why}; sent again, refused; then a read: {e}")),
        },
        Err(e) => Err(format!("{why}; sent again: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change etcd did not answer is sent again with the same compare: made then, it is made;
    /// refused, the record read after tells whether the first was applied (ours) or another
    /// change came first; etcd answering neither is unknown (`Unavailable`).
    #[test]
    fn a_change_without_an_answer_is_sent_again_and_judged_by_the_record_after() {
        let record = |epoch: u64, members: Vec<u64>| ShardRecord {
            epoch,
            members,
            hold_ms: 1000,
        };
        let ours = record(4, vec![1]);
        let seen = |r: ShardRecord| Ok(Some(r));
        let lost = || Err::<bool, String>("no answer".into());
        let unread = || -> Result<Option<ShardRecord>, String> {
            panic!("read only when the second is refused")
        };
        // answered at once: as answered, nothing sent again
        let never = || -> Result<bool, String> { panic!("not sent again") };
        assert_eq!(outcome(&ours, Ok(true), never, unread), Ok(true));
        assert_eq!(outcome(&ours, Ok(false), never, unread), Ok(false));
        // no answer: the second made it
        assert_eq!(outcome(&ours, lost(), || Ok(true), unread), Ok(true));
        // the second refused: the first was applied (ours), or another's came first
        assert_eq!(
            outcome(&ours, lost(), || Ok(false), || seen(ours.clone())),
            Ok(true)
        );
        let other = || seen(record(4, vec![2]));
        assert_eq!(outcome(&ours, lost(), || Ok(false), other), Ok(false));
        // etcd answers neither: unknown, both failures named
        let e = outcome(&ours, lost(), lost, unread).unwrap_err();
        assert!(e.contains("no answer; sent again: no answer"), "{e}");
        let e = outcome(&ours, lost(), || Ok(false), || Err("down".into())).unwrap_err();
        assert!(e.contains("down"), "{e}");
    }
}
