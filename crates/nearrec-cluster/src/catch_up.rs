//! Every router keeps its shards at their replicas: a thread of its own catches up, every
//! [`EVERY`], the replicas that missed writes (`ShardedStore::catch_up`) — a node that was
//! down, or one a router that died left out — so that redundancy comes back without anyone
//! calling for it (`ShardedOptions::catch_up_every`; `None` turns it off). It says when a
//! shard runs below its replicas, and when it is whole again; `cluster_stale_replicas` in the
//! store's stats counts the replicas left out meanwhile. The store gives the thread its pass
//! (`store/`), which holds the store only while it runs and ends with it.

use std::time::Duration;

use crate::members::CaughtUp;

/// How often a router catches up its stale replicas by default.
pub const EVERY: Duration = Duration::from_secs(2);
/// How long a catch-up may fence a shard's members for its last pass.
pub const LEASE: Duration = Duration::from_secs(10);

/// What one pass did: each replica caught up (or why not), by shard and address; and each
/// shard's members and replicas after it.
pub(crate) type Pass = (
    Vec<(usize, String, nearrec::Result<CaughtUp>)>,
    Vec<(usize, usize)>,
);

/// Starts store `name`'s background catch-up: `pass` every `every`, until it answers `None`
/// (the store is gone or closed); `last`: each shard's members and replicas now.
pub(crate) fn spawn(
    name: String,
    every: Duration,
    mut last: Vec<(usize, usize)>,
    mut pass: impl FnMut() -> Option<Pass> + Send + 'static,
) -> nearrec::Result<()> {
    std::thread::Builder::new()
        .name("nearrec-catch-up".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some((done, now)) = pass() else {
                    return;
                };
                for (shard, replica, done) in done {
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
