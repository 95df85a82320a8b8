//! A replica catching up ([`catch_up`]), as the module above says: left out first if it is
//! still named, the differing rows copied from a member (`copy.rs`), the members fenced for a
//! last pass, every count of writes made the same, and the replica admitted by the next epoch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nearrec::{Error, ErrorKind, Replica as _, StoreApi, WriteOptions};

use super::copy::copy_differing;
use super::{Learned, change, install_order, learn};
use crate::etcd::Fence;
use crate::shard::{Replica, Shard, on_each};

/// What a catch-up did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaughtUp {
    /// Rows copied: before the fence, and under it.
    pub rows_before_fence: u64,
    pub rows_fenced: u64,
    /// The count of writes the replica and its shard's members hold after.
    pub version: u64,
    /// The epoch that admitted it.
    pub epoch: u64,
    /// How long the members were fenced: from the fence to the admission that lifted it (what
    /// the catch-up cost their writes, which waited meanwhile).
    pub fenced: Duration,
}

/// Catches replica `r` of `shard` up from a member, as the module says, and admits it. Each
/// member is fenced for at most `lease` (the time its last pass may take). Tried again, from
/// what it learns then, when another router's change moved the shard's epoch under it (its
/// writes leaving a replica out meanwhile): a membership change refused as `MembershipChanged`.
pub(crate) fn catch_up(
    store: &str,
    shard: &Shard,
    pin: u64,
    r: usize,
    lease: Duration,
) -> nearrec::Result<CaughtUp> {
    let (mut tries, mut copied) = (0, CaughtUp::default());
    loop {
        match catch_up_once(store, shard, pin, r, lease, &mut copied) {
            Err(e) if e.kind() == ErrorKind::MembershipChanged && tries < 3 => tries += 1,
            // the rows every try copied and the time every try fenced, not the last one's
            // alone (a try that finds the replica admitted meanwhile fences nothing)
            done => {
                return done.map(|d| CaughtUp {
                    rows_before_fence: copied.rows_before_fence,
                    rows_fenced: copied.rows_fenced,
                    fenced: copied.fenced,
                    ..d
                });
            }
        }
    }
}

/// One try of [`catch_up`]; the rows it copies are added to `copied` as they are, so that a
/// try cut short still counts them.
fn catch_up_once(
    store: &str,
    shard: &Shard,
    pin: u64,
    r: usize,
    lease: Duration,
    copied: &mut CaughtUp,
) -> nearrec::Result<CaughtUp> {
    let fail = |kind, reason: String| Error::Shard {
        store: store.to_owned(),
        shard: shard.index,
        kind,
        reason,
    };
    let replicas = shard.all_replicas();
    let target = replicas[r].clone();
    let mut learned = learn(shard, pin, false);
    let Some((mine, _)) = learned.answers[r].clone() else {
        return Err(fail(
            ErrorKind::Unavailable,
            format!(
                "replica {} does not answer (or serves another version)",
                target.addr
            ),
        ));
    };
    if !target.is_stale() {
        return Ok(CaughtUp {
            epoch: learned.epoch,
            version: target.client.version()?,
            ..CaughtUp::default()
        });
    }
    // the shard's only member: it took every write the shard took (one it missed was left
    // without it, so failed everywhere), and is current
    if learned.members == [mine.replica] {
        target.set_stale(false);
        return Ok(CaughtUp {
            epoch: learned.epoch,
            version: target.client.version()?,
            ..CaughtUp::default()
        });
    }
    // still named a member (it came back behind, or missed a write no router saw): out first;
    // at an older epoch than the shard's: brought to it as no member
    if learned.members.contains(&mine.replica) {
        let members: Vec<u64> = (learned.members.iter())
            .filter(|&&id| id != mine.replica)
            .copied()
            .collect();
        change(
            shard,
            &learned,
            &members,
            &install_order(&learned, &members),
        )?;
        learned = learn(shard, pin, false);
    } else if mine.epoch < learned.epoch {
        target
            .client
            .set_membership(mine.epoch, learned.epoch, &learned.members)?;
        learned = learn(shard, pin, false);
    }
    let sources = shard.live_replicas();
    let Some((_, source)) = sources.first() else {
        return Err(fail(
            ErrorKind::Unavailable,
            "no member to copy from".into(),
        ));
    };
    let (rows_before_fence, _) = copy_differing(source, &target)?;
    copied.rows_before_fence += rows_before_fence;
    // the last pass: the members fenced, every write of theirs in; how long counted whatever
    // its end
    let fenced_at = Instant::now();
    let done = fenced_pass(
        store,
        shard,
        (pin, lease),
        &learned,
        &sources,
        (r, mine.replica),
        copied,
    );
    copied.fenced += fenced_at.elapsed();
    let (epoch, version) = done?;
    learn(shard, pin, false);
    Ok(CaughtUp {
        rows_before_fence,
        version,
        epoch,
        ..CaughtUp::default()
    })
}

