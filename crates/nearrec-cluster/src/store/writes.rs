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

use super::Inner;
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
        let layout = self.layout();
        for w in writes {
            let t = layout.find(w.table)?;
            let (table, hot) = (&layout.plan.tables[t], &layout.hot[t]);
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
            let mut by_part: Vec<Routed<'a>> = (table.parts.iter())
                .map(|p| Routed {
                    shard: p.shard,
                    table: w.table,
                    ids: Vec::new(),
                    values: w.values.map(OwnedValues::empty_like),
                    positions: Vec::new(),
                })
                .collect();
            // id `j` of the write, and its row of values, onto a part's
            let put = |to: &mut Routed<'a>, j: usize, id: i64| {
                to.ids.push(id);
                to.positions.push(j);
                if let (Some(o), Some(v)) = (&mut to.values, w.values) {
                    o.extend(v.rows(j..j + 1, n));
                }
            };
            for (j, &id) in w.ids.iter().enumerate() {
                if table.keyed {
                    // a key goes to its part as it is
                    put(&mut by_part[key_part(id as u64, table.parts.len())], j, id);
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
                put(&mut by_part[home], j, (id - table.parts[home].first) as i64);
                if let Some(rank) = hot.rank(id) {
                    for (p, part) in by_part.iter_mut().enumerate() {
                        put(part, j, (table.parts[p].rows + u64::from(rank)) as i64);
                    }
                }
            }
            out.extend(by_part.into_iter().filter(|r| !r.ids.is_empty()));
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
        let mut shards: Vec<usize> = routed.iter().map(|r| r.shard).collect();
        shards.sort_unstable();
        shards.dedup();
        let calls = per_shard(&routed, &shards);
        let mut pending = Vec::new();
        if let [s] = shards.as_slice()
            && let [replica] = self.shards[*s].all_replicas().as_slice()
            && self.shards[*s].epoch() == 0
        {
            // one node, the shard's only replica ever: one call
            let v = (replica.client.write_many(&calls[0], options))
                .map_err(|e| caller_error(&routed, *s, e))?;
            self.shards[*s].seen.raise(v);
        } else if !shards.is_empty() {
            // several shards, or several replicas of one: two-phase commit, so that every
            // replica takes the writes of every router in one order (a row another router's
            // write holds is not written until that one is done)
            let to_caller = |k: usize, e: Error| caller_error(&routed, k, e);
            let timeout = self.options.client.timeout;
            pending =
                (self.coordinator(&to_caller)).write(&shards, &calls, options, timeout, None)?;
        }
        // the version that holds it: each written shard's count as its commit answered (one
        // past the count last seen where its commit is on its way), the others' as last seen
        // (asking every shard for its count was a round trip to each after every write)
        for (k, least) in &mut pending {
            *least = (*least).max(self.shards[*k].seen.load());
        }
        Ok(self.version_of(&pending))
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
        let to_caller = |k: usize, e: Error| caller_error(&routed, k, e);
        let timeout = self.options.client.timeout;
        let share = Some((feed, cursor));
        (self.coordinator(&to_caller)).write(&shards, &calls, options, timeout, share)?;
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
        for s in self.shards.iter() {
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

    /// The coordinator of a write across this store's shards (`crate::txn`); `to_caller`: a
    /// shard's refusal of its share as the caller's call names things.
    fn coordinator<'a>(
        &'a self,
        to_caller: &'a dyn Fn(usize, Error) -> Error,
    ) -> txn::Coordinator<'a> {
        txn::Coordinator {
            store: &self.name,
            all: &self.shards,
            pin: self.pin.load(Ordering::Relaxed),
            to_caller,
        }
    }
}

/// One of a caller's writes, its rows on one shard.
struct Routed<'a> {
    shard: usize,
    table: &'a str,
    /// The shard's ids (a keyed table's: the keys).
    ids: Vec<i64>,
    values: Option<OwnedValues>,
    /// Each id's position in the caller's write.
    positions: Vec<usize>,
}

/// The routed rows of each of `shards`, as the calls a shard takes.
fn per_shard<'a>(routed: &'a [Routed<'a>], shards: &[usize]) -> Vec<Vec<RowWrite<'a>>> {
    (shards.iter())
        .map(|&k| {
            (routed.iter().filter(|r| r.shard == k))
                .map(|r| RowWrite {
                    table: r.table,
                    ids: &r.ids,
                    values: r.values.as_ref().map(OwnedValues::as_values),
                })
                .collect()
        })
        .collect()
}

/// `e`, shard `shard`'s refusal of its share naming a table and a position in it (a new key
/// past its table's cap), as the caller's write names them: the position in the first of the
/// caller's writes of that table routed there.
fn caller_error(routed: &[Routed<'_>], shard: usize, e: Error) -> Error {
    let (Some(table), Some(position)) = (e.table(), e.position()) else {
        return e;
    };
    let Some(at) = (routed.iter())
        .find(|r| r.shard == shard && r.table == table)
        .and_then(|r| r.positions.get(position).copied())
    else {
        return e;
    };
    match e {
        Error::Remote {
            kind,
            code,
            message,
            table,
            ..
        } => Error::Remote {
            kind,
            code,
            message: format!(
                "{message} (position {position} of shard {shard}'s share; {at} of the call)"
            ),
            table,
            position: Some(at),
        },
        Error::KeysFull {
            table, key, cap, ..
        } => Error::KeysFull {
            table,
            position: at,
            key,
            cap,
        },
        e => e,
    }
}
