//! What probing the node found, tried against it as the probe tried it: a client that opens
//! its HTTP/2 window to 0 and never reads, silent and half-open connections, a connection flood
//! under a 1,024-descriptor limit, a revoked token on an open stream (ACL edited + SIGHUP), a
//! swap outside the node's root or exposing tables the caller may not read, store names a
//! principal should not learn, echoed names of 100k characters, `grpc-timeout`s of `0n`, a
//! table larger than the disk, a metrics endpoint on every interface without an ACL; what
//! hardening added after: shape limits, principals' shares (large lookups held to them too),
//! tricklers.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Node, authorized, build, open, request};
use nearrec::{OwnedBatch, OwnedLookup};
use nearrec_server::acl::token_hash;
use nearrec_server::{NodeConfig, Stores};
use nearrec_wire::v1 as pb;
use tonic::Code;
use tonic::codegen::{Bytes, http};

/// A node serving the store at `path` as `s`, opened as `toml` says, with `config`.
fn node_of(path: &Path, toml: &str, config: NodeConfig) -> Node {
    let mut stores = Stores::new();
    stores.insert("s", open(path, toml)).unwrap();
    Node::start(stores, config)
}

/// A gRPC message as it travels: uncompressed flag, big-endian length, the message.
fn framed(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.into()
}

/// A raw HTTP/2 connection to `addr` whose streams open with `window` bytes of room for the
/// node's answers (0: the node may send none).
async fn raw_client(addr: SocketAddr, window: u32) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Sends `message` to `method` with `headers`; returns the answer's head (its body unread).
async fn raw_call(
    client: &mut h2::client::SendRequest<Bytes>,
    method: &str,
    headers: &[(&str, &str)],
    message: &impl prost::Message,
) -> http::Response<h2::RecvStream> {
    let mut req = grpc_head(method);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut ready = client.clone().ready().await.unwrap();
    let (answer, mut body) = ready.send_request(req.body(()).unwrap(), false).unwrap();
    // the node may answer on the head alone (a deadline passed on arrival) and close the stream
    // before the body is sent: the answer is what the call checks
    let _ = body.send_data(framed(message), true);
    answer.await.unwrap()
}

/// The head of a gRPC call of the node's `method`, as a stock client sends it.
fn grpc_head(method: &str) -> http::request::Builder {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://node/nearrec.v1.Node/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
}

/// The `grpc-status` of an answer that ended with its head (a refusal), if it did.
fn refused_with(head: &http::Response<h2::RecvStream>) -> Option<i32> {
    head.headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

/// A lookup of `bags` one-id bags on both tables: an answer of `bags × 16` floats.
fn lookup_of(bags: usize) -> pb::LookupRequest {
    let ids: Vec<i64> = (0..bags as i64).map(|i| i % 400).collect();
    let lookups = ["t0", "t1"]
        .map(|t| OwnedLookup::with_lengths(t, ids.clone(), vec![1i64; bags]))
        .to_vec();
    request("s", &OwnedBatch::new(lookups), false, 0)
}

/// The value of the metric line starting with `name` in a scrape (0 if absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

#[test]
fn a_client_that_never_reads_pins_at_most_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_of(
        &build(dir.path()),
        "tier = \"dram\"",
        NodeConfig {
            max_message_bytes: 2 << 20,
            max_unsent_bytes_per_connection: 4 << 20,
            max_unsent_bytes: 6 << 20,
            ..NodeConfig::default()
        },
    );
    let rt = &node.runtime;
    // answers of 1 MiB each; the connection's budget holds four
    let big = lookup_of(16_384);
    let (pending, refused) = rt.block_on(async {
        let mut sink = raw_client(node.addr, 0).await;
        let mut heads = Vec::new();
        for _ in 0..10 {
            heads.push(raw_call(&mut sink, "Lookup", &[], &big).await);
        }
        let refused: Vec<i32> = heads.iter().filter_map(refused_with).collect();
        // the sink keeps its connection (and its unread answers) open meanwhile
        (heads, refused)
    });
    assert_eq!(refused, vec![Code::ResourceExhausted as i32; 6]);
    assert_eq!(pending.len() - refused.len(), 4);
    let text = node.scrape();
    assert_eq!(
        metric(&text, "nearrec_refused_total{reason=\"unsent_bytes\"}"),
        6.0
    );
    // the requests waiting to send keep their places in the node
    assert_eq!(metric(&text, "nearrec_in_flight "), 4.0, "{text}");
    // another client is served: the node's budget has room for two more such answers
    let mut c = node.client();
    for _ in 0..2 {
        rt.block_on(c.lookup(big.clone())).unwrap();
    }
    // the sink gone, its answers go with it
    drop(pending);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&node.scrape(), "nearrec_in_flight ") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "the sink's answers are still held"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads from `c` until the node closes it (end of stream or a reset); `Err` after `within`.
fn closed_within(c: &mut TcpStream, within: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    c.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return Ok(start.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Ok(start.elapsed());
            }
            Err(e) => return Err(format!("still open after {:?}: {e}", start.elapsed())),
        }
    }
}

