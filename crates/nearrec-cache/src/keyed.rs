//! Keyed tables: rows addressed by unbounded 64-bit feature ids (DeepRec's EmbeddingVariable),
//! held in DRAM in a dense open-addressing hash table (HS-Rec §2.4).
//!
//! Slots keep a state (empty / being written / ready), the key and the index of the key's row,
//! 16 bytes together so that a probe touches one cache line; rows live apart, densely, in the
//! order keys arrived. Lookups prefetch the slots and rows of keys a few positions ahead, so
//! several cache misses are in flight at once (as the DRAM kernels do for rows). Inserts claim an empty slot with a
//! compare-and-swap, write key, row index and row, then publish the slot with a release store;
//! readers probe without locks, acquire the state and read what it publishes. Slots are at least
//! twice the row capacity, so probes stay short and always meet an empty slot. Rows are fp32,
//! kept as `AtomicU32` bits: no `unsafe`, and plain loads on the hit path.
//!
//! Writes ([`KeyedTable::write`]) replace a row atomically: each row has a sequence number, odd
//! while a writer changes it (a seqlock), and readers copy a row and take it only if the number
//! was even and unchanged around the copy, so a reader sees a row wholly before or wholly after
//! a write. A removed key's slot turns *deleted* (HS-Rec's state bits): lookups treat the key as
//! unknown, probes of other keys pass over it, and writing the key again revives the slot and
//! its row.
//!
//! A key not in the table is handled by [`Unknown`]: an error naming its position, a zero row,
//! or a row initialised from `(seed, key)` alone (so the same key gets the same row whichever
//! thread, batch or run meets it first). Each outcome is counted.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, fence};

use nearrec_kernels::reference::BagSum;
use nearrec_kernels::{PoolingMode, prefetch_row};

use crate::hash::mix;

const EMPTY: u32 = 0;
const BUSY: u32 = 1;
const READY: u32 = 2;
/// A removed key: its row is kept for the key's next write.
const DELETED: u32 = 3;
/// Keys between a slot's prefetch and its probe (and between a row's prefetch and its use).
const AHEAD: usize = 8;

/// One slot of the hash table.
#[derive(Default)]
#[repr(C, align(16))]
struct Slot {
    key: AtomicI64,
    row: AtomicU32,
    state: AtomicU32,
}

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
    mask: usize,
    slots: Box<[Slot]>,
    values: Box<[AtomicU32]>,
    /// Per row: its seqlock's number (odd while a writer changes the row).
    seqs: Box<[AtomicU32]>,
    next_row: AtomicU64,
    /// Keys removed and not written again.
    deleted: AtomicU64,
    /// Calls that changed rows (writes, removes): what a cache of rows above the table follows.
    version: AtomicU64,
    hits: AtomicU64,
    unknown_errors: AtomicU64,
    unknown_zero: AtomicU64,
    initialised: AtomicU64,
}

