//! The row cache against plain reference models, its admission draw, its contents under
//! concurrent use; the hot partition.

use std::collections::VecDeque;
use std::sync::Arc;

use nearrec_cache::{CacheConfig, HotPartition, Offer, Policy, RowCache, words_as_bytes};
use proptest::prelude::*;

const RB: usize = 12;

fn bytes_of(row: u64) -> [u8; RB] {
    let mut b = [0u8; RB];
    b[..8].copy_from_slice(&row.to_le_bytes());
    b[8..].copy_from_slice(&(row as u32 ^ 0xA5A5_A5A5).to_le_bytes());
    b
}

/// A cache with exactly one set of `ways` slots.
fn one_set(ways: usize, policy: Policy, p: f64) -> RowCache {
    let budget = ways as u64 * RowCache::slot_bytes(RB);
    let c = RowCache::new(
        budget,
        RB,
        CacheConfig {
            policy,
            admission_probability: p,
            ways,
            seed: 3,
        },
    );
    assert_eq!(c.capacity_rows(), ways as u64);
    c
}

/// Serves `trace` through `cache` the way the engine does (look up; on a miss, offer the row);
/// returns which accesses hit.
fn serve(cache: &RowCache, trace: &[u64]) -> Vec<bool> {
    trace
        .iter()
        .map(|&r| {
            let hit = cache.get(r, |b| assert_eq!(b, bytes_of(r))).is_some();
            if !hit {
                cache.offer(r, &bytes_of(r));
            }
            hit
        })
        .collect()
}

fn reference_lru(ways: usize, trace: &[u64]) -> Vec<bool> {
    let mut q: VecDeque<u64> = VecDeque::new();
    trace
        .iter()
        .map(|&r| {
            if let Some(i) = q.iter().position(|&k| k == r) {
                q.remove(i);
                q.push_back(r);
                true
            } else {
                if q.len() == ways {
                    q.pop_front();
                }
                q.push_back(r);
                false
            }
        })
        .collect()
}

/// LFU over slots: a new row counts 1, a hit adds 1, the victim is the first slot with the
/// smallest count.
fn reference_lfu(ways: usize, trace: &[u64]) -> Vec<bool> {
    let mut slots: Vec<Option<(u64, u64)>> = vec![None; ways];
    trace
        .iter()
        .map(|&r| {
            if let Some(s) = slots.iter_mut().flatten().find(|s| s.0 == r) {
                s.1 += 1;
                return true;
            }
            let at = slots.iter().position(Option::is_none).unwrap_or_else(|| {
                (0..ways)
                    .min_by_key(|&i| slots[i].map_or(0, |s| s.1))
                    .unwrap()
            });
            slots[at] = Some((r, 1));
            false
        })
        .collect()
}

proptest! {
    #[test]
    fn one_set_lru_is_exact_lru(ways in 1usize..9, trace in prop::collection::vec(0u64..12, 1..300)) {
        let c = one_set(ways, Policy::Lru, 0.5);
        prop_assert_eq!(serve(&c, &trace), reference_lru(ways, &trace));
    }

    #[test]
    fn one_set_lfu_is_exact_lfu(ways in 1usize..9, trace in prop::collection::vec(0u64..12, 1..300)) {
        let c = one_set(ways, Policy::Lfu, 0.5);
        prop_assert_eq!(serve(&c, &trace), reference_lfu(ways, &trace));
    }

    /// Any shape of cache: hits return the row's own bytes, it never holds more than its
    /// capacity, and the counters add up.
    #[test]
    fn hits_are_right_and_counters_add_up(
        budget in 0u64..5_000,
        ways in 1usize..20,
        policy in prop::sample::select(Policy::ALL.to_vec()),
        trace in prop::collection::vec(0u64..400, 0..600),
    ) {
        let c = RowCache::new(budget, RB, CacheConfig { policy, ways, ..CacheConfig::default() });
        prop_assert!(c.bytes() <= budget);
        let hits = serve(&c, &trace).into_iter().filter(|&h| h).count() as u64;
        let s = c.stats();
        prop_assert_eq!(s.hits, hits);
        prop_assert_eq!(s.hits + s.misses, trace.len() as u64);
        prop_assert_eq!(s.admissions + s.rejections, s.misses);
        prop_assert!(c.len() <= c.capacity_rows());
        prop_assert_eq!(c.len(), s.admissions - s.evictions);
    }
}

