//! Keyed tables on the engine's tiers (`docs/format.md` §16): a lookup names raw 64-bit keys,
//! which [`Engine::prepare`](crate::Engine::prepare) resolves to row numbers through the table's
//! DRAM index ([`KeyIndex`], built from its keys file at open); from there on a keyed table is
//! read like any other — from DRAM, or from SSD behind its DRAM tiers, which hold rows by row
//! number and so, one to one, by key.
//!
//! A key the table does not hold answers as its [`Unknown`] policy says: an error naming its
//! position ([`EngineError::UnknownKey`]), zeros (row 0, unless the table keeps a default row
//! there), the table's default row (row 0), or a row drawn from `(seed, key)`
//! ([`nearrec_cache::init_row`]). Init keys (and zeros in a table with a default row) are
//! resolved to row 0 too, and each bag holding one is pooled again once the batch is done, from
//! its rows read one by one and the substituted rows, in the kernels' arithmetic. Each outcome
//! is counted.
//!
//! A live store's keyed table also keeps, when its keys expire or are evicted ([`KeyLimits`]),
//! each row's last touch and touch count, and, with admission, a sketch of new keys' sightings
//! ([`KeyLife`]); lookups touch the rows they find and count sightings of keys they do not.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use nearrec_cache::{Admission, Inserted, KeyIndex, MISSING, Unknown};
use nearrec_format::{FormatError, Memory, StoreReader, ZERO_ROW};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::delta::{DeltaRow, DeltaView, TableDelta};
use crate::error::{EngineError, Result};
use nearrec_kernels::reference::BagSum;

use crate::request::{Indices, TableLookup};

mod life;

pub use life::{Clock, Evict, KeyLife, KeyLimits, Touch};

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
    /// How the keys of live keyed tables come and go, by table name (tables not named keep
    /// every key until it is removed, and refuse new keys once full).
    pub live: BTreeMap<String, KeyLimits>,
    /// TTLs and admission windows read a clock that only [`crate::Engine::advance_clock`]
    /// moves (tests), not the system's.
    pub manual_clock: bool,
}

