//! Every router keeps its shards at their replicas: a thread of its own catches up, every
//! [`EVERY`], the replicas that missed writes ([`ShardedStore::catch_up`]) — a node that was
//! down, or one a router that died left out — so that redundancy comes back without anyone
//! calling for it (`ShardedOptions::catch_up_every`; `None` turns it off). It says when a
//! shard runs below its replicas, and when it is whole again; `cluster_stale_replicas` in the
//! store's stats counts the replicas left out meanwhile. The thread holds the store only while
//! a pass runs, and ends with it.

use std::time::Duration;

use crate::store::ShardedStore;

/// How often a router catches up its stale replicas by default.
pub const EVERY: Duration = Duration::from_secs(2);
/// How long a catch-up may fence a shard's members for its last pass.
const LEASE: Duration = Duration::from_secs(10);

/// Starts `store`'s background catch-up, a pass every `every`.
pub(crate) fn spawn(store: &ShardedStore, every: Duration) -> nearrec::Result<()> {
    let weak = store.downgrade();
    let name = store.plan().store.clone();
    let mut last = store.members();
    std::thread::Builder::new()
        .name("nearrec-catch-up".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(store) = weak.upgrade().filter(|s| !s.is_closed()) else {
                    return;
                };
                for (shard, replica, done) in store.catch_up(LEASE) {
                    match done {
                        Ok(c) => tracing::info!(
                            store = %name, shard, %replica, rows = c.rows_before_fence + c.rows_fenced,
                            epoch = c.epoch, "replica caught up and admitted"
                        ),
                        Err(e) => tracing::debug!(
                            store = %name, shard, %replica, "replica not caught up yet: {e}"
                        ),
                    }
                }
                let now = store.members();
                say(&name, &last, &now);
                last = now;
            }
        })
        .map(|_| ())
        .map_err(|e| nearrec::Error::Internal(format!("cannot start the catch-up thread: {e}")))
}

/// A line for each shard whose count of members changed: below its replicas (a warning), or
/// whole again.
fn say(store: &str, before: &[(usize, usize)], now: &[(usize, usize)]) {
    for (shard, (&(was, _), &(live, all))) in before.iter().zip(now).enumerate() {
        if live == was {
            continue;
        }
        if live < all {
            tracing::warn!(
                store,
                shard,
                members = live,
                replicas = all,
                "shard {shard} runs on {live} of its {all} replicas; the others are caught up \
                 in the background"
            );
        } else {
            tracing::info!(
                store,
                shard,
                replicas = all,
                "shard {shard} has all its replicas again"
            );
        }
    }
}
