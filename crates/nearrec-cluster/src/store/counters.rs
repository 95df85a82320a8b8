//! What a sharded store reports: the digests of a table's rows where each part's rows are,
//! every shard's counters added up, each shard's tier report.

use std::sync::atomic::{AtomicU64, Ordering};

use nearrec::{Stats, StoreApi, TierReport};

use super::Inner;

impl Inner {
    pub(super) fn row_digests(
        &self,
        name: &str,
        first: u64,
        count: u64,
    ) -> nearrec::Result<Vec<u64>> {
        self.live()?;
        let layout = self.layout();
        let table = layout.table(name)?;
        nearrec::check_digest_rows(name, table.rows, first, count)?;
        let end = first + count;
        let mut out = Vec::with_capacity(count as usize);
        for part in &table.parts {
            let (from, to) = (first.max(part.first), end.min(part.first + part.rows));
            if from >= to {
                continue;
            }
            let shard = &self.shards[part.shard];
            let got = shard.any(&self.name, |c| {
                c.row_digests(name, from - part.first, to - from)
            })?;
            out.extend(got);
        }
        Ok(out)
    }

    pub(super) fn stats(&self) -> nearrec::Result<Stats> {
        self.live()?;
        let mut total: Vec<(String, f64)> = Vec::new();
        let mut first: Option<Stats> = None;
        for s in self.shards.iter() {
            let stats = s.any(&self.name, |c| c.stats())?;
            for (k, v) in &stats.values {
                match total.iter_mut().find(|(n, _)| n == k) {
                    Some(t) => t.1 += v,
                    None => total.push((k.clone(), *v)),
                }
            }
            first.get_or_insert(stats);
        }
        // percentiles and ratios do not add: a shard's are its own (per-shard stats are each
        // node's), so the sums of those are dropped
        total.retain(|(k, _)| !(k.ends_with("_us") || k.contains("ratio") || k.ends_with("_p99")));
        let counted = |n: &str, v: u64| (format!("cluster_{n}"), v as f64);
        let sum = |f: fn(&crate::shard::Counters) -> &AtomicU64| {
            self.shards
                .iter()
                .map(|s| f(&s.counters).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        total.extend([
            counted("shards", self.shards.len() as u64),
            counted("batches", self.batches.load(Ordering::Relaxed)),
            counted("bags", self.bags.load(Ordering::Relaxed)),
            counted("split_bags", self.split_bags.load(Ordering::Relaxed)),
            counted("bag_shards", self.bag_shards.load(Ordering::Relaxed)),
            counted("spread_bags", self.spread_bags.load(Ordering::Relaxed)),
            counted("reads", sum(|c| &c.reads)),
            counted("hedges", sum(|c| &c.hedges)),
            counted("hedge_wins", sum(|c| &c.hedge_wins)),
            counted("retries", sum(|c| &c.retries)),
            counted("reads_again", self.reads_again.load(Ordering::Relaxed)),
            counted("failures", sum(|c| &c.failures)),
            counted(
                "stale_replicas",
                (self.shards.iter())
                    .map(|s| (s.all_replicas().len() - s.live_replicas().len()) as u64)
                    .sum(),
            ),
        ]);
        let first = first.expect("a plan has a shard");
        Ok(Stats {
            device: first.device,
            direct_io: first.direct_io,
            block_bytes: first.block_bytes,
            values: total,
        })
    }

    /// Each table's DRAM tiers over its shards, added up.
    pub(super) fn tier_report(&self) -> nearrec::Result<Vec<TierReport>> {
        self.live()?;
        let mut out: Vec<TierReport> = Vec::new();
        for s in self.shards.iter() {
            for r in s.any(&self.name, |c| c.tier_report())? {
                let Some(t) = out.iter_mut().find(|t| t.table == r.table) else {
                    out.push(r);
                    continue;
                };
                t.resident &= r.resident;
                t.hot_rows += r.hot_rows;
                t.cache_rows += r.cache_rows;
                t.bytes += r.bytes;
                t.lookups_resident += r.lookups_resident;
                t.lookups_hot += r.lookups_hot;
                t.lookups_cache += r.lookups_cache;
                t.lookups_ssd += r.lookups_ssd;
                t.cache.hits += r.cache.hits;
                t.cache.misses += r.cache.misses;
                t.cache.admissions += r.cache.admissions;
                t.cache.rejections += r.cache.rejections;
                t.cache.evictions += r.cache.evictions;
            }
        }
        Ok(out)
    }
}