#[test]
fn silent_and_half_open_connections_are_closed_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_of(
        &build(dir.path()),
        "tier = \"dram\"",
        NodeConfig {
            // short, but with room for a loaded machine: a live client has the handshake
            // timeout to answer each ping
            handshake_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(2),
            ..NodeConfig::default()
        },
    );
    let limit = Duration::from_secs(10);
    // nothing at all; half a preface
    let mut silent = TcpStream::connect(node.addr).unwrap();
    let mut half = TcpStream::connect(node.addr).unwrap();
    half.write_all(b"PRI * HTTP/2.0\r\n").unwrap();
    // a whole preface and SETTINGS, then silence: no answer to the node's pings
    let mut mute = TcpStream::connect(node.addr).unwrap();
    mute.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .unwrap();
    for (what, c) in [
        ("silent", &mut silent),
        ("half", &mut half),
        ("mute", &mut mute),
    ] {
        closed_within(c, limit).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let text = node.scrape();
    assert!(
        metric(
            &text,
            "nearrec_connections_closed_total{reason=\"timed_out\"}"
        ) >= 2.0,
        "{text}"
    );
    // a live client idle for longer than the idle timeout answers the pings and keeps its
    // connection
    node.runtime.block_on(async {
        let mut live = raw_client(node.addr, 1 << 20).await;
        let head = raw_call(&mut live, "Lookup", &[], &lookup_of(2)).await;
        assert_eq!(refused_with(&head), None);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let head = raw_call(&mut live, "Lookup", &[], &lookup_of(2)).await;
        assert_eq!(refused_with(&head), None);
    });
}

/// Issue 62, item 12: a request whose protobuf does not decode was answered `INTERNAL`, the
/// code of the node's own faults; it is the caller's mistake, `INVALID_ARGUMENT`.
#[test]
fn a_request_that_does_not_decode_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_of(&build(dir.path()), "tier = \"dram\"", NodeConfig::default());
    node.runtime.block_on(async {
        let client = raw_client(node.addr, 1 << 20).await;
        let req = grpc_head("Lookup").body(()).unwrap();
        let mut ready = client.ready().await.unwrap();
        let (answer, mut body) = ready.send_request(req, false).unwrap();
        // a frame holding a field of wire type 7, which does not exist
        body.send_data(Bytes::from_static(&[0, 0, 0, 0, 2, 0x0f, 0x01]), true)
            .unwrap();
        let head = answer.await.unwrap();
        let status = match refused_with(&head) {
            Some(code) => code,
            None => {
                let mut body = head.into_body();
                while body.data().await.is_some() {}
                let trailers = body.trailers().await.unwrap().unwrap();
                trailers["grpc-status"].to_str().unwrap().parse().unwrap()
            }
        };
        assert_eq!(status, Code::InvalidArgument as i32);
    });
}

#[test]
fn deadlines_passed_on_arrival_are_deadline_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_of(&build(dir.path()), "tier = \"ssd\"", NodeConfig::default());
    node.runtime.block_on(async {
        let mut c = raw_client(node.addr, 1 << 20).await;
        for timeout in ["0n", "1n", "0m", "0S", "1u"] {
            let head = raw_call(
                &mut c,
                "Lookup",
                &[("grpc-timeout", timeout)],
                &lookup_of(4),
            )
            .await;
            assert_eq!(
                refused_with(&head),
                Some(Code::DeadlineExceeded as i32),
                "{timeout}"
            );
        }
    });
}

#[test]
fn store_names_and_echoes_are_bounded_to_what_the_caller_may_know() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[principal.ranker]\ntoken_sha256 = \"{}\"\nread = [\"s/*\"]\n",
            token_hash("ranker-token")
        ),
    )
    .unwrap();
    let mut stores = Stores::new();
    for name in ["s", "secret-store"] {
        let path = build(&dir.path().join(name));
        stores.insert(name, open(&path, "tier = \"dram\"")).unwrap();
    }
    let node = Node::start(
        stores,
        NodeConfig {
            acl: Some(acl),
            ..NodeConfig::default()
        },
    );
    let mut c = node.client();
    let rt = &node.runtime;
    let token = Some("ranker-token");
    // a store the caller holds no grant on is answered as one the node does not serve
    let mut said = Vec::new();
    for name in ["nope", "secret-store"] {
        let s = rt
            .block_on(c.lookup(authorized(
                request(name, &OwnedBatch::new(vec![]), false, 0),
                token,
            )))
            .unwrap_err();
        assert_eq!(s.code(), Code::NotFound, "{name}: {}", s.message());
        assert!(s.message().ends_with("it serves: s"), "{}", s.message());
        said.push(s.message().replace(name, "NAME"));
    }
    assert_eq!(said[0], said[1]);
    let info = rt
        .block_on(c.info(authorized(pb::InfoRequest { store: "s".into() }, token)))
        .unwrap()
        .into_inner();
    assert_eq!(info.stores, vec!["s".to_owned()]);
    // a name of 100k characters comes back clipped, with its own code
    let long = "x".repeat(100_000);
    let s = rt
        .block_on(c.lookup(authorized(
            request(&long, &OwnedBatch::new(vec![]), false, 0),
            token,
        )))
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
    assert!(s.message().len() < 2048, "{}", s.message().len());
    let lookup = OwnedBatch::new(vec![OwnedLookup::with_lengths(
        long,
        vec![1i64],
        vec![1i64],
    )]);
    let s = rt
        .block_on(c.lookup(authorized(request("s", &lookup, false, 0), token)))
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{}", s.message().len());
    assert!(s.message().len() <= nearrec_wire::status::MAX_ECHO);
}

