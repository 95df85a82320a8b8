//! A batch cut by shard, and the shards' pooled answers merged back exactly.
//!
//! A table whose rows are all on one shard goes to it as the caller asked (its ids, bags,
//! weights, padding and mode unchanged), its ids range-checked first. A table cut into parts is split bag by bag: each id
//! goes to the shard of its part as a local row (`id - first`) — a hot id kept on every shard
//! of the table goes with the bag's other ids, to the shard of the bag's first id that is not
//! hot — padding ids are dropped, and each shard pools its share with `sum` (`sum` and `mean`)
//! or `max`. The merge adds the partial sums, divides a `mean` by the whole bag's count, and
//! takes the maximum over the shards that had part of the bag (an empty share pools to zeros,
//! which is no maximum). Every check the engine makes comes first ([`check_batch`]), and the
//! ids are range-checked as they are routed: a bad batch gets the engine's error, naming the
//! table and the position in the caller's arrays, before any shard is asked.

use nearrec::{Bags, Batch, Error, ErrorKind, Indices, Pooled, PoolingMode, Rows, TableLookup};
use nearrec_engine::EngineError;
use nearrec_engine::check_batch;
use nearrec_plan::{ShardedTable, key_part};
use rustc_hash::FxHashMap;

mod parted;

use parted::{Bag, Parted, out_of_range, part_at, plain, row};

/// One shard's share of a batch: its lookups (borrowing `Split`'s arrays), and for each the
/// request table it serves.
#[derive(Debug, Default)]
pub(crate) struct Share {
    pub lookups: Vec<Owned>,
    /// The request table of each lookup.
    pub from: Vec<usize>,
}

/// A lookup either as the caller gave it (`Forward`), or routed rows of a split table.
#[derive(Debug)]
pub(crate) enum Owned {
    Forward(usize),
    Routed {
        table: usize,
        ids: Vec<i64>,
        lengths: Vec<i64>,
        weights: Option<Vec<f32>>,
        mode: PoolingMode,
        /// A keyed table's: each id's position in the caller's lookup (a shard's
        /// `UnknownKey` names its own).
        positions: Option<Vec<usize>>,
    },
}

/// Lookup `lookup` of shard `shard`'s share.
#[derive(Debug, Clone, Copy)]
struct Slot {
    shard: usize,
    lookup: usize,
}

/// How request table `k` comes back.
#[derive(Debug)]
enum Merge {
    /// Whole on one shard: the shard's columns as they are.
    Whole(Slot),
    /// Split: the shares it went to (each with its bag lengths, in its `Owned::Routed`), and
    /// the whole bags' counts (without padding) for a mean.
    Parts {
        slots: Vec<Slot>,
        counts: Vec<u32>,
        mode: PoolingMode,
    },
}

/// A batch cut by shard.
#[derive(Debug)]
pub(crate) struct Split {
    pub shares: Vec<Share>,
    merges: Vec<Merge>,
    /// The plan's table of each request table, and its dim.
    tables: Vec<(usize, usize)>,
    pub batch: usize,
    /// The bags of split tables (a bag of each split table per sample), those of them with
    /// ids on more than one shard, and the shards they reached together (the fan-out that
    /// replicated hot rows save: `bag_shards / split_bags`, from 1 to the table's parts).
    pub split_bags: u64,
    pub spread_bags: u64,
    pub bag_shards: u64,
}

/// A table's hot rows by id: their rank among the table's hot rows (built once per store: a
/// hash lookup per routed id, not a search of the sorted list).
#[derive(Debug, Default)]
pub(crate) struct HotRanks(FxHashMap<u64, u32>);