impl Default for KeyPolicy {
    fn default() -> Self {
        Self {
            unknown: Unknown::Error,
            tables: BTreeMap::new(),
            init_scale: 0.01,
            seed: 0,
            live: BTreeMap::new(),
            manual_clock: false,
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
    pub unknown_default: u64,
    pub unknown_init: u64,
    pub unknown_refused: u64,
    /// The most keys it may hold (its cap, else its rows less the zero row).
    pub cap: u64,
    /// DRAM its touches and admission counts take.
    pub life_bytes: u64,
    /// New keys' writes dropped before admission; keys let go of past their TTL; keys evicted
    /// at the cap; writes of new keys refused at the cap.
    pub not_admitted: u64,
    pub expired: u64,
    pub evicted: u64,
    pub refused_full: u64,
}

/// One keyed table's index and its counters.
#[derive(Debug)]
pub(crate) struct Keys {
    /// Keys to rows as of the tables' base (a live store's later changes are in its key
    /// deltas); sized for every row, so it never fills. Written only by a compaction.
    index: RwLock<KeyIndex>,
    rows: u64,
    /// Row 0 is a default row, not zeros (`docs/format.md` §16).
    default_row: bool,
    life: Option<KeyLife>,
    unknown: Unknown,
    init_scale: f32,
    seed: u64,
    hits: AtomicU64,
    zero: AtomicU64,
    default: AtomicU64,
    init: AtomicU64,
    refused: AtomicU64,
}

/// A keyed table's lookup resolved: the row of each index, and the (position, key) of each key
/// answered with an init row — or with zeros (`None`), in a table whose row 0 is a default row,
/// not zeros — resolved to row 0 until its bag is pooled again.
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    pub rows: Vec<i64>,
    pub init: Vec<(usize, Option<u64>)>,
}

impl Keys {
    /// Resolves table `table`'s keys `ids` at positions `lo..hi` (those its bags read; the
    /// others resolve to the zero row, read by nothing), in chunks on `pool` when one is given,
    /// as `delta` — the table's key delta in a live store's snapshot, if it has one — sees
    /// them: a key it gave a row since the base is that row's, one it let go of is unknown.
    pub(crate) fn resolve(
        &self,
        table: &str,
        ids: Indices<'_>,
        (lo, hi): (usize, usize),
        pool: Option<&rayon::ThreadPool>,
        delta: Option<(&TableDelta, DeltaView<'_>)>,
    ) -> Result<Resolved> {
        let n = ids.len();
        let keys: Vec<u64> = (lo..hi).map(|p| ids.get(p) as u64).collect();
        let found = self.rows_of(&keys, pool, delta);
        let now = self.life.as_ref().map_or(0, KeyLife::now);
        let reads_touch = self
            .life
            .as_ref()
            .is_some_and(|l| l.limits.touch == Touch::ReadWrite);
        let mut rows = vec![ZERO_ROW as i64; n];
        let mut init = Vec::new();
        let (mut hits, mut zero, mut default) = (0u64, 0u64, 0u64);
        for (i, (&key, row)) in keys.iter().zip(found).enumerate() {
            let position = lo + i;
            if row == MISSING
                && let Some(life) = &self.life
            {
                // a lookup is a sighting of a key waiting for admission
                life.admit(key, now);
            }
            match ((row != MISSING).then_some(row), self.unknown) {
                (Some(r), _) => {
                    rows[position] = i64::from(r);
                    hits += 1;
                    if reads_touch && let Some(life) = &self.life {
                        life.touch(r, now);
                    }
                }
                (None, Unknown::Error) => {
                    self.refused.fetch_add(1, Relaxed);
                    return Err(EngineError::UnknownKey {
                        table: table.to_owned(),
                        position,
                        key: key as i64,
                    });
                }
                (None, Unknown::Zero) if self.default_row => {
                    zero += 1;
                    init.push((position, None));
                }
                (None, Unknown::Zero) => zero += 1,
                (None, Unknown::Default) => default += 1,
                (None, Unknown::Init) => init.push((position, Some(key))),
            }
        }
        self.hits.fetch_add(hits, Relaxed);
        self.zero.fetch_add(zero, Relaxed);
        self.default.fetch_add(default, Relaxed);
        let drawn = init.iter().filter(|i| i.1.is_some()).count();
        self.init.fetch_add(drawn as u64, Relaxed);
        Ok(Resolved { rows, init })
    }

    /// The row each of `keys` holds (`MISSING`: none) as `delta` sees them — the table's key
    /// delta in a live store's snapshot, if it has one — over the index as of the base; in
    /// chunks on `pool` when one is given. Reads only: no key is sighted or counted.
    pub(crate) fn rows_of(
        &self,
        keys: &[u64],
        pool: Option<&rayon::ThreadPool>,
        delta: Option<(&TableDelta, DeltaView<'_>)>,
    ) -> Vec<u32> {
        let mut found = vec![MISSING; keys.len()];
        {
            let index = self.index();
            match pool {
                Some(pool) if keys.len() > RESOLVE_CHUNK => pool.install(|| {
                    keys.par_chunks(RESOLVE_CHUNK)
                        .zip(found.par_chunks_mut(RESOLVE_CHUNK))
                        .for_each(|(k, f)| index.get_many(k, f));
                }),
                _ => index.get_many(keys, &mut found),
            }
        }
        if let Some((d, view)) = delta {
            for (key, row) in keys.iter().zip(found.iter_mut()) {
                match d.get(*key, view.base(), view.version(), decode_row) {
                    Some(DeltaRow::Written(r)) => *row = r,
                    Some(DeltaRow::Removed) => *row = MISSING,
                    None => {}
                }
            }
        }
        found
    }

    /// The index as of the tables' base.
    pub(crate) fn index(&self) -> RwLockReadGuard<'_, KeyIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Folds a compaction's key changes into the index: each key given its row, or let go of.
    pub(crate) fn fold(&self, table: &str, changes: &[(u64, Option<u32>)]) -> Result<()> {
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        // every key let go of first: the index then never holds more keys than the table
        for &(key, _) in changes {
            index.remove(key);
        }
        for &(key, row) in changes {
            if let Some(row) = row {
                // sized for every row of the table, and the keys are at most its rows
                index.insert(key, row).map_err(|full| {
                    EngineError::invalid(
                        table,
                        format!("a compaction's keys do not fit the table's index: {full}"),
                    )
                })?;
            }
        }
        Ok(())
    }

    pub(crate) fn life(&self) -> Option<&KeyLife> {
        self.life.as_ref()
    }

    /// The most keys the table holds.
    pub(crate) fn cap(&self) -> u64 {
        self.life
            .as_ref()
            .map_or(self.rows.saturating_sub(1), |l| l.cap(self.rows))
    }

    /// The row `Unknown::Init` gives `key` (`None`: zeros).
    pub(crate) fn init_row(&self, key: Option<u64>, out: &mut [f32]) {
        match key {
            Some(key) => nearrec_cache::init_row(self.seed, self.init_scale, key, out),
            None => out.fill(0.0),
        }
    }

    pub(crate) fn report(&self, table: &str) -> KeyReport {
        let index = self.index();
        let life = self.life.as_ref();
        let load = |f: fn(&KeyLife) -> &AtomicU64| life.map_or(0, |l| f(l).load(Relaxed));
        KeyReport {
            table: table.to_owned(),
            keys: index.len(),
            index_bytes: index.bytes(),
            bytes_per_key: index.bytes_per_key(),
            unknown: self.unknown,
            hits: self.hits.load(Relaxed),
            unknown_zero: self.zero.load(Relaxed),
            unknown_default: self.default.load(Relaxed),
            unknown_init: self.init.load(Relaxed),
            unknown_refused: self.refused.load(Relaxed),
            cap: self.cap(),
            life_bytes: life.map_or(0, |l| KeyLife::bytes_for(&l.limits, self.rows)),
            not_admitted: load(|l| &l.not_admitted),
            expired: load(|l| &l.expired),
            evicted: load(|l| &l.evicted),
            refused_full: load(|l| &l.refused),
        }
    }
}

/// A row as a key delta holds it.
pub fn decode_row(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().expect("a key delta's row is 4 bytes"))
}

/// Bytes of a key delta's row.
pub const KEY_ROW_BYTES: usize = 4;

/// DRAM the indexes of `reader`'s keyed tables take, with the touches and admission counts
/// `policy` keeps of them. Each index is sized for every row of its table: a live store's new
/// keys never make it grow.
pub(crate) fn index_bytes(reader: &StoreReader, policy: &KeyPolicy) -> u64 {
    reader
        .tables()
        .iter()
        .filter(|t| t.is_keyed())
        .map(|t| {
            let life = policy
                .live
                .get(&t.name)
                .map_or(0, |l| KeyLife::bytes_for(l, t.rows));
            KeyIndex::bytes_for(t.rows.saturating_sub(1)) + life
        })
        .sum()
}

/// Builds the index of each keyed table of `reader` (`None` for the others), after checking
/// that they fit the process's memory. A key given to two rows is a corrupted store.
pub(crate) fn load(
    reader: &StoreReader,
    policy: &KeyPolicy,
    memory: &Memory,
    clock: &Arc<Clock>,
) -> Result<Vec<Option<Arc<Keys>>>> {
    for (name, limits) in &policy.live {
        let meta = reader
            .tables()
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| EngineError::UnknownTable {
                name: name.clone(),
                available: reader
                    .tables()
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        limits.check(meta)?;
    }
    memory.check(
        || "the keyed tables' indexes".into(),
        index_bytes(reader, policy),
    )?;
    (0..reader.tables().len())
        .map(|i| load_one(reader, i, policy, clock).map(|k| k.map(Arc::new)))
        .collect()
}

/// Table `i`'s index, if it is keyed. A key given two rows, or a row two keys, is a
/// corrupted store.
pub(crate) fn load_one(
    reader: &StoreReader,
    i: usize,
    policy: &KeyPolicy,
    clock: &Arc<Clock>,
) -> Result<Option<Keys>> {
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
    let mut index = KeyIndex::with_capacity(meta.rows.saturating_sub(1));
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
    let life = policy.live.get(&meta.name).map(|limits| {
        KeyLife::new(
            limits.clone(),
            meta.rows,
            clock.clone(),
            policy.seed ^ i as u64,
        )
    });
    Ok(Some(Keys {
        index: RwLock::new(index),
        rows: meta.rows,
        default_row: meta.keys.as_ref().is_some_and(|k| k.default),
        life,
        unknown: policy.of(&meta.name),
        init_scale: policy.init_scale,
        seed: policy.seed,
        hits: AtomicU64::new(0),
        zero: AtomicU64::new(0),
        default: AtomicU64::new(0),
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
