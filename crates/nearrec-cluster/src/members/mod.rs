//! A shard's membership as routers keep it, and a replica catching up (`docs/distributed.md`,
//! "A replica catching up"; the replica's side is `nearrec`'s `membership.rs`).
//!
//! Every replica keeps an epoch and the shard's members at it. A router takes the members to be
//! those named at the highest epoch a replica holds (where replicas at that epoch name different
//! sets — two changes that raced — only those all of them name), and of those, the ones whose
//! count of writes is the newest: the others missed a write. Not so one the router learned was
//! left out and a later epoch names: only a catch-up names a replica again, having made the
//! counts one under a fence, so a count behind it now is a write on its way. Only members serve
//! reads and take writes, and every prepare carries the epoch, which a replica at another
//! refuses: a router that missed a change learns it at its next write, before the write lands
//! anywhere.
//!
//! - **A replica that missed a write** the others took is left out: the router that saw it
//!   install the next epoch, without it, on the members ([`exclude`]).
//! - **A replica catching up** ([`catch_up`]): left out first if it is still named; the rows
//!   that differ from a member copied to it (digests compared where the rows are, the rows
//!   adopted as records of its own); the members fenced (new writes wait, those prepared drain)
//!   for a last pass; every count of writes made the same; then the next epoch, naming it,
//!   installed on it first and on the members after, which lifts their fences.
//! - **A change cut short** (its router died): a member still at an older epoch than the one
//!   that names it is brought to it by the next router that learns the shard (the change was
//!   decided); a fence past its lease, with no newer epoch anywhere, is lifted by the next
//!   router whose write it holds up, with an epoch of the same members ([`settle_fences`]).
//!
//! **With etcd** (`etcd/`), the shard's record there is its membership: learned from it, and
//! changed by a transaction that compares the record's revision first, so of two changes from
//! one epoch exactly one is made, whatever the network does; the replicas are then told, those
//! left out first. A replica left out without its word (it did not answer) is waited out — its
//! node's hold of it runs out — before the members take a write it lacks. A router that cannot
//! reach etcd makes no change: the write that needed one fails, `Unavailable` naming etcd.
//!
//! **Without etcd**, changes are compare-and-sets of each replica's epoch, the replicas left
//! out first and the members after, so of two changes from one epoch the one that reaches a
//! replica first wins there and the other stops. Under a partition in which two routers each
//! reach a different replica and not the other, this is no consensus: each may go on with its
//! own (documented).

mod catch_up;
mod copy;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use nearrec::{Error, ErrorKind, Membership, Replica as _, StoreApi};
use nearrec_client::Client;

use crate::etcd::{Fresh, Seen, ShardMap, ShardRecord};
use crate::shard::{Replica, Shard, on_each};
pub use catch_up::CaughtUp;
pub(crate) use catch_up::catch_up;

/// A replica's membership and count of writes, as it answered (`None`: it did not, or it
/// serves another version than the one read).
type Answer = Option<(Membership, u64)>;

/// What a router learned of a shard's membership.
#[derive(Debug)]
pub(crate) struct Learned {
    pub epoch: u64,
    /// The members by id.
    pub members: Vec<u64>,
    /// Each replica's answer.
    pub answers: Vec<Answer>,
    /// The shard's record in etcd as read (its membership kept there): `Ok(None)` without
    /// etcd, `Err` why etcd did not answer.
    pub etcd: Result<Option<Seen>, String>,
}

/// What a replica answers of its place: its membership, its count of writes, and the version
/// of its repository it serves.
fn ask(client: &Client) -> nearrec::Result<(Membership, u64, Option<u64>)> {
    let info = client.info()?;
    Ok((client.membership()?, info.version, info.served_version))
}

