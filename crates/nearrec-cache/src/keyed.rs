//! Keyed tables: rows addressed by unbounded 64-bit feature ids (DeepRec's EmbeddingVariable),
//! held in DRAM: the keys in a [`KeyIndex`] (the index a store's keyed table keeps, a cache line
//! per five keys), the rows apart, densely, fp32.
//!
//! One reader-writer lock guards both: lookups from many threads share it, each resolving its
//! whole batch of keys ([`KeyIndex::get_many`], prefetched) and pooling under it, so a bag
//! never meets a row half-written; a call that writes takes it alone, whole, so a reader sees
//! all of a call or none of it. A removed key gives its row back (the next new key may take
//! it): the table holds at most `capacity` keys at once.
//!
//! A key not in the table is handled by [`Unknown`]: an error naming its position, a zero row,
//! or a row initialised from `(seed, key)` alone (so the same key gets the same row whichever
//! thread, batch or run meets it first; racing inserts of a key agree on one row). Each outcome
//! is counted.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use nearrec_kernels::reference::BagSum;
use nearrec_kernels::{PoolingMode, prefetch_row};

use crate::hash::mix;
use crate::key_index::{KeyIndex, MISSING};

/// Rows between a row's prefetch and its use.
const AHEAD: usize = 8;

/// What a lookup of a key the table does not hold does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unknown {
    /// Fail the lookup with [`KeyedError::UnknownKey`] (nothing is pooled).
    #[default]
    Error,
    /// Pool a row of zeros (it counts towards `mean`), and count it.
    Zero,
    /// Insert the key with a row drawn uniformly from `±init_scale`, seeded by `(seed, key)`.
    Init,
    /// Pool the table's default row: a store's keyed table keeps it as row 0 (zeros, or the
    /// default slot of the TorchRec managed-collision module it was built from); a table
    /// without one (this DRAM table) pools zeros, as `Zero`.
    Default,
}

impl std::str::FromStr for Unknown {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "error" => Ok(Self::Error),
            "zero" => Ok(Self::Zero),
            "init" => Ok(Self::Init),
            "default" => Ok(Self::Default),
            _ => Err(format!(
                "unknown-key policy {s:?}: expected error, zero, init or default"
            )),
        }
    }
}

/// The row `Unknown::Init` gives `key`: uniform in `[-scale, scale)`, drawn from `(seed, key)`
/// alone, so that every table, thread, batch and run gives a key the same row.
pub fn init_row(seed: u64, scale: f32, key: u64, out: &mut [f32]) {
    let base = mix(seed ^ mix(key));
    for (j, o) in out.iter_mut().enumerate() {
        let bits = mix(base.wrapping_add(j as u64));
        let unit = (bits >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        *o = (2.0 * unit - 1.0) * scale;
    }
}

/// A keyed table's shape and policies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyedConfig {
    pub dim: usize,
    /// Most keys the table holds; inserting more is [`KeyedError::Full`].
    pub capacity: u64,
    pub unknown: Unknown,
    /// `Unknown::Init` draws from `[-init_scale, init_scale)`.
    pub init_scale: f32,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KeyedError {
    #[error(
        "table {table:?}: key {key} at position {position} is not in the table (unknown=\"error\")"
    )]
    UnknownKey {
        table: String,
        position: usize,
        key: i64,
    },
    #[error("table {table:?} is full: it holds {capacity} keys (raise its capacity)")]
    Full { table: String, capacity: u64 },
    #[error("table {table:?}: {reason}")]
    Invalid { table: String, reason: String },
    #[error("table {table:?}: cannot allocate the {bytes} bytes its capacity takes")]
    OutOfMemory { table: String, bytes: u64 },
    #[error(transparent)]
    InsufficientMemory(#[from] nearrec_format::Shortfall),
}

/// Counters of a keyed table's lookups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyedStats {
    pub keys: u64,
    pub capacity: u64,
    /// Lookups that found their key.
    pub hits: u64,
    /// Unknown keys refused (`Unknown::Error`), pooled as zeros, inserted by `Unknown::Init`.
    pub unknown_errors: u64,
    pub unknown_zero: u64,
    pub initialised: u64,
}

/// See the module docs.
pub struct KeyedTable {
    name: String,
    config: KeyedConfig,
    held: RwLock<Held>,
    /// Calls that changed rows (writes, removes): what a cache of rows above the table follows.
    version: AtomicU64,
    hits: AtomicU64,
    unknown_errors: AtomicU64,
    unknown_zero: AtomicU64,
    initialised: AtomicU64,
}

/// The keys and their rows. Row `r` (as [`KeyedTable::find`] gives it) is the index's `r + 1`
/// (the index keeps 0 for an empty slot).
struct Held {
    index: KeyIndex,
    /// `capacity × dim` values, row after row.
    values: Vec<f32>,
    /// Rows handed out so far.
    used: u32,
    /// Rows of removed keys, for the next new keys.
    free: Vec<u32>,
}

