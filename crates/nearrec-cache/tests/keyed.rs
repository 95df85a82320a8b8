//! Keyed tables against a `HashMap` model, their pooling against a plain loop, and their inserts
//! under many threads: each key ends up with exactly one row, and every reader sees that row.

use std::collections::HashMap;
use std::sync::Arc;

use nearrec_cache::{KeyedConfig, KeyedError, KeyedTable, Pool, Unknown};
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
    #[test]
    fn behaves_like_a_hash_map(
        ops in prop::collection::vec((prop_oneof![0i64..40, any::<i64>()], any::<bool>()), 1..300)
    ) {
        let t = table(512, Unknown::Error);
        let mut model: HashMap<i64, Vec<f32>> = HashMap::new();
        for (n, &(key, write)) in ops.iter().enumerate() {
            if write {
                let v = vec![n as f32, key as f32, -1.0];
                let inserted = t.assign(key, &v).unwrap();
                prop_assert_eq!(inserted, model.insert(key, v).is_none());
            }
            prop_assert_eq!(row_of(&t, key), model.get(&key).cloned());
        }
        prop_assert_eq!(t.len(), model.len() as u64);
        for (k, v) in &model {
            prop_assert_eq!(row_of(&t, *k), Some(v.clone()));
        }
    }
}

#[test]
fn pools_like_a_plain_loop_under_each_policy() {
    let keys = [5i64, -7, 5, 1 << 40, 3, -7, 99];
    let bounds = [0usize, 3, 3, 7];
    let weights = [0.5f32, 2.0, 1.0, -1.0, 0.25, 1.0, 3.0];
    for unknown in [Unknown::Error, Unknown::Zero, Unknown::Init] {
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
            Unknown::Zero => assert_eq!((s.unknown_zero, s.keys), (4, 4)),
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
