//! A live keyed table's keys coming and going: its limits (`KeyLimits`: TTL, a cap and what is
//! evicted at it, admission), the clock they are timed by, and each row's touches and new keys'
//! sightings (`KeyLife`).

use super::*;

/// What counts as a touch of a key's row, for its TTL and its eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Touch {
    /// Lookups of the key and writes of it.
    #[default]
    ReadWrite,
    /// Writes only (a key read but not trained on expires).
    Write,
}

/// Which key gives up its row when a new key finds the table at its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evict {
    /// None: a write of a new key past the cap is refused (the facade's `KeysFull`).
    #[default]
    Off,
    /// The least often touched of a sample of keys (counts halve at each compaction).
    Lfu,
    /// The least recently touched of a sample of keys.
    Lru,
}

/// How one live keyed table's keys come and go (`docs/live.md`, "Keyed tables").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyLimits {
    /// A key whose row was not touched for this many seconds is let go of at the next
    /// compaction (`None`: never; at least 1).
    pub ttl_s: Option<i64>,
    pub touch: Touch,
    /// A new key is given a row at its `admit_after`-th sighting (lookups of it and writes of
    /// it) within a window; until then its writes are dropped (counted) and its lookups answer
    /// as the table's unknown-key policy says. 0 or 1: at once.
    pub admit_after: u8,
    pub admit_window_s: u64,
    /// Counters of the admission sketch per row of it (4 rows, a byte each).
    pub admit_slots: u64,
    /// The most keys the table holds (`None`: its capacity, `rows − 1`).
    pub cap: Option<u64>,
    pub evict: Evict,
}

impl Default for KeyLimits {
    fn default() -> Self {
        Self {
            ttl_s: None,
            touch: Touch::ReadWrite,
            admit_after: 0,
            admit_window_s: 3600,
            admit_slots: 1 << 20,
            cap: None,
            evict: Evict::Off,
        }
    }
}

impl KeyLimits {
    /// Whether rows' touches are kept (a TTL or eviction needs them).
    pub fn tracks(&self) -> bool {
        self.ttl_s.is_some() || self.evict != Evict::Off
    }

    /// Checks the limits alone (`check` checks them against their table).
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some(ttl) = self.ttl_s.filter(|&t| t <= 0) {
            return Err(format!(
                "ttl_s = {ttl}: a TTL is at least a second (leave it unset for none)"
            ));
        }
        if self.admit_window_s == 0 {
            return Err("admit_window_s must be at least a second".into());
        }
        if self.cap == Some(0) {
            return Err("cap = 0: a table holds at least one key".into());
        }
        if self.admit_slots > 1 << 32 {
            return Err(format!(
                "admit_slots = {}: at most 2^32 counters a row",
                self.admit_slots
            ));
        }
        Ok(())
    }

    pub(super) fn check(&self, meta: &nearrec_format::TableMeta) -> Result<()> {
        let bad = |reason: String| Err(EngineError::invalid(&meta.name, reason));
        if !meta.is_keyed() {
            return bad("keyed.live names a table addressed by position, not a keyed table".into());
        }
        if let Err(reason) = self.validate() {
            return bad(reason);
        }
        let capacity = meta.rows.saturating_sub(1);
        if let Some(cap) = self.cap
            && (cap == 0 || cap > capacity)
        {
            return bad(format!(
                "cap = {cap} keys, but the table has room for 1 to {capacity} (its rows less the \
                 zero row; build it with a larger capacity for more)"
            ));
        }
        Ok(())
    }
}

/// The clock TTLs and admission windows read, in seconds since the Unix epoch.
#[derive(Debug)]
pub struct Clock {
    manual: bool,
    start: u64,
    ahead: AtomicU64,
}

impl Clock {
    pub(crate) fn new(manual: bool) -> Self {
        Self {
            manual,
            start: unix_now(),
            ahead: AtomicU64::new(0),
        }
    }

    pub fn now(&self) -> u64 {
        let base = if self.manual { self.start } else { unix_now() };
        base + self.ahead.load(Relaxed)
    }

