//! Tables created and dropped on a sharded store: a new plan, made from the one served
//! ([`ShardPlan::with_table`], [`ShardPlan::without_table`]), moved to by every shard as a
//! swap moves them to a version, so that no batch reads one shard at one plan and another at
//! the other:
//!
//! 1. **stage** — shard by shard, replica by replica, each replica takes the new plan as its
//!    tag while still taking the calls of routers at the old one ([`Replica::retag`], a
//!    compare-and-set of the old plan: of two routers changing the tables at once, the first
//!    to reach shard 0 goes on, the other stops there), then its part of a new table. A
//!    replica that does not answer is left out of its shard (stale, brought to the plan when
//!    it is back: [`conform`]); any refusal undoes what was staged, and the change fails;
//! 2. **decide** — with etcd, in the store's record there ([`crate::etcd::StoreRecord`]), under
//!    the `changing` key this change took before its stage (one change at a time; a stage a
//!    router left when it died is undone by the next, [`conform`]); without etcd, nothing more;
//! 3. **publish** — the new plan replaces `shards.json` (atomically) and this router's: its
//!    batches are split by it, and its replicas' calls name it;
//! 4. **release** — every replica takes calls of routers at the new plan only; a dropped
//!    table's parts go then, when no router reads them.
//!
//! Another router learns the new plan when a call is refused for naming the old one (after
//! the release) or names a table its plan lacks: it reads the plan again (etcd's record, else
//! `shards.json`), moves to it if it descends from its own, and makes the call again, once
//! ([`Inner::learning`]).

use std::sync::Arc;

use nearrec::format::TableSpec;
use nearrec::plan::ShardPlan;
use nearrec::{Error, ErrorKind, NewTable, Replica as _, Schema, StoreApi};

use nearrec_client::Client;

use super::{Inner, Layout, ShardedStore};
use crate::etcd::{SeenStore, ShardMap, StoreRecord};
use crate::shard::Replica;

impl Schema for ShardedStore {
    /// A new table, placed as the plan's scheme places one (`ShardPlan::with_table`), each part
    /// created on every replica of its shard; its rows start as `init` says, drawn part by
    /// part (the same seed does not give an unsharded store's values). The store's version
    /// after.
    fn create_table(&self, t: &NewTable<'_>) -> nearrec::Result<u64> {
        let inner = &self.inner;
        inner.changeable()?;
        TableSpec::new(t.name, t.rows, t.dim, t.dtype).validate()?;
        inner.change(
            |plan| {
                if plan.tables.iter().any(|x| x.name == t.name) {
                    return Err(Error::InvalidRequest {
                        table: Some(t.name.to_owned()),
                        position: None,
                        reason: "the store has a table of that name already".into(),
                    });
                }
                Ok(plan.with_table(t.name, t.rows, t.dim, t.dtype))
            },
            |replica, k, next| {
                let table = next.tables.last().expect("the new table");
                let Some(p) = table.part_on(k) else {
                    return Ok(());
                };
                let part = NewTable {
                    rows: table.shard_rows(p),
                    ..*t
                };
                create_part(replica, &part)
            },
        )?;
        inner.version()
    }

    /// Drops table `name` from every shard that holds a part of it, once no router reads it.
    fn drop_table(&self, name: &str) -> nearrec::Result<u64> {
        let inner = &self.inner;
        inner.changeable()?;
        let dropped = inner.change(
            |plan| {
                let unknown =
                    || nearrec::Error::from(Layout::new(plan.clone()).find(name).unwrap_err());
                match plan.without_table(name) {
                    None => Err(unknown()),
                    Some(Err(reason)) => Err(Error::InvalidRequest {
                        table: Some(name.to_owned()),
                        position: None,
                        reason: format!("the sharded store cannot drop it: {reason}"),
                    }),
                    Some(Ok(next)) => Ok(next),
                }
            },
            |_, _, _| Ok(()),
        )?;
        // released: no router reads it any more
        let parts = (dropped.tables.iter())
            .find(|t| t.name == name)
            .map(|t| t.parts.clone())
            .unwrap_or_default();
        for p in parts {
            for r in inner.shards[p.shard].all_replicas().iter() {
                let _ = r.client.drop_table(name);
            }
        }
        inner.version()
    }
}

