//! The sharded store's record in etcd (`served`: its plan and cluster version) and the key a
//! change of its tables holds while it is under way (`changing`), as the module above lists
//! them: read, and changed only by transactions that compare first.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use nearrec::{Error, ErrorKind};

use super::{ShardMap, outcome, still};

/// The sharded store's record, under `served`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreRecord {
    /// The plan batches are split by.
    pub plan: nearrec::plan::ShardPlan,
    /// The cluster version batches read (0: the shards are not served from repositories).
    pub version: u64,
}

/// The store's record as read, with the revision a change of it compares (0: none yet).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeenStore {
    pub record: Option<StoreRecord>,
    pub revision: i64,
}

/// A change of the tables holding the store's `changing` key: its lease kept alive while this
/// lives, revoked when it is dropped (the key gone with it).
#[derive(Debug)]
pub struct Changing {
    map: ShardMap,
    lease: i64,
    alive: tokio::task::JoinHandle<()>,
}

impl Drop for Changing {
    fn drop(&mut self) {
        self.alive.abort();
        let (map, lease) = (self.map.clone(), self.lease);
        // best effort, without waiting: the lease runs out by itself
        self.map.runtime.spawn(async move {
            let mut client = map.client.clone();
            let _ = map.bounded(client.lease_revoke(lease)).await;
        });
    }
}

impl ShardMap {
    fn store_key(&self) -> String {
        format!("{}/served", self.prefix)
    }

    fn changing_key(&self) -> String {
        format!("{}/changing", self.prefix)
    }
    /// The store's record, read linearizably; its plan checked whole.
    pub async fn read_store(&self) -> Result<SeenStore, String> {
        let mut kv = self.client.kv_client();
        let key = self.store_key();
        let got = self.bounded(kv.get(key.clone(), None)).await?;
        let Some(kv) = got.kvs().first() else {
            return Ok(SeenStore::default());
        };
        let bad = |e: String| format!("the record at {key} is not a sharded store's: {e}");
        let record: StoreRecord =
            serde_json::from_slice(kv.value()).map_err(|e| bad(e.to_string()))?;
        // its plan's id is its content's, as a plan file's must be
        let json = serde_json::to_vec(&record.plan).expect("a plan serializes");
        nearrec::plan::ShardPlan::parse(&json, std::path::Path::new(&key))
            .map_err(|e| bad(e.to_string()))?;
        Ok(SeenStore {
            record: Some(record),
            revision: kv.mod_revision(),
        })
    }

    /// Makes `next` the store's record if it is still as `from` saw it and no change of the
    /// tables holds `changing` (compares, then a put, in one transaction): `Ok(false)` when
    /// another change got there first.
    pub async fn change_store(&self, from: &SeenStore, next: &StoreRecord) -> Result<bool, String> {
        let key = self.store_key();
        let compare = still(&key, from.revision);
        let value = serde_json::to_vec(next).expect("a store record serializes");
        let unchanging = Compare::create_revision(self.changing_key(), CompareOp::Equal, 0);
        let txn = Txn::new()
            .when([compare, unchanging])
            .and_then([TxnOp::put(key, value, None)]);
        let mut kv = self.client.kv_client();
        Ok(self.bounded(kv.txn(txn)).await?.succeeded())
    }

    /// Takes the store's `changing` key for a change of the tables to plan `plan`, if no other
    /// change holds it and the store's record is still as `from` saw it: the change's lease,
    /// kept alive until the [`Changing`] is dropped. `Ok(None)`: another change holds it, or
    /// the record moved.
    pub async fn begin_change(
        &self,
        from: &SeenStore,
        plan: &str,
    ) -> Result<Option<Changing>, String> {
        let ttl = self.hold.as_secs().max(5) as i64 * 2;
        let mut client = self.client.clone();
        let lease = self.bounded(client.lease_grant(ttl, None)).await?.id();
        let key = self.changing_key();
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(self.store_key(), CompareOp::Equal, from.revision),
            ])
            .and_then([TxnOp::put(
                key,
                plan,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let mut kv = self.client.kv_client();
        if !self.bounded(kv.txn(txn)).await?.succeeded() {
            let _ = self.bounded(client.lease_revoke(lease)).await;
            return Ok(None);
        }
        let (mut keeper, mut stream) = self.bounded(client.lease_keep_alive(lease)).await?;
        let every = Duration::from_secs(ttl as u64) / 3;
        let alive = self.runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if keeper.keep_alive().await.is_err() || stream.message().await.is_err() {
                    return;
                }
            }
        });
        Ok(Some(Changing {
            map: self.clone(),
            lease,
            alive,
        }))
    }

    /// The plan a change of the tables under way moves to, if one holds `changing`.
    pub async fn changing(&self) -> Result<Option<String>, String> {
        let mut kv = self.client.kv_client();
        let got = self.bounded(kv.get(self.changing_key(), None)).await?;
        Ok(got
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// Ends change `changing`, making `next` the store's record if it is still as `from` saw
    /// it and `changing` still holds the key, in one transaction (compared, the record put, the
    /// key let go).
    pub async fn end_change(
        &self,
        changing: &Changing,
        from: &SeenStore,
        next: &StoreRecord,
    ) -> Result<bool, String> {
        let value = serde_json::to_vec(next).expect("a store record serializes");
        let txn = Txn::new()
            .when([
                Compare::mod_revision(self.store_key(), CompareOp::Equal, from.revision),
                // still this change's: its lease ran out, and another router may be undoing it
                Compare::lease(self.changing_key(), CompareOp::Equal, changing.lease),
            ])
            .and_then([
                TxnOp::put(self.store_key(), value, None),
                TxnOp::delete(self.changing_key(), None),
            ]);
        let mut kv = self.client.kv_client();
        Ok(self.bounded(kv.txn(txn)).await?.succeeded())
    }

    /// [`Self::change_store`] from a caller outside the runtime, made sure of as
    /// [`Self::change_surely`] is.
    pub(crate) fn change_store_surely(
        &self,
        from: &SeenStore,
        next: &StoreRecord,
    ) -> Result<bool, String> {
        outcome(
            next,
            self.blocking(self.change_store(from, next)),
            || self.blocking(self.change_store(from, next)),
            || self.blocking(self.read_store()).map(|s| s.record),
        )
    }

    /// `Unavailable`, naming etcd, for a change of the whole store (`what`).
    pub(crate) fn store_unavailable(&self, what: &str, why: impl std::fmt::Display) -> Error {
        Error::Remote {
            kind: ErrorKind::Unavailable,
            code: 14,
            message: format!(
                "{}: etcd at {} did not answer ({why}): {what} needs its quorum",
                self.store, self.endpoints
            ),
            table: None,
            position: None,
        }
    }
}