#[test]
fn a_swap_is_confined_to_its_root_and_needs_what_it_exposes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("stores");
    let served = build(&root.join("v1"));
    let next = build(&root.join("v2"));
    let outside = build(&dir.path().join("elsewhere"));
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[principal.ops]\ntoken_sha256 = \"{}\"\nread = [\"s/*\"]\nadmin = [\"s/*\"]\n\n\
             [principal.blind]\ntoken_sha256 = \"{}\"\nread = [\"s/t0\"]\nadmin = [\"s/*\"]\n",
            token_hash("ops"),
            token_hash("blind")
        ),
    )
    .unwrap();
    let node = node_of(
        &served,
        "tier = \"dram\"",
        NodeConfig {
            acl: Some(acl),
            swap_root: Some(root.clone()),
            ..NodeConfig::default()
        },
    );
    let c = node.client();
    let rt = &node.runtime;
    let swap = |path: &Path, who: &str, force: bool| {
        let req = pb::SwapRequest {
            store: "s".into(),
            path: path.to_str().unwrap().into(),
            warm: false,
            force,
            ..Default::default()
        };
        rt.block_on(c.clone().swap(authorized(req, Some(who))))
            .map(|r| r.into_inner().version)
            .map_err(|s| s.code())
    };
    // outside the served store's directory, through a link, up and out: refused
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    for path in [
        outside.clone(),
        root.join("link"),
        root.join("../elsewhere/store"),
    ] {
        assert_eq!(
            swap(&path, "ops", true),
            Err(Code::PermissionDenied),
            "{path:?}"
        );
    }
    // what the swap would expose must be readable by the caller
    assert_eq!(swap(&next, "blind", false), Err(Code::PermissionDenied));
    // a file, a NUL, nothing there: the caller's mistakes, not the node's
    std::fs::write(root.join("file"), b"x").unwrap();
    assert_eq!(
        swap(&root.join("file"), "ops", false),
        Err(Code::InvalidArgument)
    );
    assert_eq!(swap(&root.join("gone"), "ops", false), Err(Code::NotFound));
    let nul = pb::SwapRequest {
        store: "s".into(),
        path: "v2\0x".into(),
        ..Default::default()
    };
    let s = rt
        .block_on(c.clone().swap(authorized(nul, Some("ops"))))
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    // a store that would fail the served requests is refused, unless forced
    let other = root.join("other");
    let mut w = nearrec_format::StoreWriter::create(&other, Default::default()).unwrap();
    let spec = nearrec_format::TableSpec::new("t0", 400, 4, nearrec_format::DType::Fp32);
    let mut t = w.table(spec).unwrap();
    t.write_with(400, |_, out| out.fill(1.0)).unwrap();
    w.finish_table(t).unwrap();
    w.commit().unwrap();
    assert_eq!(swap(&other, "ops", false), Err(Code::InvalidArgument));
    // inside the root, readable, compatible (relative to the root too): served
    assert!(swap(&next, "ops", false).is_ok());
    assert!(swap(Path::new("v1/store"), "ops", false).is_ok());
    assert!(swap(&other, "ops", true).is_ok());
}

