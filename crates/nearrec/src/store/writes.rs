//! Writes to the served store ([`Writes`]: rows written and removed, compaction) and its tables
//! created and dropped ([`Schema`]), with what a cache above the store reads of them: the
//! changes since a version; and its counters — the live store's, the keyed tables', the SSD
//! tier's and its DRAM tiers' (what `StoreApi::stats` gathers).

use nearrec_engine::TierReport;

use super::{Changes, Store};
use crate::api::{NewTable, Schema, Stats, Writes};
use crate::error::Result;
use crate::live::{Compaction, Fed, Feeds, RowValues, RowWrite, WriteOptions};
use nearrec_format::FeedCursor;

impl Writes for Store {
    /// EMB_WRITE: upserts rows of several tables in one atomic call (all of its rows or none),
    /// durable when it returns; every lookup that starts after sees them. Values are float32,
    /// encoded with each table's dtype (int8 rows re-quantised row-wise). Returns the version
    /// the call made.
    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> Result<u64> {
        let _admitted = self.admit(None)?;
        self.current().live.write(writes, options)
    }

    /// Folds every write so far into new table files (copy-on-write) and moves the tables'
    /// base to the current version: the delta's memory is freed and the log released. A
    /// writable store also compacts by itself (`auto_compact`). Lookups go on meanwhile.
    fn compact(&self) -> Result<Compaction> {
        self.current().live.compact()
    }

    fn feed(
        &self,
        feed: &str,
        cursor: FeedCursor,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> Result<Fed> {
        let _admitted = self.admit(None)?;
        self.current().live.feed(feed, cursor, writes, options)
    }

    fn feed_status(&self) -> Result<Feeds> {
        Ok(self.current().live.snapshot().feeds().clone())
    }
}

impl Schema for Store {
    /// RM_create_table: a new table of `rows` × `dim` values stored as `dtype`, every value 0
    /// or drawn as `init` says, served from the next lookup on (on the SSD tier with no DRAM
    /// tiers in front of it). Everything written before is compacted first; calls wait
    /// meanwhile. Durable when it returns; returns the version that made it.
    fn create_table(&self, t: &NewTable<'_>) -> Result<u64> {
        let live = &self.current().live;
        live.create_table(t.name, t.rows, t.dim, t.dtype, t.init)
    }

    /// EMB_REMOVE of a table: lookups under way finish on it, later ones get `UnknownTable`;
    /// its files go. Compacts first, like [`Schema::create_table`].
    fn drop_table(&self, name: &str) -> Result<u64> {
        self.current().live.drop_table(name)
    }
}

impl Store {
    /// [`Writes::write_many`] of one table: rows `ids` become `values` (`ids.len() × dim`).
    pub fn write(&self, table: &str, ids: &[i64], values: &[f32]) -> Result<u64> {
        let w = RowWrite {
            table,
            ids,
            values: Some(RowValues::F32(values)),
        };
        self.write_many(&[w], WriteOptions::default())
    }

    /// EMB_REMOVE of rows: until written again they pool as zero rows (and are counted,
    /// `removed_served`). Atomic and durable like [`Writes::write_many`].
    pub fn remove(&self, table: &str, ids: &[i64]) -> Result<u64> {
        let w = RowWrite {
            table,
            ids,
            values: None,
        };
        self.write_many(&[w], WriteOptions::default())
    }

    /// What changed since `version` (a version this store served), for a cache kept above the
    /// store (the GPU tier) to follow it: the current version, the version its table files
    /// hold, its engine's id, and per table the rows written or removed after `version` (the
    /// last compaction's rows with them when `version` is older than the files) — `None` when
    /// they cannot be told (compacted away twice since): then everything cached must go, as
    /// it must when the engine's id changed (tables created or dropped, a store swapped in).
    pub fn changes_since(&self, version: u64) -> Changes {
        let snapshot = self.snapshot();
        let engine = snapshot.engine();
        let rows = snapshot.rows_after(version).map(|rows| {
            engine
                .tables()
                .iter()
                .zip(rows)
                .filter(|(_, rows)| !rows.is_empty())
                .map(|(t, rows)| (t.name.clone(), rows))
                .collect()
        });
        Changes {
            version: snapshot.version(),
            base: snapshot.base(),
            engine: engine.id(),
            rows,
        }
    }

    /// The write-ahead log's, the deltas' and compaction's counters: `version`,
    /// `base_version`, `delta_rows`, `delta_bytes`, `delta_served`, `removed_served`,
    /// `log_bytes`, `log_records`, `log_groups`, `log_syncs`, `log_segments`, `compactions`,
    /// `compacted_rows`, `compaction_bytes`, `compaction_seconds`, `compaction_errors`,
    /// `compacting` (1 while one runs), `delta_budget` (bytes; 0 read-only), a read-only
    /// store's `follow_ms`, `follow_moved`, `follow_errors`, and with a `scrub_rate` its scrub's
    /// `scrub_rate`, `scrub_passes`, `scrub_bytes`, `scrub_damaged`, `scrub_last_damaged`
    /// (`crate::scrub`).
    pub fn live_stats(&self) -> Vec<(&'static str, f64)> {
        let mut stats = self.current().live.stats();
        if let Some(scrub) = &self.inner.scrub {
            stats.extend(scrub.stats());
        }
        stats
    }

