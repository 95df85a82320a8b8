//! A sharded store's writes: each row routed to its shard (a keyed table's by key hash, a hot
//! row to every shard that holds it), written on the one replica of a shard, or committed
//! across shards and replicas whole (`crate::txn`); a delta file of a feed committed on every
//! shard with its cursor.

use std::sync::atomic::Ordering;

use nearrec::plan::key_part;
use nearrec::{
    Error, Fed, FeedCursor, Feeds, OwnedValues, RowValues, RowWrite, WriteOptions, Writes,
};
use nearrec_engine::EngineError;

use super::{Inner, Routed};
use crate::txn;

impl Inner {
    /// Each write's rows on their shards; a row kept on several shards (a hot row) goes to
    /// each.
    fn route_writes<'a>(
        &self,
        writes: &[RowWrite<'a>],
        options: WriteOptions,
    ) -> nearrec::Result<Vec<Routed<'a>>> {
        let mut out: Vec<Routed<'a>> = Vec::new();
        for w in writes {
            let t = self.find(w.table)?;
            let (table, hot) = (&self.plan.tables[t], &self.hot[t]);
            match w.values {
                None => {}
                Some(RowValues::F32(v)) => {
                    nearrec::check_values(w.table, w.ids.len(), table.dim as usize, v, options)?;
                }
                Some(RowValues::Encoded(b)) => {
                    let (dtype, dim) = (table.dtype, table.dim);
                    nearrec::check_encoded(w.table, w.ids.len(), dtype, dim, b, options)?;
                }
            }
            let n = w.ids.len();
            let mut by_part: Vec<(Vec<i64>, Option<OwnedValues>)> = (0..table.parts.len())
                .map(|_| (Vec::new(), w.values.map(OwnedValues::empty_like)))
                .collect();
            // row `j` of the write's values onto a part's
            let copy = |to: &mut Option<OwnedValues>, j: usize| {
                if let (Some(o), Some(v)) = (to, w.values) {
                    o.extend(v.rows(j..j + 1, n));
                }
            };
            for (j, &id) in w.ids.iter().enumerate() {
                if table.keyed {
                    // a key goes to its part as it is
                    let p = key_part(id as u64, table.parts.len());
                    by_part[p].0.push(id);
                    copy(&mut by_part[p].1, j);
                    continue;
                }
                if id < 0 || id as u64 >= table.rows {
                    return Err(EngineError::IndexOutOfRange {
                        table: w.table.to_owned(),
                        position: j,
                        bag: j,
                        value: id,
                        rows: table.rows,
                    }
                    .into());
                }
                let id = id as u64;
                let home = table.part_of(id);
                let mut put = |p: usize, local: u64| {
                    by_part[p].0.push(local as i64);
                    copy(&mut by_part[p].1, j);
                };
                put(home, id - table.parts[home].first);
                if let Some(rank) = hot.rank(id) {
                    for p in 0..table.parts.len() {
                        put(p, table.parts[p].rows + u64::from(rank));
                    }
                }
            }
            for (p, (ids, values)) in by_part.into_iter().enumerate() {
                if !ids.is_empty() {
                    out.push((table.parts[p].shard, w.table, ids, values));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn write_many(
        &self,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> nearrec::Result<u64> {
        self.live()?;
        if !self.writable {
            return Err(Error::ReadOnly {
                path: self.describe(),
            });
        }
        let routed = self.route_writes(writes, options)?;
        let _switch = self.switching.read().unwrap_or_else(|p| p.into_inner());
        let mut shards: Vec<usize> = routed.iter().map(|r| r.0).collect();
        shards.sort_unstable();
        shards.dedup();
        let calls = per_shard(&routed, &shards);
        if let [s] = shards.as_slice()
            && let [replica] = self.shards[*s].all_replicas().as_slice()
            && self.shards[*s].epoch() == 0
        {
            // one node, the shard's only replica ever: one call
            let v = replica.client.write_many(&calls[0], options)?;
            self.shards[*s].seen.raise(v);
        } else if !shards.is_empty() {
            // several shards, or several replicas of one: two-phase commit, so that every
            // replica takes the writes of every router in one order (a row another router's
            // write holds is not written until that one is done)
            self.coordinator().write(
                &shards,
                &calls,
                options,
                self.options.client.timeout,
                None,
            )?;
        }
        // the version that holds it: each written shard's count as its commit answered, the
        // others' as last seen (asking every shard for its count was a round trip to each
        // after every write)
        Ok(self.version_of(&[]))
    }

    /// A delta file of feed `feed` (`Writes::feed`): its rows and its cursor in one
    /// transaction on every shard, so that every shard holds the file with its cursor or none
    /// does; a file the shards hold already is not sent again, one past the next is refused.
    pub(super) fn feed(
        &self,
        feed: &str,
        cursor: FeedCursor,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> nearrec::Result<Fed> {
        self.live()?;
        if !self.writable {
            return Err(Error::ReadOnly {
                path: self.describe(),
            });
        }
        let held = self.feed_status()?.get(feed).copied();
        match held {
            Some(h) if h.sequence >= cursor.sequence => {
                return Ok(Fed {
                    version: self.version_of(&[]),
                    applied: false,
                    cursor: h,
                });
            }
            Some(h) if h.sequence + 1 < cursor.sequence => {
                return Err(nearrec::feed::gap(feed, h.sequence, cursor.sequence));
            }
            _ => {}
        }
        let routed = self.route_writes(writes, options)?;
        let _switch = self.switching.read().unwrap_or_else(|p| p.into_inner());
        let shards: Vec<usize> = (0..self.shards.len()).collect();
        let calls = per_shard(&routed, &shards);
        self.coordinator().write(
            &shards,
            &calls,
            options,
            self.options.client.timeout,
            Some((feed, cursor)),
        )?;
        let cursor = self.feed_status()?.get(feed).copied().unwrap_or(cursor);
        Ok(Fed {
            version: self.version_of(&[]),
            applied: true,
            cursor,
        })
    }

    /// Each feed the shards have applied, with the last file every shard holds (the least of
    /// the shards'; within a shard, the furthest of its replicas': one that caught up by
    /// copying rows takes cursors from the next file on). A feed some shard lacks is left out.
    pub(super) fn feed_status(&self) -> nearrec::Result<Feeds> {
        let mut all: Option<Feeds> = None;
        for s in &self.shards {
            let mut shard = Feeds::new();
            for (_, r) in s.live_replicas() {
                for (name, c) in r.client.feed_status()? {
                    let e = shard.entry(name).or_insert(c);
                    if c.sequence > e.sequence {
                        *e = c;
                    }
                }
            }
            all = Some(match all {
                None => shard,
                Some(mut seen) => {
                    seen.retain(|name, c| match shard.get(name) {
                        Some(o) => {
                            if o.sequence < c.sequence {
                                *c = *o;
                            }
                            true
                        }
                        None => false,
                    });
                    seen
                }
            });
        }
        Ok(all.unwrap_or_default())
    }

    /// The coordinator of a write across this store's shards (`crate::txn`).
    fn coordinator(&self) -> txn::Coordinator<'_> {
        txn::Coordinator {
            store: &self.plan.store,
            all: &self.shards,
            pin: self.pin.load(Ordering::Relaxed),
        }
    }
}

/// The routed rows of each of `shards`, as the calls a shard takes.
fn per_shard<'a>(routed: &'a [Routed<'a>], shards: &[usize]) -> Vec<Vec<RowWrite<'a>>> {
    (shards.iter())
        .map(|&k| {
            (routed.iter().filter(|r| r.0 == k))
                .map(|(_, table, ids, values)| RowWrite {
                    table,
                    ids,
                    values: values.as_ref().map(OwnedValues::as_values),
                })
                .collect()
        })
        .collect()
}
