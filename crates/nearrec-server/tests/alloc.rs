//! What the node's threads allocate per lookup once warm, counted by a global allocator that
//! counts only on threads of the node's runtime (its async workers and blocking threads; the
//! client runs on a runtime of its own).
//!
//! The transport's buffers grow with the request and are tonic's and h2's: h2 reads each frame
//! into a buffer of its own, tonic gathers the message into one that it then reserves the
//! message's length in again (twice the request: grpc/grpc-rust#2735), and the answer is
//! encoded into one buffer. Beside those a fixed number of small allocations (88-91 measured,
//! 16 KB): about half the transport's boxed futures, bodies and header maps, half the node's
//! own (the caller's share and place, the request's summary, metric labels, the answer's
//! extensions and table names, the engine's per-table vectors) and the engine's bag bounds,
//! 8 B a bag; the ids, lengths, weights and pooled answer are in vectors the node keeps
//! between requests (`nearrec_wire::arrays::Spare`). What all of it costs the node's core is
//! measured, not asserted: `bench/profile_node.py` (the allocator ~5 % at saturation).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use nearrec::{OutDtype, OwnedBatch, OwnedLookup};
use nearrec_server::{NodeConfig, Stores};
use prost::Message as _;

mod common;

use common::{Node, ROWS, build, open, request};

struct Counting;

static CALLS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static NODE: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if NODE.with(Cell::get) {
        CALLS.fetch_add(1, Relaxed);
        BYTES.fetch_add(size as u64, Relaxed);
    }
}

// SAFETY: every call is passed to System's as it came; counting touches no allocation
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on unchanged
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on unchanged
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count(new);
        // SAFETY: the caller's contract, passed on unchanged
        unsafe { System.realloc(ptr, layout, new) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on unchanged
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The node's fixed allocations per lookup, at most (16 KiB measured).
const FIXED: u64 = 24 << 10;
/// Allocations per lookup, at most, whatever its size (88-91 measured): one more per request
/// on the path shows here.
const MOST: u64 = 96;
/// What grows with a table's bags beside the transport: the engine's bag bounds, 8 bytes a
/// bag (a table of 1,024 bags: 10 measured).
const PER_BAG: u64 = 10;

fn batch(bags: usize, per_bag: usize, out: OutDtype) -> OwnedBatch {
    let ids = |k: u64| (0..bags * per_bag).map(move |i| ((i as u64 * 7 + k) % ROWS) as i64);
    let tables = ["t0", "t1"].iter().zip(0..).map(|(t, k)| {
        let ids = ids(k).collect::<Vec<_>>();
        OwnedLookup::with_lengths(*t, ids, vec![per_bag as i64; bags])
    });
    OwnedBatch {
        out,
        ..OwnedBatch::new(tables.collect())
    }
}

#[test]
fn a_warm_lookup_allocates_the_transports_buffers_and_a_fixed_amount() {
    let dir = tempfile::tempdir().unwrap();
    let mut stores = Stores::new();
    let store = open(&build(dir.path()), "tier = \"dram\"");
    stores.insert("s", store).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| NODE.with(|n| n.set(true)))
        .build()
        .unwrap();
    let node = Node::start_on(
        runtime,
        "127.0.0.1:0".parse().unwrap(),
        stores,
        NodeConfig::default(),
    );
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("http://{}", node.addr);
    let mut client = client_rt
        .block_on(nearrec_wire::v1::node_client::NodeClient::connect(url))
        .unwrap();
    let mut counts = Vec::new();
    // 2,560 ids run on the async worker, 40,960 on a blocking thread
    for (bags, out) in [
        (64, OutDtype::F32),
        (64, OutDtype::Bf16),
        (1024, OutDtype::F32),
    ] {
        let req = request("s", &batch(bags, 20, out), false, 1);
        let mut call = || (client_rt.block_on(client.lookup(req.clone())).unwrap()).into_inner();
        let answer = (0..50).map(|_| call()).last().unwrap().encoded_len() as u64;
        let n = 200;
        let (c0, b0) = (CALLS.load(Relaxed), BYTES.load(Relaxed));
        for _ in 0..n {
            call();
        }
        let calls = (CALLS.load(Relaxed) - c0) / n;
        let bytes = (BYTES.load(Relaxed) - b0) / n;
        let transport = 3 * req.encoded_len() as u64 + answer;
        let beside = bytes.saturating_sub(transport);
        eprintln!(
            "{bags} bags, {out:?}: {calls} allocations, {bytes} bytes a lookup, {beside} beside the transport's"
        );
        assert!(
            beside <= FIXED + PER_BAG * 2 * bags as u64,
            "{bags} bags ({out:?}): {bytes} bytes allocated a lookup, {beside} beyond the \
             transport's buffers ({transport}): an array per request is back"
        );
        assert!(
            calls <= MOST,
            "{bags} bags ({out:?}): {calls} allocations a lookup, over {MOST}"
        );
        counts.push(calls);
    }
    // as many allocations whatever the request's size: none per table, bag or id
    assert!(
        counts[2] <= counts[0] + 8,
        "allocations a lookup: {counts:?}"
    );
}
