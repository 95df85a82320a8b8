//! A store as a replica of its shard ([`Replica`]): a version staged beside the served one and
//! let go, its part in a write across shards, its membership read and changed, the fence of a
//! catch-up, the rows a replica catching up adopts, and the check every write passes
//! (`crate::membership` keeps the state; `docs/distributed.md`, "A replica catching up").

use std::sync::RwLockReadGuard;
use std::time::{Duration, Instant};

use super::{Store, lock};
use crate::api::{MAX_DIGEST_ROWS, Replica, ShardTag, StoreApi, row_digest};
use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::live::{Decision, LastWriter, RowWrite, Transaction, WriteOptions};
use crate::membership::{Membership, changed, now_ms};
use crate::versions::SwapTo;
use nearrec_format::FeedCursor;

impl Replica for Store {
    /// Opens version `to` of the repository the store is served from beside the served one,
    /// checked as a swap checks it (unless `force`) and warmed from it (with `warm`), without
    /// serving it: a later swap to it switches at once, and lookups pinned to its number
    /// ([`crate::Versions::lookup_version`]) are answered from it meanwhile. After that swap the
    /// version it replaced stays open for lookups pinned to it, until the next stage or swap.
    /// This is how a sharded store moves every shard to a new version without a batch that
    /// reads two: stage everywhere, switch everywhere, then pin its batches to the new one.
    /// Staging lets go of what was held before. Returns the staged version's number.
    fn stage(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64> {
        let Some(repo) = &self.inner.repo else {
            return Err(self.no_repository("stage a version"));
        };
        let _lock = repo.lock()?;
        let served = self.served_version().unwrap_or(0);
        let (version, path, _) = crate::versions::target(repo, served, to)?;
        if version == served {
            return Err(Error::invalid(format!(
                "version {version} is the one served; stage another"
            )));
        }
        self.release()?;
        let staged = self.open_version(&path, warm, force)?;
        lock(&self.inner.held).staged = Some((version, staged));
        Ok(version)
    }

    /// Lets go of the versions held open beside the served one ([`Replica::stage`]): lookups
    /// pinned to them are refused from now on (`VersionNotServed`), their memory freed once
    /// the calls on them end. A sharded store releases them once every shard serves the new
    /// version, so that every router moves to it on its next batch.
    fn release(&self) -> Result<()> {
        let gone = lock(&self.inner.held).take_all();
        for old in gone {
            self.retire(old);
        }
        Ok(())
    }

    /// At membership epoch `epoch` (`crate::membership`; `None`: the shard's only replica).
    fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
        feed: Option<(&str, FeedCursor)>,
    ) -> Result<()> {
        let _admitted = self.admit(epoch)?;
        self.current()
            .live
            .prepare_write(tx, writes, options, note, feed, true)
    }