/// `n` values from `make`, or `None` when the memory for them cannot be had.
fn try_filled<T>(n: usize, make: impl Fn() -> T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.extend((0..n).map(|_| make()));
    Some(v)
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
        nearrec_format::Memory::probe().check(
            || format!("keyed table {name:?}"),
            Self::bytes_for(config.capacity, config.dim),
        )?;
        let slots = (config.capacity as usize * 2).next_power_of_two();
        let oom = || KeyedError::OutOfMemory {
            table: name.to_owned(),
            bytes: Self::bytes_for(config.capacity, config.dim),
        };
        let slots_vec = try_filled(slots, Slot::default).ok_or_else(oom)?;
        let values = (config.capacity as usize)
            .checked_mul(config.dim)
            .and_then(|n| try_filled(n, || AtomicU32::new(0)))
            .ok_or_else(oom)?;
        let seqs = try_filled(config.capacity as usize, || AtomicU32::new(0)).ok_or_else(oom)?;
        Ok(Self {
            name: name.to_owned(),
            config,
            mask: slots - 1,
            slots: slots_vec.into_boxed_slice(),
            values: values.into_boxed_slice(),
            seqs: seqs.into_boxed_slice(),
            next_row: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
            version: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            unknown_errors: AtomicU64::new(0),
            unknown_zero: AtomicU64::new(0),
            initialised: AtomicU64::new(0),
        })
    }

    /// Bytes the table takes: slots and the rows (with their sequence numbers) for its whole
    /// capacity.
    pub fn bytes_for(capacity: u64, dim: usize) -> u64 {
        let slots = (capacity * 2).next_power_of_two();
        (slots * std::mem::size_of::<Slot>() as u64)
            .saturating_add(capacity.saturating_mul(dim as u64 + 1).saturating_mul(4))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &KeyedConfig {
        &self.config
    }

    /// How many calls have changed rows so far ([`Self::write`], [`Self::remove`], `assign`).
    pub fn version(&self) -> u64 {
        self.version.load(Acquire)
    }

    /// Keys held (removed ones not counted).
    pub fn len(&self) -> u64 {
        let rows = self.next_row.load(Acquire).min(self.config.capacity);
        rows.saturating_sub(self.deleted.load(Relaxed))
    }

    /// Rows handed out so far (a removed key keeps its row for its next write).
    fn rows_used(&self) -> u64 {
        self.next_row.load(Acquire).min(self.config.capacity)
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

    /// The row of `key`, if the table holds it. Lock-free.
    pub fn find(&self, key: i64) -> Option<u32> {
        let mut i = self.home(key);
        loop {
            let slot = &self.slots[i];
            match slot.state.load(Acquire) {
                EMPTY => return None,
                READY if slot.key.load(Relaxed) == key => return Some(slot.row.load(Relaxed)),
                DELETED if slot.key.load(Relaxed) == key => return None,
                READY | DELETED => i = (i + 1) & self.mask,
                _ => std::hint::spin_loop(), // being written: look again
            }
        }
    }

    /// Inserts `key` with the row `fill` writes (fp32, `dim` values) unless the table holds it;
    /// returns its row and whether it was inserted. Safe from many threads at once: one of
    /// several racing inserts of a key wins, the others get its row.
    pub fn insert(
        &self,
        key: i64,
        fill: impl FnOnce(&mut [f32]),
    ) -> Result<(u32, bool), KeyedError> {
        // the row is made before a slot is claimed, so nothing can fail while it is claimed
        let mut fill = Some(fill);
        let mut values = Vec::new();
        let mut i = self.home(key);
        loop {
            let slot = &self.slots[i];
            match slot.state.load(Acquire) {
                READY if slot.key.load(Relaxed) == key => {
                    return Ok((slot.row.load(Relaxed), false));
                }
                DELETED if slot.key.load(Relaxed) == key => {
                    // a removed key written again: its slot and row come back
                    if let Some(fill) = fill.take() {
                        values.resize(self.config.dim, 0.0);
                        fill(&mut values);
                    }
                    if slot
                        .state
                        .compare_exchange(DELETED, BUSY, Acquire, Relaxed)
                        .is_err()
                    {
                        continue;
                    }
                    let row = slot.row.load(Relaxed);
                    self.store_row(row, &values);
                    self.deleted.fetch_sub(1, Relaxed);
                    slot.state.store(READY, Release);
                    return Ok((row, true));
                }
                READY | DELETED => i = (i + 1) & self.mask,
                EMPTY => {
                    if let Some(fill) = fill.take() {
                        values.resize(self.config.dim, 0.0);
                        fill(&mut values);
                    }
                    if slot
                        .state
                        .compare_exchange(EMPTY, BUSY, Acquire, Relaxed)
                        .is_err()
                    {
                        continue; // taken meanwhile: look at it again
                    }
                    let row = self.next_row.fetch_add(1, Relaxed);
                    if row >= self.config.capacity {
                        self.next_row.fetch_sub(1, Relaxed);
                        slot.state.store(EMPTY, Release);
                        return Err(KeyedError::Full {
                            table: self.name.clone(),
                            capacity: self.config.capacity,
                        });
                    }
                    self.store_row(row as u32, &values);
                    slot.key.store(key, Relaxed);
                    slot.row.store(row as u32, Relaxed);
                    slot.state.store(READY, Release);
                    return Ok((row as u32, true));
                }
                _ => std::hint::spin_loop(),
            }
        }
    }

    /// Sets `key`'s row to `values`, inserting the key if needed; a reader sees the old row or
    /// the new one whole. Returns whether the key was inserted.
    pub fn assign(&self, key: i64, values: &[f32]) -> Result<bool, KeyedError> {
        self.check_width(values.len())?;
        let (row, inserted) = self.insert(key, |v| v.copy_from_slice(values))?;
        if !inserted {
            self.store_row(row, values);
        }
        self.version.fetch_add(1, Release);
        Ok(inserted)
    }

    /// Upserts the rows of `keys` (`values`: `keys.len() × dim`, row after row; a repeated key
    /// takes its last row), each replaced atomically. The call is checked whole before any row
    /// changes: the width, finite values (unless `allow_nonfinite`), and room for the keys it
    /// adds. Returns how many keys it inserted.
    pub fn write(
        &self,
        keys: &[i64],
        values: &[f32],
        allow_nonfinite: bool,
    ) -> Result<u64, KeyedError> {
        let dim = self.config.dim;
        if values.len() != keys.len() * dim {
            return Err(KeyedError::Invalid {
                table: self.name.clone(),
                reason: format!(
                    "{} keys need {} values ({} × dim {dim}), not {}",
                    keys.len(),
                    keys.len() * dim,
                    keys.len(),
                    values.len()
                ),
            });
        }
        if !allow_nonfinite && let Some(at) = values.iter().position(|v| !v.is_finite()) {
            return Err(KeyedError::Invalid {
                table: self.name.clone(),
                reason: format!(
                    "the row of key {} at position {} holds {} (pass allow_nonfinite to write it)",
                    keys[at / dim],
                    at / dim,
                    values[at]
                ),
            });
        }
        let mut fresh: Vec<i64> = keys
            .iter()
            .copied()
            .filter(|&k| self.slot_of(k).is_none())
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        if self.rows_used() + fresh.len() as u64 > self.config.capacity {
            return Err(KeyedError::Full {
                table: self.name.clone(),
                capacity: self.config.capacity,
            });
        }
        let mut inserted = 0;
        for (&key, row) in keys.iter().zip(values.chunks_exact(dim)) {
            inserted += u64::from(self.assign(key, row)?);
        }
        Ok(inserted)
    }

    /// Removes `keys` (EMB_REMOVE): their slots turn deleted, lookups treat them as unknown
    /// until they are written again. Keys the table does not hold are passed over. Returns how
    /// many were removed.
    pub fn remove(&self, keys: &[i64]) -> u64 {
        let mut removed = 0;
        for &key in keys {
            while let Some(slot) = self.slot_of(key) {
                match slot.state.compare_exchange(READY, DELETED, AcqRel, Relaxed) {
                    Ok(_) => {
                        self.deleted.fetch_add(1, Relaxed);
                        removed += 1;
                        break;
                    }
                    Err(DELETED) => break,
                    Err(_) => std::hint::spin_loop(), // being written: look again
                }
            }
        }
        if removed > 0 {
            self.version.fetch_add(1, Release);
        }
        removed
    }

    /// The slot of `key`, held or deleted (a deleted key keeps its slot and row for its next
    /// write); waits out a slot being written.
    fn slot_of(&self, key: i64) -> Option<&Slot> {
        let mut i = self.home(key);
        loop {
            let slot = &self.slots[i];
            match slot.state.load(Acquire) {
                EMPTY => return None,
                READY | DELETED if slot.key.load(Relaxed) == key => return Some(slot),
                READY | DELETED => i = (i + 1) & self.mask,
                _ => std::hint::spin_loop(),
            }
        }
    }

    /// Every key held and its row, in slot order (no meaning to it).
    pub fn entries(&self) -> Vec<(i64, u32)> {
        self.slots
            .iter()
            .filter(|s| s.state.load(Acquire) == READY)
            .map(|s| (s.key.load(Relaxed), s.row.load(Relaxed)))
            .collect()
    }

    /// Copies row `row` (as [`Self::find`] returns it) into `out` (`dim` values), whole: as it
    /// was before or after any write.
    pub fn read_row(&self, row: u32, out: &mut [f32]) {
        let at = row as usize * self.config.dim;
        let seq = &self.seqs[row as usize];
        loop {
            let before = seq.load(Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            for (o, v) in out.iter_mut().zip(&self.values[at..at + self.config.dim]) {
                *o = f32::from_bits(v.load(Relaxed));
            }
            fence(Acquire);
            if seq.load(Relaxed) == before {
                return;
            }
        }
    }

    /// The row of every key as the unknown-key policy has it (`None`: a zero row). Fails before
    /// pooling anything on the first unknown key under `Unknown::Error`.
    pub fn resolve(&self, keys: &[i64]) -> Result<Vec<Option<u32>>, KeyedError> {
        let mut rows = Vec::with_capacity(keys.len());
        let (mut hits, mut zero, mut init) = (0u64, 0u64, 0u64);
        let mut result = Ok(());
        for (position, &key) in keys.iter().enumerate() {
            if let Some(&ahead) = keys.get(position + AHEAD) {
                let slot = &self.slots[self.home(ahead)];
                prefetch_row((slot as *const Slot).cast(), std::mem::size_of::<Slot>());
            }
            let row = match (self.find(key), self.config.unknown) {
                (Some(r), _) => {
                    hits += 1;
                    Some(r)
                }
                (None, Unknown::Zero | Unknown::Default) => {
                    zero += 1;
                    None
                }
                (None, Unknown::Init) => match self.insert(key, |v| self.init_row(key, v)) {
                    Ok((r, inserted)) => {
                        init += u64::from(inserted);
                        hits += u64::from(!inserted);
                        Some(r)
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                },
                (None, Unknown::Error) => {
                    self.unknown_errors.fetch_add(1, Relaxed);
                    result = Err(KeyedError::UnknownKey {
                        table: self.name.clone(),
                        position,
                        key,
                    });
                    break;
                }
            };
            rows.push(row);
        }
        self.hits.fetch_add(hits, Relaxed);
        self.unknown_zero.fetch_add(zero, Relaxed);
        self.initialised.fetch_add(init, Relaxed);
        result.map(|()| rows)
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
        let rows = self.resolve(keys)?;
        self.pool_resolved(&rows, bounds, weights, mode, out);
        Ok(())
    }

    /// As [`Self::pool`], for keys already resolved to rows ([`Self::resolve`]; `None`: a zero
    /// row). A row the table does not hold is an error.
    pub fn pool_rows(
        &self,
        rows: &[Option<u32>],
        bounds: &[usize],
        weights: Option<&[f32]>,
        mode: PoolingMode,
        out: &mut [f32],
    ) -> Result<(), KeyedError> {
        self.check_bags(rows.len(), bounds, weights, mode, out.len())?;
        let held = self.rows_used();
        if let Some(p) = rows
            .iter()
            .position(|r| r.is_some_and(|r| u64::from(r) >= held))
        {
            return Err(KeyedError::Invalid {
                table: self.name.clone(),
                reason: format!("row {:?} at position {p} is not held", rows[p]),
            });
        }
        self.pool_resolved(rows, bounds, weights, mode, out);
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
        rows: &[Option<u32>],
        bounds: &[usize],
        weights: Option<&[f32]>,
        mode: PoolingMode,
        out: &mut [f32],
    ) {
        let dim = self.config.dim;
        let mut row = vec![0f32; dim];
        let mut bag = BagSum::new(mode, dim);
        for (b, cell) in out.chunks_exact_mut(dim).enumerate() {
            bag.reset();
            for k in bounds[b]..bounds[b + 1] {
                if let Some(&Some(ahead)) = rows.get(k + AHEAD) {
                    let p = self.values[ahead as usize * dim..].as_ptr();
                    prefetch_row(p.cast(), dim * 4);
                }
                match rows[k] {
                    Some(r) => self.read_row(r, &mut row),
                    None => row.fill(0.0),
                }
                bag.add(&row, weights.map(|w| w[k]));
            }
            bag.finish(cell);
        }
    }

    /// `values` must be one row.
    fn check_width(&self, n: usize) -> Result<(), KeyedError> {
        if n == self.config.dim {
            Ok(())
        } else {
            Err(KeyedError::Invalid {
                table: self.name.clone(),
                reason: format!("rows have {} values, got {n}", self.config.dim),
            })
        }
    }

    /// Writes row `row` under its seqlock (writers of one row take turns).
    fn store_row(&self, row: u32, values: &[f32]) {
        let seq = &self.seqs[row as usize];
        let mut s = seq.load(Relaxed);
        loop {
            if s & 1 == 1 {
                std::hint::spin_loop();
                s = seq.load(Relaxed);
                continue;
            }
            match seq.compare_exchange_weak(s, s + 1, Acquire, Relaxed) {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        fence(Release);
        let at = row as usize * self.config.dim;
        for (slot, v) in self.values[at..at + self.config.dim].iter().zip(values) {
            slot.store(v.to_bits(), Relaxed);
        }
        seq.store(s + 2, Release);
    }

    /// The row `Unknown::Init` gives `key`: uniform in `±init_scale`, from `(seed, key)` only.
    pub fn init_row(&self, key: i64, out: &mut [f32]) {
        init_row(self.config.seed, self.config.init_scale, key as u64, out);
    }

    fn home(&self, key: i64) -> usize {
        mix(key as u64) as usize & self.mask
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