impl Held {
    fn row(&self, r: u32, dim: usize) -> &[f32] {
        &self.values[r as usize * dim..(r as usize + 1) * dim]
    }

    fn row_mut(&mut self, r: u32, dim: usize) -> &mut [f32] {
        &mut self.values[r as usize * dim..(r as usize + 1) * dim]
    }

    /// Rows of `keys` (`MISSING` for a key not held, else the row + 1).
    fn lookup(&self, keys: &[i64]) -> Vec<u32> {
        let keys: &[u64] = bytemuck::cast_slice(keys);
        let mut rows = vec![MISSING; keys.len()];
        self.index.get_many(keys, &mut rows);
        rows
    }

    /// Gives `key` a row unless it holds one: `(row, inserted)`, or `None` when full.
    fn insert(&mut self, key: i64, capacity: u64) -> Option<(u32, bool)> {
        if let Some(r) = self.index.get(key as u64) {
            return Some((r - 1, false));
        }
        let row = match self.free.pop() {
            Some(r) => r,
            None if u64::from(self.used) < capacity => {
                self.used += 1;
                self.used - 1
            }
            None => return None,
        };
        (self.index.insert(key as u64, row + 1)).expect("the index is sized past the capacity");
        Some((row, true))
    }
}

impl KeyedTable {
    pub fn new(name: &str, config: KeyedConfig) -> Result<Self, KeyedError> {
        let invalid = |reason: &str| KeyedError::Invalid {
            table: name.to_owned(),
            reason: reason.to_owned(),
        };
        if config.dim == 0 {
            return Err(invalid("dim must be at least 1"));
        }
        if config.capacity == 0 || config.capacity > u64::from(u32::MAX) {
            return Err(invalid("capacity must be between 1 and 2^32 - 1 keys"));
        }
        if !(config.init_scale.is_finite() && config.init_scale >= 0.0) {
            return Err(invalid("init_scale must be finite and non-negative"));
        }
        // A capacity the host cannot back is refused before anything is allocated (the allocator
        // might grant it, leaving the OOM killer to the first writes); what the check lets
        // through is still allocated fallibly.
        let bytes = Self::bytes_for(config.capacity, config.dim);
        nearrec_format::Memory::probe().check(|| format!("keyed table {name:?}"), bytes)?;
        let oom = || KeyedError::OutOfMemory {
            table: name.to_owned(),
            bytes,
        };
        let mut values = Vec::new();
        let n = (config.capacity as usize)
            .checked_mul(config.dim)
            .filter(|&n| values.try_reserve_exact(n).is_ok())
            .ok_or_else(oom)?;
        values.resize(n, 0.0);
        let held = Held {
            index: KeyIndex::try_with_capacity(config.capacity).ok_or_else(oom)?,
            values,
            used: 0,
            free: Vec::new(),
        };
        Ok(Self {
            name: name.to_owned(),
            config,
            held: RwLock::new(held),
            version: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            unknown_errors: AtomicU64::new(0),
            unknown_zero: AtomicU64::new(0),
            initialised: AtomicU64::new(0),
        })
    }