/// Creates `part` on `replica`, or finds it there already as it would be (a change tried
/// again after it was cut short).
fn create_part(replica: &Replica, part: &NewTable<'_>) -> nearrec::Result<()> {
    match replica.client.create_table(part) {
        Ok(_) => Ok(()),
        Err(e) => match replica.client.table(part.name) {
            Ok(had) if (had.rows, had.dim, had.dtype) == (part.rows, part.dim, part.dtype) => {
                Ok(())
            }
            _ => Err(e),
        },
    }
}

impl Inner {
    /// A store whose tables can change: open, every replica writable.
    fn changeable(&self) -> nearrec::Result<()> {
        self.live()?;
        if !self.writable {
            return Err(Error::ReadOnly {
                path: self.describe(),
            });
        }
        Ok(())
    }

    /// A change of the tables, as the module says: `next` makes the new plan from the served
    /// one, `stage` does a replica's part of it (on replica `r` of shard `k`) once its tag
    /// moved. Tried again from the plan another router published, where one came first.
    /// Returns the plan replaced.
    fn change(
        &self,
        next: impl Fn(&ShardPlan) -> nearrec::Result<ShardPlan>,
        stage: impl Fn(&Replica, usize, &ShardPlan) -> nearrec::Result<()>,
    ) -> nearrec::Result<ShardPlan> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        for tries in 1.. {
            let now = self.layout().plan.clone();
            let new = next(&now)?;
            let Some(map) = self.etcd() else {
                match self.stage(&now, &new, &stage, false) {
                    Err(e) if tries == 1 && self.learn_plan()? => {
                        tracing::info!(store = %self.name, error = %e, "the plan moved; again");
                        continue;
                    }
                    Err(e) => return Err(e),
                    Ok(()) => {
                        self.publish(new)?;
                        return Ok(now);
                    }
                }
            };
            // with etcd: decided there, one change at a time
            let unavailable = |e| map.store_unavailable("a change of the tables", e);
            let seen = self.store_record(map)?;
            if seen.record.as_ref().map(|r| &r.plan.id) != Some(&now.id) && tries < 5 {
                continue; // the plan moved: learned
            }
            let Some(held) = map
                .blocking(map.begin_change(&seen, &new.id))
                .map_err(unavailable)?
            else {
                if tries < 5 {
                    std::thread::sleep(std::time::Duration::from_millis(100 * tries));
                    continue;
                }
                let other = map.blocking(map.changing()).ok().flatten();
                return Err(self.locked(&format!(
                    "another router is changing the store's tables (to plan {})",
                    other.as_deref().unwrap_or("?")
                )));
            };
            self.stage(&now, &new, &stage, true)?;
            // decided: the record names the new plan (a swap may have moved the version since)
            let decided = (0..3).find_map(|_| {
                let seen = map.blocking(map.read_store()).ok()?;
                if seen.record.as_ref().is_some_and(|r| r.plan.id == new.id) {
                    return Some(true); // an answer lost: it was taken
                }
                let version = seen.record.as_ref().map_or(0, |r| r.version);
                let next = StoreRecord {
                    plan: new.clone(),
                    version,
                };
                map.blocking(map.end_change(&held, &seen, &next))
                    .ok()
                    .filter(|&done| done)
            });
            drop(held);
            if decided.is_none() {
                // not decided, or not known to be: the replicas take both plans' calls; the
                // next change finds which etcd holds, and undoes the stage where it is not
                return Err(unavailable(format!(
                    "the change to plan {} was staged but etcd did not take it",
                    new.id
                )));
            }
            self.publish(new)?;
            return Ok(now);
        }
        unreachable!("the loop returns")
    }

    /// The store's record in etcd, made from this router's plan where there is none; a newer
    /// plan there is learned (this router moves to it). Where etcd holds a plan neither this
    /// router's nor one descending from it, that is an error: the two were not cut alike.
    fn store_record(&self, map: &ShardMap) -> nearrec::Result<SeenStore> {
        let unavailable = |e| map.store_unavailable("the store's plan", e);
        let now = self.layout();
        let seen = map.blocking(map.read_store()).map_err(unavailable)?;
        let Some(record) = &seen.record else {
            let first = StoreRecord {
                plan: now.plan.clone(),
                version: self.pin.load(std::sync::atomic::Ordering::Acquire),
            };
            map.blocking(map.change_store(&seen, &first))
                .map_err(unavailable)?;
            let seen = map.blocking(map.read_store()).map_err(unavailable)?;
            if seen.record.is_none() {
                // not made: a change of the tables holds the store
                return Err(self.locked("another router is changing the store's tables"));
            }
            return Ok(seen);
        };
        if record.plan.id != now.plan.id {
            if !record.plan.descends_from(&now.plan.id) {
                return Err(Error::invalid(format!(
                    "{}: etcd holds plan {} for the store, which is not this router's ({}) nor \
                     made from it",
                    self.describe(),
                    record.plan.id,
                    now.plan.id
                )));
            }
            self.adopt(record.plan.clone());
        }
        Ok(seen)
    }

    /// A swap's decision (`versions.rs`): where the store's record is kept in etcd, its version
    /// moved from `from` to `to` by a compare of its revision; refused where another router
    /// moved it first, or a change of the tables is under way. Nothing to decide without etcd.
    pub(super) fn decide_version(&self, from: u64, to: u64) -> nearrec::Result<()> {
        let Some(map) = self.etcd() else {
            return Ok(());
        };
        let seen = self.store_record(map)?;
        let record = seen.record.clone().expect("store_record makes one");
        let refused = |why: String| self.locked(&format!("the swap to version {to}: {why}"));
        if record.version != from {
            return Err(refused(format!(
                "etcd says the store is at version {}, not this router's {from} (another router \
                 swapped it)",
                record.version
            )));
        }
        let next = StoreRecord {
            version: to,
            ..record
        };
        match map.change_store_surely(&seen, &next) {
            Ok(true) => Ok(()),
            Ok(false) => Err(refused(
                "another router changed the store's record first (a swap, or a change of its \
                 tables)"
                    .into(),
            )),
            Err(e) => Err(map.store_unavailable("a swap", e)),
        }
    }

    /// Step 1: every replica of every shard at `new`, taking `now`'s calls still; on a
    /// refusal, what was staged undone. With `tidy` (this router holds etcd's `changing`), a
    /// change a router left staged on a replica (it died, or lost etcd) is undone there first.
    fn stage(
        &self,
        now: &ShardPlan,
        new: &ShardPlan,
        stage: &impl Fn(&Replica, usize, &ShardPlan) -> nearrec::Result<()>,
        tidy: bool,
    ) -> nearrec::Result<()> {
        let mut staged: Vec<(usize, Arc<Replica>)> = Vec::new();
        let undo = |staged: &[(usize, Arc<Replica>)], k: usize, addr: &str, e: Error| {
            for (k, s) in staged.iter().rev() {
                if s.client.retag(&new.id, &now.id, None).is_ok() {
                    undo_part(s, *k, now, new);
                }
            }
            Error::Shard {
                store: self.name.clone(),
                shard: k,
                kind: e.kind(),
                reason: format!(
                    "replica {addr} did not take the change of the tables (plan {} to {}), \
                     undone: {e}",
                    now.id, new.id
                ),
            }
        };
        for shard in self.shards.iter() {
            let k = shard.index;
            let mut left = Vec::new();
            for r in shard.all_replicas().iter() {
                let tidied = if tidy {
                    conform(&r.client, k, now, true).map(drop)
                } else {
                    Ok(())
                };
                let retagged =
                    tidied.and_then(|()| r.client.retag(&now.id, &new.id, Some(&now.id)).map(drop));
                match retagged {
                    // down: left out of its shard, brought to the plan when it is back
                    Err(e) if unanswered(&e) => left.push(r.clone()),
                    Err(e) => return Err(undo(&staged, k, &r.addr, e)),
                    Ok(()) => {
                        staged.push((k, r.clone()));
                        if let Err(e) = stage(r, k, new) {
                            return Err(undo(&staged, k, &r.addr, e));
                        }
                    }
                }
            }
            if left.is_empty() {
                continue;
            }
            let pin = self.pin.load(std::sync::atomic::Ordering::Acquire);
            let ids: Vec<u64> = (left.iter())
                .map(|r| r.id.load(std::sync::atomic::Ordering::Relaxed))
                .collect();
            let out = if staged.iter().any(|(j, _)| *j == k) {
                left.iter().for_each(|r| r.mark_stale(shard.epoch()));
                crate::members::exclude(shard, pin, &ids, None)
            } else {
                Err(Error::Remote {
                    kind: ErrorKind::Unavailable,
                    code: 14,
                    message: "no replica of the shard answered".into(),
                    table: None,
                    position: None,
                })
            };
            if let Err(e) = out {
                return Err(undo(&staged, k, &left[0].addr, e));
            }
        }
        Ok(())
    }

    /// Steps 2 and 3: `new` in `shards.json` and this router's, then every replica at it
    /// alone (one that does not answer takes the old plan's calls still, harmlessly, until a
    /// next change or catch-up).
    fn publish(&self, new: ShardPlan) -> nearrec::Result<()> {
        if let Some(dir) = &self.location {
            new.write(dir)?;
        }
        let id = new.id.clone();
        self.adopt(new);
        for shard in self.shards.iter() {
            for r in shard.all_replicas().iter() {
                let _ = r.client.retag(&id, &id, None);
            }
        }
        Ok(())
    }

    /// `StoreLocked`: `why`, and to try again once it is done.
    fn locked(&self, why: &str) -> Error {
        Error::Remote {
            kind: ErrorKind::StoreLocked,
            code: 9,
            message: format!("{}: {why}: try again once it is done", self.describe()),
            table: None,
            position: None,
        }
    }

    /// Where the store's record is kept, if in etcd.
    fn etcd(&self) -> Option<&ShardMap> {
        self.shards.first().and_then(|s| s.etcd.as_ref())
    }

    /// Splits batches by `plan` from now on; every replica's calls name it.
    pub(super) fn adopt(&self, plan: ShardPlan) {
        for shard in self.shards.iter() {
            for r in shard.all_replicas().iter() {
                r.client.set_shard_plan(&plan.id);
            }
        }
        self.layout.store(Arc::new(Layout::new(plan)));
    }

    /// Moves to the plan in etcd, or without etcd in `shards.json`, where it descends from this
    /// router's (another router changed the tables): whether it moved.
    pub(super) fn learn_plan(&self) -> nearrec::Result<bool> {
        let read = match (self.etcd(), &self.location) {
            (Some(map), _) => {
                let seen = map.blocking(map.read_store());
                let seen = seen.map_err(|e| map.store_unavailable("the store's plan", e))?;
                match seen.record {
                    Some(record) => record.plan,
                    None => return Ok(false),
                }
            }
            (None, Some(dir)) => ShardPlan::read(dir)?,
            (None, None) => return Ok(false),
        };
        let now = self.layout();
        if read.id == now.plan.id || !read.descends_from(&now.plan.id) {
            return Ok(false);
        }
        tracing::info!(store = %self.name, plan = %read.id, "learned the store's new plan");
        self.adopt(read);
        Ok(true)
    }

    /// `f`, made again once where it failed as a call of a router behind the store's plan
    /// fails (a table unknown to it, a replica refusing its plan) and a newer plan was learned.
    pub(super) fn learning<T>(&self, f: impl Fn() -> nearrec::Result<T>) -> nearrec::Result<T> {
        match f() {
            Err(e)
                if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::UnknownTable)
                    && self.learn_plan().unwrap_or(false) =>
            {
                f()
            }
            done => done,
        }
    }
}

