//! The node end to end on loopback: a server on a free port, the generated client against it.
//! Answers over the network equal the embedded store's, bit for bit, on both tiers (pooled,
//! raw, streamed); errors arrive with their kind, table and position; the node's own refusals
//! (unknown store, expired deadline, full queue) have their codes; health and reflection answer.

use nearrec::prelude::*;
use std::sync::Arc;
use std::time::Duration;

use nearrec::{AsBatch, ErrorKind, IndexVec, OwnedBags, OwnedBatch, OwnedLookup, PoolingMode};
use nearrec_server::{NodeConfig, NodeService, Shared, Stores};
use nearrec_wire::v1 as pb;
use nearrec_wire::v1::node_server::Node as _;
use nearrec_wire::{RemoteError, convert};
use tonic::Code;
use tonic::transport::Channel;

mod common;

use common::{DIM, Node, ROWS, authorized, build, open, request};

/// A random batch of `bags` bags per table, every shape of bags and pooling mode.
fn batch(seed: u64, bags: usize) -> OwnedBatch {
    let mut rng = nearrec_testkit::Xorshift::new(seed);
    let mut next = move || rng.next_u64();
    let tables = ["t0", "t1"]
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let lengths: Vec<i64> = (0..bags).map(|_| (next() % 6) as i64).collect();
            let n: i64 = lengths.iter().sum();
            let ids: Vec<i64> = (0..n).map(|_| (next() % ROWS) as i64).collect();
            let mode =
                [PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Max][(seed as usize + k) % 3];
            let mut l = if seed.is_multiple_of(2) {
                OwnedLookup::with_lengths(*t, ids.clone(), lengths.clone()).mode(mode)
            } else {
                let mut offsets = vec![0i32];
                for len in &lengths {
                    offsets.push(offsets.last().unwrap() + *len as i32);
                }
                OwnedLookup {
                    table: (*t).into(),
                    indices: IndexVec::I32(ids.iter().map(|&i| i as i32).collect()),
                    bags: OwnedBags::Offsets {
                        offsets: IndexVec::I32(offsets),
                        include_last_offset: true,
                    },
                    per_sample_weights: None,
                    mode,
                    padding_idx: None,
                }
            };
            if mode == PoolingMode::Sum && seed.is_multiple_of(3) {
                l = l.weights((0..n).map(|i| i as f32 * 0.25 - 1.0).collect());
            }
            l
        })
        .collect();
    OwnedBatch::new(tables)
}

/// Equal shapes and values; the SSD tier pools rows in the order they land, so sums may differ
/// in their last bits between two runs (fp32 sum order), nothing more.
fn same(got: &nearrec::Pooled, want: &nearrec::Pooled, what: &str) {
    assert_eq!(
        (got.batch, &got.tables),
        (want.batch, &want.tables),
        "{what}"
    );
    for (i, (a, b)) in got.values.iter().zip(&want.values).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + a.abs() + b.abs()),
            "{what}: value {i}: {a} vs {b}"
        );
    }
}

fn remote(s: &tonic::Status) -> RemoteError {
    RemoteError::from(s)
}

