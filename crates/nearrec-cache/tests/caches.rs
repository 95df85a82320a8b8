//! The row cache against plain reference models, its admission draw, its contents under
//! concurrent use; the hot partition.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use nearrec_cache::{CacheConfig, HotPartition, Offer, Policy, Reader, RowCache, Set, Slot};
use nearrec_kernels::SKIP;
use proptest::prelude::*;

const RB: usize = 12;

fn bytes_of(row: u64) -> [u8; RB] {
    let mut b = [0u8; RB];
    b[..8].copy_from_slice(&row.to_le_bytes());
    b[8..].copy_from_slice(&(row as u32 ^ 0xA5A5_A5A5).to_le_bytes());
    b
}

/// `row`'s bytes through `reader` the engine's way, one step at a time (`pause` between steps).
fn find<'r>(reader: &'r Reader<'_>, row: u64, pause: impl Fn(usize)) -> Option<&'r [u8]> {
    let (mut set, mut slot, mut found) = ([Set::NONE], [Slot::NONE], [None]);
    reader.locate(&[row], &mut set);
    pause(0);
    reader.probe(&set, &mut slot);
    pause(1);
    reader.read(&slot, &[row], &mut found);
    // SAFETY: a row this cache finds is one of its own, `row_bytes` long
    found[0].map(|row| unsafe { row.bytes(reader.cache().row_bytes()) })
}