/// Issue 62, item 1: an admin of one store swapped it to a sibling store's directory (the old
/// default root was the served store's parent) and read the sibling's rows. A swap now reaches
/// only the store's own versions or its own root, never another served store's directory or
/// repository, whatever the root; the audit line names the directory resolved.
#[test]
fn an_admin_of_one_store_cannot_swap_it_onto_another_stores_directory() {
    let dir = tempfile::tempdir().unwrap();
    let b2 = dir.path().join("b2");
    let tables = [("t0", 40, 4, nearrec_format::DType::Fp32)];
    let repo = nearrec::format::Repository::create(&b2.join("s")).unwrap();
    let own = |v: u64| repo.version_path(v);
    let s1 = nearrec_testkit::write_store(own(1), &tables, |_, i| i as f32);
    nearrec_testkit::write_store(own(2), &tables, |_, i| -(i as f32));
    let other = nearrec_testkit::write_store(b2.join("other"), &tables, |_, _| 1e6);
    let theirs = nearrec::format::Repository::create(&b2.join("t")).unwrap();
    nearrec_testkit::write_store(theirs.version_path(1), &tables, |_, _| 7.0);
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[principal.admin_s]\ntoken_sha256 = \"{}\"\nread = [\"s/*\"]\nwrite = [\"s/*\"]\n\
             admin = [\"s/*\"]\n",
            token_hash("admin_s")
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut stores = Stores::new();
    for (name, path) in [
        ("s", &s1),
        ("other", &other),
        ("t", &theirs.version_path(1)),
    ] {
        stores.insert(name, open(path, "tier = \"dram\"")).unwrap();
    }
    let node = Node::start(
        stores,
        NodeConfig {
            acl: Some(acl),
            audit_log: Some(audit.clone()),
            ..NodeConfig::default()
        },
    );
    let (c, rt) = (node.client(), &node.runtime);
    let swap = |path: &str| {
        let req = pb::SwapRequest {
            store: "s".into(),
            path: path.into(),
            force: true,
            ..Default::default()
        };
        rt.block_on(c.clone().swap(authorized(req, Some("admin_s"))))
            .map(|r| r.into_inner().version)
            .map_err(|s| (s.code(), s.message().to_owned()))
    };
    let first = || {
        let batch = OwnedBatch::new(vec![OwnedLookup::with_lengths("t0", vec![1], vec![1])]);
        let req = authorized(request("s", &batch, false, 0), Some("admin_s"));
        let answer = rt.block_on(c.clone().lookup(req)).unwrap().into_inner();
        f32::from_le_bytes(answer.pooled[..4].try_into().unwrap())
    };
    assert_eq!(first(), 4.0); // row 1 of `s`: values 4..8
    for sibling in [
        other.to_str().unwrap(),
        "../other",
        "../t/1",
        theirs.path().to_str().unwrap(),
    ] {
        let (code, message) = swap(sibling).unwrap_err();
        assert_eq!(code, Code::PermissionDenied, "{sibling}: {message}");
        assert_eq!(first(), 4.0, "{sibling}");
    }
    drop(node);
    // the probe's own layout: two plain stores side by side, no root set. The old default
    // root, the served store's parent, reached the sibling
    let plain = nearrec_testkit::write_store(b2.join("plain"), &tables, |_, i| i as f32);
    let mut stores = Stores::new();
    stores.insert("s", open(&plain, "tier = \"dram\"")).unwrap();
    stores
        .insert("other", open(&other, "tier = \"dram\""))
        .unwrap();
    let node = Node::start(stores, NodeConfig::default());
    let req = pb::SwapRequest {
        store: "s".into(),
        path: other.to_str().unwrap().into(),
        force: true,
        ..Default::default()
    };
    let e = (node.runtime.block_on(node.client().swap(req))).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    drop(node);
    // a root over every store's directory still keeps the others out
    let mut stores = Stores::new();
    stores.insert("s", open(&s1, "tier = \"dram\"")).unwrap();
    stores
        .insert("other", open(&other, "tier = \"dram\""))
        .unwrap();
    let node = Node::start(
        stores,
        NodeConfig {
            swap_root: Some(b2.clone()),
            audit_log: Some(audit.clone()),
            ..NodeConfig::default()
        },
    );
    let (c, rt) = (node.client(), &node.runtime);
    let req = |path: &str| pb::SwapRequest {
        store: "s".into(),
        path: path.into(),
        ..Default::default()
    };
    let e = rt.block_on(c.clone().swap(req("other"))).unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // its own next version, named relative to the root: served, and audited as resolved
    rt.block_on(c.clone().swap(req("s/2"))).unwrap();
    drop(node);
    let log = std::fs::read_to_string(&audit).unwrap();
    let served = own(2).canonicalize().unwrap();
    let last = log.lines().last().unwrap();
    assert!(
        last.contains(&format!("\"what\":\"swap to {}", served.display())),
        "{last}"
    );
}

/// Issue 62, item 2: with the audit log's file system full, every write was applied while its
/// audit lines were lost. With `audit_required` a change whose attempt line cannot be written is
/// refused, `UNAVAILABLE` naming the log, and nothing of it is applied; without, the log fails
/// open and counts what it lost.
#[test]
fn a_change_that_cannot_be_audited_is_refused_when_the_audit_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let write = |c: &mut pb::node_client::NodeClient<_>, rt: &tokio::runtime::Runtime, v: f32| {
        let req = pb::WriteRequest {
            store: "s".into(),
            writes: vec![pb::TableRows {
                table: "t0".into(),
                ids: nearrec_wire::arrays::encode(vec![1i64]),
                rows: nearrec_wire::arrays::encode(vec![v; 8]),
                remove: false,
                encoded: false,
            }],
            allow_nonfinite: false,
        };
        rt.block_on(c.write(req)).map(|_| ())
    };
    let row1 = |c: &mut pb::node_client::NodeClient<_>, rt: &tokio::runtime::Runtime| {
        let batch = OwnedBatch::new(vec![OwnedLookup::with_lengths("t0", vec![1], vec![1])]);
        let answer = rt
            .block_on(c.lookup(request("s", &batch, false, 0)))
            .unwrap();
        f32::from_le_bytes(answer.into_inner().pooled[..4].try_into().unwrap())
    };
    for required in [true, false] {
        let node = node_of(
            &path,
            "tier = \"dram\"\nwritable = true",
            NodeConfig {
                audit_log: Some("/dev/full".into()), // every write: ENOSPC
                audit_required: required,
                ..NodeConfig::default()
            },
        );
        let (mut c, rt) = (node.client(), &node.runtime);
        let before = row1(&mut c, rt);
        let answer = write(&mut c, rt, 42.0);
        if required {
            let s = answer.unwrap_err();
            assert_eq!(s.code(), Code::Unavailable, "{s:?}");
            assert!(s.message().contains("/dev/full"), "{s:?}");
            assert_eq!(row1(&mut c, rt), before, "nothing of the write applied");
        } else {
            answer.unwrap();
            assert_eq!(row1(&mut c, rt), 42.0);
            let lost = metric(&node.scrape(), "nearrec_audit_lines_failed_total");
            assert!(lost >= 1.0, "{lost}");
        }
    }
}

