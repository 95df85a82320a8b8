//! Keyed tables on the engine's tiers (`docs/format.md` §16): a lookup names raw 64-bit keys,
//! which [`Engine::prepare`](crate::Engine::prepare) resolves to row numbers through the table's
//! DRAM index ([`KeyIndex`], built from its keys file at open); from there on a keyed table is
//! read like any other — from DRAM, or from SSD behind its DRAM tiers, which hold rows by row
//! number and so, one to one, by key.
//!
//! A key the table does not hold answers as its [`Unknown`] policy says: an error naming its
//! position ([`EngineError::UnknownKey`]), the table's zero row (row 0), or a row drawn from
//! `(seed, key)` ([`nearrec_cache::init_row`]). Init keys are resolved to the zero row too, and
//! each bag holding one is pooled again once the batch is done, from its rows read one by one
//! and the init rows, in the kernels' arithmetic. Each outcome is counted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use nearrec_cache::{Inserted, KeyIndex, MISSING, Unknown};
use nearrec_format::{FormatError, Memory, StoreReader, ZERO_ROW};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use nearrec_kernels::reference::BagSum;

use crate::request::{Indices, TableLookup};

/// Keys a task resolves when a batch's are resolved on the worker pool.
const RESOLVE_CHUNK: usize = 4096;

/// What keys a keyed table does not hold answer ([`crate::EngineConfig::keyed`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyPolicy {
    /// Every keyed table's policy, unless `tables` names the table.
    pub unknown: Unknown,
    /// Policies of single tables, by name.
    pub tables: BTreeMap<String, Unknown>,
    /// `init` rows are uniform in `[-init_scale, init_scale)`.
    pub init_scale: f32,
    /// `init` rows are drawn from `(seed, key)`.
    pub seed: u64,
}

impl Default for KeyPolicy {
    fn default() -> Self {
        Self {
            unknown: Unknown::Error,
            tables: BTreeMap::new(),
            init_scale: 0.01,
            seed: 0,
        }
    }
}

impl KeyPolicy {
    /// Table `name`'s policy.
    pub fn of(&self, name: &str) -> Unknown {
        self.tables.get(name).copied().unwrap_or(self.unknown)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !self.init_scale.is_finite() || self.init_scale < 0.0 {
            return Err(EngineError::Config(format!(
                "keyed.init_scale = {} must be a finite number ≥ 0",
                self.init_scale
            )));
        }
        Ok(())
    }
}

/// What a keyed table's lookups found, counted (see [`crate::Engine::key_report`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyReport {
    pub table: String,
    pub keys: u64,
    /// DRAM the index takes, and per key.
    pub index_bytes: u64,
    pub bytes_per_key: f64,
    pub unknown: Unknown,
    /// Lookups of keys held; of keys not held answered with zeros, with init rows, refused.
    pub hits: u64,
    pub unknown_zero: u64,
    pub unknown_init: u64,
    pub unknown_refused: u64,
}

/// One keyed table's index and its counters.
#[derive(Debug)]
pub(crate) struct Keys {
    index: KeyIndex,
    unknown: Unknown,
    init_scale: f32,
    seed: u64,
    hits: AtomicU64,
    zero: AtomicU64,
    init: AtomicU64,
    refused: AtomicU64,
}

/// A keyed table's lookup resolved: the row of each index, and the (position, key) of each key
/// answered with an init row (resolved to the zero row until its bag is pooled again).
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    pub rows: Vec<i64>,
    pub init: Vec<(usize, u64)>,
}