impl HotRanks {
    pub fn of(table: &ShardedTable) -> Self {
        HotRanks(
            (table.hot.iter().enumerate())
                .map(|(r, &id)| (id, r as u32))
                .collect(),
        )
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn rank(&self, id: u64) -> Option<u32> {
        self.0.get(&id).copied()
    }
}

impl Split {
    /// Cuts `batch` over `shards` shards by the plan's `tables` (`find` gives a request
    /// table's index among them, or the engine's `UnknownTable`).
    pub fn new(
        batch: &Batch<'_>,
        tables: &[ShardedTable],
        hot: &[HotRanks],
        shards: usize,
        find: impl Fn(&str) -> Result<usize, EngineError>,
    ) -> Result<Self, EngineError> {
        let checked = check_batch(batch, |name| Ok(tables[find(name)?].rows))?;
        let bags = checked.first().map_or(0, |c| c.batch());
        let mut split = Split {
            shares: (0..shards).map(|_| Share::default()).collect(),
            merges: Vec::with_capacity(batch.tables.len()),
            tables: Vec::with_capacity(batch.tables.len()),
            batch: bags,
            split_bags: 0,
            spread_bags: 0,
            bag_shards: 0,
        };
        for (k, (lookup, checked)) in batch.tables.iter().zip(&checked).enumerate() {
            let t = find(lookup.table)?;
            let table = &tables[t];
            split.tables.push((t, table.dim as usize));
            if table.parts.len() == 1 {
                // checked here too, so that a bad batch costs no round trip (a key is any id)
                for b in (0..bags).filter(|_| !table.keyed) {
                    for j in checked.bounds[b]..checked.bounds[b + 1] {
                        let id = lookup.indices.get(j);
                        if id < 0 || id as u64 >= table.rows {
                            return Err(out_of_range(lookup, j, b, table.rows));
                        }
                    }
                }
                let slot = split.push(table.parts[0].shard, k, Owned::Forward(k));
                split.merges.push(Merge::Whole(slot));
                continue;
            }
            let parts = table.parts.len();
            let n = checked.bounds[bags] - checked.bounds[0];
            let mut out = Parted::new(parts, bags, n, lookup.per_sample_weights.is_some());
            if table.keyed {
                // each key to its part as it is, its position kept
                out.positions = Some(vec![Vec::new(); parts]);
                for b in 0..bags {
                    for j in checked.bounds[b]..checked.bounds[b + 1] {
                        let key = lookup.indices.get(j);
                        let weight = lookup.per_sample_weights.map_or(0.0, |w| w[j]);
                        let p = key_part(key as u64, parts);
                        out.put(p, b, key, weight);
                        if let Some(at) = &mut out.positions {
                            at[p].push(j);
                        }
                    }
                    let reached = out.end_bag();
                    split.bag_shards += reached;
                    split.spread_bags += u64::from(reached > 1);
                }
                split.finish_parts(k, t, table, lookup, bags, out);
                continue;
            }
            let firsts: Vec<u64> = table.parts[1..].iter().map(|p| p.first).collect();
            let padding = checked.padding;
            let rows = table.rows;
            let hot = &hot[t];
            let weight = |j: usize| lookup.per_sample_weights.map_or(0.0, |w| w[j]);
            // hot ids of a bag waiting for its anchor: position, home part, local row, rank
            let mut waiting: Vec<(usize, usize, i64, u32)> = Vec::new();
            for b in 0..bags {
                let (from, to) = (checked.bounds[b], checked.bounds[b + 1]);
                if hot.is_empty() {
                    // each id to the part that holds it, in one pass
                    let bag = Bag { from, to, index: b };
                    match lookup.indices {
                        Indices::I64(all) => {
                            plain(all, bag, lookup, table, &firsts, padding, &mut out)?
                        }
                        Indices::I32(all) => {
                            plain(all, bag, lookup, table, &firsts, padding, &mut out)?
                        }
                    }
                } else {
                    // one pass: an id that is not hot goes to its part, and the first of them
                    // makes that part the bag's anchor; a hot id goes to the anchor, waiting
                    // for one if none is known yet (a bag of hot ids alone goes where its
                    // first id lives)
                    let mut anchor: Option<usize> = None;
                    waiting.clear();
                    for j in from..to {
                        let id = lookup.indices.get(j);
                        if id < 0 || id as u64 >= rows {
                            return Err(out_of_range(lookup, j, b, rows));
                        }
                        let id = id as u64;
                        if Some(id) == checked.padding {
                            continue;
                        }
                        let home = part_at(&firsts, id);
                        let local = (id - table.parts[home].first) as i64;
                        match (hot.rank(id), anchor) {
                            (None, _) => {
                                anchor.get_or_insert(home);
                                out.put(home, b, local, weight(j));
                            }
                            (Some(r), Some(a)) if a != home => {
                                let at = (table.parts[a].rows + u64::from(r)) as i64;
                                out.put(a, b, at, weight(j));
                            }
                            (Some(_), Some(_)) => out.put(home, b, local, weight(j)),
                            (Some(r), None) => waiting.push((j, home, local, r)),
                        }
                    }
                    if let Some(&(_, first, _, _)) = waiting.first() {
                        let a = anchor.unwrap_or(first);
                        for &(j, home, local, r) in &waiting {
                            if a == home {
                                out.put(home, b, local, weight(j));
                            } else {
                                let at = (table.parts[a].rows + u64::from(r)) as i64;
                                out.put(a, b, at, weight(j));
                            }
                        }
                    }
                }
                let reached = out.end_bag();
                split.bag_shards += reached;
                split.spread_bags += u64::from(reached > 1);
            }
            split.finish_parts(k, t, table, lookup, bags, out);
        }
        Ok(split)
    }