/// A cross-shard write's steps are writes: a prepare needs write of its tables, every other
/// step (commit, abort, forget, the list of what the store holds) write of the whole store; a
/// transaction's id that is not 16 bytes, or a step the node does not know, is the caller's
/// mistake.
#[test]
fn a_transactions_steps_need_write_and_a_bad_id_is_refused() {
    use pb::transaction_request::Step;
    let dir = tempfile::tempdir().unwrap();
    let served = build(dir.path());
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[principal.trainer]
token_sha256 = \"{}\"
read = [\"s/*\"]
write = [\"s/*\"]

             [principal.partial]
token_sha256 = \"{}\"
read = [\"s/*\"]
write = [\"s/t0\"]

             [principal.ranker]
token_sha256 = \"{}\"
read = [\"s/*\"]
",
            token_hash("trainer"),
            token_hash("partial"),
            token_hash("ranker")
        ),
    )
    .unwrap();
    let node = node_of(
        &served,
        "tier = \"dram\"\nwritable = true",
        NodeConfig {
            acl: Some(acl),
            ..NodeConfig::default()
        },
    );
    let c = node.client();
    let rt = &node.runtime;
    let row = |table: &str| pb::TableRows {
        table: table.into(),
        ids: 3i64.to_le_bytes().to_vec().into(),
        rows: [0.5f32; 8]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
        remove: false,
        encoded: false,
    };
    let step = |who: &str, step: Step, tx: &[u8], writes: Vec<pb::TableRows>| {
        let req = pb::TransactionRequest {
            store: "s".into(),
            tx: tx.to_vec().into(),
            step: step as i32,
            writes,
            ..Default::default()
        };
        rt.block_on(c.clone().transaction(authorized(req, Some(who))))
            .map(|r| r.into_inner())
            .map_err(|s| s.code())
    };
    let tx = 7u128.to_le_bytes();
    // read only: no step at all, not even the list
    assert_eq!(
        step("ranker", Step::List, &[], vec![]).unwrap_err(),
        Code::PermissionDenied
    );
    assert_eq!(
        step("ranker", Step::Prepare, &tx, vec![row("t0")]).unwrap_err(),
        Code::PermissionDenied
    );
    // write of t0 alone: its prepare of t0, not of t1, and no step of the whole store
    assert_eq!(
        step("partial", Step::Prepare, &tx, vec![row("t1")]).unwrap_err(),
        Code::PermissionDenied
    );
    assert!(step("partial", Step::Prepare, &tx, vec![row("t0")]).is_ok());
    assert_eq!(
        step("partial", Step::Commit, &tx, vec![]).unwrap_err(),
        Code::PermissionDenied
    );
    assert_eq!(
        step("partial", Step::List, &[], vec![]).unwrap_err(),
        Code::PermissionDenied
    );
    // write of the store: the list shows it, the commit serves it
    let listed = step("trainer", Step::List, &[], vec![]).unwrap();
    assert_eq!(listed.transactions.len(), 1);
    assert_eq!(listed.transactions[0].state, "prepared");
    let v = step("trainer", Step::Commit, &tx, vec![]).unwrap().version;
    assert!(v > 0);
    // an id of another length, a step past the enum: the caller's mistakes
    assert_eq!(
        step("trainer", Step::Commit, &[1, 2, 3], vec![]).unwrap_err(),
        Code::InvalidArgument
    );
    let odd = pb::TransactionRequest {
        store: "s".into(),
        tx: tx.to_vec().into(),
        step: 99,
        ..Default::default()
    };
    let s = rt
        .block_on(c.clone().transaction(authorized(odd, Some("trainer"))))
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
}

#[test]
fn a_table_larger_than_the_disk_is_refused_at_once_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let toml = "tier = \"dram\"\nwritable = true";
    let node = node_of(&path, toml, NodeConfig::default());
    let files = || std::fs::read_dir(&path).unwrap().count();
    let before = files();
    let req = pb::CreateTableRequest {
        store: "s".into(),
        name: "huge".into(),
        rows: 1 << 44,
        dim: 64,
        ..Default::default()
    };
    let s = node
        .runtime
        .block_on(node.client().create_table(req))
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    assert!(s.message().contains("free"), "{}", s.message());
    assert_eq!(files(), before, "a refused table leaves no file");
}

/// The `nearrec-server` binary, started as an operator starts it; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    /// Lines the node logs (stderr), as they come.
    log: std::sync::mpsc::Receiver<String>,
}

impl Server {
    /// Starts the binary with `args`; `nofile`: its descriptor limit, soft and hard.
    fn start(args: &[&str], nofile: Option<u64>) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nearrec-server"));
        cmd.args(args)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit only, between fork and exec
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "nearrec-server listening on ADDR (stores: ...); metrics on http://ADDR/metrics"
        let addr = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        let metrics = line
            .rsplit("http://")
            .next()
            .unwrap()
            .trim()
            .trim_end_matches("/metrics")
            .parse()
            .unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Self {
            child,
            addr,
            metrics,
            log,
        }
    }

    fn scrape(&self) -> String {
        common::scrape(self.metrics)
    }

    /// Waits for a log line holding `text`.
    fn logged(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(l) if l.contains(text) => return,
                Ok(_) => {}
                Err(e) => panic!("no log line with {text:?}: {e}"),
            }
        }
    }

    /// CPU seconds the node has used (user + system).
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        // utime and stime: fields 14 and 15 of the line, 12 and 13 after the command
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        // SAFETY: sysconf reads a constant
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This process's descriptor limit raised to its hard limit (the flood needs more than 1,024).
fn raise_own_nofile() -> u64 {
    nearrec_server::conns::raise_nofile().unwrap()
}