/// Replica `client` of shard `k` made as plan `plan` has it, where it is behind it (at a plan
/// `plan` was made from: left out of a change of the tables while it was down) or — with
/// `staged`, only while this router holds etcd's `changing`, so that no other change is under
/// way — where a change a router left staged has it ahead (its tag a plan made from `plan`,
/// taking `plan`'s calls still): its tag moved, a missing or misshapen part created (its rows
/// zero until a catch-up copies them), a part of a table `plan` lacks dropped. Whether it
/// changed: then it missed writes, and is to be left out of its shard and caught up. A replica
/// of another plan is left as it is (the router's check refuses it).
pub(super) fn conform(
    client: &Client,
    k: usize,
    plan: &ShardPlan,
    staged: bool,
) -> nearrec::Result<bool> {
    let info = client.info()?;
    let Some(tag) = info.shard.as_ref() else {
        return Ok(false);
    };
    let mut changed = false;
    if tag.plan != plan.id {
        let behind = plan.parents.contains(&tag.plan);
        let ahead = staged && tag.previous.as_deref() == Some(plan.id.as_str());
        if !behind && !ahead {
            return Ok(false);
        }
        client.retag(&tag.plan, &plan.id, None)?;
        changed = true;
    }
    let placed = plan.shard_tables(k);
    let fits = |t: &nearrec::TableInfo, (i, p): (usize, usize)| {
        let want = &plan.tables[i];
        want.name == t.name
            && (want.keyed
                || (want.shard_rows(p), want.dim, want.dtype) == (t.rows, t.dim, t.dtype))
    };
    for t in &info.tables {
        if !placed.iter().any(|&at| fits(t, at)) {
            client.drop_table(&t.name)?;
            changed = true;
        }
    }
    for &(i, p) in &placed {
        if !info.tables.iter().any(|t| fits(t, (i, p))) {
            let want = &plan.tables[i];
            client.create_table(&NewTable {
                name: &want.name,
                rows: want.shard_rows(p),
                dim: want.dim,
                dtype: want.dtype,
                init: nearrec::Init::Zeros,
            })?;
            changed = true;
        }
    }
    Ok(changed)
}