#[test]
fn answers_over_the_network_equal_the_embedded_stores() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let embedded = [
        open(&path, "tier = \"dram\""),
        open(&path, "tier = \"ssd\"\ndram_budget = \"4KiB\""),
    ];
    let mut stores = Stores::new();
    stores
        .insert("dram", open(&path, "tier = \"dram\""))
        .unwrap();
    stores
        .insert("ssd", open(&path, "tier = \"ssd\"\ndram_budget = \"4KiB\""))
        .unwrap();
    let node = Node::start(stores, NodeConfig::default());
    let mut client = node.client();
    for seed in 0..24u64 {
        let b = batch(seed, 1 + (seed as usize * 7) % 40);
        for (name, local) in ["dram", "ssd"].iter().zip(&embedded) {
            let want = local.lookup(&b.as_batch()).unwrap().0;
            let got = node
                .runtime
                .block_on(client.lookup(request(name, &b, false, seed)))
                .unwrap()
                .into_inner();
            assert_eq!(got.id, seed);
            let got = convert::unpooled(&got).unwrap();
            same(&got, &want, &format!("seed {seed} on {name}"));
            // raw: every distinct id once, its row as the store reads it
            let rows = node
                .runtime
                .block_on(client.lookup(request(name, &b, true, seed)))
                .unwrap()
                .into_inner();
            let rows = convert::unraw(&rows).unwrap();
            assert_eq!(rows.len(), 2);
            for (r, t) in rows.iter().zip(&b.tables) {
                let mut ids: Vec<i64> = match &t.indices {
                    IndexVec::I64(v) => v.clone(),
                    IndexVec::I32(v) => v.iter().map(|&i| i64::from(i)).collect(),
                };
                ids.sort_unstable();
                ids.dedup();
                assert_eq!(r.ids, ids);
                let mut want = vec![0f32; ids.len() * DIM as usize];
                local.read_rows(&t.table, &ids, &mut want).unwrap();
                assert_eq!(r.values, want, "raw rows of {} on {name}", t.table);
            }
        }
    }
    // a stream: answers in order, each matching its request; a bad request in the middle
    // answers with its error and the stream goes on
    let batches: Vec<OwnedBatch> = (0..12u64).map(|s| batch(s, 8)).collect();
    let mut reqs: Vec<pb::LookupRequest> = batches
        .iter()
        .enumerate()
        .map(|(i, b)| request("ssd", b, false, i as u64))
        .collect();
    reqs[5].tables[0].table = "nope".into();
    let answers: Vec<pb::LookupResponse> = node.runtime.block_on(async {
        let mut s = client
            .lookup_stream(tokio_stream::iter(reqs))
            .await
            .unwrap()
            .into_inner();
        let mut out = Vec::new();
        while let Some(a) = s.message().await.unwrap() {
            out.push(a);
        }
        out
    });
    assert_eq!(answers.len(), 12);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a.id, i as u64);
        if i == 5 {
            let e = RemoteError::from(a.error.as_ref().expect("an error"));
            assert_eq!(e.kind, Some(ErrorKind::UnknownTable));
            assert_eq!(e.table.as_deref(), Some("nope"));
            continue;
        }
        assert!(a.error.is_none());
        let want = embedded[1].lookup(&batches[i].as_batch()).unwrap().0;
        same(
            &convert::unpooled(a).unwrap(),
            &want,
            &format!("stream answer {i}"),
        );
    }
}

/// `(count, sum)` of `nearrec_request_seconds{call, stage}` in a scrape (zeros when absent).
fn stage(text: &str, call: &str, stage: &str) -> (f64, f64) {
    let labels = format!("{{call=\"{call}\",stage=\"{stage}\"}} ");
    let value = |kind: &str| {
        let prefix = format!("nearrec_request_seconds_{kind}{labels}");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0.0, |v| v.parse().unwrap())
    };
    (value("count"), value("sum"))
}

#[test]
fn every_answered_call_is_timed_by_stage() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    for (tier, toml) in [
        ("dram", "tier = \"dram\""),
        ("ssd", "tier = \"ssd\"\ndram_budget = \"4KiB\""),
    ] {
        let mut stores = Stores::new();
        stores.insert("s", open(&path, toml)).unwrap();
        let node = Node::start(stores, NodeConfig::default());
        let mut client = node.client();
        let (pooled, raw) = (10u64, 3u64);
        for seed in 0..pooled + raw {
            let b = batch(seed, 16);
            let r = request("s", &b, seed >= pooled, seed);
            node.runtime.block_on(client.lookup(r)).unwrap();
        }
        let mut bad = request("s", &batch(99, 4), false, 99);
        bad.tables[1].table = "nope".into();
        assert!(node.runtime.block_on(client.lookup(bad)).is_err());
        let text = node.scrape();
        let n = |stage_: &str| stage(&text, "Lookup", stage_).0;
        // every call waited and finished; each answer was sent; the engine's stages are those
        // of the pooled answers (raw rows are not pooled, the failed call was never routed)
        assert_eq!(n("total"), (pooled + raw + 1) as f64, "{tier}\n{text}");
        assert_eq!(n("send"), (pooled + raw) as f64, "{tier}\n{text}");
        for s in ["route", "io", "pool"] {
            assert_eq!(n(s), pooled as f64, "{s} on {tier}\n{text}");
        }
        let sum = |stage_: &str| stage(&text, "Lookup", stage_).1;
        assert!(sum("route") > 0.0 && sum("pool") > 0.0 && sum("send") > 0.0);
        if tier == "dram" {
            assert_eq!(
                sum("io"),
                0.0,
                "a DRAM-resident store never waits on a device"
            );
        } else {
            assert!(sum("io") > 0.0, "the SSD tier waited on its device\n{text}");
        }
        // the stages lie within the engine's time and the call's
        assert!(sum("route") + sum("io") + sum("pool") <= sum("engine") * 1.01);
        assert!(sum("engine") <= sum("total"));
    }
}