#[test]
fn admission_probability_is_honoured() {
    for (p, lo, hi) in [(0.0, 0.0, 0.0), (0.5, 0.45, 0.55), (1.0, 1.0, 1.0)] {
        let c = one_set(4, Policy::LfuPa, p);
        // fill the set, then offer 4,000 fresh rows
        for r in 0..4 {
            assert_eq!(c.offer(r, &bytes_of(r)), Offer::Admitted { evicted: None });
        }
        let admitted = (100..4_100)
            .filter(|&r| matches!(c.offer(r, &bytes_of(r)), Offer::Admitted { .. }))
            .count() as f64
            / 4_000.0;
        assert!(
            (lo..=hi).contains(&admitted),
            "p = {p}: admitted {admitted}"
        );
    }
    // free slots are always taken, whatever p
    let c = one_set(4, Policy::LruPa, 0.0);
    assert!(matches!(
        c.offer(9, &bytes_of(9)),
        Offer::Admitted { evicted: None }
    ));
    assert_eq!(c.offer(9, &bytes_of(9)), Offer::Present);
}

#[test]
fn lfu_keeps_frequent_rows_that_lru_drops() {
    // one hot row among one-off rows, three between its uses: a 3-way LRU loses it each time,
    // LFU keeps it once it has been hit
    let trace: Vec<u64> = [7, 7]
        .into_iter()
        .chain((0..2_000u64).flat_map(|i| [7, 10_000 + i, 20_000 + i, 30_000 + i]))
        .collect();
    let hit_ratio = |policy| {
        let c = one_set(3, policy, 0.5);
        let h = serve(&c, &trace).into_iter().filter(|&h| h).count();
        h as f64 / trace.len() as f64
    };
    assert!(hit_ratio(Policy::Lfu) > 0.24, "{}", hit_ratio(Policy::Lfu));
    assert!(hit_ratio(Policy::Lru) < 0.01, "{}", hit_ratio(Policy::Lru));
}

#[test]
fn concurrent_readers_and_writers_see_whole_rows() {
    let cache = Arc::new(RowCache::new(
        64 * 1024,
        RB,
        CacheConfig {
            ways: 4,
            ..CacheConfig::default()
        },
    ));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = Arc::clone(&cache);
            std::thread::spawn(move || {
                let mut gets = 0u64;
                let mut x = t + 1;
                for _ in 0..50_000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = (x >> 33) % 8_000;
                    gets += 1;
                    if c.get(r, |b| assert_eq!(b, bytes_of(r), "row {r}"))
                        .is_none()
                    {
                        c.offer(r, &bytes_of(r));
                    }
                }
                gets
            })
        })
        .collect();
    let gets: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let s = cache.stats();
    assert_eq!(s.hits + s.misses, gets);
    assert!(s.hits > 0 && s.evictions > 0);
    assert!(cache.len() <= cache.capacity_rows());
}

/// Bytes of `row` at `version`: every byte differs between versions and between rows, so a
/// copy mixing two writes of a slot shows.
fn versioned(row: u64, version: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (row as u8).wrapping_mul(31) ^ version.wrapping_mul(101) ^ i as u8)
        .collect()
}