/// Store `store`'s catch-up's last pass, from `learned`: the members (`sources`, the first copied from)
/// fenced for at most `lease`, the rows that differ copied again to replica `r` (id `id`), one
/// count of writes everywhere, and the replica admitted; the epoch that admits it and the
/// count. On an error the fence is lifted.
fn fenced_pass(
    store: &str,
    shard: &Shard,
    (pin, lease): (u64, Duration),
    learned: &Learned,
    sources: &[(usize, Arc<Replica>)],
    (r, id): (usize, u64),
    copied: &mut CaughtUp,
) -> nearrec::Result<(u64, u64)> {
    let target = shard.all_replicas()[r].clone();
    let source = &sources[0].1;
    // with etcd, the fence is taken there first: one catch-up at a time fences a shard
    let held = fence_in_etcd(store, shard, learned, (id, lease))?;
    let fenced = on_each(sources, |(_, m)| m.client.fence(learned.epoch, lease));
    let lift = |why: Error| {
        let order = install_order(learned, &learned.members);
        let _ = change(shard, learned, &learned.members, &order);
        learn(shard, pin, false);
        let_go(shard, held);
        why
    };
    let mut counts = Vec::with_capacity(fenced.len());
    for f in fenced {
        counts.push(f.map_err(lift)?);
    }
    let count = counts[0];
    if counts.iter().any(|&c| c != count) {
        return Err(lift(Error::Shard {
            store: store.to_owned(),
            shard: shard.index,
            kind: ErrorKind::Internal,
            reason: format!("the members' counts of writes differ under the fence: {counts:?}"),
        }));
    }
    let (rows_fenced, copied_to) = copy_differing(source, &target).map_err(lift)?;
    copied.rows_fenced += rows_fenced;
    // one count of writes on every replica: the replica's copies were writes of its own
    let version = count.max(copied_to);
    target
        .client
        .adopt(&[], WriteOptions::default(), version)
        .map_err(lift)?;
    if version > count {
        for (_, m) in sources {
            m.client
                .adopt(&[], WriteOptions::default(), version)
                .map_err(lift)?;
        }
    }
    // admitted: on it first, then on the members (which lifts their fences)
    let mut members = learned.members.clone();
    members.push(id);
    let mut order = vec![r];
    order.extend(
        install_order(learned, &learned.members)
            .into_iter()
            .filter(|&q| q != r),
    );
    let epoch = change(shard, learned, &members, &order).map_err(lift)?;
    let_go(shard, held);
    Ok((epoch, version))
}

/// Shard `shard`'s fence taken in etcd for replica `id`'s catch-up, for `lease`, where its
/// membership is kept there: its lease. Refused (`MembershipChanged`, so that the catch-up
/// learns and tries again) where another catch-up holds it or the record moved; `Unavailable`
/// where etcd does not answer.
fn fence_in_etcd(
    store: &str,
    shard: &Shard,
    learned: &Learned,
    (id, lease): (u64, Duration),
) -> nearrec::Result<Option<i64>> {
    let Some(map) = &shard.etcd else {
        return Ok(None);
    };
    let seen = match &learned.etcd {
        Ok(Some(seen)) => seen.clone(),
        Ok(None) => return Ok(None),
        Err(e) => return Err(map.unavailable(shard.index, e)),
    };
    let fence = Fence {
        epoch: learned.epoch,
        replica: id,
    };
    match map.blocking(map.fence(shard.index, &seen, &fence, lease)) {
        Ok(Some(held)) => Ok(Some(held)),
        Ok(None) => {
            let other = map.blocking(map.fenced(shard.index)).ok().flatten();
            Err(Error::MembershipChanged {
                store: format!("shard {} of {store}", shard.index),
                epoch: learned.epoch,
                member: false,
                reason: match other {
                    Some(f) => format!(
                        "another catch-up (of replica {:016x}) holds the shard's fence in etcd",
                        f.replica
                    ),
                    None => "the shard's record in etcd moved".into(),
                },
            })
        }
        Err(e) => Err(map.unavailable(shard.index, e)),
    }
}

/// Lets go of a fence taken in etcd.
fn let_go(shard: &Shard, held: Option<i64>) {
    if let (Some(map), Some(lease)) = (&shard.etcd, held) {
        map.blocking(map.settled(lease));
    }
}