#[test]
fn a_connection_flood_under_a_1024_descriptor_limit_leaves_clients_served() {
    if raise_own_nofile() < 2048 {
        eprintln!("skipped: this process may not open 2,048 descriptors");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let store = format!("{}=s", path.display());
    let node = Server::start(&[&store, "--handshake-timeout", "30"], Some(1024));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut client = rt
        .block_on(pb::node_client::NodeClient::connect(format!(
            "http://{}",
            node.addr
        )))
        .unwrap();
    let small = lookup_of(4);
    rt.block_on(client.lookup(small.clone())).unwrap();
    let cpu = node.cpu_seconds();
    let flood: Vec<TcpStream> = (0..1100)
        .filter_map(|_| TcpStream::connect(node.addr).ok())
        .collect();
    assert!(flood.len() > 1000, "{} connections", flood.len());
    // the client connected before the flood is answered in the middle of it
    let start = Instant::now();
    for _ in 0..20 {
        let call = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), client.lookup(small.clone())).await
        });
        call.expect("a call in the flood timed out").unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    // ... and the node does not spin on its accept loop (it spun at 14.5 s of CPU in 12 s)
    let spent = node.cpu_seconds() - cpu;
    let took = start.elapsed().as_secs_f64();
    assert!(
        spent < 0.5 * took + 0.5,
        "{spent:.2} s of CPU in {took:.2} s"
    );
    let text = node.scrape();
    assert!(
        metric(
            &text,
            "nearrec_connections_closed_total{reason=\"refused\"}"
        ) > 0.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "nearrec_connections_closed_total{reason=\"accept_error\"}"
        ),
        0.0,
        "the cap keeps the node within its descriptors"
    );
    drop(flood);
    // once the flood is gone, new clients connect
    let mut fresh = rt
        .block_on(pb::node_client::NodeClient::connect(format!(
            "http://{}",
            node.addr
        )))
        .unwrap();
    rt.block_on(fresh.lookup(small)).unwrap();
}

#[test]
fn a_revoked_token_ends_an_open_stream() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let acl = dir.path().join("acl.toml");
    let grants = |reader: bool| {
        let mut text = format!(
            "[principal.partial]\ntoken_sha256 = \"{}\"\nread = [\"s/t0\"{}]\n",
            token_hash("partial"),
            if reader { ", \"s/t1\"" } else { "" }
        );
        if reader {
            text += &format!(
                "\n[principal.gone]\ntoken_sha256 = \"{}\"\nread = [\"*\"]\n",
                token_hash("gone")
            );
        }
        std::fs::write(&acl, text).unwrap();
    };
    grants(true);
    let store = format!("{}=s", path.display());
    let node = Server::start(&[&store, "--acl", acl.to_str().unwrap()], None);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(pb::node_client::NodeClient::connect(format!(
            "http://{}",
            node.addr
        )))
        .unwrap();
    let both = lookup_of(2);
    // two streams open, each answered once
    let mut streams = Vec::new();
    for token in ["gone", "partial"] {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let outgoing = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut c = client.clone();
        let mut answers = rt
            .block_on(c.lookup_stream(authorized(outgoing, Some(token))))
            .unwrap()
            .into_inner();
        rt.block_on(tx.send(both.clone())).unwrap();
        let first = rt.block_on(answers.message()).unwrap().unwrap();
        assert!(first.error.is_none(), "{token}: {:?}", first.error);
        streams.push((tx, answers));
    }
    // the ACL edited and reloaded: "gone" is no more, "partial" lost t1
    grants(false);
    // SAFETY: a signal to the child
    unsafe { libc::kill(node.child.id() as i32, libc::SIGHUP) };
    node.logged("ACL reloaded");
    let (tx, mut answers) = streams.remove(0);
    rt.block_on(tx.send(both.clone())).unwrap();
    let ended = rt.block_on(answers.message()).unwrap_err();
    assert_eq!(ended.code(), Code::Unauthenticated, "{}", ended.message());
    let (tx, mut answers) = streams.remove(0);
    rt.block_on(tx.send(both)).unwrap();
    let denied = rt.block_on(answers.message()).unwrap().unwrap();
    assert_eq!(
        denied.error.map(|e| e.code),
        Some(Code::PermissionDenied as i32)
    );
}

#[test]
fn a_metrics_endpoint_on_every_interface_needs_an_acl_or_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_nearrec-server"))
        .args([path.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "0.0.0.0:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // a node that starts anyway is stopped at once, not left listening on every interface
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node started with its metrics on 0.0.0.0 and no ACL");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(2));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains("0.0.0.0") && err.contains("--insecure"),
        "{err}"
    );
}

