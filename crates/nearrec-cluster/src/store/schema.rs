//! Tables created and dropped on a sharded store: a new plan, made from the one served
//! ([`ShardPlan::with_table`], [`ShardPlan::without_table`]), moved to by every shard as a
//! swap moves them to a version, so that no batch reads one shard at one plan and another at
//! the other:
//!
//! 1. **stage** — shard by shard, replica by replica (in that order, so that of two routers
//!    changing the tables at once the first to reach shard 0 goes on and the other stops
//!    there), each replica takes its part of a new table (`create_table`), then the new plan
//!    as its tag, still taking the calls of routers at the old one ([`Replica::retag`], a
//!    compare-and-set of the old plan). Any refusal undoes what was staged, and the change
//!    fails;
//! 2. **publish** — the new plan replaces `shards.json` (atomically) and this router's: its
//!    batches are split by it, and its replicas' calls name it;
//! 3. **release** — every replica takes calls of routers at the new plan only; a dropped
//!    table's parts go then, when no router reads them.
//!
//! Another router learns the new plan when a call is refused for naming the old one (after
//! the release) or names a table its plan lacks: it reads `shards.json` again, moves to the plan
//! there if it descends from its own, and makes the call again, once ([`Inner::learning`]).
//! Every replica must answer a change: one that does not fails it, undone.

use std::sync::Arc;

use nearrec::format::TableSpec;
use nearrec::plan::ShardPlan;
use nearrec::{Error, ErrorKind, NewTable, Replica as _, Schema, StoreApi};

use super::{Inner, Layout, ShardedStore};
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
    /// one, `stage` does a replica's part of it (on replica `r` of shard `k`) before its tag
    /// moves. Tried once more from the plan another router published, where one came first.
    /// Returns the plan replaced.
    fn change(
        &self,
        next: impl Fn(&ShardPlan) -> nearrec::Result<ShardPlan>,
        stage: impl Fn(&Replica, usize, &ShardPlan) -> nearrec::Result<()>,
    ) -> nearrec::Result<ShardPlan> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let mut tries = 0;
        loop {
            let now = self.layout().plan.clone();
            let new = next(&now)?;
            match self.stage(&now, &new, &stage) {
                Err(e) if tries == 0 && self.learn_plan()? => {
                    tracing::info!(store = %self.name, error = %e, "the plan moved; trying again");
                    tries += 1;
                }
                Err(e) => return Err(e),
                Ok(()) => {
                    self.publish(new)?;
                    return Ok(now);
                }
            }
        }
    }

    /// Step 1: every replica of every shard at `new`, taking `now`'s calls still; on a
    /// refusal, what was staged undone.
    fn stage(
        &self,
        now: &ShardPlan,
        new: &ShardPlan,
        stage: &impl Fn(&Replica, usize, &ShardPlan) -> nearrec::Result<()>,
    ) -> nearrec::Result<()> {
        let mut staged: Vec<(usize, Arc<Replica>)> = Vec::new();
        for shard in &self.shards {
            for r in shard.all_replicas().iter() {
                let done = stage(r, shard.index, new)
                    .and_then(|()| r.client.retag(&now.id, &new.id, Some(&now.id)));
                if let Err(e) = done {
                    for (k, s) in staged.iter().rev() {
                        let _ = s.client.retag(&new.id, &now.id, None);
                        undo_part(s, *k, now, new);
                    }
                    undo_part(r, shard.index, now, new);
                    return Err(Error::Shard {
                        store: self.name.clone(),
                        shard: shard.index,
                        kind: e.kind(),
                        reason: format!(
                            "replica {} did not take the change of the tables (plan {} to {}), \
                             undone: {e}",
                            r.addr, now.id, new.id
                        ),
                    });
                }
                staged.push((shard.index, r.clone()));
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
        for shard in &self.shards {
            for r in shard.all_replicas().iter() {
                let _ = r.client.retag(&id, &id, None);
            }
        }
        Ok(())
    }

    /// Splits batches by `plan` from now on; every replica's calls name it.
    fn adopt(&self, plan: ShardPlan) {
        for shard in &self.shards {
            for r in shard.all_replicas().iter() {
                r.client.set_shard_plan(&plan.id);
            }
        }
        self.layout.store(Arc::new(Layout::new(plan)));
    }

    /// Moves to the plan in `shards.json` where it descends from this router's (another
    /// router changed the tables): whether it moved.
    pub(super) fn learn_plan(&self) -> nearrec::Result<bool> {
        let Some(dir) = &self.location else {
            return Ok(false);
        };
        let read = ShardPlan::read(dir)?;
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

/// A staged part of `new` dropped from replica `r` of shard `k` (a table `now` lacks).
fn undo_part(r: &Replica, k: usize, now: &ShardPlan, new: &ShardPlan) {
    for t in &new.tables {
        if t.part_on(k).is_some() && now.tables.iter().all(|x| x.name != t.name) {
            let _ = r.client.drop_table(&t.name);
        }
    }
}