    /// Bytes the table takes: its index and the rows for its whole capacity.
    pub fn bytes_for(capacity: u64, dim: usize) -> u64 {
        KeyIndex::bytes_for(capacity)
            .saturating_add(capacity.saturating_mul(dim as u64).saturating_mul(4))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &KeyedConfig {
        &self.config
    }

    /// How many calls have changed rows so far ([`Self::write`], [`Self::remove`], `assign`).
    pub fn version(&self) -> u64 {
        self.version.load(Relaxed)
    }

    /// Keys held.
    pub fn len(&self) -> u64 {
        self.read().index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> KeyedStats {
        KeyedStats {
            keys: self.len(),
            capacity: self.config.capacity,
            hits: self.hits.load(Relaxed),
            unknown_errors: self.unknown_errors.load(Relaxed),
            unknown_zero: self.unknown_zero.load(Relaxed),
            initialised: self.initialised.load(Relaxed),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Held> {
        self.held.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, Held> {
        self.held.write().unwrap_or_else(|e| e.into_inner())
    }

    fn full(&self) -> KeyedError {
        KeyedError::Full {
            table: self.name.clone(),
            capacity: self.config.capacity,
        }
    }

    /// The row of `key`, if the table holds it.
    pub fn find(&self, key: i64) -> Option<u32> {
        self.read().index.get(key as u64).map(|r| r - 1)
    }

    /// Sets `key`'s row to `values`, inserting the key if needed. Returns whether the key was
    /// inserted.
    pub fn assign(&self, key: i64, values: &[f32]) -> Result<bool, KeyedError> {
        self.write(&[key], values, true).map(|n| n == 1)
    }

    /// Upserts the rows of `keys` (`values`: `keys.len() × dim`, row after row; a repeated key
    /// takes its last row), as one change readers see whole. The call is checked whole before
    /// any row changes: the width, finite values (unless `allow_nonfinite`), and room for the
    /// keys it adds. Returns how many keys it inserted.
    pub fn write(
        &self,
        keys: &[i64],
        values: &[f32],
        allow_nonfinite: bool,
    ) -> Result<u64, KeyedError> {
        let dim = self.config.dim;
        let invalid = |reason: String| KeyedError::Invalid {
            table: self.name.clone(),
            reason,
        };
        if values.len() != keys.len() * dim {
            return Err(invalid(format!(
                "{} keys need {} values ({} × dim {dim}), not {}",
                keys.len(),
                keys.len() * dim,
                keys.len(),
                values.len()
            )));
        }
        if !allow_nonfinite && let Some(at) = values.iter().position(|v| !v.is_finite()) {
            return Err(invalid(format!(
                "the row of key {} at position {} holds {} (pass allow_nonfinite to write it)",
                keys[at / dim],
                at / dim,
                values[at]
            )));
        }
        let mut held = self.write_lock();
        let mut fresh: Vec<i64> = (keys.iter().copied())
            .filter(|&k| held.index.get(k as u64).is_none())
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        if held.index.len() + fresh.len() as u64 > self.config.capacity {
            return Err(self.full());
        }
        let mut inserted = 0;
        for (&key, row) in keys.iter().zip(values.chunks_exact(dim)) {
            let (r, new) = (held.insert(key, self.config.capacity)).expect("room was checked");
            inserted += u64::from(new);
            held.row_mut(r, dim).copy_from_slice(row);
        }
        self.version.fetch_add(1, Relaxed);
        Ok(inserted)
    }

    /// Removes `keys` (EMB_REMOVE): lookups treat them as unknown until they are written again,
    /// and their rows go to the next new keys. Keys the table does not hold are passed over.
    /// Returns how many were removed.
    pub fn remove(&self, keys: &[i64]) -> u64 {
        let mut held = self.write_lock();
        let mut removed = 0;
        for &key in keys {
            if let Some(r) = held.index.remove(key as u64) {
                held.free.push(r - 1);
                removed += 1;
            }
        }
        if removed > 0 {
            self.version.fetch_add(1, Relaxed);
        }
        removed
    }

    /// Every key held and its row, in no particular order.
    pub fn entries(&self) -> Vec<(i64, u32)> {
        let held = self.read();
        (held.index.iter())
            .map(|(k, r)| (k as i64, r - 1))
            .collect()
    }

    /// Copies row `row` (as [`Self::find`] returns it) into `out` (`dim` values).
    pub fn read_row(&self, row: u32, out: &mut [f32]) {
        out.copy_from_slice(self.read().row(row, self.config.dim));
    }

    /// The row of every key as the unknown-key policy has it (`None`: a zero row). Fails before
    /// pooling anything on the first unknown key under `Unknown::Error`.
    pub fn resolve(&self, keys: &[i64]) -> Result<Vec<Option<u32>>, KeyedError> {
        self.resolved(keys).map(|(rows, _)| rows)
    }

    /// [`Self::resolve`], and the read guard the rows stay valid under.
    fn resolved(
        &self,
        keys: &[i64],
    ) -> Result<(Vec<Option<u32>>, RwLockReadGuard<'_, Held>), KeyedError> {
        let mut held = self.read();
        let mut found = held.lookup(keys);
        let missing = found.iter().filter(|&&r| r == MISSING).count() as u64;
        // keys pooled as zeros, or inserted here: the rest are hits
        let mut unknown = missing;
        if missing > 0 {
            match self.config.unknown {
                Unknown::Error => {
                    let position = found.iter().position(|&r| r == MISSING).unwrap_or(0);
                    self.unknown_errors.fetch_add(1, Relaxed);
                    return Err(KeyedError::UnknownKey {
                        table: self.name.clone(),
                        position,
                        key: keys[position],
                    });
                }
                Unknown::Zero | Unknown::Default => {
                    self.unknown_zero.fetch_add(missing, Relaxed);
                }
                Unknown::Init => {
                    drop(held);
                    unknown = self.insert_new(keys, &found)?;
                    // every key again, not only those inserted: while no lock was held, a key
                    // found before may have been removed and its row given to another key
                    held = self.read();
                    found = held.lookup(keys);
                }
            }
        }
        self.hits.fetch_add(keys.len() as u64 - unknown, Relaxed);
        let rows = (found.iter())
            .map(|&r| (r != MISSING).then(|| r - 1))
            .collect();
        Ok((rows, held))
    }

    /// Inserts the keys `found` misses with their `Unknown::Init` rows; how many it inserted
    /// (a key another thread inserted meanwhile keeps that row).
    fn insert_new(&self, keys: &[i64], found: &[u32]) -> Result<u64, KeyedError> {
        let (dim, capacity) = (self.config.dim, self.config.capacity);
        let mut held = self.write_lock();
        let mut init = 0;
        let mut result = Ok(());
        for (&key, _) in keys.iter().zip(found).filter(|(_, r)| **r == MISSING) {
            match held.insert(key, capacity) {
                Some((r, true)) => {
                    self.init_row(key, held.row_mut(r, dim));
                    init += 1;
                }
                Some((_, false)) => {}
                None => {
                    result = Err(self.full());
                    break;
                }
            }
        }
        self.initialised.fetch_add(init, Relaxed);
        result.map(|()| init)
    }

    /// Pools the bags `bounds` (`batch + 1` positions into `keys`) into `out` (`batch × dim`),
    /// optionally weighted per key (`PoolingMode::Sum` only). Empty bags give zeros.
    pub fn pool(
        &self,
        keys: &[i64],
        bounds: &[usize],
        weights: Option<&[f32]>,
        mode: PoolingMode,
        out: &mut [f32],
    ) -> Result<(), KeyedError> {
        self.check_bags(keys.len(), bounds, weights, mode, out.len())?;
        let (rows, held) = self.resolved(keys)?;
        self.pool_resolved(&held, &rows, bounds, weights, mode, out);
        Ok(())
    }

    /// As [`Self::pool`], for keys already resolved to rows ([`Self::resolve`]; `None`: a zero
    /// row). A row the table has not handed out is an error.
    pub fn pool_rows(
        &self,
        rows: &[Option<u32>],
        bounds: &[usize],
        weights: Option<&[f32]>,
        mode: PoolingMode,
        out: &mut [f32],
    ) -> Result<(), KeyedError> {
        self.check_bags(rows.len(), bounds, weights, mode, out.len())?;
        let held = self.read();
        if let Some(p) = rows.iter().position(|r| r.is_some_and(|r| r >= held.used)) {
            return Err(KeyedError::Invalid {
                table: self.name.clone(),
                reason: format!("row {:?} at position {p} is not held", rows[p]),
            });
        }
        self.pool_resolved(&held, rows, bounds, weights, mode, out);
        Ok(())
    }

    fn check_bags(
        &self,
        n: usize,
        bounds: &[usize],
        weights: Option<&[f32]>,
        mode: PoolingMode,
        out: usize,
    ) -> Result<(), KeyedError> {
        let dim = self.config.dim;
        let invalid = |reason: String| KeyedError::Invalid {
            table: self.name.clone(),
            reason,
        };
        let batch = bounds.len().saturating_sub(1);
        if bounds.first() != Some(&0)
            || bounds.last() != Some(&n)
            || bounds.windows(2).any(|w| w[0] > w[1])
        {
            return Err(invalid(format!(
                "bag bounds must rise from 0 to the {n} keys"
            )));
        }
        if out != batch * dim {
            return Err(invalid(format!(
                "output holds {out} values, not {batch} bags x dim {dim}"
            )));
        }
        if let Some(w) = weights {
            if w.len() != n {
                return Err(invalid(format!("{} weights for {n} keys", w.len())));
            }
            if mode != PoolingMode::Sum {
                return Err(invalid("per-key weights need sum pooling".into()));
            }
        }
        Ok(())
    }

    /// Pools resolved rows as the kernels' reference pools every bag ([`BagSum`]).
    fn pool_resolved(
        &self,
        held: &Held,
        rows: &[Option<u32>],
        bounds: &[usize],
        weights: Option<&[f32]>,
        mode: PoolingMode,
        out: &mut [f32],
    ) {
        let dim = self.config.dim;
        let zeros = vec![0f32; dim];
        let mut bag = BagSum::new(mode, dim);
        for (b, cell) in out.chunks_exact_mut(dim).enumerate() {
            bag.reset();
            for k in bounds[b]..bounds[b + 1] {
                if let Some(&Some(ahead)) = rows.get(k + AHEAD) {
                    prefetch_row(held.row(ahead, dim).as_ptr().cast(), dim * 4);
                }
                let row = rows[k].map_or(&zeros[..], |r| held.row(r, dim));
                bag.add(row, weights.map(|w| w[k]));
            }
            bag.finish(cell);
        }
    }

    /// The row `Unknown::Init` gives `key`: uniform in `±init_scale`, from `(seed, key)` only.
    pub fn init_row(&self, key: i64, out: &mut [f32]) {
        init_row(self.config.seed, self.config.init_scale, key as u64, out);
    }
}

impl std::fmt::Debug for KeyedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedTable")
            .field("name", &self.name)
            .field("keys", &self.len())
            .field("config", &self.config)
            .finish()
    }
}