/// The epoch and members replicas that answered `answers` name: the highest epoch any holds,
/// and the members every replica at it names (every replica at epoch 0).
fn of_answers(replicas: &[Arc<Replica>], answers: &[Answer]) -> (u64, Vec<u64>) {
    let epoch = (answers.iter().flatten())
        .map(|(m, _)| m.epoch)
        .max()
        .unwrap_or(0);
    let members: Vec<u64> = if epoch == 0 {
        // every replica: those that do not answer too, by the ids they answered before
        (replicas.iter().zip(answers))
            .map(|(r, a)| {
                a.as_ref()
                    .map_or_else(|| r.id.load(Relaxed), |(m, _)| m.replica)
            })
            .filter(|&id| id != 0)
            .collect()
    } else {
        let mut named = (answers.iter().flatten()).filter(|(m, _)| m.epoch == epoch);
        let first = named
            .next()
            .map_or_else(Vec::new, |(m, _)| m.members.clone());
        named.fold(first, |mut all, (m, _)| {
            all.retain(|id| m.members.contains(id));
            all
        })
    };
    (epoch, members)
}

/// Learns shard `shard`'s membership from its replicas, those serving cluster version `pin`
/// (0: any), or from its record in etcd where it is kept there: marks each replica live or
/// stale as the module says, brings members behind the shard's epoch to it, and keeps the epoch
/// and members for the router's writes. With `by_count`, a member whose count of writes is
/// behind the others' is stale too (when no write can be under way between them: a replica
/// given anew, a store connecting); not one it learned was left out and that a later epoch
/// names (a catch-up admitted it). A replica this router saw miss a write stays stale until an
/// epoch past that one names it again.
pub(crate) fn learn(shard: &Shard, pin: u64, by_count: bool) -> Learned {
    let replicas = shard.all_replicas();
    let answers: Vec<Answer> = on_each(&replicas, |r| {
        let (m, count, served) = ask(&r.client).ok()?;
        (pin == 0 || served.unwrap_or(0) == pin).then_some((m, count))
    });
    let etcd = match &shard.etcd {
        Some(map) => map.read_now(shard.index).map(Some),
        None => Ok(None),
    };
    let kept = match &etcd {
        Ok(Some(Seen {
            record: Some(r), ..
        })) => Some((r.epoch, r.members.clone())),
        // etcd did not answer: the members this router knows, read on, changed by no one
        Err(_) => Some(shard.membership.lock().unwrap().clone()).filter(|(e, _)| *e > 0),
        _ => None,
    };
    let (epoch, mut members) = match kept {
        Some(kept) => kept,
        None => of_answers(&replicas, &answers),
    };
    members.sort_unstable();
    // members behind the epoch that names them: the change that named them was decided
    for (r, answer) in replicas.iter().zip(&answers) {
        if let Some((m, _)) = answer
            && m.epoch < epoch
            && members.contains(&m.replica)
        {
            let _ = r.client.set_membership(m.epoch, epoch, &members);
        }
    }
    // at epoch 0 every replica is a member (a read-only one has no id)
    let named = |id: u64| epoch == 0 || members.contains(&id);
    let newest = (answers.iter().flatten())
        .filter(|(m, _)| named(m.replica))
        .map(|(_, count)| *count)
        .max()
        .unwrap_or(0);
    for (r, answer) in replicas.iter().zip(&answers) {
        match answer {
            Some((m, count)) => {
                r.id.store(m.replica, Relaxed);
                // behind the others: missed a write (`by_count`), or is taking one now — as
                // it was, then; unless a catch-up admitted it since it was left out, which
                // made its count the members' (a write of another router's that its members
                // committed first is on its way to it)
                let member = named(m.replica);
                let admitted = member && r.admitted_at(epoch);
                let behind = *count < newest && (by_count || (r.is_stale() && !admitted));
                r.set_stale(!(member && !behind && !r.missed_since(epoch)));
                if !member {
                    r.left_out_at(epoch);
                }
            }
            // not answering: held out of reads as any replica that misses; a member left as it
            // is (a write it misses leaves it out), anything else stale
            None => {
                if !named(r.id.load(Relaxed)) {
                    r.set_stale(true);
                    r.left_out_at(epoch);
                }
            }
        }
    }
    if let (Some(map), Ok(Some(seen))) = (&shard.etcd, &etcd) {
        let hold = seen.record.as_ref().map_or(map.hold, ShardRecord::hold);
        wait_fresh(
            map,
            shard.index,
            &replicas,
            &answers,
            (epoch, &members),
            hold,
        );
    }
    *shard.membership.lock().unwrap() = (epoch, members.clone());
    Learned {
        epoch,
        members,
        answers,
        etcd,
    }
}