/// The plan a router opening the store with `plan` splits batches by: the one in etcd's
/// record where that one descends from `plan` (a change of the tables since `shards.json` was
/// read or written), else `plan` — `plan` too where etcd does not answer now: a router reads on
/// without etcd, and learns a newer plan at the first call that needs it.
pub(super) fn newest_plan(map: &ShardMap, plan: ShardPlan) -> ShardPlan {
    match map.blocking(map.read_store()) {
        Ok(SeenStore {
            record: Some(record),
            ..
        }) if record.plan.id != plan.id && record.plan.descends_from(&plan.id) => record.plan,
        Ok(_) => plan,
        Err(e) => {
            tracing::warn!(store = %plan.store, error = %e, "etcd did not answer for the store's plan");
            plan
        }
    }
}

/// Whether `e` is a replica that did not answer (down, or cut off), rather than one that refused.
fn unanswered(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Unavailable | ErrorKind::DeadlineExceeded
    )
}

/// A staged part of `new` dropped from replica `r` of shard `k` (a table `now` lacks).
fn undo_part(r: &Replica, k: usize, now: &ShardPlan, new: &ShardPlan) {
    for t in &new.tables {
        if t.part_on(k).is_some() && now.tables.iter().all(|x| x.name != t.name) {
            let _ = r.client.drop_table(&t.name);
        }
    }
}
