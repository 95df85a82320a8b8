//! The client's defaults under failure: calls that change nothing are made again after a
//! transient refusal and never past their deadline; a write is never made twice; a client of
//! several nodes moves to the next when its node goes.

#[path = "../../nearrec-server/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nearrec::{
    AsBatch, Batch, Compaction, ErrorKind, Inference, Inferred, Info, Pooled, Read, RowWrite, Rows,
    Stats, Store, StoreApi, Submitted, SwapTo, TierReport, Versioned, Versions, WriteOptions,
    Writes,
};
use nearrec_client::{Client, ClientOptions, Retry};
use nearrec_format::DType;
use nearrec_server::{NodeConfig, Stores};

/// A store that refuses the first `fail` calls of each verb as a store behind a network would
/// (`Overloaded` or `Unavailable`), and counts every call that reached it.
#[derive(Debug)]
struct Flaky {
    store: Store,
    fail: u32,
    kind: ErrorKind,
    calls: Arc<Mutex<BTreeMap<&'static str, u32>>>,
}

impl Flaky {
    fn enter(&self, verb: &'static str) -> nearrec::Result<()> {
        let mut calls = self.calls.lock().unwrap();
        let n = calls.entry(verb).or_default();
        *n += 1;
        if *n <= self.fail {
            let code = match self.kind {
                ErrorKind::Overloaded => 8,
                _ => 14,
            };
            return Err(nearrec::Error::Remote {
                kind: self.kind,
                code,
                message: format!("{verb}: refused ({n} of {})", self.fail),
                table: None,
                position: None,
            });
        }
        Ok(())
    }
}

impl StoreApi for Flaky {
    fn describe(&self) -> String {
        "a flaky store".into()
    }
    fn info(&self) -> nearrec::Result<Info> {
        StoreApi::info(&self.store)
    }
    fn lookup(&self, batch: &Batch<'_>) -> nearrec::Result<(Pooled, Read)> {
        self.enter("lookup")?;
        StoreApi::lookup(&self.store, batch)
    }
    fn lookup_rows(&self, batch: &Batch<'_>) -> nearrec::Result<Versioned<Vec<Rows>>> {
        StoreApi::lookup_rows(&self.store, batch)
    }
    fn submit(&self, batch: Box<dyn AsBatch>) -> nearrec::Result<Submitted> {
        StoreApi::submit(&self.store, batch)
    }
    fn refresh(&self) -> nearrec::Result<u64> {
        StoreApi::refresh(&self.store)
    }
    fn stats(&self) -> nearrec::Result<Stats> {
        StoreApi::stats(&self.store)
    }
    fn tier_report(&self) -> nearrec::Result<Vec<TierReport>> {
        StoreApi::tier_report(&self.store)
    }
    fn scrub(&self, rate: u64) -> nearrec::Result<Vec<nearrec::TableCheck>> {
        StoreApi::scrub(&self.store, rate)
    }
    fn close(&self) -> nearrec::Result<()> {
        StoreApi::close(&self.store)
    }
    fn writes(&self) -> Option<&dyn Writes> {
        Some(self)
    }
    fn versions(&self) -> Option<&dyn Versions> {
        Some(self)
    }
    fn inference(&self) -> Option<&dyn Inference> {
        Some(self)
    }
}

