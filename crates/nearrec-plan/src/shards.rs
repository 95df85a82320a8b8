//! Shards: which node serves which rows of which table, and the plan file (`shards.json`) that
//! the router and the nodes read.
//!
//! A table is cut into contiguous row ranges, its *parts*, each on a different shard: one part
//! is TorchRec's `TABLE_WISE`, a part on every shard `ROW_WISE`, a part on each of a group of
//! shards sized to the table's demand `TABLE_ROW_WISE`. One representation holds all three, so
//! the router has one way to split a batch. Shards are balanced by a cost that weighs a table's
//! bytes and its expected load equally: `cost = ½ · bytes / Σ bytes + ½ · lookups / Σ lookups`,
//! the lookups counted in a trace (without one, every table is taken to be read equally often).
//! A row-wise table's cuts fall where each part holds an equal share of that cost, so the rows
//! a trace reads most are spread, not piled on the first shard.
//!
//! With `replicate_hot`, a table cut into several parts keeps its hottest rows (by the trace)
//! on every shard that holds a part of it as well, after the part's own rows: the router sends
//! a bag's hot ids with its other ids instead of to one more shard.
//!
//! A shard is an ordinary store (`shard-K` beside the plan) whose tables are the parts it
//! holds, under the tables' names: part rows first (global id `first + r` at local row `r`),
//! then the table's hot rows in ascending id order.

use std::path::{Path, PathBuf};

use nearrec_format::{DType, TableMeta};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::error::{PlanError, Result};
use crate::planner::TraceTable;

/// The plan's file name in a sharded store's directory.
pub const SHARD_PLAN: &str = "shards.json";
/// The plan file's format; a reader refuses any other.
pub const SHARD_PLAN_FORMAT: u32 = 1;
/// The most shards, and replicas of a shard, a plan may have.
pub const MAX_SHARDS: usize = 4096;
pub const MAX_REPLICAS: usize = 16;

/// How tables are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// Whole tables, each on one shard (TorchRec's `TABLE_WISE`).
    Table,
    /// Every table over every shard (`ROW_WISE`).
    Row,
    /// Each table over as many shards as its cost asks (`TABLE_ROW_WISE`): a cold table stays
    /// whole, a hot one is spread.
    TableRow,
    /// `Table` when whole tables balance within 15 % of the mean cost, else `TableRow`.
    Auto,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Table => "table",
            Scheme::Row => "row",
            Scheme::TableRow => "table-row",
            Scheme::Auto => "auto",
        }
    }

    /// The scheme of `name` (`table`, `row`, `table-row`, `auto`).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "table" => Scheme::Table,
            "row" => Scheme::Row,
            "table-row" => Scheme::TableRow,
            "auto" => Scheme::Auto,
            _ => {
                return Err(PlanError::InvalidArgument {
                    what: "scheme",
                    reason: format!("must be table, row, table-row or auto, not {name:?}"),
                });
            }
        })
    }
}

/// What [`plan_shards`] is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardOptions {
    pub shards: usize,
    pub replicas: usize,
    pub scheme: Scheme,
    /// The hottest rows of each table cut into several parts kept on each of its shards
    /// (needs a trace).
    pub replicate_hot: u64,
}

/// A sharded store's plan: what the router splits batches by and every shard is checked against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardPlan {
    pub format: u32,
    /// A digest of everything below: a shard store carries the id of the plan it was cut by.
    pub id: String,
    /// The name the sharded store is served as (the source store's).
    pub store: String,
    /// The scheme that made it (`auto` resolved).
    pub scheme: Scheme,
    pub shards: usize,
    pub replicas: usize,
    pub tables: Vec<ShardedTable>,
    /// The plans this one was made from by tables created and dropped, oldest (the cut's)
    /// first: a shard tagged with one of them is this store's, behind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
}

