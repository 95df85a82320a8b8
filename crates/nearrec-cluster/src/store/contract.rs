//! The contract's verbs on a sharded store, each from the router's parts: lookups split and
//! merged at one cluster version, writes routed (`writes.rs`) or committed across shards
//! (`crate::txn`), swaps of every shard (`crate::versions`), counters added up
//! (`counters.rs`); and a submitted lookup on the router's runtime.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nearrec::{
    AsBatch, Batch, Compaction, Error, Fed, FeedCursor, Feeds, Inference, Info, PendingLookup,
    Pooled, Read, RowWrite, Rows, Stats, StoreApi, Submitted, SwapTo, TableCheck, TableInfo,
    TierReport, Versioned, Versions, WriteOptions, Writes,
};

use super::{Inner, ShardedStore};
use crate::shard::on_each;
use crate::versions;

/// What a sharded store does with each verb: lookups split by shard and merged, at one cluster
/// version; a write to the one node of its shard, or atomically to every replica of every
/// shard it touches (`txn/`); a swap of every shard at once (`versions.rs`); digests where
/// each part's rows are; counters added up; a table created or dropped by a new plan every
/// shard moves to (`schema.rs`). It is no [`nearrec::Replica`] (it drives its replicas with
/// it).
impl StoreApi for ShardedStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn info(&self) -> nearrec::Result<Info> {
        let inner = &self.inner;
        inner.live()?;
        let mut version = 0;
        let (mut tier, mut writable) = (String::new(), true);
        // the cluster versions: those every shard's repository holds
        let mut versions: Option<Vec<u64>> = None;
        // a keyed table's keys: its parts' together
        let layout = inner.layout();
        let mut keys: Vec<Option<u64>> = vec![None; layout.plan.tables.len()];
        // a shard none of whose replicas answers leaves the info to the plan and what this
        // router saw of it last: a client still connects, and reaches the other shards' tables;
        // what only that shard could say (its keyed parts' keys) is unknown. No shard
        // answering is the store unavailable.
        let mut down = Vec::new();
        let mut failure = None;
        for s in inner.shards.iter() {
            // this router's writes counted: asked once their commits have landed
            s.committing.landed(crate::txn::COMMITS_AWAITED);
            let info = match s.any(&inner.name, |c| c.info()) {
                Ok(info) => info,
                Err(e) => {
                    version += s.seen.load();
                    down.push(s.index);
                    failure = Some(e);
                    continue;
                }
            };
            s.seen.raise(info.version);
            for (t, held) in layout.plan.tables.iter().zip(keys.iter_mut()) {
                let part = info.tables.iter().find(|x| x.name == t.name && t.keyed);
                if let Some(n) = part.and_then(|x| x.keys) {
                    *held = Some(held.unwrap_or(0) + n);
                }
            }
            version += info.version;
            writable &= info.writable;
            versions = Some(match versions {
                None => info.versions,
                Some(v) => v
                    .into_iter()
                    .filter(|x| info.versions.contains(x))
                    .collect(),
            });
            if tier.is_empty() || info.tier == "ssd" {
                tier = info.tier;
            }
        }
        if let Some(e) = failure
            && down.len() == inner.shards.len()
        {
            return Err(e);
        }
        let unknown = |t: &nearrec_plan::shards::ShardedTable| {
            t.keyed && t.parts.iter().any(|p| down.contains(&p.shard))
        };
        Ok(Info {
            name: inner.name.clone(),
            tables: (layout.plan.tables.iter().zip(keys))
                .map(|(t, keys)| TableInfo {
                    name: t.name.clone(),
                    rows: t.rows,
                    dim: t.dim,
                    dtype: t.dtype,
                    keys: keys.filter(|_| !unknown(t)),
                })
                .collect(),
            version,
            tier,
            writable,
            model: !inner.models.is_empty(),
            stores: Vec::new(),
            path: (inner.location.as_ref())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            served_version: Some(inner.pin.load(Ordering::Acquire)).filter(|&v| v > 0),
            versions: versions.unwrap_or_default(),
            shard: None,
        })
    }

    /// A sharded store is no shard itself (asking its shards would be a call to each).
    fn shard(&self) -> nearrec::Result<Option<nearrec::shard::ShardTag>> {
        Ok(None)
    }

    fn location(&self) -> Option<PathBuf> {
        self.inner.location.clone()
    }

    fn table(&self, name: &str) -> nearrec::Result<TableInfo> {
        self.inner.live()?;
        let layout = self.inner.learning(|| {
            let layout = self.inner.layout();
            layout.table(name)?;
            Ok(layout)
        })?;
        let t = layout.table(name)?;
        if t.keyed {
            // its keys are its parts' together
            return self
                .info()?
                .tables
                .into_iter()
                .find(|x| x.name == name)
                .ok_or_else(|| Error::Internal(format!("table {name:?} left the plan")));
        }
        Ok(TableInfo {
            name: t.name.clone(),
            rows: t.rows,
            dim: t.dim,
            dtype: t.dtype,
            keys: None,
        })
    }

    fn version(&self) -> nearrec::Result<u64> {
        self.inner.version()
    }

    fn lookup(&self, batch: &Batch<'_>) -> nearrec::Result<(Pooled, Read)> {
        self.inner.learning(|| self.inner.lookup(batch, None))
    }

    fn lookup_rows(&self, batch: &Batch<'_>) -> nearrec::Result<Versioned<Vec<Rows>>> {
        self.inner.learning(|| self.inner.lookup_rows(batch, None))
    }

    fn submit(&self, batch: Box<dyn AsBatch>) -> nearrec::Result<Submitted> {
        self.inner.live()?;
        let inner = self.inner.clone();
        let task = self.inner.runtime.spawn_blocking(move || {
            let batch = batch.as_batch();
            inner
                .learning(|| inner.lookup(&batch, None))
                .map(|(p, _)| p)
        });
        Ok(Box::new(Pending {
            inner: self.inner.clone(),
            task,
        }))
    }

    fn refresh(&self) -> nearrec::Result<u64> {
        self.inner.version()
    }

    fn row_digests(&self, table: &str, first: u64, count: u64) -> nearrec::Result<Vec<u64>> {
        self.inner.row_digests(table, first, count)
    }

    fn stats(&self) -> nearrec::Result<Stats> {
        self.inner.stats()
    }

    fn tier_report(&self) -> nearrec::Result<Vec<TierReport>> {
        self.inner.tier_report()
    }

    /// Every replica of every shard at once, each on its node's disk; a check names its table
    /// `TABLE on ADDRESS`. A replica that cannot be reached fails the call.
    fn scrub(&self, rate: u64) -> nearrec::Result<Vec<TableCheck>> {
        self.inner.live()?;
        let shards = self.inner.shards.iter();
        let replicas: Vec<_> = shards.flat_map(|s| s.all_replicas().to_vec()).collect();
        let passes = on_each(&replicas, |r| r.client.scrub(rate));
        let mut checks = Vec::new();
        for (r, pass) in replicas.iter().zip(passes) {
            checks.extend(pass?.into_iter().map(|c| TableCheck {
                table: format!("{} on {}", c.table, r.addr),
                ..c
            }));
        }
        Ok(checks)
    }

    fn close(&self) -> nearrec::Result<()> {
        self.inner.closed.store(true, Ordering::Relaxed);
        // this router's commits on their way land first, within a call's deadline (one that
        // does not is settled later, as a router's that died)
        let timeout = self
            .inner
            .options
            .client
            .timeout
            .unwrap_or(crate::txn::SETTLE_AFTER);
        for s in self.inner.shards.iter() {
            s.committing.landed(timeout);
            s.close();
        }
        Ok(())
    }

    fn concrete(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    nearrec::capable!(writes, schema, versions);

    /// Where its shards keep a model (`infer.rs`).
    fn inference(&self) -> Option<&dyn Inference> {
        (!self.inner.models.is_empty()).then_some(self as &dyn Inference)
    }
}

