//! Cluster versions. A sharded store whose shards are served from repositories of versions
//! (`DIR/shard-K/1, 2, ...`; `nearrec shard --publish` cuts a new store by the same plan into
//! version V of every shard) reads each batch at one version, its router's *pin*: every shard's
//! share of the batch asks for that version (`Versions::lookup_version`), and a replica that
//! does not hold it refuses rather than answer from another. A swap moves every shard to a new
//! version without a batch that reads two:
//!
//! 1. **stage** — every live replica opens version V beside the one it serves
//!    (`Replica::stage`), checked and warmed; any refusal fails the swap, nothing switched;
//!    then, where the store's record is kept in etcd, the record moved to V by a compare of its
//!    revision (`decide`): of two routers swapping at once one goes on, the other releases
//!    what it staged and fails; none while a change of the tables is under way;
//! 2. **switch** — every live replica serves V, keeping the version it replaced open for
//!    lookups pinned to it (batches of this router and of others still read the old version,
//!    on every shard); a replica that fails its switch is stale; a shard none of whose
//!    replicas switched is switched back everywhere and the swap fails;
//! 3. **pin** — this router's batches read V from then on;
//! 4. **release** — every replica lets go of the version V replaced.
//!
//! Another router learns of the switch when a replica refuses its pin (released, or a node
//! restarted that serves only its repository's current version): it asks the shards what they
//! serve, moves its pin there ([`pin_of`]) and reads the batch again. A batch of any router is
//! answered at one version or refused and read again: never from two.

use std::sync::atomic::{AtomicU64, Ordering};

use nearrec::{Error, ErrorKind, Replica as _, StoreApi, SwapTo, Versions as _};

use crate::shard::{Replica, Shard, on_each};

/// The cluster version to read at, from what each shard's replicas serve (`served[k]`: shard
/// `k`'s replicas' repository versions; `None` for a replica not served from a repository):
/// the newest version some replica of every shard serves; when there is none (a switch under
/// way), the oldest any serves (a switching replica keeps it open); 0 when no shard is served
/// from a repository (no pin: each read takes what is served).
pub(crate) fn pin_of(served: &[Vec<Option<u64>>]) -> u64 {
    let all: Vec<u64> = served.iter().flatten().flatten().copied().collect();
    if all.is_empty() {
        return 0;
    }
    let everywhere = (all.iter().copied())
        .filter(|v| served.iter().all(|s| s.contains(&Some(*v))))
        .max();
    everywhere.unwrap_or_else(|| all.iter().copied().min().unwrap_or(0))
}

/// The version every live replica of `shards` serves now, by [`pin_of`] (replicas that do not
/// answer are left out).
pub(crate) fn served(shards: &[Shard]) -> u64 {
    let served: Vec<Vec<Option<u64>>> = (shards.iter())
        .map(|s| {
            let live = s.live_replicas();
            let infos = on_each(&live, |(_, r)| r.client.info());
            infos
                .into_iter()
                .filter_map(|i| i.ok().map(|i| i.served_version))
                .collect()
        })
        .collect();
    pin_of(&served)
}

