//! A node's hold of its replicas in etcd ([`hold`]), as the module above says: a lease renewed
//! every quarter of the hold, the shard's record read, the replica held from the round's start.

use std::future::Future;
use std::time::Instant;

use etcd_client::PutOptions;
use nearrec::Membership;

use super::{Seen, ShardMap, ShardRecord};

/// What a node's hold of one replica reports each round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Held at the record's epoch for its hold time from the round's start.
    Held(Membership),
    /// etcd names it no member (let go), or it answered what the replica refused.
    Out(String),
    /// etcd did not answer within the round: the replica's hold runs out by itself.
    NoAnswer(String),
}

/// Holds one replica of shard `shard` for its node, until `stop` resolves: every quarter of the
/// hold time, its lease renewed (granted anew, and `shards/<k>/replicas/<id>` put on it, when it
/// is lost), then the shard's record read and given to `apply` with the instant the round began
/// (`nearrec::Store::hold`). Rounds that etcd does not answer in time apply nothing: the hold
/// runs out by itself. `report` hears each round's outcome when it changes.
pub async fn hold(
    map: ShardMap,
    shard: usize,
    replica: u64,
    address: String,
    apply: impl Fn(&ShardRecord, Instant) -> nearrec::Result<Membership>,
    mut report: impl FnMut(&Held),
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut lease: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> = None;
    let mut last: Option<Held> = None;
    // the record's, once read: the router that made it decided how long a hold is
    let mut hold = map.hold;
    loop {
        let began = Instant::now();
        let round = async {
            if lease.is_none() {
                lease = Some(grant(&map, shard, replica, &address).await?);
            }
            let (keeper, stream) = lease.as_mut().expect("granted above");
            map.bounded(keeper.keep_alive()).await?;
            let alive = map.bounded(stream.message()).await?;
            if alive.is_none_or(|r| r.ttl() <= 0) {
                lease = None;
                return Err("the lease ran out in etcd; granted anew next round".to_owned());
            }
            map.read(shard).await
        };
        let outcome = match tokio::time::timeout(hold / 2, round).await {
            // the lease's stream may have died with its connection: a new lease next round
            // (the old one runs out in etcd by itself)
            Err(_) => {
                lease = None;
                Held::NoAnswer(format!("no answer within {:?}", hold / 2))
            }
            Ok(Err(why)) => {
                lease = None;
                Held::NoAnswer(why)
            }
            Ok(Ok(Seen { record: None, .. })) => {
                Held::Out("the shard has no record in etcd yet (no router has made it)".into())
            }
            Ok(Ok(Seen {
                record: Some(r), ..
            })) => {
                hold = r.hold();
                match apply(&r, began) {
                    Ok(m) if m.members.contains(&m.replica) => Held::Held(m),
                    Ok(m) => Held::Out(format!("etcd names it no member at epoch {}", m.epoch)),
                    Err(e) => Held::Out(e.to_string()),
                }
            }
        };
        if last.as_ref() != Some(&outcome) {
            report(&outcome);
            last = Some(outcome);
        }
        let next = began + hold / 4;
        tokio::select! {
            () = tokio::time::sleep_until(next.into()) => {}
            () = &mut stop => return,
        }
    }
}

/// A lease for replica `replica`'s node, its key put on it, kept alive by the stream returned.
async fn grant(
    map: &ShardMap,
    shard: usize,
    replica: u64,
    address: &str,
) -> Result<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream), String> {
    let mut client = map.client.clone();
    let ttl = i64::try_from(map.hold.as_secs().max(1) * 2).unwrap_or(i64::MAX);
    let lease = map.bounded(client.lease_grant(ttl, None)).await?;
    let put = PutOptions::new().with_lease(lease.id());
    let key = map.replica_key(shard, replica);
    (map.bounded(client.put(key, address, Some(put))).await)?;
    map.bounded(client.lease_keep_alive(lease.id())).await
}