    pub(crate) fn advance(&self, seconds: u64) -> Result<u64> {
        if !self.manual {
            return Err(EngineError::Config(
                "the clock is the system's: only a store opened with keyed.manual_clock moves \
                 its clock by hand"
                    .into(),
            ));
        }
        self.ahead.fetch_add(seconds, Relaxed);
        Ok(self.now())
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A live keyed table's touches and admission counts (see [`KeyLimits`]).
#[derive(Debug)]
pub struct KeyLife {
    pub limits: KeyLimits,
    /// Per row, when it was last touched (Unix seconds) and how often (empty unless tracked).
    touched: Box<[AtomicU32]>,
    count: Box<[AtomicU32]>,
    admission: Option<Admission>,
    clock: Arc<Clock>,
    pub(super) not_admitted: AtomicU64,
    pub(super) expired: AtomicU64,
    pub(super) evicted: AtomicU64,
    pub(super) refused: AtomicU64,
}

impl KeyLife {
    pub(super) fn new(limits: KeyLimits, rows: u64, clock: Arc<Clock>, seed: u64) -> Self {
        let now = clock.now();
        let tracked = if limits.tracks() { rows as usize } else { 0 };
        let admission = (limits.admit_after > 1).then(|| {
            Admission::new(
                limits.admit_after,
                limits.admit_window_s,
                limits.admit_slots,
                seed,
                now,
            )
        });
        Self {
            touched: (0..tracked).map(|_| AtomicU32::new(now as u32)).collect(),
            count: (0..tracked).map(|_| AtomicU32::new(0)).collect(),
            admission,
            clock,
            limits,
            not_admitted: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// DRAM a table of `rows` rows under `limits` takes for them.
    pub(super) fn bytes_for(limits: &KeyLimits, rows: u64) -> u64 {
        let tracked = if limits.tracks() { rows * 8 } else { 0 };
        let sketch = if limits.admit_after > 1 {
            Admission::bytes_for(limits.admit_slots)
        } else {
            0
        };
        tracked + sketch
    }

    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Whether its rows' touches are kept (for a TTL or eviction).
    pub fn tracks(&self) -> bool {
        self.limits.tracks()
    }

    /// The most keys the table holds.
    pub fn cap(&self, rows: u64) -> u64 {
        self.limits.cap.unwrap_or(rows.saturating_sub(1))
    }

    /// Row `row` touched at `now` (written; or read, when reads count).
    pub fn touch(&self, row: u32, now: u64) {
        if let (Some(t), Some(c)) = (self.touched.get(row as usize), self.count.get(row as usize)) {
            t.store(now as u32, Relaxed);
            let n = c.load(Relaxed);
            c.store(n.saturating_add(1), Relaxed);
        }
    }

    /// A key's row taken at `now` by a new key: its touches start again.
    pub fn reset(&self, row: u32, now: u64) {
        if let (Some(t), Some(c)) = (self.touched.get(row as usize), self.count.get(row as usize)) {
            t.store(now as u32, Relaxed);
            c.store(1, Relaxed);
        }
    }

    /// A sighting of a key the table does not hold, at `now`: whether it is admitted (always,
    /// without admission).
    pub fn admit(&self, key: u64, now: u64) -> bool {
        self.admission.as_ref().is_none_or(|a| a.admit(key, now))
    }

    /// Whether row `row`'s key has outlived its TTL at `now`.
    pub fn expired(&self, row: u32, now: u64) -> bool {
        match (self.limits.ttl_s, self.touched.get(row as usize)) {
            (Some(ttl), Some(t)) => u64::from(t.load(Relaxed)) + ttl.max(1) as u64 <= now,
            _ => false,
        }
    }

    /// How much row `row`'s key is worth keeping (the least is evicted first).
    pub fn score(&self, row: u32) -> u64 {
        let at = |v: &[AtomicU32]| {
            v.get(row as usize)
                .map_or(0, |x| u64::from(x.load(Relaxed)))
        };
        match self.limits.evict {
            Evict::Lfu => at(&self.count),
            Evict::Lru | Evict::Off => at(&self.touched),
        }
    }

    /// Halves every row's count (a compaction's aging: LFU forgets old popularity).
    pub fn age(&self) {
        for c in self.count.iter() {
            c.store(c.load(Relaxed) / 2, Relaxed);
        }
    }

    /// Counts what a write did with keys: dropped unadmitted, let go of expired, evicted,
    /// refused at the cap.
    pub fn count(&self, not_admitted: u64, expired: u64, evicted: u64, refused: u64) {
        self.not_admitted.fetch_add(not_admitted, Relaxed);
        self.expired.fetch_add(expired, Relaxed);
        self.evicted.fetch_add(evicted, Relaxed);
        self.refused.fetch_add(refused, Relaxed);
    }
}
