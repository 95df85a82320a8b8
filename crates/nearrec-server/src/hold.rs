//! A node's writable shard replicas held in etcd (`docs/distributed.md`, "Membership in etcd"):
//! with `etcd` configured, each store the node serves that is a writable replica of a shard is
//! made to serve only while held (`nearrec::Store::require_hold`), and a task of the node's
//! runtime holds it (`nearrec_cluster::etcd::hold`): its lease renewed and its shard's record
//! read every quarter of the hold time. Cut off from etcd past its hold, or left out, the replica
//! refuses reads and writes (`Unavailable`), so no router reads from it what the members have
//! moved past.

use std::net::SocketAddr;
use std::sync::Arc;

use nearrec::StoreApi;
use nearrec_cluster::etcd::{EtcdOptions, Held, ShardMap, hold};

use crate::config::NodeConfig;
use crate::stores::Stores;

/// The replicas of `stores` to hold, each made to serve only while held, and a task holding
/// each, until `stop` changes. Nothing without `config.etcd`.
pub(crate) async fn start(
    stores: &Stores,
    config: &NodeConfig,
    listen: SocketAddr,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    if config.etcd.is_empty() {
        return Ok(());
    }
    for (name, store) in stores.iter() {
        let Some(tag) = store.shard().map_err(|e| e.to_string())? else {
            continue;
        };
        let Some(local) = embedded(store) else {
            continue;
        };
        let replica = store
            .replica()
            .and_then(|r| r.membership().ok())
            .map_or(0, |m| m.replica);
        if !store.info().map_err(|e| e.to_string())?.writable || replica == 0 {
            // read-only: it takes no writes, so it cannot miss one
            continue;
        }
        local.require_hold();
        let options = EtcdOptions {
            prefix: config.etcd_prefix.clone(),
            ..EtcdOptions::new(config.etcd.clone())
        };
        let handle = tokio::runtime::Handle::current();
        let map = ShardMap::connect(&options, &tag.store, &tag.plan, handle)
            .await
            .map_err(|e| format!("store {name}: {e}"))?;
        let held = store.clone();
        let apply = move |r: &nearrec_cluster::etcd::ShardRecord, began| {
            let s = embedded(&held).expect("an embedded store");
            s.hold(r.epoch, &r.members, began, r.hold())
        };
        let address = format!("{listen}/{name}");
        let (name, shard) = (name.to_owned(), tag.shard);
        let report = move |h: &Held| match h {
            Held::Held(m) => {
                tracing::info!(store = %name, shard, epoch = m.epoch, "held in etcd");
            }
            Held::Out(why) => tracing::warn!(store = %name, shard, "not held: {why}"),
            Held::NoAnswer(why) => {
                tracing::warn!(store = %name, shard, "etcd did not answer: {why}");
            }
        };
        let mut stop = stop.clone();
        tokio::spawn(hold(
            map,
            tag.shard,
            replica,
            address,
            apply,
            report,
            async move {
                let _ = stop.wait_for(|&s| s).await;
            },
        ));
    }
    Ok(())
}

fn embedded(store: &Arc<dyn StoreApi>) -> Option<&nearrec::Store> {
    store.concrete()?.downcast_ref::<nearrec::Store>()
}
