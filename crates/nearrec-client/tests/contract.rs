//! The store's conformance suite (`nearrec`'s `tests/suite/`) over a storage node on loopback,
//! through this client: each store served by a node of its own in this process.

#[path = "../../nearrec/tests/suite/mod.rs"]
#[macro_use]
mod suite;

#[path = "../../nearrec-server/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;

use nearrec::{ErrorKind, StoreApi};
use nearrec_client::{Client, ClientOptions};
use nearrec_server::{NodeConfig, Stores};

use suite::Opened;

/// The store on a node of its own (the SSD tier behind DRAM tiers smaller than its tables),
/// through a client.
fn node(path: &Path, writable: bool) -> Opened {
    let toml = format!("tier = \"ssd\"\ndram_budget = \"16KiB\"\nwritable = {writable}");
    let mut stores = Stores::new();
    stores.insert("s", common::open(path, &toml)).unwrap();
    // the suite swaps to stores beside the one served, not versions of a repository
    let config = NodeConfig {
        swap_root: path.parent().map(Path::to_path_buf),
        ..NodeConfig::default()
    };
    let node = common::Node::start(stores, config);
    let client = Client::connect(&node.addr.to_string(), "s", ClientOptions::default()).unwrap();
    Opened {
        store: Arc::new(client),
        keep: Box::new(node),
        lacks: Vec::new(),
    }
}

store_api_suite!(node);

/// A node's store, through its client, has every capability: the node answers for its store.
#[test]
fn a_client_has_every_capability() {
    let (_dir, path) = suite::fixture();
    let s = node(&path, false);
    assert_eq!(s.store.capabilities(), nearrec::CAPABILITIES);
}

/// A closed client's calls are `Unavailable`; the node goes on serving others.
#[test]
fn a_closed_client_refuses_every_later_call() {
    let (_dir, path) = suite::fixture();
    let opened = node(&path, false);
    opened.store.close().unwrap();
    let e = opened.store.info().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let node: &common::Node = opened.keep.downcast_ref().unwrap();
    let other = Client::connect(&node.addr.to_string(), "s", ClientOptions::default()).unwrap();
    assert_eq!(other.info().unwrap().tables.len(), suite::TABLES.len());
}

/// What only a node answers: its own refusals, typed.
#[test]
fn a_store_the_node_does_not_serve_is_not_found() {
    let (_dir, path) = suite::fixture();
    let opened = node(&path, false);
    let node: &common::Node = opened.keep.downcast_ref().unwrap();
    let other = Client::connect(&node.addr.to_string(), "x", ClientOptions::default()).unwrap();
    let e = other.info().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreNotFound, "{e}");
}

/// A client whose last clone goes inside an async context (a router's call) lets its runtime
/// go on a thread of its own: tokio refuses to drop a runtime there.
#[test]
fn a_client_dropped_inside_a_runtime_lets_its_own_go() {
    let (_dir, path) = suite::fixture();
    let opened = node(&path, false);
    let node: &common::Node = opened.keep.downcast_ref().unwrap();
    let client = Client::connect(&node.addr.to_string(), "s", ClientOptions::default()).unwrap();
    client.info().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async move { drop(client) });
}