    /// The SSD tier's counters and the DRAM tiers' totals (`None` for a DRAM-resident store).
    /// The keyed tables' counters, summed over them (none without keyed tables): keys held
    /// (a writer's exactly; a read-only store's as of its tables' base), the indexes' DRAM,
    /// lookups of keys held (`keyed_hits`) and of keys not held answered with zeros, init rows
    /// or refused (`unknown_keys_zero`, `_init`, `_refused`), or with the table's default row
    /// (`unknown_keys_default`); live keys — new keys' writes
    /// dropped before admission (`keys_not_admitted`), keys let go of past their TTL
    /// (`keys_expired`), evicted at a cap (`keys_evicted`), new keys refused at a cap
    /// (`keys_refused_full`) — and the DRAM their touches and admission counts take
    /// (`keyed_life_bytes`).
    pub fn key_stats(&self) -> Vec<(String, f64)> {
        let reports = self.engine().key_report();
        if reports.is_empty() {
            return Vec::new();
        }
        let sum =
            |f: fn(&nearrec_engine::KeyReport) -> u64| reports.iter().map(f).sum::<u64>() as f64;
        let held = reports
            .iter()
            .map(|r| self.keys_held(&r.table).unwrap_or(r.keys))
            .sum::<u64>() as f64;
        [
            ("keyed_keys", held),
            ("keyed_index_bytes", sum(|r| r.index_bytes)),
            ("keyed_hits", sum(|r| r.hits)),
            ("unknown_keys_zero", sum(|r| r.unknown_zero)),
            ("unknown_keys_default", sum(|r| r.unknown_default)),
            ("unknown_keys_init", sum(|r| r.unknown_init)),
            ("unknown_keys_refused", sum(|r| r.unknown_refused)),
            ("keys_not_admitted", sum(|r| r.not_admitted)),
            ("keys_expired", sum(|r| r.expired)),
            ("keys_evicted", sum(|r| r.evicted)),
            ("keys_refused_full", sum(|r| r.refused_full)),
            ("keyed_life_bytes", sum(|r| r.life_bytes)),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into()
    }

    /// Keys keyed table `table` holds (`None`: not a keyed table): as its writer has decided
    /// them, or, opened read-only, as this store serves them now.
    pub fn keys_held(&self, table: &str) -> Option<u64> {
        self.current().live.keys_held(table)
    }

    /// Moves the clock keyed tables' TTLs and admission windows read `seconds` ahead (a store
    /// opened with `manual_clock`; else `InvalidRequest`); returns the time it reads now, in
    /// Unix seconds.
    pub fn advance_clock(&self, seconds: u64) -> Result<u64> {
        Ok(self.engine().advance_clock(seconds)?)
    }

    /// The SSD tier's counters and its DRAM tiers' totals (`None`: DRAM-resident), what
    /// [`StoreApi::stats`] adds the live store's and the keyed tables' to.
    pub(super) fn tier_stats(&self) -> Option<Stats> {
        let engine = self.engine();
        let (io, device) = (engine.io_stats()?, engine.device()?);
        let mut values = io.snapshot();
        let reports = engine.tier_report();
        let sum = |f: fn(&TierReport) -> u64| reports.iter().map(f).sum::<u64>() as f64;
        let lookups = sum(|r| r.lookups_resident + r.lookups_hot + r.lookups_cache + r.lookups_ssd);
        let dram = sum(|r| r.lookups_resident + r.lookups_hot + r.lookups_cache);
        values.extend(
            [
                ("dram_tier_bytes", sum(|r| r.bytes)),
                ("lookups_resident", sum(|r| r.lookups_resident)),
                ("lookups_hot", sum(|r| r.lookups_hot)),
                ("lookups_cache", sum(|r| r.lookups_cache)),
                ("lookups_ssd", sum(|r| r.lookups_ssd)),
                (
                    "dram_hit_ratio",
                    if lookups > 0.0 { dram / lookups } else { 0.0 },
                ),
                ("cache_admissions", sum(|r| r.cache.admissions)),
                ("cache_rejections", sum(|r| r.cache.rejections)),
                ("cache_evictions", sum(|r| r.cache.evictions)),
                ("unprotected_tables", engine.unprotected_tables() as f64),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        Some(Stats {
            device: device.kind().to_owned(),
            direct_io: device.direct(),
            block_bytes: device.block_size(),
            values,
        })
    }
}
