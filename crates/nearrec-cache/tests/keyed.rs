//! Keyed tables against a `HashMap` model, their pooling against a plain loop, and their inserts
//! under many threads: each key ends up with exactly one row, and every reader sees that row.

use std::collections::HashMap;
use std::sync::Arc;

use nearrec_cache::{KeyedConfig, KeyedError, KeyedTable, Unknown};
use nearrec_kernels::PoolingMode as Pool;
use proptest::prelude::*;

fn table(capacity: u64, unknown: Unknown) -> KeyedTable {
    KeyedTable::new(
        "t",
        KeyedConfig {
            dim: 3,
            capacity,
            unknown,
            init_scale: 0.5,
            seed: 9,
        },
    )
    .unwrap()
}

fn row_of(t: &KeyedTable, key: i64) -> Option<Vec<f32>> {
    t.find(key).map(|r| {
        let mut v = vec![0f32; 3];
        t.read_row(r, &mut v);
        v
    })
}

proptest! {
    /// Writes (one key or several per call), removes and reads against a map.
    #[test]
    fn behaves_like_a_hash_map(
        ops in prop::collection::vec((prop_oneof![0i64..40, any::<i64>()], 0u8..4), 1..300)
    ) {
        let t = table(512, Unknown::Error);
        let mut model: HashMap<i64, Vec<f32>> = HashMap::new();
        for (n, &(key, op)) in ops.iter().enumerate() {
            let v = vec![n as f32, key as f32, -1.0];
            match op {
                0 => {
                    let inserted = t.assign(key, &v).unwrap();
                    prop_assert_eq!(inserted, model.insert(key, v).is_none());
                }
                1 => {
                    // the key twice in one call: the last row wins
                    let w = [v.clone(), vec![0.5; 3]].concat();
                    let inserted = t.write(&[key, key], &w, false).unwrap();
                    prop_assert_eq!(inserted, u64::from(model.insert(key, vec![0.5; 3]).is_none()));
                }
                2 => {
                    let removed = t.remove(&[key, key]);
                    prop_assert_eq!(removed, u64::from(model.remove(&key).is_some()));
                }
                _ => {}
            }
            prop_assert_eq!(row_of(&t, key), model.get(&key).cloned());
            prop_assert_eq!(t.len(), model.len() as u64);
        }
        for (k, v) in &model {
            prop_assert_eq!(row_of(&t, *k), Some(v.clone()));
        }
        let mut held: Vec<i64> = t.entries().into_iter().map(|e| e.0).collect();
        held.sort_unstable();
        let mut want: Vec<i64> = model.keys().copied().collect();
        want.sort_unstable();
        prop_assert_eq!(held, want);
    }
}

#[test]
fn a_removed_key_is_unknown_until_written_again() {
    for unknown in [
        Unknown::Error,
        Unknown::Zero,
        Unknown::Init,
        Unknown::Default,
    ] {
        let t = table(4, unknown);
        t.write(&[7, 8], &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0], false)
            .unwrap();
        assert_eq!(t.remove(&[7, 99]), 1);
        let mut out = vec![0f32; 3];
        let pooled = t.pool(&[7], &[0, 1], None, Pool::Sum, &mut out);
        match unknown {
            Unknown::Error => assert!(matches!(pooled, Err(KeyedError::UnknownKey { key: 7, .. }))),
            // a DRAM table's default row is zeros
            Unknown::Zero | Unknown::Default => assert_eq!(out, [0.0; 3]),
            Unknown::Init => {
                let mut init = vec![0f32; 3];
                t.init_row(7, &mut init);
                assert_eq!(out, init);
            }
        }
        // written again, the key takes a row given back by a removal: the table holds 4 keys
        t.write(&[7], &[3.0; 3], false).unwrap();
        t.write(&[1, 2], &[0.0; 6], false).unwrap();
        assert_eq!(row_of(&t, 7), Some(vec![3.0; 3]));
        assert_eq!(t.len(), 4);
        // a call that needs more room than is left changes nothing
        let err = t.write(&[8, 50], &[9.0; 6], false).unwrap_err();
        assert!(matches!(err, KeyedError::Full { .. }), "{err}");
        assert_eq!(row_of(&t, 8), Some(vec![2.0; 3]));
        let err = t.write(&[8], &[9.0; 4], false).unwrap_err();
        assert!(matches!(err, KeyedError::Invalid { .. }), "{err}");
        let err = t
            .write(&[8, 1], &[0.0, 0.0, 0.0, 1.0, f32::NAN, 1.0], false)
            .unwrap_err();
        assert!(err.to_string().contains("key 1 at position 1"), "{err}");
        assert_eq!(row_of(&t, 1), Some(vec![0.0; 3]));
        t.write(&[1], &[f32::INFINITY; 3], true).unwrap();
    }
}