/// Moves every shard of `store` to what `to` names, as the module says; `pin` is the router's,
/// moved last. Returns the new version's number and each shard's count of writes there.
pub(crate) fn switch(
    store: &str,
    shards: &[Shard],
    pin: &AtomicU64,
    to: &SwapTo,
    (warm, force): (bool, bool),
    decide: &dyn Fn(u64, u64) -> nearrec::Result<()>,
) -> nearrec::Result<(u64, Vec<u64>)> {
    let old = pin.load(Ordering::Acquire);
    if old == 0 {
        return Err(Error::invalid(format!(
            "the shards of {store} are not served from repositories of versions: cut the store \
             with nearrec shard (each shard a repository) and publish new versions with \
             nearrec shard --publish"
        )));
    }
    if let SwapTo::Path(p) = to {
        return Err(Error::invalid(format!(
            "a sharded store swaps to a version every shard holds, not to a path ({p}): publish \
             the new store's cut (nearrec shard NEW --publish DIR), then swap to its version"
        )));
    }
    let live: Vec<(usize, std::sync::Arc<Replica>)> = (shards.iter())
        .flat_map(|s| s.live_replicas().into_iter().map(|(_, r)| (s.index, r)))
        .collect();
    let fail = |k: usize, r: &Replica, what: &str, e: Error| Error::Shard {
        store: store.to_owned(),
        shard: k,
        kind: e.kind(),
        reason: format!("replica {} did not {what}: {e}", r.addr),
    };

    // 1. stage everywhere, or nothing switches
    let staged = on_each(&live, |(_, r)| r.client.stage(to, warm, force));
    let mut version = None;
    for ((k, r), got) in live.iter().zip(staged) {
        let v = got.map_err(|e| fail(*k, r, "stage the version", e))?;
        match version {
            None => version = Some(v),
            Some(w) if w != v => {
                return Err(Error::Shard {
                    store: store.to_owned(),
                    shard: *k,
                    kind: ErrorKind::InvalidRequest,
                    reason: format!(
                        "replica {} staged version {v} where others staged {w}: the shards' \
                         repositories are not in step (publish each version to every shard)",
                        r.addr
                    ),
                });
            }
            Some(_) => {}
        }
    }
    let Some(version) = version else {
        return Err(Error::Shard {
            store: store.to_owned(),
            shard: 0,
            kind: ErrorKind::Unavailable,
            reason: "no live replica to swap".into(),
        });
    };

    // decided (in etcd, where the store's record is kept there): of two routers swapping at
    // once, one switches
    if let Err(e) = decide(old, version) {
        on_each(&live, |(_, r)| r.client.release());
        return Err(e);
    }

    // 2. switch everywhere: each keeps the version it replaced for reads still pinned to it
    let switched = on_each(&live, |(_, r)| {
        r.client.swap(&SwapTo::Version(version), false, force)
    });
    let mut counts = vec![None; shards.len()];
    let mut first_error = None;
    for ((k, r), got) in live.iter().zip(switched) {
        match got {
            Ok(count) => counts[*k] = Some(counts[*k].unwrap_or(0).max(count)),
            Err(e) => {
                r.mark_stale(shards[*k].epoch());
                first_error.get_or_insert_with(|| fail(*k, r, "switch", e));
            }
        }
    }
    if counts.iter().any(Option::is_none) {
        // a shard that did not switch: back everywhere, the pin unmoved
        let back: Vec<_> = (live.iter())
            .filter(|(k, _)| counts[*k].is_some())
            .collect();
        on_each(&back, |(_, r)| {
            r.client.swap(&SwapTo::Version(old), false, true)
        });
        let _ = decide(version, old);
        return Err(first_error.expect("a shard without a switched replica had an error"));
    }

    // 3. this router reads the new version from now on; then the replicas let go of the old
    // one, so that every other router's next batch is refused there and moves to the new one
    // (best effort: one that keeps it lets it go at the next stage)
    let counts: Vec<u64> = counts.into_iter().map(Option::unwrap_or_default).collect();
    for (s, &c) in shards.iter().zip(&counts) {
        s.seen.repin(version, c);
    }
    pin.store(version, Ordering::Release);
    on_each(&live, |(_, r)| r.client.release());
    Ok((version, counts))
}

#[cfg(test)]
mod tests {
    use super::pin_of;

    #[test]
    fn the_pin_is_the_newest_version_every_shard_serves_else_the_oldest_any_does() {
        assert_eq!(pin_of(&[vec![None], vec![None, None]]), 0);
        assert_eq!(pin_of(&[vec![Some(3)], vec![Some(3), Some(3)]]), 3);
        // one replica of shard 1 switched, the other did not
        assert_eq!(pin_of(&[vec![Some(3)], vec![Some(4), Some(3)]]), 3);
        assert_eq!(pin_of(&[vec![Some(4)], vec![Some(4), Some(3)]]), 4);
        // shard 0 switched, shard 1 not yet: the old one, which switched replicas keep
        assert_eq!(pin_of(&[vec![Some(4)], vec![Some(3)]]), 3);
        // a shard with no answer is no vote
        assert_eq!(pin_of(&[vec![Some(4)], vec![]]), 4);
    }
}