/// Waits out the change that made shard `shard`'s epoch `epoch` (naming `members`) while it is
/// fresh in etcd ([`Fresh`]: made less than a hold ago, leaving replicas out without their
/// word, its router gone or still waiting them out) — unless each replica it left out answers
/// here at that epoch, or takes it now: until then one may still be held, serving reads that
/// miss what the members take. One hold (and a tenth) from now at most, since the change was
/// made before: cut short when it is fresh no more (its router settled it). etcd not answering
/// the question: the whole hold.
fn wait_fresh(
    map: &ShardMap,
    shard: usize,
    replicas: &[Arc<Replica>],
    answers: &[Answer],
    (epoch, members): (u64, &[u64]),
    hold: Duration,
) {
    let start = Instant::now();
    let fresh = match map.blocking(map.fresh(shard)) {
        Ok(Some(f)) if f.epoch == epoch => f,
        Ok(_) => return,
        Err(_) => return map.wait_out(start, hold),
    };
    let unsure = fresh.left.iter().any(|&id| {
        let at = (replicas.iter().zip(answers)).find_map(|(r, a)| {
            a.as_ref()
                .filter(|(m, _)| m.replica == id)
                .map(|(m, _)| (r, m))
        });
        match at {
            Some((_, m)) if m.epoch >= epoch => false,
            Some((r, m)) => r.client.set_membership(m.epoch, epoch, members).is_err(),
            None => true,
        }
    });
    let until = start + hold + hold / 10;
    while unsure && Instant::now() < until {
        match map.blocking(map.fresh(shard)) {
            Ok(Some(f)) if f.epoch == epoch => std::thread::sleep(hold / 20),
            Ok(_) => return,
            Err(_) => return map.wait_out(start, hold),
        }
    }
}

/// Refuses a shard two of whose replicas are one replica's copies (a replica's directory copied
/// with its `MEMBERSHIP`, so with its id): a change of membership could not tell them apart.
pub(crate) fn check_ids(store: &str, shard: &Shard) -> nearrec::Result<()> {
    let replicas = shard.all_replicas();
    for (i, a) in replicas.iter().enumerate() {
        let id = a.id.load(Relaxed);
        if let Some(b) = (replicas[i + 1..].iter()).find(|b| id != 0 && b.id.load(Relaxed) == id) {
            return Err(Error::Shard {
                store: store.to_owned(),
                shard: shard.index,
                kind: ErrorKind::InvalidRequest,
                reason: format!(
                    "replicas {} and {} are copies of one replica (id {id:#x} in their \
                     MEMBERSHIP files): remove the file from the copy before serving it, and it \
                     joins as a replica of its own",
                    a.addr, b.addr
                ),
            });
        }
    }
    Ok(())
}

/// Installs epoch `learned.epoch + 1` naming `members` on the replicas at `order` (indices into
/// the shard's replicas, those left out first), each from the epoch it answered. Stops at the
/// first that refuses (another change got there first): the caller learns again. With etcd,
/// the change is made there first ([`decide`]), and the members `learned` named that it leaves
/// out are told before anyone else, or waited out.
fn change(
    shard: &Shard,
    learned: &Learned,
    members: &[u64],
    order: &[usize],
) -> nearrec::Result<u64> {
    let replicas = shard.all_replicas();
    let epoch = learned.epoch + 1;
    let mut order = order.to_vec();
    if let Some(map) = &shard.etcd {
        let (decided, hold, fresh) = decide(map, shard, learned, epoch, members)?;
        let id = |r: usize| {
            (learned.answers[r].as_ref())
                .map_or_else(|| replicas[r].id.load(Relaxed), |(m, _)| m.replica)
        };
        let left: Vec<usize> = (0..replicas.len())
            .filter(|&r| learned.members.contains(&id(r)) && !members.contains(&id(r)))
            .collect();
        let told = on_each(&left, |&r| match &learned.answers[r] {
            Some((m, _)) => replicas[r]
                .client
                .set_membership(m.epoch, epoch, members)
                .is_ok(),
            None => false,
        });
        if told.contains(&false) {
            map.wait_out(decided, hold);
        }
        if let Some(lease) = fresh {
            map.blocking(map.settled(lease));
        }
        order.retain(|r| !left.contains(r));
    }
    for &r in &order {
        let Some((m, _)) = &learned.answers[r] else {
            continue;
        };
        replicas[r].client.set_membership(m.epoch, epoch, members)?;
    }
    *shard.membership.lock().unwrap() = (epoch, members.to_vec());
    Ok(epoch)
}

