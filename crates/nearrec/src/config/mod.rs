//! [`StoreConfig`]: how a store is opened and served — one object for every surface. Rust
//! callers build it, Python's `nearrec.StoreConfig` mirrors it, `nearrec <verb> --config
//! store.toml` reads it, and command-line flags override its fields. The defaults live here and
//! nowhere else.
//!
//! It is serde: a TOML file holds its fields at the top level (sizes as integers or strings such
//! as `"4GiB"`). A key it does not know is an error, so a typo is never silently ignored.
//!
//! ```toml
//! tier = "ssd"
//! dram_budget = "4GiB"
//! cache_policy = "lfu_pa"
//! plan = "rmc1.plan.toml"   # or [plan.tables.t0] resident = true ...
//! device = "rm-ssd"         # or a [device] table: the flash model's full parameter set
//! ```
//!
//! `plan` and `device` read either way, a string or a table: `sources.rs`.

mod sources;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nearrec_cache::{CacheConfig, Policy};
use nearrec_engine::{EngineConfig, KeyLimits, KeyPolicy, Tier, Unknown};
pub use nearrec_format::wal::WalRecovery;
use nearrec_plan::{Placement, Size};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use sources::{DeviceSource, PlanSource};

/// How a store is opened and served. `Default` gives the recommended settings; every field is
/// also a keyword of Python's `nearrec.open` and a flag of the `nearrec` command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Where rows are served from: `auto` (DRAM when the tables fit `dram_budget`, else SSD with
    /// DRAM tiers in that budget), `dram` (every table loaded at open) or `ssd`.
    pub tier: Tier,
    /// Bytes of DRAM the store may take. `None`: half of this machine's memory (as its memory
    /// cgroup narrows it) for `auto`; no DRAM tiers for an explicit `ssd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dram_budget: Option<Size>,
    /// Pooling threads; 0: one per available core.
    pub threads: usize,
    /// Check each table's CRC-32C while loading it into DRAM.
    pub verify_checksums: bool,
    /// SSD tier: check every read against the table's sector checksums as it lands (4 bytes of
    /// memory per 512 bytes of table).
    pub verify_reads: bool,
    /// SSD tier: bypass the page cache (`O_DIRECT`); off only for comparisons.
    pub direct_io: bool,
    /// SSD tier: reads in flight per io_uring ring (1–4096).
    pub io_queue_depth: u32,
    /// SSD tier: io_uring rings, i.e. batches that can read at the same time (1–64).
    pub io_rings: usize,
    /// SSD tier: threads of the pread fallback (1–1024).
    pub pread_threads: usize,
    /// SSD tier: rows whose blocks are at most this many bytes apart share one read.
    pub merge_gap_bytes: Size,
    /// SSD tier: read each distinct row once per batch; off only to measure what it saves.
    pub dedup: bool,
    /// SSD tier: merge reads of neighbouring blocks; off only to measure what it saves.
    pub merge: bool,
    /// SSD tier: the row caches' policy: `lru`, `lfu`, `lru_pa` or `lfu_pa` (the `_pa` ones
    /// admit a miss into a full set with probability `admission_probability`).
    pub cache_policy: Policy,
    /// SSD tier: the chance a miss enters a full cache set (`_pa` policies), in [0, 1].
    pub admission_probability: f64,
    /// SSD tier: slots per cache set (1–65536).
    pub cache_ways: usize,
    /// SSD tier: the DRAM placement — a plan file written by `nearrec plan`, or per table
    /// `{resident, hot_rows, cache_bytes}`. `None`: tables kept whole smallest first, the rest
    /// of the budget as row caches in proportion to the tables' sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanSource>,
    /// Serve the SSD tier from a simulated drive (the flash device model) instead of the disk:
    /// a preset (`rm-ssd`, `cosmos-plus`, `this-disk`) or a full parameter set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceSource>,
    /// Open for writing (`write`, `remove`): one writing process per store, held by a lock that
    /// ends with the process however it ends. Other processes open it read-only.
    pub writable: bool,
    /// Writable stores: `sync` (a call returns once its rows are on disk) or `async` (once they
    /// are in the kernel: they survive a killed process, and reach the disk within
    /// `durability_window_ms`).
    pub durability: DurabilityMode,
    /// Writable stores, `async`: the longest a returned call waits to reach the disk, in ms
    /// (1–10000).
    pub durability_window_ms: u64,
    /// Writable stores: what a bad record at the end of the write-ahead log does to the open —
    /// `tolerate_torn_tail` (it is cut off, reported: a write a crash interrupted was never
    /// acknowledged) or `absolute` (the open is refused, naming the record and the byte to cut
    /// at). Either way a dropped record is reported, never silent (`docs/live.md`).
    pub wal_recovery: WalRecovery,
    /// Writable stores: memory for rows written since the tables' files (each row's encoded
    /// bytes plus 48 bytes); a call that does not fit waits for compaction to free it.
    pub delta_budget: Size,
    /// Writable stores: fold the delta into new table files in the background whenever it
    /// holds half its budget (off: only `compact()` does).
    pub auto_compact: bool,
    /// The most bytes per second a compaction writes, and a swap reads to load the new
    /// version's DRAM tiers while the old one serves — each of a swap's row reads counted as at
    /// least 4 KiB, what a random read costs the disk — to leave the disk to lookups (64 MiB,
    /// about 16,000 random reads a second; `0`: as fast as the disk goes).
    pub compaction_rate: Size,
    /// Bytes a second a background scrub reads the store's table files at, checking every
    /// sector against its sum, pass after pass, so that damage to rows nobody reads is found
    /// and counted (`scrub_*` in the stats; `0`: no scrub).
    pub scrub_rate: Size,
    /// Writable stores: how long a call that does not fit the delta waits for a compaction to
    /// free room before it is refused (`DeltaFull`), in ms (0–600000).
    pub write_wait_ms: u64,
    /// Read-only stores: follow the writer in another process — every this many ms, look for
    /// new records in its log and compactions, and serve them (1–3600000; `None`: do not, and
    /// move only on `refresh()`; the storage node follows every 1000 ms unless told).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub follow_ms: Option<u64>,
    /// A store opened from a repository of versions: after a swap, remove the versions beyond
    /// the newest `keep_last` (never the one served), once the last call on them has ended
    /// (1–1000; `None`: keep every version).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
    /// Fill the DRAM tiers' row caches at open, before the store serves, from this file: a
    /// recorded trace (`.nrtrace`: each table's most requested rows first) or a hot set a
    /// previous run kept (`hot_set_dir`). Takes the place of the hot set kept in `hot_set_dir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<PathBuf>,
    /// Keep the store's hot set here, as `NAME.hotset` (NAME: the store's, or its repository's,
    /// directory name): the rows its DRAM tiers hold, written when the store closes (a node's
    /// drain) and read at the next open to fill them again, so a restart serves at its hit
    /// rate from the first request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot_set_dir: Option<PathBuf>,
    /// Keyed tables: what a key a table does not hold answers — `error` (an `UnknownKey`
    /// naming its position), `zero` (the table's row of zeros) or `init` (a row drawn from
    /// `(key_seed, key)`, uniform in ±`init_scale`, the same for a key wherever it is met);
    /// each outcome counted.
    pub unknown_keys: Unknown,
    /// Keyed tables: `unknown_keys` of single tables, by name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown_keys_by_table: BTreeMap<String, Unknown>,
    /// Keyed tables, `init`: rows are uniform in `[-init_scale, init_scale)` (finite, ≥ 0).
    pub init_scale: f32,
    /// Keyed tables, `init`: the seed rows are drawn with.
    pub key_seed: u64,
    /// Live keyed tables: how each one's keys come and go, by table name — `ttl_s` (a key
    /// whose row is not touched that long is let go of at the next compaction; `touch`:
    /// `read_write` or `write` says what counts), `admit_after` (a new key takes a row at its
    /// Nth sighting within `admit_window_s`), `cap` (the most keys it holds) and `evict` (`off`:
    /// a new key past the cap is refused, `KeysFull`; `lfu` / `lru`: a sampled key gives up
    /// its row).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub key_limits: BTreeMap<String, KeyLimits>,
    /// Writable stores with keyed tables: keep the keys they evict (at their cap) and let
    /// expire (past their TTL) in an evicted keys' log beside the store (`evicted/`: delta
    /// files, `op = delete` with the row as it was, `docs/live.md`), at most this many bytes of
    /// it (the oldest files removed first; at least 1 MiB). `None`: no log. Each eviction then
    /// reads its key's row as it is applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evicted_log: Option<Size>,
    /// Keyed tables' TTLs and admission windows read a clock that only
    /// `Store::advance_clock` moves (tests), not the system's.
    pub manual_clock: bool,
}