/// One table of a sharded store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardedTable {
    pub name: String,
    pub rows: u64,
    pub dim: u32,
    pub dtype: DType,
    /// Its share of the trace's lookups (of the tables' count without a trace).
    pub load: f64,
    /// Its row ranges in ascending order, each on a shard of its own, together every row.
    pub parts: Vec<Part>,
    /// Rows kept on every shard of the table as well (ascending, only with several parts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hot: Vec<u64>,
    /// A keyed table (`docs/format.md` §16): its ids are keys, and part `k` of `n` holds the
    /// keys `key` with [`key_part`]`(key, n) == k` — its row range is only its nominal share
    /// (an even one). It has no hot rows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keyed: bool,
}

/// The part of `parts` that holds key `key` of a keyed table cut by key hash: SplitMix64's
/// finaliser of the key's 64 bits, modulo the parts. Stated here once: the cut, the router and
/// anything placing keys (a client that shards its own writes) use this function.
pub fn key_part(key: u64, parts: usize) -> usize {
    let mut z = key;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % parts as u64) as usize
}

/// Rows `first .. first + rows` of a table, on shard `shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    pub shard: usize,
    pub first: u64,
    pub rows: u64,
}

impl ShardedTable {
    /// The part that holds row `id` (which must be below `rows`).
    pub fn part_of(&self, id: u64) -> usize {
        self.parts.partition_point(|p| p.first <= id) - 1
    }

    /// The part on shard `shard`, if the table has one there.
    pub fn part_on(&self, shard: usize) -> Option<usize> {
        self.parts.iter().position(|p| p.shard == shard)
    }

    /// The rows its table on the shard of part `k` holds: the part's, then the hot rows.
    pub fn shard_rows(&self, k: usize) -> u64 {
        self.parts[k].rows + self.hot.len() as u64
    }
}

impl ShardPlan {
    /// The directory of shard `k` under the plan's directory `dir`.
    pub fn shard_dir(dir: &Path, k: usize) -> PathBuf {
        dir.join(format!("shard-{k}"))
    }

    /// The tables shard `k` holds: `(table index, part index)` in the plan's table order.
    pub fn shard_tables(&self, k: usize) -> Vec<(usize, usize)> {
        (self.tables.iter().enumerate())
            .filter_map(|(t, table)| table.part_on(k).map(|p| (t, p)))
            .collect()
    }