/// Makes epoch `epoch`, naming `members`, shard `shard`'s record in etcd (`map`) if it is still the one
/// `learned` read: when it was made, the hold time a replica it leaves out is waited out for,
/// and — when it leaves members out — the lease that keeps it fresh meanwhile ([`Fresh`]; to
/// be settled once they are told or waited out). `MembershipChanged` when another change was
/// made first (the caller learns again), `Unavailable` naming etcd when it did not answer.
fn decide(
    map: &ShardMap,
    shard: &Shard,
    learned: &Learned,
    epoch: u64,
    members: &[u64],
) -> nearrec::Result<(Instant, Duration, Option<i64>)> {
    let seen = match &learned.etcd {
        Ok(Some(seen)) => seen,
        Ok(None) => unreachable!("learned without etcd"),
        Err(why) => return Err(map.unavailable(shard.index, why)),
    };
    if members.is_empty() {
        // whatever asked it: a shard without members serves nothing, and no router could
        // ever name one again (found by the partition harness: a catch-up leaving its only
        // member out)
        return Err(map.unavailable(
            shard.index,
            "the change would leave the shard no member: not made",
        ));
    }
    let hold = seen.record.as_ref().map_or(map.hold, ShardRecord::hold);
    let mut sorted = members.to_vec();
    sorted.sort_unstable();
    let record = ShardRecord {
        epoch,
        members: sorted,
        hold_ms: u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
    };
    let left: Vec<u64> = (learned.members.iter())
        .filter(|id| !members.contains(id))
        .copied()
        .collect();
    let fresh = Fresh { epoch, left };
    let lease = match fresh.left.is_empty() {
        true => None,
        false => Some(
            (map.blocking(map.fresh_lease(hold)))
                .map_err(|why| map.unavailable(shard.index, why))?,
        ),
    };
    let fresh = lease.map(|lease| (&fresh, lease));
    let outcome = map.change_surely(shard.index, seen, &record, fresh);
    if outcome != Ok(true)
        && let Some(lease) = lease
    {
        map.blocking(map.settled(lease));
    }
    match outcome {
        // made: its hold is waited out from now (a change answered late was made earlier)
        Ok(true) => Ok((Instant::now(), hold, lease)),
        Ok(false) => Err(Error::MembershipChanged {
            store: format!("shard {} of {}", shard.index, map.store()),
            epoch: learned.epoch,
            member: true,
            reason: format!(
                "another router changed the shard's membership in etcd first (from epoch {})",
                learned.epoch
            ),
        }),
        Err(why) => Err(map.unavailable(shard.index, why)),
    }
}

/// The replicas of `learned` in the order a change installs on them: those `members` leaves
/// out first, then the members.
fn install_order(learned: &Learned, members: &[u64]) -> Vec<usize> {
    let (mut out, mut inside) = (Vec::new(), Vec::new());
    for (r, answer) in learned.answers.iter().enumerate() {
        if let Some((m, _)) = answer {
            if members.contains(&m.replica) {
                inside.push(r);
            } else {
                out.push(r);
            }
        }
    }
    out.extend(inside);
    out
}