    /// Request table `k` (the plan's table `t`), routed part by part into `out`, handed to the
    /// shares of its parts, and its merge recorded.
    fn finish_parts(
        &mut self,
        k: usize,
        t: usize,
        table: &ShardedTable,
        lookup: &TableLookup<'_>,
        bags: usize,
        out: Parted,
    ) {
        let Parted {
            ids,
            lengths,
            weights,
            counts,
            positions,
            ..
        } = out;
        let weights: Vec<Option<Vec<f32>>> = weights
            .into_iter()
            .map(|w| lookup.per_sample_weights.map(|_| w))
            .collect();
        let mut positions = positions.map(Vec::into_iter);
        self.split_bags += bags as u64;
        let mode = match lookup.mode {
            PoolingMode::Max => PoolingMode::Max,
            _ => PoolingMode::Sum,
        };
        let mut slots = Vec::new();
        for (p, ((ids, lengths), weights)) in ids.into_iter().zip(lengths).zip(weights).enumerate()
        {
            let at = positions.as_mut().and_then(Iterator::next);
            if ids.is_empty() {
                continue;
            }
            let routed = Owned::Routed {
                table: t,
                ids,
                lengths,
                weights,
                mode,
                positions: at,
            };
            slots.push(self.push(table.parts[p].shard, k, routed));
        }
        self.merges.push(Merge::Parts {
            slots,
            counts,
            mode: lookup.mode,
        });
    }

    /// `e`, an error shard `shard` answered its share with, as the caller's request names
    /// things: an `UnknownKey` at a position of a routed keyed lookup moves to the caller's
    /// position of that key (the first routed lookup of the table long enough, when the
    /// request names the table more than once).
    pub fn caller_error(&self, shard: usize, e: Error, tables: &[ShardedTable]) -> Error {
        let (Some(table), Some(position)) = (e.table(), e.position()) else {
            return e;
        };
        if e.kind() != ErrorKind::UnknownKey {
            return e;
        }
        let found = self.shares[shard].lookups.iter().find_map(|o| match o {
            Owned::Routed {
                table: t,
                positions: Some(at),
                ..
            } if tables[*t].name == table => at.get(position).copied(),
            _ => None,
        });
        match (found, e) {
            (
                Some(at),
                Error::Remote {
                    kind,
                    code,
                    message,
                    table,
                    ..
                },
            ) => Error::Remote {
                kind,
                code,
                message: format!(
                    "{message} (position {position} of shard {shard}'s share; {at} of the \
                     request)"
                ),
                table,
                position: Some(at),
            },
            (_, e) => e,
        }
    }