impl Inference for Flaky {
    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> nearrec::Result<Inferred> {
        Inference::infer(&self.store, dense, batch)
    }
    fn update_model(&self, weights: &[nearrec::model::Tensor<'_>]) -> nearrec::Result<()> {
        self.enter("update_model")?;
        Inference::update_model(&self.store, weights)
    }
    fn saved_model(&self) -> nearrec::Result<nearrec::SavedModel> {
        Inference::saved_model(&self.store)
    }
}

impl Writes for Flaky {
    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> nearrec::Result<u64> {
        self.enter("write")?;
        Writes::write_many(&self.store, writes, options)
    }
    fn compact(&self) -> nearrec::Result<Compaction> {
        Writes::compact(&self.store)
    }
    fn feed(
        &self,
        feed: &str,
        cursor: nearrec::FeedCursor,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> nearrec::Result<nearrec::Fed> {
        self.enter("feed")?;
        Writes::feed(&self.store, feed, cursor, writes, options)
    }
    fn feed_status(&self) -> nearrec::Result<nearrec::Feeds> {
        Writes::feed_status(&self.store)
    }
}

impl Versions for Flaky {
    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> nearrec::Result<u64> {
        self.enter("swap")?;
        Versions::swap(&self.store, to, warm, force)
    }
    fn lookup_version(&self, batch: &Batch<'_>, version: u64) -> nearrec::Result<(Pooled, Read)> {
        Versions::lookup_version(&self.store, batch, version)
    }
    fn lookup_rows_version(
        &self,
        batch: &Batch<'_>,
        version: u64,
    ) -> nearrec::Result<Versioned<Vec<Rows>>> {
        Versions::lookup_rows_version(&self.store, batch, version)
    }
}

type Calls = Arc<Mutex<BTreeMap<&'static str, u32>>>;

/// A writable store of one table served by a node through [`Flaky`].
fn flaky_node(dir: &Path, fail: u32, kind: ErrorKind) -> (common::Node, Calls) {
    let path =
        nearrec_testkit::write_store(dir.join("s"), &[("t", 100, 4, DType::Fp32)], |_, i| {
            i as f32
        });
    let calls = Calls::default();
    let flaky = Flaky {
        store: common::open(&path, "writable = true"),
        fail,
        kind,
        calls: calls.clone(),
    };
    let mut stores = Stores::new();
    stores.insert("s", flaky).unwrap();
    (common::Node::start(stores, NodeConfig::default()), calls)
}

fn one_lookup(client: &Client) -> nearrec::Result<Vec<f32>> {
    let (ids, lengths) = ([3i64], [1i64]);
    let batch = Batch::new(vec![nearrec::TableLookup::new(
        "t",
        nearrec::Indices::I64(&ids),
        nearrec::Bags::Lengths(nearrec::Indices::I64(&lengths)),
    )]);
    Ok(client.lookup(&batch)?.0.values)
}

fn options(attempts: u32) -> ClientOptions {
    ClientOptions {
        retry: Retry {
            attempts,
            backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
        },
        ..ClientOptions::default()
    }
}

#[test]
fn a_read_is_made_again_after_a_transient_refusal_and_a_write_never() {
    for kind in [ErrorKind::Overloaded, ErrorKind::Unavailable] {
        let dir = tempfile::tempdir().unwrap();
        let (node, calls) = flaky_node(dir.path(), 2, kind);
        let client = Client::connect(&node.addr.to_string(), "s", options(4)).unwrap();
        assert_eq!(one_lookup(&client).unwrap(), vec![12.0, 13.0, 14.0, 15.0]);
        assert_eq!(
            calls.lock().unwrap()["lookup"],
            3,
            "{kind:?}: two refused, one answered"
        );

        let row = [7f32; 4];
        let write = RowWrite {
            table: "t",
            ids: &[5],
            values: Some(nearrec::RowValues::F32(&row)),
        };
        let e = client
            .write_many(&[write], WriteOptions::default())
            .unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert_eq!(
            calls.lock().unwrap()["write"],
            1,
            "{kind:?}: a write is made once"
        );
        // a feed's file is sent again: its cursor makes it apply once
        let cursor = nearrec::FeedCursor {
            sequence: 1,
            ..Default::default()
        };
        let fed = client
            .feed("f", cursor, &[write], WriteOptions::default())
            .unwrap();
        assert!(fed.applied, "{kind:?}");
        assert_eq!(calls.lock().unwrap()["feed"], 3, "{kind:?}: sent again");
        let again = client
            .feed("f", cursor, &[write], WriteOptions::default())
            .unwrap();
        assert!(!again.applied, "{kind:?}: the store had it");
        assert_eq!(again.version, fed.version, "{kind:?}: nothing written");
        assert_eq!(client.feed_status().unwrap()["f"].sequence, 1);
        let e = client.swap(&SwapTo::Version(1), false, false).unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert_eq!(
            calls.lock().unwrap()["swap"],
            1,
            "{kind:?}: a swap is made once"
        );
        let bias = nearrec::model::Tensor {
            name: "top.bias",
            shape: &[1],
            values: &[0.5],
        };
        let e = client.update_model(&[bias]).unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert_eq!(
            calls.lock().unwrap()["update_model"],
            1,
            "{kind:?}: a model update is made once"
        );
    }
}

#[test]
fn retries_stop_at_their_count_and_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (node, calls) = flaky_node(dir.path(), 1000, ErrorKind::Overloaded);
    let addr = node.addr.to_string();
    let e = one_lookup(&Client::connect(&addr, "s", options(3)).unwrap()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Overloaded, "{e}");
    assert_eq!(calls.lock().unwrap()["lookup"], 3);
    // none again with attempts = 1
    one_lookup(&Client::connect(&addr, "s", options(1)).unwrap()).unwrap_err();
    assert_eq!(calls.lock().unwrap()["lookup"], 4);
    // pauses of up to a second, a deadline of 300 ms: the retries end within it
    let slow = ClientOptions {
        timeout: Some(Duration::from_millis(300)),
        retry: Retry {
            attempts: 100,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        },
        ..ClientOptions::default()
    };
    let client = Client::connect(&addr, "s", slow).unwrap();
    let started = Instant::now();
    one_lookup(&client).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_client_of_several_nodes_moves_to_the_next_when_its_node_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = flaky_node(&dir.path().join("a"), 0, ErrorKind::Overloaded);
    let (second, _) = flaky_node(&dir.path().join("b"), 0, ErrorKind::Overloaded);
    // a dead address first: skipped at connect
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let addrs = format!("{dead_addr},{},{}", first.addr, second.addr);
    let client = Client::connect(&addrs, "s", options(4)).unwrap();
    assert_eq!(client.address(), first.addr.to_string());
    one_lookup(&client).unwrap();
    drop(first); // stopped: its connection goes
    assert_eq!(one_lookup(&client).unwrap(), vec![12.0, 13.0, 14.0, 15.0]);
    assert_eq!(client.address(), second.addr.to_string());
    // every address gone: the error names each
    drop(second);
    let e = Client::connect(&format!("{dead_addr},{dead_addr}"), "s", options(1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("connection refused at"), "{e}");
}