/// A cache with exactly one set of `ways` slots.
fn one_set(ways: usize, policy: Policy, p: f64) -> RowCache {
    let budget = RowCache::budget_for_rows(ways as u64, RB, ways);
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
/// returns which accesses hit. Accesses take turns between the two ways of reading: `get`, and
/// the engine's: a reader, the set found ahead, `probe`, `row` and `count`.
fn serve(cache: &RowCache, trace: &[u64]) -> Vec<bool> {
    trace
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            let hit = if i % 2 == 0 {
                cache.get(r, |b| assert_eq!(b, bytes_of(r))).is_some()
            } else {
                let reader = cache.reader();
                let found = find(&reader, r, |_| ());
                if let Some(bytes) = found {
                    assert_eq!(bytes, bytes_of(r));
                }
                let hit = found.is_some();
                drop(reader);
                cache.count(u64::from(hit), u64::from(!hit));
                hit
            };
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

/// The policy's reference model (the `_pa` ones admitting everything: `p` = 1).
fn reference(policy: Policy, ways: usize, trace: &[u64]) -> Vec<bool> {
    if policy.frequency() {
        reference_lfu(ways, trace)
    } else {
        reference_lru(ways, trace)
    }
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

    /// Admitting every row, the `_pa` policies are their plain ones.
    #[test]
    fn admitting_everything_pa_is_exact(
        ways in 1usize..9,
        policy in prop::sample::select(vec![Policy::LruPa, Policy::LfuPa]),
        trace in prop::collection::vec(0u64..12, 1..300),
    ) {
        let c = one_set(ways, policy, 1.0);
        prop_assert_eq!(serve(&c, &trace), reference(policy, ways, &trace));
    }

    /// Many sets, several shards: each set is its own exact LRU / LFU over the rows that map to
    /// it (the set [`RowCache::set`] names is the one rows are admitted to and found in).
    #[test]
    fn every_set_is_exact(
        sets in 1u64..600,
        ways in 1usize..6,
        policy in prop::sample::select(vec![Policy::Lru, Policy::Lfu]),
        trace in prop::collection::vec(0u64..3_000, 1..1_500),
    ) {
        let c = RowCache::new(
            sets * RowCache::budget_for_rows(ways as u64, RB, ways),
            RB,
            CacheConfig { policy, ways, ..CacheConfig::default() },
        );
        let mut by_set: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
        for (i, &r) in trace.iter().enumerate() {
            by_set.entry({
                let mut set = [Set::NONE];
                c.reader().locate(&[r], &mut set);
                set[0].number()
            }).or_default().push((i, r));
        }
        let got = serve(&c, &trace);
        let mut want = vec![false; trace.len()];
        for accesses in by_set.values() {
            let rows: Vec<u64> = accesses.iter().map(|a| a.1).collect();
            for (&(i, _), hit) in accesses.iter().zip(reference(policy, ways, &rows)) {
                want[i] = hit;
            }
        }
        prop_assert_eq!(got, want);
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

/// A padding lookup ([`SKIP`]) is never found, whatever slot a probe gave it: not a row's, and
/// not an empty way's, whose tag (0) is also one row in 256's.
#[test]
fn padding_is_never_found() {
    let config = CacheConfig {
        ways: 16,
        ..CacheConfig::default()
    };
    let c = RowCache::new(RowCache::budget_for_rows(64, RB, 16), RB, config).with_rows(64);
    // every set keeps empty ways; row 0, whose tag is 0, is not cached
    for r in (1..64).step_by(3) {
        assert!(matches!(c.offer(r, &bytes_of(r)), Offer::Admitted { .. }));
    }
    let reader = c.reader();
    let mut empty_ways = 0;
    for r in 0..64u64 {
        let (mut set, mut slot, mut found) = ([Set::NONE], [Slot::NONE], [None]);
        reader.locate(&[r], &mut set);
        reader.probe(&set, &mut slot);
        empty_ways += u64::from(slot[0] != Slot::NONE && r % 3 != 1);
        reader.read(&slot, &[SKIP], &mut found);
        assert!(found[0].is_none(), "padding found in row {r}'s slot");
    }
    assert!(
        empty_ways > 0,
        "no probe met an empty way: the test shows nothing"
    );
    assert_eq!(find(&reader, SKIP, |_| {}), None);
}

/// The share of misses a full set admits is `p`, within five standard deviations of a
/// binomial draw, in one set and over many sets and shards; free slots are taken whatever `p`;
/// hits draw nothing (the rate over misses stays `p` however many hits come between them).
#[test]
fn admission_probability_is_honoured() {
    for policy in [Policy::LruPa, Policy::LfuPa] {
        for p in [0.0, 0.1, 0.5, 0.9, 1.0] {
            for sets in [1u64, 512] {
                let ways = 4;
                let c = RowCache::new(
                    sets * RowCache::budget_for_rows(ways, RB, ways as usize),
                    RB,
                    CacheConfig {
                        policy,
                        admission_probability: p,
                        ways: ways as usize,
                        seed: 11,
                    },
                );
                // fill every set: rows offered until as many were admitted as there are slots
                let mut r = 0u64;
                while c.len() < c.capacity_rows() {
                    c.offer(r, &bytes_of(r));
                    r += 1;
                }
                let (n, before) = (8_000u64, c.stats());
                let (mut admitted, mut hits) = (0u64, 0u64);
                for k in 0..n {
                    let fresh = 1_000_000 + k;
                    if matches!(c.offer(fresh, &bytes_of(fresh)), Offer::Admitted { .. }) {
                        admitted += 1;
                    }
                    // hits between misses: draws must not be spent on them
                    for _ in 0..3 {
                        hits += u64::from(c.get(fresh, |_| ()).is_some());
                    }
                }
                let rate = admitted as f64 / n as f64;
                let sd = (p * (1.0 - p) / n as f64).sqrt();
                assert!(
                    (rate - p).abs() <= 5.0 * sd + 1e-12,
                    "{policy} p = {p}, {sets} sets: admitted {rate}"
                );
                assert_eq!(
                    hits,
                    3 * admitted,
                    "{policy} p = {p}: an admitted row is held"
                );
                let s = c.stats();
                assert_eq!(s.admissions - before.admissions, admitted);
                assert_eq!(s.rejections - before.rejections, n - admitted);
            }
        }
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

/// Bytes of `row` at `version`: the version and the row in the first 8 bytes, then bytes that
/// differ between versions and between rows, so a copy mixing two writes of a slot, or two
/// rows, shows.
fn versioned(row: u64, version: u32, len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..len)
        .map(|i| (row as u8).wrapping_mul(31) ^ (version as u8).wrapping_mul(101) ^ i as u8)
        .collect();
    b[..4].copy_from_slice(&version.to_le_bytes());
    b[4..8].copy_from_slice(&(row as u32).to_le_bytes());
    b
}

/// Reads in place against admissions, evictions and replacements of the same slots: every row
/// read is one whole write of that row (never a mix of two writes, never another row's), and
/// never older than the newest write of it that had finished when the read began. Readers use
/// `get` and the engine's way (a reader held over `set`, `probe` and `row`, with pauses
/// between, so that writers meet it and keep their rows aside); each row has one writer, which
/// publishes a version once its write is done.
#[test]
fn reads_never_see_a_torn_or_stale_row() {
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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
    // the newest version of each row whose write has finished (0: none yet)
    let done: Arc<Vec<AtomicU32>> = Arc::new((0..ROWS).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let (deferred, hits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let check = move |row: u64, newest: u32, bytes: &[u8]| {
        assert_eq!(bytes.len(), LEN);
        let version = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        assert!(
            bytes == &versioned(row, version, LEN)[..],
            "row {row}: a torn or foreign copy"
        );
        assert!(
            version >= newest,
            "row {row}: version {version} read after version {newest} was written"
        );
    };
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let (c, stop, done) = (Arc::clone(&cache), Arc::clone(&stop), Arc::clone(&done));
            let deferred = Arc::clone(&deferred);
            std::thread::spawn(move || {
                let mut x = t + 7;
                while !stop.load(Ordering::Relaxed) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // writer t owns the rows r with r % 2 == t
                    let r = (x >> 33) % (ROWS / 2) * 2 + t;
                    let version = done[r as usize].load(Ordering::Relaxed) + 1;
                    let bytes = versioned(r, version, LEN);
                    // admissions evict (ROWS rows, 64 slots); replacements rewrite in place
                    let written = if x & 1 == 0 {
                        let offer = c.offer(r, &bytes);
                        deferred.fetch_add(u64::from(offer == Offer::Deferred), Ordering::Relaxed);
                        matches!(offer, Offer::Admitted { .. })
                    } else {
                        c.replace(r, &bytes)
                    };
                    if written {
                        done[r as usize].store(version, Ordering::Release);
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (c, done) = (Arc::clone(&cache), Arc::clone(&done));
            let hits = Arc::clone(&hits);
            std::thread::spawn(move || {
                let mut x = t + 1;
                for i in 0..200_000u64 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = (x >> 33) % ROWS;
                    let newest = done[r as usize].load(Ordering::Acquire);
                    if i % 2 == 0 {
                        let hit = c.get(r, |b| check(r, newest, b)).is_some();
                        hits.fetch_add(u64::from(hit), Ordering::Relaxed);
                        continue;
                    }
                    let reader = c.reader();
                    let pause = |step: usize| {
                        if i % 8 == 1 + 2 * step as u64 {
                            std::thread::yield_now();
                        }
                    };
                    if let Some(bytes) = find(&reader, r, pause) {
                        check(r, newest, bytes);
                        hits.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    readers.into_iter().for_each(|t| t.join().unwrap());
    stop.store(true, Ordering::Relaxed);
    writers.into_iter().for_each(|t| t.join().unwrap());
    let (hits, deferred) = (
        hits.load(Ordering::Relaxed),
        deferred.load(Ordering::Relaxed),
    );
    assert!(
        hits > 1000 && deferred > 10,
        "the readers hardly hit ({hits}) or writers never met a reader ({deferred} rows kept \
         aside): the test checked little"
    );
}

/// A row offered while a reader holds the cache is kept aside, not written under the reader,
/// and lands when the last reader leaves; once the room aside is full, an offer waits for the
/// readers to leave rather than drop rows or write under them.
#[test]
fn rows_offered_under_a_reader_land_when_it_leaves() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    const ROWS: u64 = 1 << 16;
    // a slot for every row, placed by number: nothing is evicted, so every row offered stays
    let c = Arc::new(
        RowCache::new(
            RowCache::budget_for_rows(ROWS, RB, 16),
            RB,
            CacheConfig::default(),
        )
        .with_rows(ROWS),
    );
    let reader = c.reader();
    assert_eq!(c.offer(5, &bytes_of(5)), Offer::Deferred);
    assert!(find(&reader, 5, |_| ()).is_none());
    drop(reader);
    assert_eq!(c.get(5, |b| b.to_vec()), Some(bytes_of(5).to_vec()));
    assert_eq!(c.stats().admissions, 1);

    // another thread holds a reader until a timer lets it go; offers fill the room aside, and
    // the one that finds it full returns only after the reader has left
    let released = Arc::new(AtomicBool::new(false));
    let (held_tx, held_rx) = mpsc::channel();
    let holder = {
        let (c, released) = (Arc::clone(&c), Arc::clone(&released));
        std::thread::spawn(move || {
            let reader = c.reader();
            held_tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
            released.store(true, Ordering::SeqCst);
            drop(reader);
        })
    };
    held_rx.recv().unwrap();
    let mut row = 1_000u64;
    while c.offer(row, &bytes_of(row)) == Offer::Deferred {
        row += 1;
        assert!(row < ROWS, "the room aside never filled");
    }
    assert!(
        released.load(Ordering::SeqCst),
        "an offer with no room aside wrote while a reader held the cache"
    );
    holder.join().unwrap();
    for r in 1_000..=row {
        assert_eq!(
            c.get(r, |b| b.to_vec()),
            Some(bytes_of(r).to_vec()),
            "row {r} was lost"
        );
    }
}

/// A cache with a slot for every row of its table, told so, holds every row offered at once
/// (rows placed by number: no set overflows); one placing by hash drops some of them.
#[test]
fn a_cache_told_its_rows_holds_them_all() {
    for (rows, ways) in [(3_000u64, 4usize), (1_000, 16), (5, 1), (77, 8)] {
        let budget = RowCache::budget_for_rows(rows, RB, ways);
        let config = CacheConfig {
            ways,
            policy: Policy::Lru,
            ..CacheConfig::default()
        };
        let told = RowCache::new(budget, RB, config).with_rows(rows);
        let hashed = RowCache::new(budget, RB, config);
        for r in 0..rows {
            assert!(matches!(
                told.offer(r, &bytes_of(r)),
                Offer::Admitted { evicted: None }
            ));
            hashed.offer(r, &bytes_of(r));
        }
        for r in 0..rows {
            assert_eq!(
                told.get(r, <[u8]>::to_vec),
                Some(bytes_of(r).to_vec()),
                "row {r}"
            );
        }
        assert_eq!(told.len(), rows);
        // a row beyond them (outside the contract) is still cached, not a panic
        let beyond = rows + 10 * told.capacity_rows();
        told.offer(beyond, &bytes_of(beyond));
        assert!(told.get(beyond, |_| ()).is_some());
        if rows > 100 {
            assert!(hashed.stats().evictions > 0, "{rows} rows, {ways} ways");
        }
        // rows beyond the count it was told still work, placed as hashed caches place them
        let small = RowCache::new(budget, RB, config).with_rows(rows + told.capacity_rows());
        assert!(matches!(
            small.offer(rows, &bytes_of(rows)),
            Offer::Admitted { .. }
        ));
        assert!(small.get(rows, |_| ()).is_some());
    }
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
            prop_assert_eq!(hot.get_prefetched(hot.prefetch(r), r), Some(&bytes_of(r)[..]));
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