impl Writes for ShardedStore {
    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> nearrec::Result<u64> {
        self.inner
            .learning(|| self.inner.write_many(writes, options))
    }

    fn compact(&self) -> nearrec::Result<Compaction> {
        let inner = &self.inner;
        inner.live()?;
        let mut done = Compaction {
            version: 0,
            tables: 0,
            rows: 0,
            bytes: 0,
            seconds: 0.0,
        };
        for s in inner.shards.iter() {
            let c = s.each(&inner.name, |c| c.compact())?;
            done.version += c.version;
            done.tables += c.tables;
            done.rows += c.rows;
            done.bytes += c.bytes;
            done.seconds = done.seconds.max(c.seconds);
        }
        Ok(done)
    }

    /// Every shard takes the file's rows and its cursor in one transaction (`writes.rs`).
    fn feed(
        &self,
        feed: &str,
        cursor: FeedCursor,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> nearrec::Result<Fed> {
        self.inner.feed(feed, cursor, writes, options)
    }

    fn feed_status(&self) -> nearrec::Result<Feeds> {
        self.inner.live()?;
        self.inner.feed_status()
    }
}

impl Versions for ShardedStore {
    /// Every shard to the version `to` names, at once for this router's batches and never
    /// half for any router's (`versions.rs`); returns the shards' counts of writes there,
    /// summed.
    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> nearrec::Result<u64> {
        let inner = &self.inner;
        inner.live()?;
        let _switch = inner.switching.write().unwrap_or_else(|p| p.into_inner());
        let decide = |from, to| inner.decide_version(from, to);
        let (_, counts) = versions::switch(
            &inner.name,
            &inner.shards,
            &inner.pin,
            to,
            (warm, force),
            &decide,
        )?;
        Ok(counts.iter().sum())
    }

    fn lookup_version(&self, batch: &Batch<'_>, version: u64) -> nearrec::Result<(Pooled, Read)> {
        self.inner
            .learning(|| self.inner.lookup(batch, Some(version)))
    }

    fn lookup_rows_version(
        &self,
        batch: &Batch<'_>,
        version: u64,
    ) -> nearrec::Result<Versioned<Vec<Rows>>> {
        self.inner
            .learning(|| self.inner.lookup_rows(batch, Some(version)))
    }
}

/// A submitted lookup of a sharded store, run on the router's runtime.
#[derive(Debug)]
struct Pending {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<nearrec::Result<Pooled>>,
}

impl Pending {
    fn joined(
        r: Result<nearrec::Result<Pooled>, tokio::task::JoinError>,
    ) -> nearrec::Result<Pooled> {
        r.map_err(|e| Error::Internal(format!("a sharded lookup's task failed: {e}")))?
    }
}

impl PendingLookup for Pending {
    fn is_done(&self) -> bool {
        self.task.is_finished()
    }

    fn wait(mut self: Box<Self>) -> nearrec::Result<Pooled> {
        let inner = self.inner.clone();
        Self::joined(inner.runtime.block_on(&mut self.task))
    }

    fn wait_timeout(
        mut self: Box<Self>,
        timeout: Duration,
    ) -> Result<nearrec::Result<Pooled>, Submitted> {
        let inner = self.inner.clone();
        let task = &mut self.task;
        match inner
            .runtime
            .block_on(async { tokio::time::timeout(timeout, task).await })
        {
            Ok(r) => Ok(Self::joined(r)),
            Err(_) => Err(self),
        }
    }
}