/// Lock-free reads against admissions, evictions and replacements of the same slots: every row
/// read is one whole write of that row (readers through `get` and through `probe` + `read` with
/// a pause between them), never a mix.
#[test]
fn lock_free_reads_never_see_a_torn_row() {
    const LEN: usize = 300; // several lines, not a multiple of 8
    const ROWS: u64 = 256;
    let cache = Arc::new(RowCache::new(
        64 * RowCache::slot_bytes(LEN),
        LEN,
        CacheConfig {
            ways: 4,
            ..CacheConfig::default()
        },
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let check = |row: u64, bytes: &[u8]| {
        assert_eq!(bytes.len(), LEN);
        let v = (0..=255u8).find(|&v| versioned(row, v, 1)[0] == bytes[0]);
        assert!(
            v.is_some_and(|v| bytes == &versioned(row, v, LEN)[..]),
            "row {row}: a torn or foreign copy"
        );
    };
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let (c, stop) = (Arc::clone(&cache), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut x = t + 7;
                let mut version = 0u8;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = (x >> 33) % ROWS;
                    version = version.wrapping_add(1);
                    // admissions evict (ROWS rows, 64 slots); replacements rewrite in place
                    if x & 1 == 0 {
                        c.offer(r, &versioned(r, version, LEN));
                    } else {
                        c.replace(r, &versioned(r, version, LEN));
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let c = Arc::clone(&cache);
            std::thread::spawn(move || {
                let (mut x, mut hits) = (t + 1, 0u64);
                let mut out = vec![0u64; c.words()];
                for i in 0..200_000u64 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = (x >> 33) % ROWS;
                    if i % 2 == 0 {
                        hits += u64::from(c.get(r, |b| check(r, b)).is_some());
                    } else if let Some(at) = c.probe(r) {
                        std::hint::spin_loop();
                        if c.read(at, r, &mut out) {
                            check(r, &words_as_bytes(&out)[..LEN]);
                            hits += 1;
                        }
                    }
                }
                hits
            })
        })
        .collect();
    let hits: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writers.into_iter().for_each(|t| t.join().unwrap());
    assert!(
        hits > 1000,
        "the readers hardly hit ({hits}): the test checked little"
    );
}

#[test]
fn zero_budget_caches_nothing() {
    let c = RowCache::new(10, RB, CacheConfig::default());
    assert_eq!(c.capacity_rows(), 0);
    assert_eq!(c.offer(1, &bytes_of(1)), Offer::Rejected);
    assert!(c.get(1, |_| ()).is_none());
}

#[test]
fn hot_partition_serves_its_rows_only() {
    let rows = [5u64, 900, 17];
    let hot = HotPartition::new(&rows, RB, |rows, buf| {
        for (r, dst) in rows.iter().zip(buf.chunks_exact_mut(RB)) {
            dst.copy_from_slice(&bytes_of(*r));
        }
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(hot.rows(), 3);
    for r in rows {
        assert_eq!(hot.get(r), Some(&bytes_of(r)[..]));
    }
    assert_eq!(hot.get(6), None);
    assert_eq!(hot.get(u64::MAX), None);
    assert_eq!(hot.bytes(), HotPartition::bytes_for(3, RB));
    let failed = HotPartition::new(&rows, RB, |_, _| Err("disk"));
    assert_eq!(failed.unwrap_err(), "disk");
    // a live store's compaction overwrites pinned rows, and only those
    // SAFETY: no reader on this thread or any other
    assert!(unsafe { hot.overwrite(900, &bytes_of(1)) });
    // SAFETY: as above
    assert!(!unsafe { hot.overwrite(6, &bytes_of(1)) });
    assert_eq!(hot.get(900), Some(&bytes_of(1)[..]));
    assert_eq!(hot.get(5), Some(&bytes_of(5)[..]));
    assert_eq!(hot.get(6), None);
}

#[test]
fn replace_changes_a_cached_row_and_nothing_else() {
    let c = one_set(2, Policy::Lru, 1.0);
    assert!(matches!(c.offer(3, &bytes_of(3)), Offer::Admitted { .. }));
    assert!(matches!(c.offer(4, &bytes_of(4)), Offer::Admitted { .. }));
    let before = c.stats();
    assert!(c.replace(3, &bytes_of(30)));
    assert!(!c.replace(5, &bytes_of(50)));
    assert_eq!(c.stats(), before);
    assert_eq!(c.get(3, <[u8]>::to_vec), Some(bytes_of(30).to_vec()));
    assert_eq!(c.get(4, <[u8]>::to_vec), Some(bytes_of(4).to_vec()));
    assert_eq!(c.get(5, <[u8]>::to_vec), None);
}

proptest! {
    #[test]
    fn hot_partition_finds_exactly_its_rows(
        rows in prop::collection::hash_set(prop_oneof![0u64..200, 0u64..1 << 48], 0..300),
        probes in prop::collection::vec(prop_oneof![0u64..200, 0u64..1 << 48], 0..100),
    ) {
        let rows: Vec<u64> = rows.into_iter().collect();
        let hot = HotPartition::new(&rows, RB, |rows, buf| {
            for (r, dst) in rows.iter().zip(buf.chunks_exact_mut(RB)) {
                dst.copy_from_slice(&bytes_of(*r));
            }
            Ok::<(), ()>(())
        })
        .unwrap();
        for &r in &rows {
            prop_assert_eq!(hot.get(r), Some(&bytes_of(r)[..]));
            prop_assert_eq!(hot.get_prefetched(r), Some(&bytes_of(r)[..]));
        }
        for p in probes {
            prop_assert_eq!(hot.get(p).is_some(), rows.contains(&p));
        }
    }
}

proptest! {
    #[test]
    fn budget_for_rows_holds_every_row_and_not_much_more(
        rows in 0u64..200_000, ways in 1usize..33, row_bytes in 1usize..300,
    ) {
        let budget = RowCache::budget_for_rows(rows, row_bytes, ways);
        let config = CacheConfig { ways, ..CacheConfig::default() };
        let cache = RowCache::new(budget, row_bytes, config);
        prop_assert!(cache.capacity_rows() >= rows);
        prop_assert!(cache.capacity_rows() <= 2 * rows + 256 * ways as u64);
    }
}
