//! A node's writable shard replicas held in etcd (`docs/distributed.md`, "Membership in etcd"):
//! with `etcd` configured, each store the node serves that is a writable replica of a shard is
//! made to serve only while held (`nearrec::Store::require_hold`), and a task of the node's
//! runtime holds it (`nearrec_cluster::etcd::hold`): its lease renewed and its shard's record
//! read every quarter of the hold time. Cut off from etcd past its hold, or left out, the replica
//! refuses reads and writes (`Unavailable`), so no router reads from it what the members have
//! moved past.

use std::net::SocketAddr;

use nearrec_cluster::etcd::{EtcdOptions, Held, ShardMap, ShardRecord, hold};

use crate::config::NodeConfig;
use crate::stores::{Stores, embedded};

/// The replicas of `stores` to hold, each made to serve only while held, and held on a thread
/// of its own (its own runtime: request handlers that block cannot starve the renewals) until
/// `stop` changes. Nothing without `config.etcd`.
pub(crate) async fn start(
    stores: &Stores,
    config: &NodeConfig,
    listen: SocketAddr,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    if config.etcd.is_empty() {
        return Ok(());
    }
    let mut held = Vec::new();
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
        held.push((name.to_owned(), store.clone(), tag, replica));
    }
    if held.is_empty() {
        return Ok(());
    }
    let options = EtcdOptions {
        prefix: config.etcd_prefix.clone(),
        ..EtcdOptions::new(config.etcd.clone())
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the holds' runtime: {e}"))?;
    let (connected, connecting) = tokio::sync::oneshot::channel();
    let mut stop = stop.clone();
    let work = async move {
        let mut maps = Vec::with_capacity(held.len());
        for (name, _, tag, _) in &held {
            let handle = tokio::runtime::Handle::current();
            match ShardMap::connect(&options, &tag.store, &tag.plan, handle).await {
                Ok(map) => maps.push(map),
                Err(e) => {
                    let _ = connected.send(Err(format!("store {name}: {e}")));
                    return;
                }
            }
        }
        let _ = connected.send(Ok(()));
        for ((name, store, tag, replica), map) in held.into_iter().zip(maps) {
            let apply = move |r: &ShardRecord, began| {
                let s = embedded(&store).expect("an embedded store");
                s.hold(r.epoch, &r.members, began, r.hold())
            };
            let address = format!("{listen}/{name}");
            let shard = tag.shard;
            let report = move |h: &Held| match h {
                Held::Held(m) => {
                    tracing::info!(store = %name, shard, epoch = m.epoch, "held in etcd");
                }
                Held::Out(why) => tracing::warn!(store = %name, shard, "not held: {why}"),
                Held::NoAnswer(why) => {
                    tracing::warn!(store = %name, shard, "etcd did not answer: {why}");
                }
            };
            let mut stopped = stop.clone();
            let until = async move {
                let _ = stopped.wait_for(|&s| s).await;
            };
            tokio::spawn(hold(map, shard, replica, address, apply, report, until));
        }
        let _ = stop.wait_for(|&s| s).await;
    };
    std::thread::Builder::new()
        .name("nearrec-hold".into())
        .spawn(move || runtime.block_on(work))
        .map_err(|e| format!("cannot start the holds' thread: {e}"))?;
    connecting
        .await
        .map_err(|_| "the holds' thread stopped".to_owned())?
}