    /// The plan in directory `dir`, checked whole.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(SHARD_PLAN);
        let bytes = std::fs::read(&path).map_err(|source| PlanError::Io {
            path: path.clone(),
            source,
        })?;
        Self::parse(&bytes, &path)
    }

    /// The plan whose JSON is `bytes` (read from `origin`, which errors name), checked whole.
    pub fn parse(bytes: &[u8], origin: &Path) -> Result<Self> {
        let bad = |table: Option<String>, reason: String| PlanError::BadShardPlan {
            path: origin.to_path_buf(),
            table,
            reason,
        };
        let plan: ShardPlan = serde_json::from_slice(bytes)
            .map_err(|e| bad(None, format!("not a shard plan: {e}")))?;
        if plan.format != SHARD_PLAN_FORMAT {
            return Err(bad(
                None,
                format!(
                    "format {} is not the {SHARD_PLAN_FORMAT} this build reads",
                    plan.format
                ),
            ));
        }
        plan.check().map_err(|(table, reason)| bad(table, reason))?;
        if plan.id != plan.digest() {
            return Err(bad(
                None,
                format!(
                    "its id {} is not its content's ({}): the file was edited",
                    plan.id,
                    plan.digest()
                ),
            ));
        }
        Ok(plan)
    }

    /// The plan as its file holds it.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan serializes") + "\n"
    }

    /// Writes the plan to `dir/shards.json`, atomically.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(SHARD_PLAN);
        nearrec_format::replace_file(&path, self.to_json().as_bytes()).map_err(|e| {
            PlanError::Io {
                path: path.clone(),
                source: std::io::Error::other(e.to_string()),
            }
        })?;
        Ok(path)
    }

    /// The id of this plan's content (every field but `id`; `parents` only where there are
    /// some, so that a cut's id is what it was before plans had them).
    fn digest(&self) -> String {
        let fields = (
            self.format,
            &self.store,
            self.scheme,
            self.shards,
            self.replicas,
            &self.tables,
        );
        let content = if self.parents.is_empty() {
            serde_json::to_vec(&fields)
        } else {
            serde_json::to_vec(&(fields, &self.parents))
        }
        .expect("a plan serializes");
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&content))
    }

    /// The id of the cut this plan descends from: what names the store where plans change
    /// (its keys in etcd).
    pub fn root(&self) -> &str {
        self.parents.first().unwrap_or(&self.id)
    }

    /// Whether `id` is this plan or one it was made from.
    pub fn descends_from(&self, id: &str) -> bool {
        self.id == id || self.parents.iter().any(|p| p == id)
    }

    /// The plan with a new table of `rows` × `dim` values in `dtype` (a name no table has),
    /// placed as the plan's scheme places a table no trace has read (its cost its bytes alone):
    /// whole on the least loaded shard (`table`), over every shard (`row`), or over as many
    /// as its cost asks (`table-row`), each part on the least loaded shard without one. Its
    /// parents are this plan's and this plan.
    pub fn with_table(&self, name: &str, rows: u64, dim: u32, dtype: DType) -> ShardPlan {
        let n = self.shards;
        let bytes = |t: &ShardedTable| t.rows as f64 * t.dtype.row_bytes(t.dim) as f64;
        let new_bytes = rows as f64 * dtype.row_bytes(dim) as f64;
        let total = (self.tables.iter().map(bytes).sum::<f64>() + new_bytes).max(1.0);
        let mut load = vec![0f64; n];
        for t in &self.tables {
            for p in &t.parts {
                let share = p.rows as f64 / t.rows as f64;
                load[p.shard] += share * (0.5 * bytes(t) / total + 0.5 * t.load);
            }
        }
        let cost = 0.5 * new_bytes / total;
        let most = n.min(rows as usize).max(1);
        let groups = match self.scheme {
            Scheme::Table | Scheme::Auto => 1,
            Scheme::Row => most,
            Scheme::TableRow => ((cost * n as f64 - 1e-9).ceil() as usize).clamp(1, most),
        };
        let g = groups as u64;
        let mut parts: Vec<Part> = Vec::with_capacity(groups);
        for k in 0..g {
            let (first, end) = (rows * k / g, rows * (k + 1) / g);
            let shard = (0..n)
                .filter(|&s| parts.iter().all(|p| p.shard != s))
                .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
                .expect("a table has at most one part per shard");
            load[shard] += cost / g as f64;
            parts.push(Part {
                shard,
                first,
                rows: end - first,
            });
        }
        let mut plan = self.clone();
        plan.tables.push(ShardedTable {
            name: name.to_owned(),
            rows,
            dim,
            dtype,
            load: 0.0,
            parts,
            hot: Vec::new(),
            keyed: false,
        });
        plan.descend(self);
        plan
    }

    /// The plan without table `name`; `None` where no table has that name. A plan a shard of
    /// which would hold no table is refused by its check: the reason, naming the shard.
    pub fn without_table(&self, name: &str) -> Option<std::result::Result<ShardPlan, String>> {
        let mut plan = self.clone();
        let at = plan.tables.iter().position(|t| t.name == name)?;
        plan.tables.remove(at);
        if let Err((_, reason)) = plan.check() {
            return Some(Err(reason));
        }
        plan.descend(self);
        Some(Ok(plan))
    }

    /// Makes this plan a child of `parent`: its lineage, then its own id.
    fn descend(&mut self, parent: &ShardPlan) {
        self.parents = parent.parents.clone();
        self.parents.push(parent.id.clone());
        self.id = self.digest();
    }

    /// What makes a plan one: shard and replica counts in range; every table's parts
    /// contiguous over its rows, each on a shard of its own; hot rows ascending, within the
    /// table, only on tables of several parts; every shard holding something.
    fn check(&self) -> std::result::Result<(), (Option<String>, String)> {
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err((
                None,
                format!("shards {} is not 1 ..= {MAX_SHARDS}", self.shards),
            ));
        }
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err((
                None,
                format!("replicas {} is not 1 ..= {MAX_REPLICAS}", self.replicas),
            ));
        }
        if self.tables.is_empty() {
            return Err((None, "the plan has no tables".into()));
        }
        let mut held = vec![false; self.shards];
        for (i, t) in self.tables.iter().enumerate() {
            let named = |reason: String| (Some(t.name.clone()), reason);
            if self.tables[..i].iter().any(|u| u.name == t.name) {
                return Err(named("listed twice".into()));
            }
            if t.rows == 0 || t.dim == 0 {
                return Err(named(format!("{} rows × dim {}", t.rows, t.dim)));
            }
            let mut next = 0u64;
            for (k, p) in t.parts.iter().enumerate() {
                if p.shard >= self.shards {
                    return Err(named(format!(
                        "part {k} is on shard {} of {}",
                        p.shard, self.shards
                    )));
                }
                if t.parts[..k].iter().any(|q| q.shard == p.shard) {
                    return Err(named(format!("two parts on shard {}", p.shard)));
                }
                if p.first != next || p.rows == 0 {
                    return Err(named(format!(
                        "part {k} holds rows {} + {}; the parts must cover its {} rows in order",
                        p.first, p.rows, t.rows
                    )));
                }
                next = p.first + p.rows;
                held[p.shard] = true;
            }
            if next != t.rows {
                return Err(named(format!(
                    "its parts cover {next} of its {} rows",
                    t.rows
                )));
            }
            if !t.hot.is_empty() && (t.parts.len() < 2 || t.keyed) {
                return Err(named(
                    "hot rows on a table of one part, or a keyed one".into(),
                ));
            }
            if t.hot.windows(2).any(|w| w[0] >= w[1]) || t.hot.last() >= Some(&t.rows) {
                return Err(named(format!(
                    "hot rows must ascend within its {} rows",
                    t.rows
                )));
            }
        }
        if let Some(k) = held.iter().position(|&h| !h) {
            return Err((None, format!("shard {k} holds no table")));
        }
        Ok(())
    }
}