#[test]
fn a_trickling_client_is_cut_at_the_request_timeout_and_holds_up_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    // one engine slot and one queue place: a trickler holding either would stop every other
    let config = NodeConfig {
        max_in_flight: 1,
        max_queued: 1,
        request_timeout: Duration::from_secs(1),
        ..NodeConfig::default()
    };
    let node = node_of(&path, "tier = \"dram\"", config);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    // four clients each send a lookup's head, then its body a byte every 100 ms (minutes of it)
    let tricklers: Vec<_> = (0..4)
        .map(|_| {
            let addr = node.addr;
            rt.spawn(async move {
                let client = raw_client(addr, 1 << 20).await;
                let req = grpc_head("Lookup").body(()).unwrap();
                let mut ready = client.ready().await.unwrap();
                let (answer, mut body) = ready.send_request(req, false).unwrap();
                let bytes = framed(&lookup_of(64));
                let sending = tokio::spawn(async move {
                    for k in 0..bytes.len() {
                        if body.send_data(bytes.slice(k..k + 1), false).is_err() {
                            return k;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    bytes.len()
                });
                let head = answer.await.unwrap();
                let sent = sending.await.unwrap();
                (refused_with(&head), sent)
            })
        })
        .collect();
    // meanwhile, another client is answered every time
    let mut c = node.client();
    for _ in 0..20 {
        node.runtime.block_on(c.lookup(lookup_of(4))).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    for t in tricklers {
        let (code, sent) = rt.block_on(t).unwrap();
        assert_eq!(code, Some(Code::DeadlineExceeded as i32));
        assert!(sent < framed(&lookup_of(64)).len(), "sent all {sent} bytes");
    }
    // cut at the timeout, long before its body would have arrived
    assert!(started.elapsed() < Duration::from_secs(30));
    let text = node.scrape();
    assert_eq!(
        metric(&text, "nearrec_refused_total{reason=\"slow_request\"}"),
        4.0
    );
}

#[test]
fn a_greedy_principal_is_held_to_its_share_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[principal.greedy]\ntoken_sha256 = \"{}\"\nread = [\"*\"]\n\n\
             [principal.modest]\ntoken_sha256 = \"{}\"\nread = [\"*\"]\n",
            token_hash("greedy"),
            token_hash("modest")
        ),
    )
    .unwrap();
    let config = NodeConfig {
        acl: Some(acl),
        max_calls_per_principal: 2,
        max_connections_per_principal: 2,
        ..NodeConfig::default()
    };
    let node = node_of(&path, "tier = \"dram\"", config);
    let rt = &node.runtime;
    let channel = || node.client();
    let ask = |c: &mut pb::node_client::NodeClient<_>, token: &str| {
        rt.block_on(c.lookup(authorized(lookup_of(2), Some(token))))
    };
    // greedy holds two streams open on one connection: its third call is refused
    let mut first = channel();
    let mut streams = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let outgoing = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut answers = rt
            .block_on(first.lookup_stream(authorized(outgoing, Some("greedy"))))
            .unwrap()
            .into_inner();
        rt.block_on(tx.send(lookup_of(2))).unwrap();
        assert!(rt.block_on(answers.message()).unwrap().is_some());
        streams.push((tx, answers));
    }
    let refused = ask(&mut first, "greedy").unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("greedy has 2 calls open"),
        "{refused:?}"
    );
    // modest is served, on the same connection and on its own
    assert!(ask(&mut first, "modest").is_ok());
    assert!(ask(&mut channel(), "modest").is_ok());
    // a stream closed gives its place back
    drop(streams.pop());
    let again = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(20));
        ask(&mut first, "greedy").ok()
    });
    assert!(again.is_some(), "the closed stream's place never came back");
    drop(streams);
    // connections: greedy calls on a second, and is refused on a third while both are open
    let mut second = channel();
    assert!(ask(&mut second, "greedy").is_ok());
    let mut third = channel();
    let refused = ask(&mut third, "greedy").unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("holds 2 connections"),
        "{refused:?}"
    );
    assert!(ask(&mut third, "modest").is_ok());
    // one closed, the third is greedy's second
    drop(second);
    let again = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(20));
        ask(&mut third, "greedy").ok()
    });
    assert!(again.is_some(), "the closed connection was never let go");
    let text = node.scrape();
    assert!(metric(&text, "nearrec_refused_total{reason=\"principal_calls\"}") >= 1.0);
    assert!(
        metric(
            &text,
            "nearrec_refused_total{reason=\"principal_connections\"}"
        ) >= 1.0
    );
}

/// Issue 62, item 9's question: a probe's 600 streams on one connection were all answered with
/// `--max-calls-per-principal` 300 or 512, though a connection's stream cap is 256. HTTP/2's
/// `SETTINGS_MAX_CONCURRENT_STREAMS` binds the client: streams past the cap wait in the client,
/// unopened, until one closes, so the node never has more than the cap open on one connection
/// and a share above the cap never binds a single connection. A share below it does.
#[test]
fn streams_past_a_connections_cap_wait_in_the_client_not_at_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    for share in [6, 3] {
        let config = NodeConfig {
            max_streams_per_connection: 4,
            max_calls_per_principal: share,
            ..NodeConfig::default()
        };
        let node = node_of(&path, "tier = \"dram\"", config);
        let rt = &node.runtime;
        let mut c = node.client();
        let open = |c: &mut pb::node_client::NodeClient<_>| {
            rt.block_on(async {
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                let outgoing = tokio_stream::wrappers::ReceiverStream::new(rx);
                let opened =
                    tokio::time::timeout(Duration::from_millis(500), c.lookup_stream(outgoing));
                tx.send(lookup_of(2)).await.unwrap();
                match opened.await {
                    Err(_) => Err(None), // still waiting in the client
                    Ok(Err(s)) => Err(Some(s.code())),
                    Ok(Ok(answers)) => {
                        let mut answers = answers.into_inner();
                        match answers.message().await {
                            Ok(Some(_)) => Ok((tx, answers)),
                            Ok(None) => Err(Some(Code::Unknown)),
                            Err(s) => Err(Some(s.code())),
                        }
                    }
                }
            })
        };
        let mut streams = Vec::new();
        for k in 0..4 {
            match open(&mut c) {
                Ok(s) => streams.push(s),
                Err(code) => {
                    assert_eq!(share, 3, "stream {k}: {code:?}");
                    assert_eq!((k, code), (3, Some(Code::ResourceExhausted)));
                }
            }
        }
        if share == 6 {
            // a fifth waits in the client, neither opened nor refused
            assert_eq!(open(&mut c).err(), Some(None));
        }
    }
}