#[test]
fn a_call_meant_for_a_shard_the_store_is_not_is_refused_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut stores = Stores::new();
    stores.insert("s", open(&path, "tier = \"dram\"")).unwrap();
    let node = Node::start(stores, NodeConfig::default());
    let mut client = node.client();
    fn meant<T>(header: &str, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        (r.metadata_mut()).insert(nearrec_wire::SHARD_HEADER, header.parse().unwrap());
        r
    }
    let b = batch(2, 4);
    // without the header, answered; with one naming a shard, refused: the store is none
    assert!(
        node.runtime
            .block_on(client.lookup(request("s", &b, false, 0)))
            .is_ok()
    );
    let s = (node.runtime)
        .block_on(client.lookup(meant("abc/1", request("s", &b, false, 0))))
        .unwrap_err();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(remote(&s).kind, Some(ErrorKind::Unavailable));
    assert!(
        s.message().contains("meant for shard 1 of plan abc"),
        "{s:?}"
    );
    assert!(s.message().contains("is no shard of any plan"), "{s:?}");
    // a write too, and nothing of it applied
    let info = |c: &mut nearrec_wire::v1::node_client::NodeClient<Channel>, h: &str| {
        let req = pb::InfoRequest { store: "s".into() };
        node.runtime
            .block_on(c.info(meant(h, req)))
            .map(|r| r.into_inner())
    };
    let before = info(&mut client, "abc/1").unwrap().version;
    let write = pb::WriteRequest {
        store: "s".into(),
        ..Default::default()
    };
    let s = (node.runtime)
        .block_on(client.write(meant("abc/1", write)))
        .unwrap_err();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    // Info answers whatever the header says: it is how a router learns what a node serves
    assert_eq!(info(&mut client, "abc/1").unwrap().version, before);
    // a header that is not PLAN/SHARD is the caller's mistake
    for bad in ["abc", "abc/x", "/1"] {
        let s = (node.runtime)
            .block_on(client.lookup(meant(bad, request("s", &b, false, 0))))
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{bad}: {s:?}");
    }
    let text = node.scrape();
    let line = "nearrec_refused_total{reason=\"wrong_shard\"} 2";
    assert!(text.contains(line), "{line} not in\n{text}");
}

#[test]
fn errors_arrive_typed_with_their_table_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut stores = Stores::new();
    stores.insert("s", open(&path, "tier = \"dram\"")).unwrap();
    let node = Node::start(stores, NodeConfig::default());
    let mut client = node.client();
    let mut ask = |req: pb::LookupRequest| {
        node.runtime
            .block_on(client.lookup(req))
            .map(|r| r.into_inner())
    };
    let good = batch(2, 4);
    // an id out of range, named by its table and position
    let mut b = good.clone();
    b.tables[1].indices = IndexVec::I64(vec![1, 2, ROWS as i64 + 5, 3]);
    b.tables[1].bags = OwnedBags::Fixed {
        batch: 4,
        bag_size: 1,
    };
    b.tables[0].bags = OwnedBags::Fixed {
        batch: 4,
        bag_size: 0,
    };
    b.tables[0].indices = IndexVec::I64(vec![]);
    b.tables[0].per_sample_weights = None;
    b.tables[1].per_sample_weights = None;
    let s = ask(request("s", &b, false, 0)).unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    let e = remote(&s);
    assert_eq!(e.kind, Some(ErrorKind::IndexOutOfRange));
    assert_eq!((e.table.as_deref(), e.position), (Some("t1"), Some(2)));
    // malformed messages: ragged bytes, decreasing offsets, offsets past the end, no tables,
    // no bags, an unknown index type, a 2 GiB answer
    let base = request("s", &good, false, 0);
    let mut cases: Vec<(pb::LookupRequest, Code, Option<&str>)> = Vec::new();
    let mut r = base.clone();
    r.tables[0].ids = r.tables[0].ids.slice(..r.tables[0].ids.len() - 3);
    cases.push((r, Code::InvalidArgument, Some("t0")));
    let mut r = base.clone();
    r.tables[1].index_type = pb::IndexType::Int64 as i32;
    r.tables[1].ids = nearrec_wire::arrays::encode(vec![1i64, 2, 3]);
    r.tables[1].bags = Some(pb::table_lookup::Bags::Offsets(pb::Offsets {
        offsets: nearrec_wire::arrays::encode(vec![0i64, 2, 1, 3]),
        include_last_offset: false,
    }));
    r.tables[1].per_sample_weights = Default::default();
    cases.push((r.clone(), Code::InvalidArgument, Some("t1")));
    r.tables[1].bags = Some(pb::table_lookup::Bags::Offsets(pb::Offsets {
        offsets: nearrec_wire::arrays::encode(vec![0i64, 1, 9, 3]),
        include_last_offset: false,
    }));
    cases.push((r, Code::InvalidArgument, Some("t1")));
    let mut r = base.clone();
    r.tables.clear();
    cases.push((r, Code::InvalidArgument, None));
    let mut r = base.clone();
    r.tables[0].bags = None;
    cases.push((r, Code::InvalidArgument, Some("t0")));
    let mut r = base.clone();
    r.tables[0].index_type = 0;
    cases.push((r, Code::InvalidArgument, Some("t0")));
    let mut r = base.clone();
    for t in &mut r.tables {
        t.ids = Default::default();
        t.per_sample_weights = Default::default();
        t.bags = Some(pb::table_lookup::Bags::Fixed(pb::FixedBags {
            batch: 1 << 31,
            bag_size: 0,
        }));
    }
    cases.push((r, Code::InvalidArgument, Some("t0")));
    let mut r = base.clone();
    r.tables[0].table = "missing".into();
    cases.push((r, Code::NotFound, Some("missing")));
    for (i, (req, code, table)) in cases.into_iter().enumerate() {
        let s = ask(req).unwrap_err();
        assert_eq!(s.code(), code, "case {i}: {s:?}");
        let e = remote(&s);
        assert!(
            e.kind.is_some(),
            "case {i}: a nearrec error carries its kind: {s:?}"
        );
        assert_eq!(e.table.as_deref(), table, "case {i}: {s:?}");
    }
    // the node's own refusals
    let s = ask(request("other", &good, false, 0)).unwrap_err();
    assert_eq!((s.code(), remote(&s).kind), (Code::NotFound, None));
    assert!(s.message().contains("it serves: s"), "{}", s.message());
    // the node still serves
    assert!(ask(request("", &good, false, 0)).is_ok());
}