    fn hold_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
        feed: Option<(&str, FeedCursor)>,
    ) -> Result<()> {
        let _admitted = self.admit(epoch)?;
        self.current()
            .live
            .prepare_write(tx, writes, options, note, feed, false)
    }

    fn decide(&self, tx: u128, decision: Decision, keep: bool) -> Result<u64> {
        self.current().live.decide(tx, decision, keep)
    }

    fn forget(&self, tx: u128) -> Result<()> {
        self.current().live.forget(tx)
    }

    fn transactions(&self) -> Result<Vec<Transaction>> {
        self.current().live.transactions()
    }

    fn membership(&self) -> Result<Membership> {
        Ok(self.inner.place.read().clone())
    }

    /// Makes `members` (ids, any order) the shard's members at `epoch` on this replica if it
    /// is at epoch `expected` now (a compare-and-set; else [`Error::MembershipChanged`] naming
    /// the one it holds), durably; lifts a fence. `epoch` must be past `expected`.
    fn set_membership(&self, expected: u64, epoch: u64, members: &[u64]) -> Result<Membership> {
        let name = || self.name();
        self.inner
            .place
            .change(|m| {
                if m.epoch != expected || epoch <= expected {
                    return Err(changed(
                        name(),
                        m,
                        format!(
                            "asked to go from epoch {expected} to {epoch} (an epoch only moves \
                         forward, from the one held)"
                        ),
                    ));
                }
                m.install(epoch, members);
                Ok(())
            })
            .inspect(|m| {
                // told it is out: it serves nothing from now on, not until its hold runs out (its
                // router may let the members take a write it lacks as soon as it answers this)
                if !m.is_member() {
                    self.inner.place.let_go();
                }
            })
    }

    /// Fences the replica for a catch-up's last pass: new prepares and writes are refused
    /// (`StoreLocked`; their routers try again within their deadlines) until its membership
    /// changes, and this waits until none it took before is still prepared, for at most
    /// `lease`. Returns the store's count of writes then, which holds while fenced. Refused
    /// unless the replica is a member at `epoch`; when what is prepared does not drain within
    /// the lease, the fence is lifted again and the call refused.
    fn fence(&self, epoch: u64, lease: Duration) -> Result<u64> {
        let name = || self.name();
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let started = std::time::Instant::now();
        // taken whole: the writes under way finish first
        self.inner.place.change(|m| {
            if m.epoch != epoch || !m.is_member() {
                let why = format!("a fence asked for a member at epoch {epoch}");
                return Err(changed(name(), m, why));
            }
            m.fenced_at_ms = Some(now_ms());
            m.fence_lease_ms = lease_ms;
            Ok(())
        })?;
        loop {
            let holding = (self.transactions()?.iter()).any(|t| {
                matches!(
                    t.state,
                    crate::TxState::Prepared | crate::TxState::Committed
                )
            });
            if !holding {
                return Ok(self.snapshot().version());
            }
            if started.elapsed() + Duration::from_millis(2) >= lease {
                self.inner.place.change(|m| {
                    m.fenced_at_ms = None;
                    Ok(())
                })?;
                return Err(Error::Fenced {
                    store: self.name(),
                    reason: "what it held prepared did not drain within the fence's lease".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A replica catching up takes `writes` (rows copied from a member of its shard) as
    /// record `count` of its log — the shard's count of writes becomes its own, the numbers
    /// between taken by empty records — and aborts what it holds prepared (its rows come whole
    /// from the member now). Only a replica that is no member adopts rows; a fenced member
    /// adopts a count alone (a catch-up making every replica's count one). `count` must be past
    /// the version (or at it, with no rows), by at most 2²⁰. Returns the version after.
    fn adopt(&self, writes: &[RowWrite<'_>], options: WriteOptions, count: u64) -> Result<u64> {
        let state = self.inner.place.read();
        let fenced_count = writes.is_empty() && state.fenced_at_ms.is_some();
        if state.is_member() && !fenced_count {
            let why = "a member takes writes, not a catch-up's rows (a fenced one, a count)".into();
            return Err(changed(self.name(), &state, why));
        }
        self.current().live.adopt(writes, options, count)
    }

    fn key_digests(&self, table: &str, after: Option<u64>, count: u64) -> Result<Vec<(u64, u64)>> {
        if count > MAX_DIGEST_ROWS {
            return Err(Error::InvalidRequest {
                table: Some(table.to_owned()),
                position: None,
                reason: format!(
                    "{count} keys' digests asked in one call; at most {MAX_DIGEST_ROWS}"
                ),
            });
        }
        let keys = self.current().live.keys_after(table, after, count)?;
        let dim = StoreApi::table(self, table)?.dim as usize;
        let ids: Vec<i64> = keys.iter().map(|&k| k as i64).collect();
        let mut rows = vec![0f32; ids.len() * dim];
        self.read_rows(table, &ids, &mut rows)?;
        let digests = rows.chunks_exact(dim.max(1)).map(row_digest);
        Ok(keys.into_iter().zip(digests).collect())
    }

    fn retag(&self, expected: &str, plan: &str, previous: Option<&str>) -> Result<ShardTag> {
        let served = self.current();
        let path = served.path.clone();
        let tag = served.live.change_params(|params| {
            let shard = params.get("shard").cloned();
            let Some(mut tag) = shard.and_then(|t| serde_json::from_value::<ShardTag>(t).ok())
            else {
                return Err(Error::invalid(format!(
                    "{} is no shard of a sharded store: it has no plan to change",
                    path.display()
                )));
            };
            if tag.plan == plan && tag.previous.as_deref() == previous {
                return Ok(tag);
            }
            if tag.plan != expected {
                return Err(Error::invalid(format!(
                    "shard {} is of plan {}, not {expected}: another change of the sharded \
                     store's tables came first (learn its plan and try again)",
                    tag.shard, tag.plan
                )));
            }
            tag.plan = plan.to_owned();
            tag.previous = previous.map(str::to_owned);
            params["shard"] = serde_json::to_value(&tag).expect("a shard tag serializes");
            Ok(tag)
        })?;
        served.tag.store(Some(std::sync::Arc::new(tag.clone())));
        Ok(tag)
    }
}

impl Store {
    /// The transactions a lookup of `batch` coming now waits for ([`Store::settle`]): those
    /// prepared here that hold one of its rows, and those of `expect` still held here
    /// (`docs/distributed.md`, "Reads while writes go on"). None on a store that takes no
    /// writes, and none while no write across shards is under way: a node asks before every
    /// lookup of a replica.
    pub fn awaited(&self, batch: &Batch<'_>, expect: &[u128]) -> Vec<u128> {
        self.current().live.awaited(batch, expect)
    }

    /// Waits until none of `txns` is held prepared here (each decided, its rows applied or
    /// let go of); past `until`, `StoreLocked` naming a row one still holds.
    pub fn settle(&self, txns: &[u128], until: Instant) -> Result<()> {
        self.current().live.settle(txns, until)
    }

    /// The transactions that last wrote `batch`'s rows within [`crate::WRITERS_KEPT`], each
    /// once with its coordinator's note: what a router checks the answers of one read of
    /// several shards against each other with.
    pub fn writers(&self, batch: &Batch<'_>) -> Vec<LastWriter> {
        self.current().live.writers(batch)
    }

    /// Makes this replica served only while held ([`Store::hold`]), from now on: its node keeps
    /// its shard's membership in etcd. Until the first hold it serves nothing.
    pub fn require_hold(&self) {
        self.inner.place.require_hold();
    }

    /// The shard's membership as etcd keeps it, read by the replica's node in a round that
    /// began at `began` and renewed its lease there: an epoch past the replica's is installed
    /// (durably; a fence lifted, as any change lifts it), and the replica is held until
    /// `began + hold` if the members at its epoch then name it, let go of now if not. Refused (`MembershipChanged`,
    /// and the replica let go of) when etcd's epoch is behind the replica's: its epoch was not
    /// decided there. Returns the replica's membership after.
    pub fn hold(
        &self,
        epoch: u64,
        members: &[u64],
        began: std::time::Instant,
        hold: Duration,
    ) -> Result<Membership> {
        let place = &self.inner.place;
        let now = place.read().clone();
        if epoch < now.epoch {
            place.set_held(None);
            let why = format!(
                "etcd keeps the shard at epoch {epoch}, behind this replica's: its epoch was not \
                 decided there"
            );
            return Err(changed(self.name(), &now, why));
        }
        let m = if epoch > now.epoch {
            // a router's change may have moved it meanwhile: installed only over an older one
            place.change(|m| {
                if epoch > m.epoch {
                    m.install(epoch, members);
                }
                Ok(())
            })?
        } else {
            now
        };
        // at the epoch it holds now: etcd's, or a later one a router installed meanwhile
        place.set_held(m.members.contains(&m.replica).then(|| began + hold));
        Ok(m)
    }

    /// Checks that a prepare at `epoch` (`None`: a write sent to one replica) may be taken, and
    /// holds the check until the returned guard drops: a change or a fence waits for it. A
    /// write without an epoch is taken only by a replica whose membership never changed.
    pub(crate) fn admit(&self, epoch: Option<u64>) -> Result<RwLockReadGuard<'_, Membership>> {
        self.inner.place.check_held(|| self.name())?;
        let m = self.inner.place.read();
        let refuse = match epoch {
            _ if !m.is_member() => Some("it is no member of its shard (it is catching up)".into()),
            Some(e) if e != m.epoch => Some(format!("the write was sent at epoch {e}")),
            None if m.epoch > 0 => Some(
                "a write sent to this replica alone: its shard is replicated, write through its \
                 sharded store"
                    .into(),
            ),
            _ => None,
        };
        if let Some(why) = refuse {
            return Err(changed(self.name(), &m, why));
        }
        if m.fenced_at_ms.is_some() {
            return Err(Error::Fenced {
                store: self.name(),
                reason: "prepares wait while a replica of its shard catches up".into(),
            });
        }
        Ok(m)
    }
}