/// A principal's large lookups of DRAM-resident tables run off the async workers, so that its
/// share binds them as it binds any call. Run on the worker that decoded them (up to 65,536 ids
/// did), each held it from start to end: on a node of one worker no two were ever open at once,
/// the share never refused one, and every other client's request waited behind them (`nearrec
/// bench abuse`: the others' p99 went to 17× its value alone).
#[test]
fn large_resident_lookups_leave_the_async_worker_and_count_against_the_share() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let acl = dir.path().join("acl.toml");
    let grant = format!(
        "[principal.greedy]\ntoken_sha256 = \"{}\"\nread = [\"*\"]\n",
        token_hash("greedy")
    );
    std::fs::write(&acl, grant).unwrap();
    let config = NodeConfig {
        acl: Some(acl),
        max_calls_per_principal: 1,
        ..NodeConfig::default()
    };
    let mut stores = Stores::new();
    stores.insert("s", open(&path, "tier = \"dram\"")).unwrap();
    let node = Node::start_with("127.0.0.1:0".parse().unwrap(), 1, stores, config);
    // 2 × 30,000 ids a call, in 16 bags: past the 8,192 that run inline, within the 65,536
    // that did (a small answer: no budget of unsent bytes refuses it)
    let ids: Vec<i64> = (0..30_000).map(|i| i % 400).collect();
    let lookups = ["t0", "t1"].map(|t| OwnedLookup::with_lengths(t, ids.clone(), vec![1875; 16]));
    let big = request("s", &OwnedBatch::new(lookups.to_vec()), false, 0);
    let clients: Vec<_> = (0..4).map(|_| node.client()).collect();
    let answers = node.runtime.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for k in 0..32 {
            let (mut client, req) = (clients[k % 4].clone(), big.clone());
            calls.spawn(async move { client.lookup(authorized(req, Some("greedy"))).await });
        }
        calls.join_all().await
    });
    let refused = answers.iter().filter(|a| a.is_err()).count();
    assert!(
        refused > 0,
        "32 calls at once were never two open at a time"
    );
    for a in &answers {
        match a {
            Ok(r) => assert_eq!(r.get_ref().pooled.len(), 16 * 2 * common::DIM as usize * 4),
            Err(e) => assert!(
                e.code() == Code::ResourceExhausted && e.message().contains("greedy has 1 calls"),
                "{e:?}"
            ),
        }
    }
    assert!(refused < answers.len(), "{answers:?}");
}

#[test]
fn a_request_past_the_nodes_shape_limits_is_refused_naming_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let config = NodeConfig {
        max_tables_per_request: 2,
        max_bags_per_request: 100,
        max_indices_per_request: 150,
        ..NodeConfig::default()
    };
    let node = node_of(&path, "tier = \"dram\"\nwritable = true", config);
    let mut c = node.client();
    let rt = &node.runtime;
    // within every limit: answered
    assert!(rt.block_on(c.lookup(lookup_of(50))).is_ok());
    // 2 × 60 bags: past the bags at t1
    let mut cases = vec![(lookup_of(60), "t1", "max_bags_per_request (100)")];
    // 2 × 40 bags of 2 ids: past the indices at t1
    let two: Vec<i64> = (0..80).collect();
    let lookups = ["t0", "t1"]
        .map(|t| OwnedLookup::with_lengths(t, two.clone(), vec![2i64; 40]))
        .to_vec();
    cases.push((
        request("s", &OwnedBatch::new(lookups), false, 0),
        "t1",
        "max_indices_per_request (150)",
    ));
    // three tables
    let three = ["t0", "t1", "t0"]
        .map(|t| OwnedLookup::with_lengths(t, vec![1], vec![1]))
        .to_vec();
    cases.push((
        request("s", &OwnedBatch::new(three), false, 0),
        "t0",
        "3 tables",
    ));
    for (req, table, says) in cases {
        let s = rt.block_on(c.lookup(req)).unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        let e = nearrec_wire::RemoteError::from(&s);
        assert_eq!(e.table.as_deref(), Some(table), "{s:?}");
        assert!(s.message().contains(says), "{s:?}");
    }
    // a write of 200 rows: past the indices
    let ids: Vec<i64> = (0..200).collect();
    let write = pb::WriteRequest {
        store: "s".into(),
        writes: vec![pb::TableRows {
            table: "t0".into(),
            ids: nearrec_wire::arrays::encode(ids),
            rows: nearrec_wire::arrays::encode(vec![0.5f32; 200 * common::DIM as usize]),
            ..Default::default()
        }],
        ..Default::default()
    };
    let s = rt.block_on(c.write(write)).unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("max_indices_per_request"), "{s:?}");
    let text = node.scrape();
    assert_eq!(
        metric(&text, "nearrec_refused_total{reason=\"request_shape\"}"),
        4.0
    );
}