/// One table's demand: its share of the cost, and where in its rows the reads fall.
struct Demand {
    bytes: u64,
    lookups: f64,
    /// Row ids read and how often, ascending by id (empty without a trace).
    counts: Vec<(u64, u64)>,
    /// Prefix sums of `counts`' counts (one more entry than `counts`).
    prefix: Vec<u64>,
}

impl Demand {
    fn new(meta: &TableMeta, trace: Option<&TraceTable<'_>>) -> Self {
        let mut counts: FxHashMap<u64, u64> = FxHashMap::default();
        if let Some(t) = trace {
            for &id in t.indices {
                *counts.entry(id as u64).or_default() += 1;
            }
        }
        let mut counts: Vec<(u64, u64)> = counts.into_iter().collect();
        counts.sort_unstable();
        let mut prefix = Vec::with_capacity(counts.len() + 1);
        prefix.push(0);
        for &(_, c) in &counts {
            prefix.push(prefix.last().unwrap() + c);
        }
        Demand {
            bytes: meta.rows * meta.row_bytes,
            lookups: trace.map_or(1.0, |t| t.indices.len() as f64),
            counts,
            prefix,
        }
    }

    /// The share of the table's cost in rows `0 .. end`: half by rows, half by reads.
    fn share_below(&self, end: u64, rows: u64) -> f64 {
        let total = *self.prefix.last().unwrap();
        let by_rows = end as f64 / rows as f64;
        if total == 0 {
            return by_rows;
        }
        let k = self.counts.partition_point(|&(id, _)| id < end);
        0.5 * by_rows + 0.5 * self.prefix[k] as f64 / total as f64
    }

    /// The `n` most read rows (ties: the lower id), ascending by id.
    fn hottest(&self, n: u64) -> Vec<u64> {
        let mut by_count: Vec<(u64, u64)> = self.counts.clone();
        by_count.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut hot: Vec<u64> = by_count
            .iter()
            .take(n as usize)
            .map(|&(id, _)| id)
            .collect();
        hot.sort_unstable();
        hot
    }
}

