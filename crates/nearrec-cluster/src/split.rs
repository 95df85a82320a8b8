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

use nearrec::{Bags, Batch, Indices, Pooled, PoolingMode, Rows, TableLookup};
use nearrec_engine::EngineError;
use nearrec_engine::check_batch;
use nearrec_plan::ShardedTable;

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
    },
}

/// How request table `k` comes back.
#[derive(Debug)]
enum Merge {
    /// Whole on one shard: the shard's columns as they are.
    Whole { shard: usize },
    /// Split: the shards it went to, each shard's bag lengths, and the whole bags' counts
    /// (without padding) for a mean.
    Parts {
        shards: Vec<usize>,
        lengths: Vec<Vec<i64>>,
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
    /// Bags with ids on more than one shard, and the shards all bags of split tables reached
    /// (the fan-out replicated hot rows save).
    pub spread_bags: u64,
    pub bag_shards: u64,
}

/// Where row `id` of `table` goes for a bag whose anchor part is `anchor`: the part, and its
/// local row there.
fn route(table: &ShardedTable, id: u64, anchor: Option<usize>) -> (usize, i64) {
    let home = table.part_of(id);
    match (anchor, table.hot.binary_search(&id)) {
        (Some(a), Ok(rank)) if a != home => (a, (table.parts[a].rows + rank as u64) as i64),
        _ => (home, (id - table.parts[home].first) as i64),
    }
}

fn out_of_range(lookup: &TableLookup<'_>, position: usize, bag: usize, rows: u64) -> EngineError {
    EngineError::IndexOutOfRange {
        table: lookup.table.to_owned(),
        position,
        bag,
        value: lookup.indices.get(position),
        rows,
    }
}

impl Split {
    /// Cuts `batch` over `shards` shards by the plan's `tables` (`find` gives a request
    /// table's index among them, or the engine's `UnknownTable`).
    pub fn new(
        batch: &Batch<'_>,
        tables: &[ShardedTable],
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
            spread_bags: 0,
            bag_shards: 0,
        };
        for (k, (lookup, checked)) in batch.tables.iter().zip(&checked).enumerate() {
            let t = find(lookup.table)?;
            let table = &tables[t];
            split.tables.push((t, table.dim as usize));
            if table.parts.len() == 1 {
                // checked here too, so that a bad batch costs no round trip
                for b in 0..bags {
                    for j in checked.bounds[b]..checked.bounds[b + 1] {
                        let id = lookup.indices.get(j);
                        if id < 0 || id as u64 >= table.rows {
                            return Err(out_of_range(lookup, j, b, table.rows));
                        }
                    }
                }
                let shard = table.parts[0].shard;
                split.shares[shard].lookups.push(Owned::Forward(k));
                split.shares[shard].from.push(k);
                split.merges.push(Merge::Whole { shard });
                continue;
            }
            let parts = table.parts.len();
            let mut ids: Vec<Vec<i64>> = vec![Vec::new(); parts];
            let mut lengths: Vec<Vec<i64>> = vec![vec![0; bags]; parts];
            let mut weights: Vec<Option<Vec<f32>>> = (0..parts)
                .map(|_| lookup.per_sample_weights.map(|_| Vec::new()))
                .collect();
            let mut counts = vec![0u32; bags];
            let rows = table.rows;
            for b in 0..bags {
                let (from, to) = (checked.bounds[b], checked.bounds[b + 1]);
                // range-checked first, over the whole bag, so that the first bad id is named
                let mut anchor = None;
                for j in from..to {
                    let id = lookup.indices.get(j);
                    if id < 0 || id as u64 >= rows {
                        return Err(out_of_range(lookup, j, b, rows));
                    }
                    if anchor.is_none()
                        && Some(id as u64) != checked.padding
                        && table.hot.binary_search(&(id as u64)).is_err()
                    {
                        anchor = Some(table.part_of(id as u64));
                    }
                }
                let mut reached = 0u64; // parts this bag reached, as bits (up to 64), else counted
                let mut reached_many = vec![false; if parts > 64 { parts } else { 0 }];
                for j in from..to {
                    let id = lookup.indices.get(j) as u64;
                    if Some(id) == checked.padding {
                        continue;
                    }
                    // a bag of hot ids alone goes where its first id lives
                    let anchor = *anchor.get_or_insert_with(|| table.part_of(id));
                    let (p, local) = route(table, id, Some(anchor));
                    ids[p].push(local);
                    lengths[p][b] += 1;
                    if let (Some(w), Some(all)) = (&mut weights[p], lookup.per_sample_weights) {
                        w.push(all[j]);
                    }
                    counts[b] += 1;
                    if parts > 64 {
                        reached_many[p] = true;
                    } else {
                        reached |= 1 << p;
                    }
                }
                let reached = if parts > 64 {
                    reached_many.iter().filter(|&&r| r).count() as u64
                } else {
                    u64::from(reached.count_ones())
                };
                split.bag_shards += reached;
                split.spread_bags += u64::from(reached > 1);
            }
            let mode = match lookup.mode {
                PoolingMode::Max => PoolingMode::Max,
                _ => PoolingMode::Sum,
            };
            let mut shards_of = Vec::new();
            let mut kept_lengths = Vec::new();
            for (p, ((ids, lengths), weights)) in
                ids.into_iter().zip(lengths).zip(weights).enumerate()
            {
                if ids.is_empty() {
                    continue;
                }
                let shard = table.parts[p].shard;
                shards_of.push(shard);
                kept_lengths.push(lengths.clone());
                split.shares[shard].lookups.push(Owned::Routed {
                    table: t,
                    ids,
                    lengths,
                    weights,
                    mode,
                });
                split.shares[shard].from.push(k);
            }
            split.merges.push(Merge::Parts {
                shards: shards_of,
                lengths: kept_lengths,
                counts,
                mode: lookup.mode,
            });
        }
        Ok(split)
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
        // each request table's columns in each shard's answer
        let mut at: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.merges.len()];
        for (s, share) in self.shares.iter().enumerate() {
            let mut col = 0;
            for &k in &share.from {
                at[k].push((s, col));
                col += self.tables[k].1;
            }
        }
        let mut col = 0;
        for (k, merge) in self.merges.iter().enumerate() {
            let dim = self.tables[k].1;
            let column = |s: usize, c: usize, b: usize| -> &[f32] {
                let p = answers[s].as_ref().expect("every shard asked has answered");
                &p.values[b * p.width() + c..][..dim]
            };
            for b in 0..self.batch {
                let out = &mut values[b * width + col..][..dim];
                match merge {
                    Merge::Whole { shard } => {
                        let (_, c) = at[k].iter().find(|(s, _)| s == shard).copied().unwrap();
                        out.copy_from_slice(column(*shard, c, b));
                    }
                    Merge::Parts {
                        shards,
                        lengths,
                        counts,
                        mode,
                    } => {
                        let mut first = true;
                        for (i, &s) in shards.iter().enumerate() {
                            if lengths[i][b] == 0 {
                                continue;
                            }
                            let (_, c) = at[k].iter().find(|(x, _)| *x == s).copied().unwrap();
                            let part = column(s, c, b);
                            for (o, &v) in out.iter_mut().zip(part) {
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