/// When a write call returns (see [`StoreConfig::durability`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    #[default]
    Sync,
    Async,
}

impl Default for StoreConfig {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Self {
            tier: Tier::Auto,
            dram_budget: engine.dram_budget_bytes.map(Size),
            threads: engine.threads,
            verify_checksums: engine.verify_checksums,
            verify_reads: engine.verify_reads,
            direct_io: engine.direct_io,
            io_queue_depth: engine.io_queue_depth,
            io_rings: engine.io_rings,
            pread_threads: engine.pread_threads,
            merge_gap_bytes: Size(engine.merge_gap_bytes),
            dedup: engine.dedup,
            merge: engine.merge,
            cache_policy: engine.cache.policy,
            admission_probability: engine.cache.admission_probability,
            cache_ways: engine.cache.ways,
            plan: None,
            device: None,
            writable: false,
            durability: DurabilityMode::Sync,
            durability_window_ms: 10,
            wal_recovery: WalRecovery::default(),
            delta_budget: Size(256 << 20),
            auto_compact: true,
            compaction_rate: Size(64 << 20),
            scrub_rate: Size(0),
            write_wait_ms: 10_000,
            follow_ms: None,
            keep_last: None,
            evicted_log: None,
            warm: None,
            hot_set_dir: None,
            unknown_keys: engine.keyed.unknown,
            unknown_keys_by_table: BTreeMap::new(),
            init_scale: engine.keyed.init_scale,
            key_seed: engine.keyed.seed,
            key_limits: BTreeMap::new(),
            manual_clock: false,
        }
    }
}