impl Keys {
    /// Resolves table `table`'s keys `ids` at positions `lo..hi` (those its bags read; the
    /// others resolve to the zero row, read by nothing), in chunks on `pool` when one is given.
    pub(crate) fn resolve(
        &self,
        table: &str,
        ids: Indices<'_>,
        (lo, hi): (usize, usize),
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<Resolved> {
        let n = ids.len();
        let keys: Vec<u64> = (lo..hi).map(|p| ids.get(p) as u64).collect();
        let mut found = vec![MISSING; keys.len()];
        match pool {
            Some(pool) if keys.len() > RESOLVE_CHUNK => pool.install(|| {
                keys.par_chunks(RESOLVE_CHUNK)
                    .zip(found.par_chunks_mut(RESOLVE_CHUNK))
                    .for_each(|(k, f)| self.index.get_many(k, f));
            }),
            _ => self.index.get_many(&keys, &mut found),
        }
        let mut rows = vec![ZERO_ROW as i64; n];
        let mut init = Vec::new();
        let (mut hits, mut zero) = (0u64, 0u64);
        for (i, (&key, row)) in keys.iter().zip(found).enumerate() {
            let position = lo + i;
            match ((row != MISSING).then_some(row), self.unknown) {
                (Some(r), _) => {
                    rows[position] = i64::from(r);
                    hits += 1;
                }
                (None, Unknown::Error) => {
                    self.refused.fetch_add(1, Relaxed);
                    return Err(EngineError::UnknownKey {
                        table: table.to_owned(),
                        position,
                        key: key as i64,
                    });
                }
                (None, Unknown::Zero) => zero += 1,
                (None, Unknown::Init) => init.push((position, key)),
            }
        }
        self.hits.fetch_add(hits, Relaxed);
        self.zero.fetch_add(zero, Relaxed);
        self.init.fetch_add(init.len() as u64, Relaxed);
        Ok(Resolved { rows, init })
    }

    /// The row `Unknown::Init` gives `key`.
    pub(crate) fn init_row(&self, key: u64, out: &mut [f32]) {
        nearrec_cache::init_row(self.seed, self.init_scale, key, out);
    }

    pub(crate) fn report(&self, table: &str) -> KeyReport {
        KeyReport {
            table: table.to_owned(),
            keys: self.index.len(),
            index_bytes: self.index.bytes(),
            bytes_per_key: self.index.bytes_per_key(),
            unknown: self.unknown,
            hits: self.hits.load(Relaxed),
            unknown_zero: self.zero.load(Relaxed),
            unknown_init: self.init.load(Relaxed),
            unknown_refused: self.refused.load(Relaxed),
        }
    }
}

/// DRAM the indexes of `reader`'s keyed tables take.
pub(crate) fn index_bytes(reader: &StoreReader) -> u64 {
    reader
        .tables()
        .iter()
        .filter(|t| t.is_keyed())
        .map(|t| KeyIndex::bytes_for(t.entries()))
        .sum()
}

/// Builds the index of each keyed table of `reader` (`None` for the others), after checking
/// that they fit the process's memory. A key given to two rows is a corrupted store.
pub(crate) fn load(
    reader: &StoreReader,
    policy: &KeyPolicy,
    memory: &Memory,
) -> Result<Vec<Option<Arc<Keys>>>> {
    memory.check(|| "the keyed tables' indexes".into(), index_bytes(reader))?;
    (0..reader.tables().len())
        .map(|i| load_one(reader, i, policy).map(|k| k.map(Arc::new)))
        .collect()
}

/// Table `i`'s index, if it is keyed. A key given two rows, or a row two keys, is a
/// corrupted store.
pub(crate) fn load_one(reader: &StoreReader, i: usize, policy: &KeyPolicy) -> Result<Option<Keys>> {
    let Some(entries) = reader.keys(i)? else {
        return Ok(None);
    };
    let meta = &reader.tables()[i];
    let corrupted = |reason: String| -> EngineError {
        let file = &meta.keys.as_ref().expect("keyed").file;
        FormatError::corrupted(
            reader.path().join(file),
            format!("table {:?}: {reason}", meta.name),
        )
        .into()
    };
    let mut index = KeyIndex::with_capacity(entries.len() as u64);
    let mut taken = vec![0u64; meta.rows.div_ceil(64) as usize];
    for &(key, row) in &entries {
        let (word, bit) = (row as usize / 64, 1u64 << (row % 64));
        if taken[word] & bit != 0 {
            return Err(corrupted(format!(
                "row {row} is given to two keys (one is {key})"
            )));
        }
        taken[word] |= bit;
        match index.insert(key, row) {
            Ok(Inserted::New) => {}
            Ok(Inserted::Present(first)) => {
                return Err(corrupted(format!(
                    "key {key} is given to rows {first} and {row}"
                )));
            }
            Err(full) => unreachable!("an index sized for its keys took them all: {full}"),
        }
    }
    Ok(Some(Keys {
        index,
        unknown: policy.of(&meta.name),
        init_scale: policy.init_scale,
        seed: policy.seed,
        hits: AtomicU64::new(0),
        zero: AtomicU64::new(0),
        init: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    }))
}

/// Pools one bag from its rows (`rows[i]` the `i`-th index's, decoded; `t`'s weights from
/// position `lo`) as the reference kernel pools a bag.
pub(crate) fn pool_bag(t: &TableLookup<'_>, lo: usize, rows: &[f32], dim: usize, out: &mut [f32]) {
    let mut bag = BagSum::new(t.mode, dim);
    for (i, row) in rows.chunks_exact(dim).enumerate() {
        bag.add(row, t.per_sample_weights.map(|w| w[lo + i]));
    }
    bag.finish(out);
}

/// `t` with its indices replaced by `rows` (a keyed table's keys resolved).
pub(crate) fn with_rows<'a>(t: &TableLookup<'a>, rows: &'a [i64]) -> TableLookup<'a> {
    TableLookup {
        indices: Indices::I64(rows),
        ..*t
    }
}