/// Writers replace rows with constant rows (every value the same) while readers pool them: a
/// reader never sees a row with two values in it.
#[test]
fn readers_never_see_a_torn_row() {
    let t = Arc::new(
        KeyedTable::new(
            "t",
            KeyedConfig {
                dim: 64,
                capacity: 16,
                unknown: Unknown::Error,
                init_scale: 0.0,
                seed: 0,
            },
        )
        .unwrap(),
    );
    let keys: Vec<i64> = (0..8).collect();
    t.write(&keys, &vec![0.0; 8 * 64], false).unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (t, done, keys) = (t.clone(), done.clone(), keys.clone());
            std::thread::spawn(move || {
                let bounds: Vec<usize> = (0..=keys.len()).collect();
                let mut out = vec![0f32; keys.len() * 64];
                let mut n = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || n == 0 {
                    t.pool(&keys, &bounds, None, Pool::Sum, &mut out).unwrap();
                    for row in out.chunks(64) {
                        assert!(row.iter().all(|&v| v == row[0]), "a torn row: {row:?}");
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (t, keys) = (t.clone(), keys.clone());
            std::thread::spawn(move || {
                for k in 0..3000 {
                    let x = (k * 2 + w) as f32;
                    t.write(&keys[k % 8..k % 8 + 1], &[x; 64], false).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

#[test]
fn pools_like_a_plain_loop_under_each_policy() {
    let keys = [5i64, -7, 5, 1 << 40, 3, -7, 99];
    let bounds = [0usize, 3, 3, 7];
    let weights = [0.5f32, 2.0, 1.0, -1.0, 0.25, 1.0, 3.0];
    for unknown in [
        Unknown::Error,
        Unknown::Zero,
        Unknown::Init,
        Unknown::Default,
    ] {
        let t = table(64, unknown);
        for (i, k) in [5i64, -7, 1 << 40, 3].into_iter().enumerate() {
            t.assign(k, &[i as f32 + 1.0, -(i as f32), 0.5 * i as f32])
                .unwrap();
        }
        for (mode, w) in [
            (Pool::Sum, None),
            (Pool::Sum, Some(&weights[..])),
            (Pool::Mean, None),
            (Pool::Max, None),
        ] {
            let mut out = vec![7f32; 9];
            let got = t.pool(&keys, &bounds, w, mode, &mut out);
            if unknown == Unknown::Error {
                // 99 is unknown: the error names it, nothing is inserted
                let err = got.unwrap_err();
                assert_eq!(
                    err,
                    KeyedError::UnknownKey {
                        table: "t".into(),
                        position: 6,
                        key: 99
                    }
                );
                assert_eq!(t.len(), 4);
                continue;
            }
            got.unwrap();
            let mut want = vec![0f32; 9];
            for b in 0..3 {
                let bag = bounds[b]..bounds[b + 1];
                let cell = &mut want[b * 3..b * 3 + 3];
                if mode == Pool::Max && !bag.is_empty() {
                    cell.fill(f32::NEG_INFINITY);
                }
                for k in bag.clone() {
                    let row = row_of(&t, keys[k]).unwrap_or(vec![0.0; 3]);
                    let wk = w.map_or(1.0, |w| w[k]);
                    for j in 0..3 {
                        cell[j] = match mode {
                            Pool::Max => cell[j].max(row[j]),
                            _ => cell[j] + wk * row[j],
                        };
                    }
                }
                if mode == Pool::Mean && !bag.is_empty() {
                    cell.iter_mut().for_each(|a| *a /= bag.len() as f32);
                }
            }
            assert_eq!(out, want, "{unknown:?} {mode:?}");
        }
        let s = t.stats();
        match unknown {
            Unknown::Error => assert_eq!(s.unknown_errors, 4),
            Unknown::Zero | Unknown::Default => assert_eq!((s.unknown_zero, s.keys), (4, 4)),
            Unknown::Init => assert_eq!((s.initialised, s.keys), (1, 5)),
        }
    }
}

#[test]
fn init_depends_on_the_key_alone_and_bad_input_is_refused() {
    let (a, b) = (table(64, Unknown::Init), table(64, Unknown::Init));
    let mut out = vec![0f32; 3 * 4];
    a.pool(&[1, 2, 3, 4], &[0, 1, 2, 3, 4], None, Pool::Sum, &mut out)
        .unwrap();
    b.pool(&[4, 3, 2, 1], &[0, 1, 2, 3, 4], None, Pool::Sum, &mut out)
        .unwrap();
    for k in 1..=4 {
        let row = row_of(&a, k).unwrap();
        assert_eq!(Some(&row), row_of(&b, k).as_ref());
        assert!(row.iter().all(|v| v.abs() <= 0.5) && row.iter().any(|&v| v != 0.0));
    }
    assert_ne!(row_of(&a, 1), row_of(&a, 2));
    let mut out = vec![0f32; 3];
    let bad = |r: Result<(), KeyedError>| matches!(r, Err(KeyedError::Invalid { .. }));
    assert!(bad(a.pool(&[1, 2], &[0, 1], None, Pool::Sum, &mut out)));
    assert!(bad(a.pool(
        &[1],
        &[0, 1],
        Some(&[1.0]),
        Pool::Max,
        &mut out
    )));
    assert!(bad(a.pool(&[1], &[0, 1], None, Pool::Sum, &mut [0.0; 2])));
    assert!(a.assign(1, &[1.0]).is_err());
    assert!(
        KeyedTable::new(
            "x",
            KeyedConfig {
                dim: 0,
                ..*a.config()
            }
        )
        .is_err()
    );
}

#[test]
fn a_full_table_says_so_and_keeps_serving() {
    let t = table(10, Unknown::Init);
    for k in 0..10 {
        t.assign(k * 1000, &[k as f32; 3]).unwrap();
    }
    let mut out = vec![0f32; 3];
    let err = t.pool(&[5], &[0, 1], None, Pool::Sum, &mut out);
    assert!(matches!(err, Err(KeyedError::Full { capacity: 10, .. })));
    t.pool(&[9000], &[0, 1], None, Pool::Sum, &mut out).unwrap();
    assert_eq!(out, vec![9.0; 3]);
    // a removed key's row goes to the next new key: the capacity counts the keys held
    assert_eq!(t.remove(&[0, 42]), 1);
    t.pool(&[5], &[0, 1], None, Pool::Sum, &mut out).unwrap();
    let mut init = vec![0f32; 3];
    t.init_row(5, &mut init);
    assert_eq!((out, t.len(), t.find(0)), (init, 10, None));
    assert!(matches!(
        t.assign(6, &[1.0; 3]),
        Err(KeyedError::Full { .. })
    ));
}

#[test]
fn concurrent_inserts_give_each_key_one_row() {
    let t = Arc::new(table(6000, Unknown::Init));
    let keys: Vec<i64> = (0..5000).map(|k| k * 7919 - 100_000).collect();
    let seen: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|th| {
                let (t, keys) = (&t, &keys);
                s.spawn(move || {
                    // each thread walks the keys in its own order, in batches
                    let mut order = keys.clone();
                    order.rotate_left(th * 1250);
                    if th % 2 == 1 {
                        order.reverse();
                    }
                    let mut rows = HashMap::new();
                    for chunk in order.chunks(97) {
                        let bounds: Vec<usize> = (0..=chunk.len()).collect();
                        let mut out = vec![0f32; chunk.len() * 3];
                        t.pool(chunk, &bounds, None, Pool::Sum, &mut out).unwrap();
                        for (k, row) in chunk.iter().zip(out.chunks(3)) {
                            rows.insert(*k, row.to_vec());
                        }
                    }
                    keys.iter().map(|k| rows[k].clone()).collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(t.len(), 5000);
    let s = t.stats();
    assert_eq!(s.initialised, 5000);
    assert_eq!(s.hits + s.initialised, 4 * 5000);
    for (i, &k) in keys.iter().enumerate() {
        let mut want = vec![0f32; 3];
        t.init_row(k, &mut want);
        assert_eq!(row_of(&t, k), Some(want.clone()));
        for th in &seen {
            assert_eq!(th[i], want, "key {k}");
        }
    }
}

#[test]
fn concurrent_inserts_past_capacity_fill_it_exactly() {
    let t = Arc::new(table(50, Unknown::Error));
    let outcomes: Vec<(i64, bool)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4i64)
            .map(|th| {
                let t = &t;
                s.spawn(move || {
                    (0..100i64)
                        .map(|k| {
                            let key = (k * 4 + th) % 100; // every key tried by every thread
                            (key, t.assign(key, &[key as f32; 3]).is_ok())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(t.len(), 50);
    let held: Vec<i64> = (0..100).filter(|&k| t.find(k).is_some()).collect();
    assert_eq!(held.len(), 50);
    for k in held {
        assert_eq!(row_of(&t, k), Some(vec![k as f32; 3]));
        assert!(outcomes.contains(&(k, true)));
    }
}

#[test]
fn a_capacity_beyond_memory_is_an_error_not_an_abort() {
    let config = KeyedConfig {
        dim: 1 << 20,
        capacity: u64::from(u32::MAX),
        unknown: Unknown::Zero,
        init_scale: 0.5,
        seed: 9,
    };
    match KeyedTable::new("huge", config) {
        Err(KeyedError::InsufficientMemory(short)) => {
            assert!(short.what.contains("huge") && short.asked > 1 << 50);
        }
        other => panic!(
            "expected InsufficientMemory, got {:?}",
            other.map(|t| t.len())
        ),
    }
}
