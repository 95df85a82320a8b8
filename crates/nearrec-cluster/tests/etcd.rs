//! A sharded store whose membership is kept in etcd (`etcd.rs`, `docs/distributed.md`,
//! "Membership in etcd"), against a real etcd (Debian's `etcd-server`, which `make test`
//! installs) started on free loopback ports: the record made by the first router and changed
//! only by transactions; replicas held by their nodes' leases, and serving nothing once cut
//! off from etcd past their hold or named no member there; a router without etcd failing the
//! write that needs a change, `Unavailable` naming etcd, with nothing of it applied.

#[path = "../../nearrec-server/tests/common/mod.rs"]
mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nearrec::plan::shards::ShardPlan;
use nearrec::plan::{Scheme, ShardOptions, plan_shards};
use nearrec::{
    Bags, Batch, ErrorKind, Indices, Replica as _, RowValues, RowWrite, StoreApi, TableLookup,
    WriteOptions,
};
use nearrec_cluster::etcd::{EtcdOptions, Fence, Seen, ShardMap, ShardRecord};
use nearrec_cluster::{Endpoint, ShardedOptions, ShardedStore};
use nearrec_server::{NodeConfig, Stores};

/// A one-member etcd on free loopback ports, its data in a directory of its own; killed when
/// dropped.
struct Etcd {
    child: Option<Child>,
    data: tempfile::TempDir,
    client: String,
    peer: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    fn start() -> Self {
        let mut etcd = Etcd {
            child: None,
            data: tempfile::tempdir().unwrap(),
            client: format!("127.0.0.1:{}", free_port()),
            peer: format!("127.0.0.1:{}", free_port()),
        };
        etcd.restart();
        etcd
    }