impl StoreConfig {
    /// Reads a config from TOML text (unknown keys are errors).
    pub fn from_toml(text: &str) -> Result<Self> {
        let config: Self = toml::from_str(text).map_err(|e| Error::Config {
            key: String::new(),
            reason: e.to_string().trim_end().to_owned(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads a config from JSON (how the Python binding hands one over); an error names the
    /// field at fault.
    pub fn from_json(text: &str) -> Result<Self> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let config: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let reason = e.inner().to_string();
            // (where in the JSON text means nothing to a caller that never wrote it)
            let reason = match reason.rfind(" at line ") {
                Some(i) => reason[..i].to_owned(),
                None => reason,
            };
            Error::Config {
                key: e.path().to_string().trim_start_matches('.').to_owned(),
                reason,
            }
        })?;
        config.validate()?;
        Ok(config)
    }

    /// The config as JSON; [`StoreConfig::from_json`] reads it back equal.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a store config serialises to JSON")
    }

    /// Reads a config file (a regular file: a FIFO is refused, not waited on).
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = nearrec_format::files::read_regular(path, 0).map_err(|e| Error::Config {
            key: String::new(),
            reason: format!("{}: {e}", path.display()),
        })?;
        let text = String::from_utf8(bytes).map_err(|_| Error::Config {
            key: String::new(),
            reason: format!("{}: not UTF-8 text", path.display()),
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            Error::Config { key, reason } => Error::Config {
                key,
                reason: format!("{}: {reason}", path.display()),
            },
            other => other,
        })
    }

    /// The config as TOML; [`StoreConfig::from_toml`] reads it back equal.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a store config serialises to TOML")
    }

    /// Checks every field's range; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, reason: String| {
            Err(Error::Config {
                key: key.into(),
                reason,
            })
        };
        if self.threads > 1024 {
            return bad("threads", format!("{} is more than 1024", self.threads));
        }
        if !(1..=4096).contains(&self.io_queue_depth) {
            return bad(
                "io_queue_depth",
                format!("{} must be in 1..=4096", self.io_queue_depth),
            );
        }
        if !(1..=64).contains(&self.io_rings) {
            return bad("io_rings", format!("{} must be in 1..=64", self.io_rings));
        }
        if !(1..=1024).contains(&self.pread_threads) {
            return bad(
                "pread_threads",
                format!("{} must be in 1..=1024", self.pread_threads),
            );
        }
        if !(0.0..=1.0).contains(&self.admission_probability) {
            return bad(
                "admission_probability",
                format!("{} must be in [0, 1]", self.admission_probability),
            );
        }
        for (table, limits) in &self.key_limits {
            if let Err(reason) = limits.validate() {
                return Err(Error::InvalidRequest {
                    table: Some(table.clone()),
                    position: None,
                    reason: format!("key_limits: {reason}"),
                });
            }
        }
        if !self.init_scale.is_finite() || self.init_scale < 0.0 {
            return bad(
                "init_scale",
                format!("{} must be a finite number ≥ 0", self.init_scale),
            );
        }
        if !(1..=65536).contains(&self.cache_ways) {
            return bad(
                "cache_ways",
                format!("{} must be in 1..=65536", self.cache_ways),
            );
        }
        if !(1..=10_000).contains(&self.durability_window_ms) {
            return bad(
                "durability_window_ms",
                format!("{} must be in 1..=10000", self.durability_window_ms),
            );
        }
        if self.delta_budget.0 < 1 << 20 {
            return bad(
                "delta_budget",
                format!("{} bytes is less than 1 MiB", self.delta_budget.0),
            );
        }
        if self.write_wait_ms > 600_000 {
            return bad(
                "write_wait_ms",
                format!("{} must be in 0..=600000", self.write_wait_ms),
            );
        }
        if let Some(Size(b)) = self.evicted_log
            && b < 1 << 20
        {
            return bad("evicted_log", format!("{b} bytes is less than 1 MiB"));
        }
        if let Some(n) = self.keep_last
            && !(1..=1000).contains(&n)
        {
            return bad("keep_last", format!("{n} must be in 1..=1000"));
        }
        if let Some(ms) = self.follow_ms {
            if !(1..=3_600_000).contains(&ms) {
                return bad("follow_ms", format!("{ms} must be in 1..=3600000"));
            }
            if self.writable {
                return bad(
                    "follow_ms",
                    "a writable store is the writer: it has nobody to follow".into(),
                );
            }
        }
        if self.writable && self.device.is_some() {
            return bad(
                "writable",
                "a store served from a simulated drive (device) is read-only".into(),
            );
        }
        if let Some(device) = &self.device {
            device.resolve().map_err(|e| Error::Config {
                key: "device".into(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// The engine's configuration, with the placement `plan` resolves to.
    pub(crate) fn engine(&self, placement: Option<Placement>) -> EngineConfig {
        EngineConfig {
            tier: self.tier,
            dram_budget_bytes: self.dram_budget.map(Size::bytes),
            threads: self.threads,
            verify_checksums: self.verify_checksums,
            verify_reads: self.verify_reads,
            direct_io: self.direct_io,
            io_queue_depth: self.io_queue_depth,
            io_rings: self.io_rings,
            pread_threads: self.pread_threads,
            merge_gap_bytes: self.merge_gap_bytes.bytes(),
            dedup: self.dedup,
            merge: self.merge,
            cache: CacheConfig {
                policy: self.cache_policy,
                admission_probability: self.admission_probability,
                ways: self.cache_ways,
                ..CacheConfig::default()
            },
            placement,
            keyed: KeyPolicy {
                unknown: self.unknown_keys,
                tables: self.unknown_keys_by_table.clone(),
                init_scale: self.init_scale,
                seed: self.key_seed,
                live: self.key_limits.clone(),
                manual_clock: self.manual_clock,
            },
            ..EngineConfig::default()
        }
    }

    pub fn with_tier(mut self, tier: Tier) -> Self {
        self.tier = tier;
        self
    }

    pub fn with_dram_budget(mut self, bytes: u64) -> Self {
        self.dram_budget = Some(Size(bytes));
        self
    }

    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    pub fn with_plan(mut self, plan: PlanSource) -> Self {
        self.plan = Some(plan);
        self
    }

    /// With [`StoreConfig::warm`]: the DRAM tiers filled from `file` at open.
    pub fn with_warm(mut self, file: impl Into<PathBuf>) -> Self {
        self.warm = Some(file.into());
        self
    }

    pub fn with_device(mut self, device: DeviceSource) -> Self {
        self.device = Some(device);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nearrec_device::DeviceConfig;
    use nearrec_plan::TablePlacement;

    #[test]
    fn toml_round_trip_of_every_field() {
        let mut placement = Placement::default();
        placement.tables.insert(
            "t0".into(),
            TablePlacement {
                resident: false,
                hot_rows: vec![3, 1, 4],
                cache_bytes: 1 << 20,
            },
        );
        let configs = [
            StoreConfig::default(),
            StoreConfig {
                tier: Tier::Ssd,
                dram_budget: Some(Size(4 << 30)),
                threads: 3,
                verify_checksums: false,
                verify_reads: false,
                direct_io: false,
                io_queue_depth: 64,
                io_rings: 4,
                pread_threads: 8,
                merge_gap_bytes: Size(8192),
                dedup: false,
                merge: false,
                cache_policy: Policy::Lru,
                admission_probability: 0.25,
                cache_ways: 8,
                plan: Some(PlanSource::Placement(placement)),
                device: Some(DeviceSource::Config(Box::new(DeviceConfig::rm_ssd()))),
                writable: false,
                durability: DurabilityMode::Async,
                durability_window_ms: 50,
                wal_recovery: WalRecovery::Absolute,
                delta_budget: Size(64 << 20),
                auto_compact: false,
                compaction_rate: Size(100 << 20),
                scrub_rate: Size(16 << 20),
                write_wait_ms: 0,
                follow_ms: Some(250),
                keep_last: Some(3),
                evicted_log: Some(Size(64 << 20)),
                warm: Some("requests.nrtrace".into()),
                hot_set_dir: Some("/var/lib/nearrec".into()),
                unknown_keys: Unknown::Zero,
                unknown_keys_by_table: [("users".to_owned(), Unknown::Init)].into(),
                init_scale: 0.5,
                key_seed: 9,
                key_limits: [(
                    "users".to_owned(),
                    KeyLimits {
                        ttl_s: Some(86_400),
                        cap: Some(1000),
                        evict: nearrec_engine::Evict::Lfu,
                        ..KeyLimits::default()
                    },
                )]
                .into(),
                manual_clock: true,
            },
            StoreConfig::default()
                .with_plan(PlanSource::File("a.plan.toml".into()))
                .with_device(DeviceSource::Preset("cosmos-plus".into())),
        ];
        for c in configs {
            let text = c.to_toml();
            assert_eq!(StoreConfig::from_toml(&text).unwrap(), c, "{text}");
            assert_eq!(StoreConfig::from_json(&c.to_json()).unwrap(), c);
        }
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        let c =
            StoreConfig::from_toml("dram_budget = \"4GiB\"\nmerge_gap_bytes = \"8KiB\"").unwrap();
        assert_eq!(c.dram_budget, Some(Size(4 << 30)));
        assert_eq!(c.merge_gap_bytes, Size(8192));
        assert!(StoreConfig::from_toml("dram_budget = -1").is_err());
        assert!(StoreConfig::from_toml("dram_budget = \"lots\"").is_err());
    }

    #[test]
    fn a_typo_is_an_error_naming_it() {
        let e = StoreConfig::from_toml("tier = \"ssd\"\ncache_polcy = \"lru\"").unwrap_err();
        assert!(e.to_string().contains("cache_polcy"), "{e}");
        let e = StoreConfig::from_toml("[plan.tables.t0]\nresidnt = true").unwrap_err();
        assert!(e.to_string().contains("residnt"), "{e}");
        let e = StoreConfig::from_toml("tier = \"disk\"").unwrap_err();
        assert!(e.to_string().contains("disk"), "{e}");
    }

    #[test]
    fn json_errors_name_the_field() {
        for (text, key) in [
            (r#"{"threads": -1}"#, "threads"),
            (r#"{"dram_budget": true}"#, "dram_budget"),
            (r#"{"dram_budget": 1.5}"#, "dram_budget"),
            (r#"{"tier": null}"#, "tier"),
            (r#"{"plan": {"tables": {"a": {"resident": "no"}}}}"#, "plan"),
        ] {
            match StoreConfig::from_json(text) {
                Err(Error::Config { key: k, .. }) => assert!(k.starts_with(key), "{text}: {k}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn ranges_are_checked_by_field() {
        for (text, key) in [
            ("io_queue_depth = 0", "io_queue_depth"),
            ("io_rings = 65", "io_rings"),
            ("pread_threads = 0", "pread_threads"),
            ("admission_probability = 1.5", "admission_probability"),
            ("cache_ways = 0", "cache_ways"),
            ("threads = 100000", "threads"),
            ("device = \"floppy\"", "device"),
        ] {
            match StoreConfig::from_toml(text) {
                Err(Error::Config { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn defaults_are_the_engines() {
        let (c, e) = (StoreConfig::default(), EngineConfig::default());
        assert_eq!(c.tier, Tier::Auto);
        assert_eq!(c.io_queue_depth, e.io_queue_depth);
        assert_eq!(c.cache_policy, e.cache.policy);
        assert_eq!(c.engine(None).cache, e.cache);
    }
}