/// Leaves the replicas `gone` (by id) out of the shard, after they missed a write the others
/// took: the next epoch, without them, installed on the members (without etcd the ones left
/// out are not asked: they are likely down, and at the older epoch they are no members anyway;
/// with etcd they are told, or waited out). Tried again on the epoch another router's change
/// made. Without etcd this is done as well as it can be, and answers `Ok`; with etcd a change
/// not made — etcd did not answer, or three other changes won — is the error: the write that
/// needed it must not go on without it; so is, with etcd, a shard whose epoch moved past `at`
/// (the epoch the write was prepared at: another router changed the members it was sent to,
/// and it is tried again at the new one), and a change that would leave no member.
pub(crate) fn exclude(
    shard: &Shard,
    pin: u64,
    gone: &[u64],
    at: Option<u64>,
) -> nearrec::Result<()> {
    let mut outcome = Ok(());
    for _ in 0..3 {
        let learned = learn(shard, pin, false);
        if let Some(map) = &shard.etcd {
            if at.is_some_and(|at| learned.epoch != at) {
                return Err(Error::MembershipChanged {
                    store: format!("shard {} of {}", shard.index, map.store()),
                    epoch: learned.epoch,
                    member: true,
                    reason: format!(
                        "the write was prepared at epoch {}, and the shard's members changed \
                         since",
                        at.unwrap_or(0)
                    ),
                });
            }
            if learned.members.iter().all(|id| gone.contains(id)) {
                return Err(map.unavailable(
                    shard.index,
                    "every member of the shard missed the write: leaving them out would leave \
                     none",
                ));
            }
        }
        let members: Vec<u64> = (learned.members.iter())
            .filter(|id| !gone.contains(id))
            .copied()
            .collect();
        if members.len() == learned.members.len() {
            return Ok(());
        }
        let order: Vec<usize> = (install_order(&learned, &members).into_iter())
            .filter(|&r| {
                (learned.answers[r].as_ref()).is_some_and(|(m, _)| members.contains(&m.replica))
            })
            .collect();
        outcome = change(shard, &learned, &members, &order).map(drop);
        match &outcome {
            Ok(()) => {
                learn(shard, pin, false);
                return Ok(());
            }
            Err(e) if e.kind() != ErrorKind::MembershipChanged => break,
            Err(_) => {}
        }
    }
    if shard.etcd.is_none() {
        Ok(())
    } else {
        outcome
    }
}

/// Learns shard `shard`'s membership as a router connecting, or given a replica anew, does:
/// a member behind the others' count of writes (it was down while they were written, at epoch
/// 0, before any router left it out) is left out now.
pub(crate) fn learn_anew(shard: &Shard, pin: u64) {
    let mut learned = learn(shard, pin, true);
    if let Ok(Some(Seen { record: None, .. })) = &learned.etcd
        && !learned.members.is_empty()
    {
        // the first router of a shard kept in etcd: the record made from what the replicas
        // say, at an epoch past theirs (epoch 0's "every replica" is no set etcd can keep)
        let order = install_order(&learned, &learned.members);
        let _ = change(shard, &learned, &learned.members.clone(), &order);
        learned = learn(shard, pin, true);
    }
    let newest = (learned.answers.iter().flatten())
        .map(|(_, count)| *count)
        .max()
        .unwrap_or(0);
    let behind: Vec<u64> = (learned.answers.iter().flatten())
        .filter(|(m, count)| *count < newest && m.replica != 0)
        .filter(|(m, _)| learned.epoch == 0 || learned.members.contains(&m.replica))
        .map(|(m, _)| m.replica)
        .collect();
    if !behind.is_empty() {
        // not made now (etcd down): the next write that reaches them, or a catch-up, leaves
        // them out
        let _ = exclude(shard, pin, &behind, None);
    }
}

/// Learns shard `shard`'s membership and lifts the fences held past their lease on its
/// replicas, when no newer epoch names another set (a catch-up that died before it admitted its
/// replica): the next epoch, of the same members, on every replica that answers. What it learned
/// last.
pub(crate) fn settle_fences(shard: &Shard, pin: u64) -> Learned {
    let learned = learn(shard, pin, false);
    let expired = (learned.answers.iter().flatten())
        .any(|(m, _)| m.epoch == learned.epoch && m.fence_expired());
    if !expired {
        return learned;
    }
    let order = install_order(&learned, &learned.members);
    let _ = change(shard, &learned, &learned.members, &order);
    learn(shard, pin, false)
}