    /// Started (again, from its data) and answering.
    fn restart(&mut self) {
        let (client, peer) = (
            format!("http://{}", self.client),
            format!("http://{}", self.peer),
        );
        let log = std::fs::File::create(self.data.path().join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args(["--name", "n0", "--data-dir"])
            .arg(self.data.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("n0={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd (Debian's etcd-server: `make system-deps` installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        loop {
            let up = runtime.block_on(async {
                let mut c = etcd_client::Client::connect([&self.client], None).await?;
                c.get("/", None).await
            });
            if up.is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not start: {up:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn options(&self, hold: Duration) -> EtcdOptions {
        EtcdOptions {
            hold,
            timeout: Duration::from_millis(500),
            ..EtcdOptions::new(vec![self.client.clone()])
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

const HOLD: Duration = Duration::from_millis(600);
const TOML: &str = "tier = \"dram\"\nwritable = true";

/// A writable store of one shard with two replicas, each on a node that holds it in `etcd`.
struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<common::Node>,
    served: Vec<PathBuf>,
    plan: ShardPlan,
}

impl Cluster {
    fn start(etcd: &Etcd) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let source = common::build(&dir.path().join("source"));
        let reader = nearrec::Located::open(&source).unwrap().reader;
        let options = ShardOptions {
            shards: 1,
            replicas: 2,
            scheme: Scheme::Table,
            replicate_hot: 0,
        };
        let plan = plan_shards("s", reader.tables(), None, &options).unwrap();
        let out = dir.path().join("cut");
        nearrec::shard::write_shards(&reader, &plan, &out, false).unwrap();
        let mut cluster = Cluster {
            dir,
            nodes: Vec::new(),
            served: Vec::new(),
            plan,
        };
        for r in 0..2 {
            let copy = cluster.dir.path().join(format!("replica-{r}"));
            copy_dir(&ShardPlan::shard_dir(&out, 0), &copy);
            cluster.served.push(copy);
            cluster.nodes.push(node(&cluster.served[r], etcd));
        }
        cluster
    }

    fn endpoints(&self) -> Vec<Vec<Endpoint>> {
        vec![
            (self.nodes.iter())
                .map(|n| Endpoint::parse(&format!("{}/s", n.addr)))
                .collect(),
        ]
    }

    fn router(&self, etcd: &Etcd) -> ShardedStore {
        let options = ShardedOptions {
            catch_up_every: None,
            etcd: Some(etcd.options(HOLD)),
            client: nearrec_client::ClientOptions {
                timeout: Some(Duration::from_secs(5)),
                ..nearrec_client::ClientOptions::default()
            },
            ..ShardedOptions::default()
        };
        let cut = self.dir.path().join("cut");
        ShardedStore::open(&cut, &self.endpoints(), options).unwrap()
    }

    fn client(&self, r: usize) -> nearrec_client::Client {
        let addr = self.nodes[r].addr.to_string();
        nearrec_client::Client::connect(&addr, "s", nearrec_client::ClientOptions::default())
            .unwrap()
    }
}

fn node(served: &Path, etcd: &Etcd) -> common::Node {
    let mut stores = Stores::new();
    stores.insert("s", common::open(served, TOML)).unwrap();
    let config = NodeConfig {
        etcd: vec![etcd.client.clone()],
        ..NodeConfig::default()
    };
    common::Node::start(stores, config)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

fn write(store: &dyn StoreApi, id: i64, value: f32) -> nearrec::Result<u64> {
    let values = vec![value; common::DIM as usize];
    let w = RowWrite {
        table: "t0",
        ids: &[id],
        values: Some(RowValues::F32(&values)),
    };
    store
        .writes()
        .expect("writable")
        .write_many(&[w], WriteOptions::default())
}

fn read(store: &dyn StoreApi, id: i64) -> nearrec::Result<f32> {
    let ids = [id];
    let batch = Batch::new(vec![TableLookup::new(
        "t0",
        Indices::I64(&ids),
        Bags::Fixed {
            batch: 1,
            bag_size: 1,
        },
    )]);
    Ok(store.lookup(&batch)?.0.values[0])
}

/// Waits until `f` holds, for at most `within`.
fn until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Plan `plan_id`'s keys in `etcd`, read and changed from a runtime of their own (as another
/// router would).
fn shard_map(etcd: &Etcd, plan_id: &str) -> (tokio::runtime::Runtime, ShardMap) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let map = runtime
        .block_on(ShardMap::connect(
            &etcd.options(HOLD),
            "s",
            plan_id,
            runtime.handle().clone(),
        ))
        .unwrap();
    (runtime, map)
}

fn record(etcd: &Etcd, plan: &ShardPlan) -> Seen {
    let (runtime, map) = shard_map(etcd, &plan.id);
    runtime.block_on(map.read(0)).unwrap()
}

/// The first router makes the shard's record, naming both replicas; the nodes hold them, and
/// writes and reads go through as without etcd.
#[test]
fn the_first_router_makes_the_record_and_the_nodes_hold_their_replicas() {
    let etcd = Etcd::start();
    let cluster = Cluster::start(&etcd);
    // before any router: no record, so no node holds its replica, which serves nothing
    std::thread::sleep(HOLD / 2);
    let refused = read(&cluster.client(0), 3).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Unavailable, "{refused}");
    assert!(refused.to_string().contains("etcd"), "{refused}");
    let router = cluster.router(&etcd);
    let seen = record(&etcd, &cluster.plan);
    let made = seen.record.expect("a record");
    assert!(made.epoch >= 1);
    let mut ids: Vec<u64> = (0..2)
        .map(|r| cluster.client(r).membership().unwrap().replica)
        .collect();
    ids.sort_unstable();
    assert_eq!(made.members, ids);
    assert_eq!(made.hold(), HOLD);
    // held within a round: reads and writes go through
    until(HOLD * 2, "both replicas held", || {
        (0..2).all(|r| read(&cluster.client(r), 3).is_ok())
    });
    write(&router, 3, 7.0).unwrap();
    for r in 0..2 {
        assert_eq!(read(&cluster.client(r), 3).unwrap(), 7.0);
    }
    assert_eq!(read(&router, 3).unwrap(), 7.0);
}

/// Two changes decided from one record: exactly one is made.
#[test]
fn of_two_changes_from_one_record_one_is_made() {
    let etcd = Etcd::start();
    let (runtime, map) = shard_map(&etcd, "plan");
    let at = |epoch, members: &[u64]| ShardRecord {
        epoch,
        members: members.to_vec(),
        hold_ms: 600,
    };
    let none = runtime.block_on(map.read(0)).unwrap();
    assert_eq!(none, Seen::default());
    assert!(
        runtime
            .block_on(map.change(0, &none, &at(1, &[1, 2]), None))
            .unwrap()
    );
    // a second creation from "no record" loses
    assert!(
        !runtime
            .block_on(map.change(0, &none, &at(1, &[1]), None))
            .unwrap()
    );
    let one = runtime.block_on(map.read(0)).unwrap();
    assert_eq!(one.record, Some(at(1, &[1, 2])));
    // two routers from epoch 1: one leaves 2 out, the other 1; the second is refused
    assert!(
        runtime
            .block_on(map.change(0, &one, &at(2, &[1]), None))
            .unwrap()
    );
    assert!(
        !runtime
            .block_on(map.change(0, &one, &at(2, &[2]), None))
            .unwrap()
    );
    assert_eq!(
        runtime.block_on(map.read(0)).unwrap().record,
        Some(at(2, &[1]))
    );
}

/// etcd gone: within a hold no replica serves (it cannot know it is still a member), and a
/// router's write that must leave a replica out fails `Unavailable` naming etcd, nothing of it
/// applied. etcd back: the replicas are held again, and the write goes through.
#[test]
fn without_etcd_replicas_stop_serving_and_no_change_is_made() {
    let mut etcd = Etcd::start();
    let mut cluster = Cluster::start(&etcd);
    let router = cluster.router(&etcd);
    until(HOLD * 2, "held", || read(&router, 5).is_ok());
    write(&router, 5, 1.0).unwrap();
    etcd.kill();
    let cut = Instant::now();
    until(HOLD * 2, "replica 0 unheld", || {
        read(&cluster.client(0), 5).is_err_and(|e| e.to_string().contains("etcd"))
    });
    assert!(
        cut.elapsed() >= HOLD / 4,
        "let go before its hold could run out"
    );
    // a router opens all the same (it reads on without etcd; each read is refused here only
    // because no replica is held now)
    let second = cluster.router(&etcd);
    let e = read(&second, 5).unwrap_err();
    assert!(e.to_string().contains("not held"), "{e}");
    // replica 1 down as well: a write that reaches replica 0 alone must leave 1 out first
    let mut down = cluster.nodes.remove(1);
    down.begin_drain();
    drop(down);
    let refused = write(&router, 5, 2.0).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Unavailable, "{refused}");
    assert!(refused.to_string().contains("etcd"), "{refused}");
    etcd.restart();
    until(HOLD * 3, "replica 0 held again", || {
        read(&cluster.client(0), 5).is_ok()
    });
    assert_eq!(
        read(&cluster.client(0), 5).unwrap(),
        1.0,
        "the refused write was applied"
    );
    // with etcd, the write leaves replica 1 out and goes through
    write(&router, 5, 3.0).unwrap();
    assert_eq!(read(&cluster.client(0), 5).unwrap(), 3.0);
    let left = record(&etcd, &cluster.plan).record.unwrap();
    assert_eq!(
        left.members,
        vec![cluster.client(0).membership().unwrap().replica]
    );
}

/// A replica that etcd names no member — another router left it out while this node could
/// not be told — stops serving within one round of its hold, and says why.
#[test]
fn a_replica_etcd_names_no_member_stops_serving() {
    let etcd = Etcd::start();
    let cluster = Cluster::start(&etcd);
    let router = cluster.router(&etcd);
    until(HOLD * 2, "held", || {
        (0..2).all(|r| read(&cluster.client(r), 1).is_ok())
    });
    let (runtime, map) = shard_map(&etcd, &cluster.plan.id);
    let seen = runtime.block_on(map.read(0)).unwrap();
    let was = seen.record.clone().unwrap();
    let out = cluster.client(1).membership().unwrap().replica;
    let next = ShardRecord {
        epoch: was.epoch + 1,
        members: (was.members.iter())
            .filter(|&&m| m != out)
            .copied()
            .collect(),
        ..was
    };
    assert!(runtime.block_on(map.change(0, &seen, &next, None)).unwrap());
    let changed = Instant::now();
    until(HOLD + HOLD / 10, "replica 1 let go", || {
        read(&cluster.client(1), 1).is_err_and(|e| e.to_string().contains("no member"))
    });
    assert!(changed.elapsed() <= HOLD + HOLD / 10);
    assert_eq!(cluster.client(1).membership().unwrap().epoch, next.epoch);
    // the router learns at its next write (replica 0 at the new epoch refuses the old one)
    write(&router, 1, 4.0).unwrap();
    assert_eq!(read(&router, 1).unwrap(), 4.0);
    assert!(read(&cluster.client(1), 1).is_err());
}

/// A change that leaves a replica out without its word is kept fresh in etcd for one hold (and
/// a tenth) from when it was made: a router that learns it meanwhile — its maker gone before
/// telling the replica or waiting it out — and cannot reach that replica itself (here, one it
/// was never given) waits until one hold has passed before its write commits, for until then
/// the replica may still be held and serve reads that miss the write.
#[test]
fn a_change_its_router_left_unfinished_is_waited_out_by_the_router_that_learns_it() {
    use nearrec_cluster::etcd::Fresh;
    let etcd = Etcd::start();
    let cluster = Cluster::start(&etcd);
    let router = cluster.router(&etcd);
    until(HOLD * 2, "held", || {
        (0..2).all(|r| read(&cluster.client(r), 1).is_ok())
    });
    write(&router, 1, 1.0).unwrap();
    let (runtime, map) = shard_map(&etcd, &cluster.plan.id);
    // another router's change, leaving out a replica this router does not know, made and never
    // finished (no one told, no wait)
    let seen = runtime.block_on(map.read(0)).unwrap();
    let was = seen.record.clone().unwrap();
    let next = ShardRecord {
        epoch: was.epoch + 1,
        // a hold well past what the write takes by itself
        hold_ms: 3_000,
        ..was
    };
    let fresh = Fresh {
        epoch: next.epoch,
        left: vec![0x5eed],
    };
    let lease = runtime.block_on(map.fresh_lease(next.hold())).unwrap();
    let made = runtime.block_on(map.change(0, &seen, &next, Some((&fresh, lease))));
    assert!(made.unwrap());
    let made_at = Instant::now();
    assert_eq!(runtime.block_on(map.fresh(0)).unwrap(), Some(fresh));
    // both replicas take the new epoch from their nodes: the router's next write, at the old
    // one, is refused, and the router learns the change
    until(HOLD * 2, "the new epoch on both", || {
        (0..2).all(|r| cluster.client(r).membership().unwrap().epoch == next.epoch)
    });
    write(&router, 2, 2.0).unwrap();
    // and waits it out before the write commits: one hold (and a tenth) since the change
    let waited = made_at.elapsed();
    assert!(waited >= next.hold() * 11 / 10, "went on after {waited:?}");
    assert_eq!(read(&router, 2).unwrap(), 2.0);
}

/// Version `v` published into each replica's repository: a copy of its version 1.
fn publish_copy(cluster: &Cluster, v: u64) {
    for served in &cluster.served {
        let repo = nearrec::format::Repository::detect(served).unwrap();
        let copy = cluster.dir.path().join(format!("copy-{v}"));
        copy_dir(&repo.version_path(1), &copy);
        let at = repo.publish(&copy, nearrec::format::Publish::Move).unwrap();
        assert_eq!(at, v);
    }
}

/// With etcd, the store's plan and version are its record there: a change of the tables or a
/// swap is refused while another change holds the store, and a swap moves the record's
/// version; a table created through one router is decided there and learned from there by a
/// router whose `shards.json` is older; a change a router left staged (it died between its
/// stage and its decision) is undone by the next change.
#[test]
fn the_store_s_plan_and_version_are_decided_in_etcd() {
    let etcd = Etcd::start();
    let cluster = Cluster::start(&etcd);
    publish_copy(&cluster, 2);
    let a = cluster.router(&etcd);
    let cut = cluster.dir.path().join("cut");
    let old = ShardPlan::read(&cut).unwrap();
    let fresh = |name| nearrec::NewTable {
        name,
        rows: 8,
        dim: common::DIM,
        dtype: nearrec::format::DType::Fp32,
        init: nearrec::Init::Zeros,
    };
    let (runtime, map) = shard_map(&etcd, &old.id);

    // another change holds the store: a change of the tables and a swap are refused, typed
    let seen = runtime.block_on(map.read_store()).unwrap();
    let held = runtime
        .block_on(map.begin_change(&seen, "another"))
        .unwrap()
        .expect("no change holds the store");
    let e = a
        .schema()
        .unwrap()
        .create_table(&fresh("fresh"))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}");
    let versions = a.versions().unwrap();
    let e = versions
        .swap(&nearrec::SwapTo::Version(2), false, false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}");
    // let go: the swap goes through, and the record says its version
    drop(held);
    until(Duration::from_secs(5), "the change let go", || {
        runtime.block_on(map.changing()).unwrap().is_none()
    });
    versions
        .swap(&nearrec::SwapTo::Version(2), false, false)
        .unwrap();
    let stored = runtime.block_on(map.read_store()).unwrap().record.unwrap();
    assert_eq!((stored.version, &stored.plan), (2, &old));

    a.schema().unwrap().create_table(&fresh("fresh")).unwrap();
    let plan = a.plan();
    let stored = runtime.block_on(map.read_store()).unwrap().record.unwrap();
    assert_eq!((stored.version, &stored.plan), (2, &plan));
    // a router opened from an older shards.json takes the plan etcd holds
    old.write(&cut).unwrap();
    let b = cluster.router(&etcd);
    assert_eq!(b.plan().id, plan.id);
    b.table("fresh").unwrap();

    // a router staged a change to plan x on replica 1 (its tag, a part of x's table) and died
    let x = plan.with_table("left", 8, common::DIM, nearrec::format::DType::Fp32);
    let replica = cluster.client(1);
    replica.retag(&plan.id, &x.id, Some(&plan.id)).unwrap();
    nearrec::Schema::create_table(&replica, &fresh("left")).unwrap();
    // the next change undoes it there first
    b.schema().unwrap().create_table(&fresh("second")).unwrap();
    for r in 0..2 {
        let info = cluster.client(r).info().unwrap();
        let tag = info.shard.unwrap();
        assert_eq!((tag.plan, tag.previous), (b.plan().id, None));
        let names: Vec<String> = info.tables.into_iter().map(|t| t.name).collect();
        assert!(!names.contains(&"left".to_owned()), "{names:?}");
        assert!(names.contains(&"second".to_owned()), "{names:?}");
    }
    // a's next call naming it learns the plan, from etcd
    a.table("second").unwrap();
}

/// A catch-up takes its shard's fence in etcd first: while another catch-up holds it, none
/// fences the members (the catch-up is refused, naming it, and the members take writes); once
/// it is let go, the catch-up admits its replica and lets its own fence go.
#[test]
fn one_catch_up_at_a_time_holds_a_shard_s_fence_in_etcd() {
    let etcd = Etcd::start();
    let mut cluster = Cluster::start(&etcd);
    let router = cluster.router(&etcd);
    until(HOLD * 2, "both replicas held", || {
        (0..2).all(|r| read(&cluster.client(r), 3).is_ok())
    });
    // replica 1 down: the write that misses it leaves it out; back at another address, stale
    let served = cluster.served[1].clone();
    drop(cluster.nodes.remove(1));
    write(&router, 3, 5.0).unwrap();
    cluster.nodes.push(node(&served, &etcd));
    router.set_replicas(0, &cluster.endpoints()[0]).unwrap();
    // another router's catch-up holds the shard's fence
    let (runtime, map) = shard_map(&etcd, &cluster.plan.id);
    let seen = runtime.block_on(map.read(0)).unwrap();
    let fence = Fence {
        epoch: seen.record.as_ref().unwrap().epoch,
        replica: 99,
    };
    let other = runtime
        .block_on(map.fence(0, &seen, &fence, Duration::from_secs(30)))
        .unwrap()
        .expect("no fence yet");
    let tried = router.catch_up(Duration::from_secs(5));
    assert!(
        matches!(&tried[..], [(0, _, Err(e))] if e.to_string().contains("holds the shard's fence")),
        "{tried:?}"
    );
    // its members were never fenced by it: they take writes
    write(&router, 4, 6.0).unwrap();
    runtime.block_on(map.settled(other));
    let done = router.catch_up(Duration::from_secs(5));
    assert!(matches!(&done[..], [(0, _, Ok(_))]), "{done:?}");
    assert_eq!(runtime.block_on(map.fenced(0)).unwrap(), None);
    until(HOLD * 2, "the caught-up replica serves", || {
        read(&cluster.client(1), 4).is_ok_and(|v| v == 6.0)
    });
    assert_eq!(read(&cluster.client(1), 3).unwrap(), 5.0);
}