/// A plan that cuts the tables `tables` (a store's, named `store`) into `options.shards`
/// shards, balanced by bytes and by `trace`'s load where one is given (checked against the
/// tables first: a trace made for another store is a `TraceMismatch`).
pub fn plan_shards(
    store: &str,
    tables: &[TableMeta],
    trace: Option<&[TraceTable<'_>]>,
    options: &ShardOptions,
) -> Result<ShardPlan> {
    let n = options.shards;
    let invalid = |what, reason: String| PlanError::InvalidArgument { what, reason };
    if !(1..=MAX_SHARDS).contains(&n) {
        return Err(invalid("shards", format!("{n} is not 1 ..= {MAX_SHARDS}")));
    }
    if !(1..=MAX_REPLICAS).contains(&options.replicas) {
        return Err(invalid(
            "replicas",
            format!("{} is not 1 ..= {MAX_REPLICAS}", options.replicas),
        ));
    }
    if tables.is_empty() {
        return Err(invalid("store", "has no tables to shard".into()));
    }
    if options.replicate_hot > 0 && trace.is_none() {
        return Err(invalid(
            "replicate_hot",
            "needs a trace to find the hot rows by".into(),
        ));
    }
    // a trace's ids of a keyed table are keys, not rows: its share of the lookups counts, and
    // where they fall among the rows does not
    let keyed = |name: &str| tables.iter().any(|t| t.name == name && t.is_keyed());
    if let Some(trace) = trace {
        let plan_tables: Vec<crate::PlanTable> = tables.iter().map(Into::into).collect();
        let rows: Vec<TraceTable<'_>> = trace.iter().filter(|t| !keyed(t.name)).cloned().collect();
        crate::check_trace(&plan_tables, &rows)?;
    }
    let demand: Vec<Demand> = tables
        .iter()
        .map(|t| {
            let traced = trace.and_then(|tr| tr.iter().find(|x| x.name == t.name));
            if t.is_keyed() {
                let mut d = Demand::new(t, None);
                d.lookups = traced.map_or(if trace.is_some() { 0.0 } else { 1.0 }, |x| {
                    x.indices.len() as f64
                });
                return d;
            }
            // a table the trace does not read costs its bytes alone
            let mut d = Demand::new(t, traced);
            if trace.is_some() && traced.is_none() {
                d.lookups = 0.0;
            }
            d
        })
        .collect();
    let bytes: f64 = demand.iter().map(|d| d.bytes as f64).sum::<f64>().max(1.0);
    let lookups: f64 = demand.iter().map(|d| d.lookups).sum();
    let cost: Vec<f64> = demand
        .iter()
        .map(|d| {
            let by_load = if lookups > 0.0 {
                d.lookups / lookups
            } else {
                0.0
            };
            0.5 * d.bytes as f64 / bytes + 0.5 * by_load
        })
        .collect();

    let whole = vec![1usize; tables.len()];
    let (scheme, groups) = match options.scheme {
        Scheme::Table => (Scheme::Table, whole),
        Scheme::Row => (
            Scheme::Row,
            tables.iter().map(|t| n.min(t.rows as usize)).collect(),
        ),
        Scheme::TableRow => (Scheme::TableRow, spread(tables, &cost, n)),
        Scheme::Auto => {
            let loads = place(tables, &demand, &cost, &whole, n).1;
            let (max, mean) = (loads.iter().cloned().fold(0.0, f64::max), 1.0 / n as f64);
            if tables.len() >= n && max <= 1.15 * mean && loads.iter().all(|&l| l > 0.0) {
                (Scheme::Table, whole)
            } else {
                (Scheme::TableRow, spread(tables, &cost, n))
            }
        }
    };
    let (parts, _) = place(tables, &demand, &cost, &groups, n);
    let out: Vec<ShardedTable> = tables
        .iter()
        .zip(parts)
        .zip(&demand)
        .map(|((t, parts), d)| {
            let hot = if parts.len() > 1 && !t.is_keyed() {
                d.hottest(options.replicate_hot)
            } else {
                Vec::new()
            };
            ShardedTable {
                name: t.name.clone(),
                rows: t.rows,
                dim: t.dim,
                dtype: t.dtype,
                load: if lookups > 0.0 {
                    d.lookups / lookups
                } else {
                    0.0
                },
                parts,
                hot,
                keyed: t.is_keyed(),
            }
        })
        .collect();
    let mut plan = ShardPlan {
        format: SHARD_PLAN_FORMAT,
        id: String::new(),
        store: store.to_owned(),
        scheme,
        shards: n,
        replicas: options.replicas,
        tables: out,
        parents: Vec::new(),
    };
    plan.check().map_err(|(_, reason)| {
        invalid(
            "shards",
            format!(
                "{reason}: {n} shards for {} tables under {}-wise sharding leave a shard \
                 empty (try --scheme row or table-row, or fewer shards)",
                tables.len(),
                scheme.name()
            ),
        )
    })?;
    plan.id = plan.digest();
    Ok(plan)
}

/// Table-row-wise: each table over the fewest shards that keep its parts within the mean cost
/// of a shard, then more parts for the costliest parts until every shard can hold one.
fn spread(tables: &[TableMeta], cost: &[f64], n: usize) -> Vec<usize> {
    let most = |t: &TableMeta| n.min(t.rows as usize);
    let mut groups: Vec<usize> = (tables.iter().zip(cost))
        .map(|(t, &c)| ((c * n as f64 - 1e-9).ceil() as usize).clamp(1, most(t)))
        .collect();
    while groups.iter().sum::<usize>() < n {
        let widest = (0..tables.len())
            .filter(|&i| groups[i] < most(&tables[i]))
            .max_by(|&a, &b| {
                let (pa, pb) = (cost[a] / groups[a] as f64, cost[b] / groups[b] as f64);
                pa.total_cmp(&pb).then(b.cmp(&a))
            });
        match widest {
            Some(i) => groups[i] += 1,
            None => break, // fewer rows than shards in all: the plan's check says so
        }
    }
    groups
}

/// Cuts table `i` into `groups[i]` parts of equal cost share and places every part, costliest
/// first, on the least loaded shard that holds no part of its table yet. The parts of each
/// table (ascending rows) and each shard's load.
fn place(
    tables: &[TableMeta],
    demand: &[Demand],
    cost: &[f64],
    groups: &[usize],
    n: usize,
) -> (Vec<Vec<Part>>, Vec<f64>) {
    // (table, first, rows, cost)
    let mut cuts: Vec<(usize, u64, u64, f64)> = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        let g = groups[i] as u64;
        let mut bounds = vec![0u64];
        for k in 1..g {
            let target = k as f64 / g as f64;
            let prev = *bounds.last().unwrap();
            // the first row end whose share reaches the target, leaving a row for each part after
            let (mut lo, mut hi) = (prev + 1, t.rows - (g - k));
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if demand[i].share_below(mid, t.rows) >= target {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            bounds.push(lo);
        }
        bounds.push(t.rows);
        for w in bounds.windows(2) {
            let share = demand[i].share_below(w[1], t.rows) - demand[i].share_below(w[0], t.rows);
            cuts.push((i, w[0], w[1] - w[0], cost[i] * share));
        }
    }
    cuts.sort_by(|a, b| b.3.total_cmp(&a.3).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
    let mut load = vec![0f64; n];
    let mut parts: Vec<Vec<Part>> = vec![Vec::new(); tables.len()];
    for (i, first, rows, c) in cuts {
        let shard = (0..n)
            .filter(|&s| parts[i].iter().all(|p| p.shard != s))
            .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
            .expect("a table has at most one part per shard");
        load[shard] += c;
        parts[i].push(Part { shard, first, rows });
    }
    for p in &mut parts {
        p.sort_by_key(|p| p.first);
    }
    (parts, load)
}