#[test]
fn an_expired_deadline_costs_no_device_read_and_a_full_queue_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut stores = Stores::new();
    stores
        .insert("s", open(&path, "tier = \"ssd\"\ndram_budget = 0"))
        .unwrap();
    let store = stores.get("s", |_| true).unwrap().1;
    let config = NodeConfig {
        max_in_flight: 1,
        max_queued: 1,
        ..NodeConfig::default()
    };
    let node = Node::start(stores, config);
    let mut client = node.client();
    let reads = || store.stats().unwrap().get("device_reads").unwrap();
    let before = reads();
    // a deadline of 1 ns has passed by the time the node looks at the request. Over the wire
    // tonic's client enforces it too (and may give up first), so the node's side is asked
    // directly, through the service the server runs
    let service = NodeService(Arc::new(Shared::new(
        {
            let mut only = Stores::new();
            only.insert("s", open(&path, "tier = \"ssd\"\ndram_budget = 0"))
                .unwrap();
            only
        },
        NodeConfig {
            max_in_flight: 1,
            max_queued: 1,
            ..NodeConfig::default()
        },
        None,
    )));
    let direct = service.0.stores.get("s", |_| true).unwrap().1;
    let direct_reads = || direct.stats().unwrap().get("device_reads").unwrap();
    let mut req = tonic::Request::new(request("s", &batch(4, 16), false, 0));
    req.metadata_mut()
        .insert("grpc-timeout", "1n".parse().unwrap());
    let s = node.runtime.block_on(service.lookup(req)).unwrap_err();
    assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
    assert_eq!(direct_reads(), 0.0, "an expired request read the device");
    assert_eq!(
        service
            .0
            .admission
            .expired
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // with a deadline it meets, the same request reads
    let mut req = tonic::Request::new(request("s", &batch(4, 16), false, 0));
    req.metadata_mut()
        .insert("grpc-timeout", "10S".parse().unwrap());
    node.runtime.block_on(service.lookup(req)).unwrap();
    assert!(direct_reads() > 0.0);
    // over the wire, a deadline that has passed is refused without a device read too
    let mut req = tonic::Request::new(request("s", &batch(4, 16), false, 0));
    req.set_timeout(Duration::from_nanos(1));
    let s = node.runtime.block_on(client.lookup(req)).unwrap_err();
    assert!(
        matches!(s.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{s:?}"
    );
    assert_eq!(reads(), before, "an expired request read the device");
    // flood: with one slot and one queue place, most of 64 concurrent requests are refused
    let b = Arc::new(batch(6, 64));
    let codes: Vec<Code> = node.runtime.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let mut c = client.clone();
                let b = b.clone();
                tokio::spawn(async move {
                    match c.lookup(request("s", &b, false, i)).await {
                        Ok(_) => Code::Ok,
                        Err(s) => s.code(),
                    }
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let refused = codes
        .iter()
        .filter(|c| **c == Code::ResourceExhausted)
        .count();
    let served = codes.iter().filter(|c| **c == Code::Ok).count();
    assert_eq!(refused + served, 64, "{codes:?}");
    assert!(refused > 0 && served >= 2, "{codes:?}");
    // and the node stays healthy
    assert!(
        node.runtime
            .block_on(client.lookup(request("s", &batch(1, 4), false, 0)))
            .is_ok()
    );
    // the refusals are counted, as a reason and as the calls' status
    let text = node.scrape();
    for line in [
        format!("nearrec_refused_total{{reason=\"overloaded\"}} {refused}"),
        format!("nearrec_requests_total{{call=\"Lookup\",code=\"ResourceExhausted\"}} {refused}"),
    ] {
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
}

/// The node's side of a lookup, through the service the server runs (no client deadline).
fn ask(
    node: &Node,
    service: &NodeService,
    req: pb::LookupRequest,
    timeout: Option<&str>,
) -> Result<pb::LookupResponse, tonic::Status> {
    let mut req = tonic::Request::new(req);
    if let Some(t) = timeout {
        req.metadata_mut()
            .insert("grpc-timeout", t.parse().unwrap());
    }
    node.runtime
        .block_on(service.lookup(req))
        .map(tonic::Response::into_inner)
}

/// `reqs` sent to `node` all at once, each on a task of its own: their answers, in order.
fn all_at_once(
    node: &Node,
    reqs: Vec<pb::LookupRequest>,
) -> Vec<Result<pb::LookupResponse, tonic::Status>> {
    let client = node.client();
    node.runtime.block_on(async {
        let tasks: Vec<_> = (reqs.into_iter())
            .map(|req| {
                let mut c = client.clone();
                tokio::spawn(async move { c.lookup(req).await.map(tonic::Response::into_inner) })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    })
}

/// The engine batches the node's coalesced lookups ran as (`nearrec_batch_requests_count`).
fn engine_batches(node: &Node) -> f64 {
    (node.scrape().lines())
        .find_map(|l| l.strip_prefix("nearrec_batch_requests_count "))
        .expect("nearrec_batch_requests_count")
        .parse()
        .unwrap()
}

#[test]
fn small_lookups_that_read_the_device_coalesce_and_answer_as_if_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    for tier in ["tier = \"dram\"", "tier = \"ssd\"\ndram_budget = \"4KiB\""] {
        let local = open(&path, tier);
        let mut stores = Stores::new();
        stores.insert("s", open(&path, tier)).unwrap();
        let config = NodeConfig {
            coalesce_bags: 64,
            coalesce_window: Duration::from_millis(20),
            ..NodeConfig::default()
        };
        let node = Node::start(stores, config);
        // 48 concurrent small requests of three shapes; one asks for a row past the end
        let batches: Vec<OwnedBatch> = (0..48u64)
            .map(|s| batch(s % 3 * 2, 1 + s as usize % 5))
            .collect();
        let mut bad = batches[7].clone();
        if let IndexVec::I64(ids) = &mut bad.tables[1].indices {
            ids.push(ROWS as i64 + 3);
        }
        if let OwnedBags::Lengths(IndexVec::I64(l)) = &mut bad.tables[1].bags {
            *l.last_mut().unwrap() += 1;
        }
        let mut all = batches.clone();
        all[7] = bad;
        let reqs = (all.iter().enumerate()).map(|(i, b)| request("s", b, false, i as u64));
        let answers = all_at_once(&node, reqs.collect());
        for (i, (a, b)) in answers.iter().zip(&batches).enumerate() {
            if i == 7 {
                let e = remote(a.as_ref().unwrap_err());
                assert_eq!(e.kind, Some(ErrorKind::IndexOutOfRange), "{e:?}");
                assert_eq!(e.table.as_deref(), Some("t1"));
                continue;
            }
            let a = a.as_ref().unwrap();
            assert_eq!(a.id, i as u64);
            let want = local.lookup(&b.as_batch()).unwrap().0;
            same(
                &convert::unpooled(a).unwrap(),
                &want,
                &format!("request {i}"),
            );
        }
        // on the SSD tier fewer engine batches than requests: they coalesced; DRAM-resident
        // lookups run at once, each alone
        let count = engine_batches(&node);
        if tier == "tier = \"dram\"" {
            assert_eq!(count, 0.0, "DRAM-resident lookups do not coalesce");
            continue;
        }
        assert!(
            (1.0..40.0).contains(&count),
            "{count} engine batches for 48 requests"
        );
        // a request whose deadline passes while it waits for company answers DEADLINE_EXCEEDED
        let service = NodeService(Arc::new(Shared::new(
            {
                let mut only = Stores::new();
                only.insert("s", open(&path, tier)).unwrap();
                only
            },
            NodeConfig {
                coalesce_bags: 64,
                coalesce_window: Duration::from_millis(300),
                ..NodeConfig::default()
            },
            None,
        )));
        let s = ask(
            &node,
            &service,
            request("s", &batch(2, 3), false, 0),
            Some("20m"),
        )
        .unwrap_err();
        assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
        // and batches of coalesce_bags or more run alone, at once
        let big = batch(2, 64);
        let got = ask(&node, &service, request("s", &big, false, 1), Some("200m")).unwrap();
        same(
            &convert::unpooled(&got).unwrap(),
            &local.lookup(&big.as_batch()).unwrap().0,
            "big",
        );
    }
}

#[test]
fn lookups_pinned_to_a_version_coalesce_only_with_their_own_and_read_it() {
    let dir = tempfile::tempdir().unwrap();
    // a repository of two versions of the store: version 2 is version 1 negated
    let repo = nearrec::format::Repository::create(&dir.path().join("repo")).unwrap();
    let tables = [
        ("t0", ROWS, DIM, nearrec::format::DType::Fp32),
        ("t1", ROWS, DIM, nearrec::format::DType::Fp16),
    ];
    for (k, sign) in [(1u64, 1.0f32), (2, -1.0)] {
        let built =
            nearrec_testkit::write_store(dir.path().join(format!("v{k}")), &tables, |t, i| {
                sign * nearrec_testkit::pattern(t, i)
            });
        repo.publish(&built, nearrec::format::Publish::Move)
            .unwrap();
    }
    repo.set_pointer(&nearrec::format::Pointer {
        current: 1,
        history: vec![],
    })
    .unwrap();
    let tier = "tier = \"ssd\"\ndram_budget = \"4KiB\"";
    let store = open(repo.path(), tier);
    store
        .stage(&nearrec::SwapTo::Version(2), false, false)
        .unwrap();
    let mut stores = Stores::new();
    stores.insert("s", store).unwrap();
    let config = NodeConfig {
        coalesce_bags: 64,
        coalesce_window: Duration::from_millis(20),
        ..NodeConfig::default()
    };
    let node = Node::start(stores, config);
    let client = node.client();
    let local = [1, 2].map(|v| open(&repo.version_path(v), tier));
    // 36 concurrent small requests, a third pinned to each version, a third to none
    let pins = [0u64, 1, 2];
    let batches: Vec<OwnedBatch> = (0..36u64)
        .map(|s| batch(s % 2, 1 + s as usize % 4))
        .collect();
    let reqs = (batches.iter().enumerate()).map(|(i, b)| pb::LookupRequest {
        at_version: pins[i % 3],
        ..request("s", b, false, i as u64)
    });
    let answers = all_at_once(&node, reqs.collect());
    for (i, (a, b)) in answers.iter().zip(&batches).enumerate() {
        let a = a.as_ref().unwrap();
        let want = local[usize::from(pins[i % 3] == 2)]
            .lookup(&b.as_batch())
            .unwrap()
            .0;
        same(
            &convert::unpooled(a).unwrap(),
            &want,
            &format!("request {i}"),
        );
    }
    let count = engine_batches(&node);
    assert!(
        (3.0..36.0).contains(&count),
        "{count} engine batches for 36 requests"
    );
    // a version the store does not hold: refused, typed, not answered from another
    let mut req = request("s", &batches[0], false, 0);
    req.at_version = 3;
    let s = node
        .runtime
        .block_on(client.clone().lookup(req))
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert_eq!(remote(&s).kind, Some(ErrorKind::VersionNotServed), "{s:?}");
}

#[test]
fn health_and_reflection_answer_and_info_describes_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut stores = Stores::new();
    stores.insert("s", open(&path, "tier = \"dram\"")).unwrap();
    let node = Node::start(stores, NodeConfig::default());
    let channel = node
        .runtime
        .block_on(
            Channel::from_shared(format!("http://{}", node.addr))
                .unwrap()
                .connect(),
        )
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "nearrec.v1.Node"] {
        let r = node
            .runtime
            .block_on(health.check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            }))
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
    }
    let info = node
        .runtime
        .block_on(node.client().info(pb::InfoRequest {
            store: String::new(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(info.store, "s");
    assert_eq!(info.stores, vec!["s".to_owned()]);
    let tables: Vec<(String, u64, u32, String)> = info
        .tables
        .iter()
        .map(|t| (t.name.clone(), t.rows, t.dim, t.dtype.clone()))
        .collect();
    assert_eq!(
        tables,
        vec![
            ("t0".into(), ROWS, DIM, "fp32".into()),
            ("t1".into(), ROWS, DIM, "fp16".into())
        ]
    );
    assert!(!info.writable && !info.model);
}

#[test]
fn readyz_answers_ready_while_serving_and_not_once_the_drain_begins() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut stores = Stores::new();
    stores.insert("s", open(&path, "tier = \"dram\"")).unwrap();
    let config = NodeConfig {
        drain_timeout: Duration::from_secs(3),
        ..NodeConfig::default()
    };
    let mut node = Node::start(stores, config);
    let (status, body) = common::get(node.metrics, "/readyz");
    assert_eq!((status, body.ends_with("ready\n")), (200, true), "{body}");
    assert_eq!(common::get(node.metrics, "/healthz").0, 200);
    // a stream held open keeps the drain going: meanwhile the node is alive but not ready
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::LookupRequest>(1);
    let mut client = node.client();
    let _answers = node
        .runtime
        .block_on(client.lookup_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .unwrap();
    node.begin_drain();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let (status, body) = common::get(node.metrics, "/readyz");
        if status == 503 {
            assert!(body.contains("draining"), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still ready while draining: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(common::get(node.metrics, "/healthz").0, 200);
    drop(tx);
}

#[test]
fn writes_over_the_network_are_seen_by_the_next_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut stores = Stores::new();
    let writable = "tier = \"ssd\"\nwritable = true\ndram_budget = \"4KiB\"";
    stores.insert("s", open(&path, writable)).unwrap();
    let store = stores.get("s", |_| true).unwrap().1;
    let node = Node::start(stores, NodeConfig::default());
    let mut c = node.client();
    let rt = &node.runtime;
    let ids = vec![3i64, 7, 399];
    let rows: Vec<f32> = (0..ids.len() * DIM as usize)
        .map(|i| i as f32 + 0.5)
        .collect();
    let v = rt
        .block_on(c.write(pb::WriteRequest {
            store: "s".into(),
            writes: vec![pb::TableRows {
                table: "t0".into(),
                ids: nearrec_wire::arrays::encode(ids.clone()),
                rows: nearrec_wire::arrays::encode(rows.clone()),
                remove: false,
                encoded: false,
            }],
            allow_nonfinite: false,
        }))
        .unwrap()
        .into_inner()
        .version;
    assert_eq!(v, store.version().unwrap());
    let one = OwnedBatch::new(vec![OwnedLookup::with_lengths(
        "t0",
        ids.clone(),
        vec![1i64; 3],
    )]);
    let got = rt
        .block_on(c.lookup(request("s", &one, false, 0)))
        .unwrap()
        .into_inner();
    assert!(got.version >= v);
    assert_eq!(convert::unpooled(&got).unwrap().values, rows);
    // a NaN is refused by default, named by its table; nothing is applied
    let s = rt
        .block_on(c.write(pb::WriteRequest {
            store: "s".into(),
            writes: vec![pb::TableRows {
                table: "t0".into(),
                ids: nearrec_wire::arrays::encode(vec![1i64]),
                rows: nearrec_wire::arrays::encode(vec![f32::NAN; DIM as usize]),
                remove: false,
                encoded: false,
            }],
            allow_nonfinite: false,
        }))
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(remote(&s).table.as_deref(), Some("t0"));
    assert_eq!(store.version().unwrap(), v);
    // remove, create, drop
    rt.block_on(c.remove(pb::RemoveRequest {
        store: "s".into(),
        table: "t0".into(),
        ids: nearrec_wire::arrays::encode(vec![7i64]),
    }))
    .unwrap();
    let got = rt
        .block_on(c.lookup(request("s", &one, false, 0)))
        .unwrap()
        .into_inner();
    let got = convert::unpooled(&got).unwrap().values;
    assert!(
        got[8..16].iter().all(|&x| x == 0.0),
        "a removed row pools as zeros"
    );
    rt.block_on(c.create_table(pb::CreateTableRequest {
        store: "s".into(),
        name: "t9".into(),
        rows: 10,
        dim: 4,
        dtype: "fp16".into(),
        init: "zeros".into(),
        seed: 0,
    }))
    .unwrap();
    let info = rt
        .block_on(c.info(pb::InfoRequest::default()))
        .unwrap()
        .into_inner();
    assert!(
        info.tables
            .iter()
            .any(|t| t.name == "t9" && t.dtype == "fp16")
    );
    rt.block_on(c.drop_table(pb::DropTableRequest {
        store: "s".into(),
        name: "t9".into(),
    }))
    .unwrap();
    let s = rt
        .block_on(c.drop_table(pb::DropTableRequest {
            store: "s".into(),
            name: "t9".into(),
        }))
        .unwrap_err();
    assert_eq!(remote(&s).kind, Some(ErrorKind::UnknownTable));
}

#[test]
fn a_read_only_store_refuses_writes_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut stores = Stores::new();
    stores.insert("s", open(&path, "tier = \"dram\"")).unwrap();
    let node = Node::start(stores, NodeConfig::default());
    let s = node
        .runtime
        .block_on(node.client().remove(pb::RemoveRequest {
            store: "s".into(),
            table: "t0".into(),
            ids: nearrec_wire::arrays::encode(vec![1i64]),
        }))
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert_eq!(remote(&s).kind, Some(ErrorKind::StoreReadOnly));
}

#[test]
fn the_acl_names_who_may_read_write_and_administer_which_tables() {
    use nearrec_server::acl::token_hash;
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[principal.reader]\ntoken_sha256 = \"{}\"\nread = [\"s/t0\"]\n\n\
             [principal.writer]\ntoken_sha256 = \"{}\"\nread = [\"*\"]\nwrite = [\"s/t*\"]\n",
            token_hash("reader-token"),
            token_hash("writer-token")
        ),
    )
    .unwrap();
    let mut stores = Stores::new();
    stores
        .insert("s", open(&path, "tier = \"dram\"\nwritable = true"))
        .unwrap();
    let node = Node::start(
        stores,
        NodeConfig {
            acl: Some(acl.clone()),
            ..NodeConfig::default()
        },
    );
    let mut c = node.client();
    let rt = &node.runtime;
    let t0 = OwnedBatch::new(vec![OwnedLookup::with_lengths(
        "t0",
        vec![1i64, 2],
        vec![2i64],
    )]);
    let both = batch(3, 4);
    let write = pb::WriteRequest {
        store: "s".into(),
        writes: vec![pb::TableRows {
            table: "t1".into(),
            ids: nearrec_wire::arrays::encode(vec![1i64]),
            rows: nearrec_wire::arrays::encode(vec![0.5f32; DIM as usize]),
            remove: false,
            encoded: false,
        }],
        allow_nonfinite: false,
    };
    let code = |r: Result<tonic::Response<pb::LookupResponse>, tonic::Status>| {
        r.map(|_| ()).map_err(|s| s.code())
    };
    // no token, a wrong token
    let no = rt.block_on(c.lookup(authorized(request("s", &t0, false, 0), None)));
    assert_eq!(code(no), Err(Code::Unauthenticated));
    let wrong = rt.block_on(c.lookup(authorized(request("s", &t0, false, 0), Some("guess"))));
    assert_eq!(code(wrong), Err(Code::Unauthenticated));
    // the reader reads t0, not t1; writes nothing
    let ok = rt.block_on(c.lookup(authorized(
        request("s", &t0, false, 0),
        Some("reader-token"),
    )));
    assert_eq!(code(ok), Ok(()));
    let s = rt
        .block_on(c.lookup(authorized(
            request("s", &both, false, 0),
            Some("reader-token"),
        )))
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    assert!(s.message().contains("\"t1\""), "{}", s.message());
    assert!(
        !s.message().contains("reader-token"),
        "a refusal shows no token"
    );
    let s = rt
        .block_on(c.write(authorized(write.clone(), Some("reader-token"))))
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    // the writer writes t1 and reads everything, but administers nothing
    rt.block_on(c.write(authorized(write, Some("writer-token"))))
        .unwrap();
    let s = rt
        .block_on(c.drop_table(authorized(
            pb::DropTableRequest {
                store: "s".into(),
                name: "t1".into(),
            },
            Some("writer-token"),
        )))
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    // health answers without a token
    let channel = rt
        .block_on(
            Channel::from_shared(format!("http://{}", node.addr))
                .unwrap()
                .connect(),
        )
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    assert!(
        rt.block_on(health.check(tonic_health::pb::HealthCheckRequest::default()))
            .is_ok()
    );
    // the refusals are counted, by reason and by call and status
    let text = node.scrape();
    for line in [
        "nearrec_refused_total{reason=\"unauthenticated\"} 2",
        "nearrec_refused_total{reason=\"permission_denied\"} 3",
        "nearrec_requests_total{call=\"Lookup\",code=\"Unauthenticated\"} 2",
        "nearrec_requests_total{call=\"Lookup\",code=\"PermissionDenied\"} 1",
        "nearrec_requests_total{call=\"Lookup\",code=\"Ok\"} 1",
        "nearrec_requests_total{call=\"Write\",code=\"Ok\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert!(!text.contains("reader-token") && !text.contains("writer-token"));
}