    /// Adds `lookup` (for request table `k`) to shard `shard`'s share; where it is.
    fn push(&mut self, shard: usize, k: usize, lookup: Owned) -> Slot {
        let share = &mut self.shares[shard];
        share.lookups.push(lookup);
        share.from.push(k);
        Slot {
            shard,
            lookup: share.lookups.len() - 1,
        }
    }

    /// Shard `shard`'s share as a batch over `request`'s arrays and this split's.
    pub fn batch_for<'a>(
        &'a self,
        shard: usize,
        request: &Batch<'a>,
        tables: &'a [ShardedTable],
    ) -> Batch<'a> {
        let lookups = self.shares[shard].lookups.iter().map(|o| match o {
            Owned::Forward(k) => request.tables[*k],
            Owned::Routed {
                table,
                ids,
                lengths,
                weights,
                mode,
                ..
            } => {
                let mut l = TableLookup::new(
                    &tables[*table].name,
                    Indices::I64(ids),
                    Bags::Lengths(Indices::I64(lengths)),
                )
                .with_mode(*mode);
                if let Some(w) = weights {
                    l = l.with_weights(w);
                }
                l
            }
        });
        Batch::new(lookups.collect())
    }

    /// The shards this batch goes to.
    pub fn shards(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.shares.len()).filter(|&s| !self.shares[s].lookups.is_empty())
    }

    /// The answer from each shard's pooled share (`answers[s]`, `None` for a shard not asked).
    pub fn merge(&self, answers: &[Option<Pooled>], tables: &[ShardedTable]) -> Pooled {
        let width: usize = self.tables.iter().map(|&(_, d)| d).sum();
        let mut values = vec![0f32; self.batch * width];
        // where each lookup of each share starts in that shard's answer
        let cols: Vec<Vec<usize>> = (self.shares.iter())
            .map(|share| {
                let mut col = 0;
                (share.from.iter())
                    .map(|&k| {
                        col += self.tables[k].1;
                        col - self.tables[k].1
                    })
                    .collect()
            })
            .collect();
        // a slot's answer: its pooled rows and where its columns start
        let answer = |slot: Slot| -> (&Pooled, usize) {
            let p = answers[slot.shard].as_ref();
            let p = p.expect("every shard asked has answered");
            (p, cols[slot.shard][slot.lookup])
        };
        let mut col = 0;
        for (k, merge) in self.merges.iter().enumerate() {
            let dim = self.tables[k].1;
            match merge {
                Merge::Whole(slot) => {
                    let from = answer(*slot);
                    for b in 0..self.batch {
                        values[b * width + col..][..dim].copy_from_slice(row(from, b, dim));
                    }
                }
                Merge::Parts {
                    slots,
                    counts,
                    mode,
                } => {
                    let parts: Vec<((&Pooled, usize), &[i64])> = (slots.iter())
                        .map(|&slot| {
                            let lengths = match &self.shares[slot.shard].lookups[slot.lookup] {
                                Owned::Routed { lengths, .. } => lengths.as_slice(),
                                Owned::Forward(_) => unreachable!("a split table is routed"),
                            };
                            (answer(slot), lengths)
                        })
                        .collect();
                    for b in 0..self.batch {
                        let out = &mut values[b * width + col..][..dim];
                        let mut first = true;
                        for &(from, lengths) in &parts {
                            if lengths[b] == 0 {
                                continue;
                            }
                            for (o, &v) in out.iter_mut().zip(row(from, b, dim)) {
                                *o = match (mode, first) {
                                    (_, true) => v,
                                    (PoolingMode::Max, false) => o.max(v),
                                    _ => *o + v,
                                };
                            }
                            first = false;
                        }
                        if *mode == PoolingMode::Mean && counts[b] > 0 {
                            let n = counts[b] as f32;
                            out.iter_mut().for_each(|v| *v /= n);
                        }
                    }
                }
            }
            col += dim;
        }
        Pooled {
            values,
            batch: self.batch,
            tables: self
                .tables
                .iter()
                .map(|&(t, d)| (tables[t].name.clone(), d))
                .collect(),
        }
    }

    /// Each request table's distinct rows from the shards' answers, local rows back to the
    /// table's ids, ascending.
    pub fn merge_rows(&self, answers: &[Option<Vec<Rows>>], tables: &[ShardedTable]) -> Vec<Rows> {
        let mut out: Vec<Vec<(i64, Vec<f32>)>> = vec![Vec::new(); self.merges.len()];
        for (s, share) in self.shares.iter().enumerate() {
            let Some(rows) = &answers[s] else { continue };
            for (rows, &k) in rows.iter().zip(&share.from) {
                let table = &tables[self.tables[k].0];
                if table.keyed {
                    // keys come back as they went
                    for (i, &key) in rows.ids.iter().enumerate() {
                        out[k].push((key, rows.values[i * rows.dim..][..rows.dim].to_vec()));
                    }
                    continue;
                }
                let part = table.part_on(s).expect("a shard asked holds the table");
                let (first, held) = (table.parts[part].first, table.parts[part].rows);
                for (i, &local) in rows.ids.iter().enumerate() {
                    let local = local as u64;
                    let id = if local < held {
                        first + local
                    } else {
                        table.hot[(local - held) as usize]
                    };
                    let row = rows.values[i * rows.dim..][..rows.dim].to_vec();
                    out[k].push((id as i64, row));
                }
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(k, mut rows)| {
                rows.sort_by_key(|r| r.0);
                rows.dedup_by_key(|r| r.0);
                let (t, dim) = self.tables[k];
                Rows {
                    table: tables[t].name.clone(),
                    dim,
                    ids: rows.iter().map(|r| r.0).collect(),
                    values: rows.into_iter().flat_map(|r| r.1).collect(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nearrec_plan::{Part, ShardedTable};

    /// The cost of cutting a batch of 64 bags × 8 tables × 80 ids over two shards (printed,
    /// not asserted: `cargo test -p nearrec-cluster --release -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn time_a_split() {
        let rows = 65_536u64;
        let tables: Vec<ShardedTable> = (0..8)
            .map(|t| ShardedTable {
                name: format!("t{t}"),
                rows,
                dim: 32,
                dtype: nearrec::format::DType::Fp32,
                load: 0.125,
                parts: vec![
                    Part {
                        shard: 0,
                        first: 0,
                        rows: rows / 2,
                    },
                    Part {
                        shard: 1,
                        first: rows / 2,
                        rows: rows / 2,
                    },
                ],
                hot: (0..500).map(|i| i * 7).collect(),
                keyed: false,
            })
            .collect();
        let ids: Vec<i64> = (0..64 * 80).map(|i| (i * 7919) % rows as i64).collect();
        let names: Vec<String> = (0..8).map(|t| format!("t{t}")).collect();
        let lookups = names
            .iter()
            .map(|n| {
                TableLookup::new(
                    n,
                    Indices::I64(&ids),
                    Bags::Fixed {
                        batch: 64,
                        bag_size: 80,
                    },
                )
            })
            .collect();
        let batch = Batch::new(lookups);
        for hot in [false, true] {
            let ranks: Vec<HotRanks> = tables
                .iter()
                .map(|t| {
                    if hot {
                        HotRanks::of(t)
                    } else {
                        HotRanks::default()
                    }
                })
                .collect();
            let t = std::time::Instant::now();
            for _ in 0..200 {
                let s = Split::new(&batch, &tables, &ranks, 2, |n| {
                    Ok(names.iter().position(|x| x == n).unwrap())
                })
                .unwrap();
                std::hint::black_box(&s);
            }
            println!(
                "hot {hot}: {:.0} µs a batch",
                t.elapsed().as_secs_f64() * 1e6 / 200.0
            );
        }
    }
}
