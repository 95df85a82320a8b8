//! Keyed tables on every tier: lookups by raw 64-bit key pool the keys' rows as a map of keys
//! to rows says, on the DRAM tier and on the SSD tier behind its DRAM tiers, in every pooling
//! mode; unknown keys answer by their policy (an error naming the position, the zero row, an
//! init row), counted; the index's memory is checked before it is built.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use nearrec_engine::{
    Bags, Batch, Engine, EngineConfig, EngineError, Indices, KeyPolicy, PoolingMode, TableLookup,
    Tier, Unknown,
};
use nearrec_format::{DType, StoreReader};
use nearrec_testkit::{Xorshift, pattern, write_keyed_store};

const KEYS: usize = 2000;
const DIM: usize = 8;

/// Distinct keys spread over the whole 64-bit range (negative as `i64` too).
fn keys() -> Vec<u64> {
    let mut rng = Xorshift::new(5);
    let mut seen = std::collections::HashSet::new();
    let mut keys = Vec::new();
    while keys.len() < KEYS {
        let k = rng.next_u64();
        if seen.insert(k) {
            keys.push(k);
        }
    }
    keys
}

fn store(dir: &Path) -> PathBuf {
    write_keyed_store(
        dir.join("store"),
        "ids",
        &keys(),
        DIM as u32,
        DType::Fp32,
        pattern,
    )
}

/// Each key's row, as the store was written.
fn model() -> HashMap<u64, Vec<f32>> {
    keys()
        .into_iter()
        .enumerate()
        .map(|(r, k)| {
            let row = (0..DIM).map(|j| pattern(0, (r * DIM + j) as u64)).collect();
            (k, row)
        })
        .collect()
}

fn engine(path: &Path, tier: Tier, budget: Option<u64>, unknown: Unknown) -> Engine {
    let config = EngineConfig {
        threads: 2,
        tier,
        dram_budget_bytes: budget,
        keyed: KeyPolicy {
            unknown,
            ..KeyPolicy::default()
        },
        ..EngineConfig::default()
    };
    Engine::from_reader(&StoreReader::open(path).unwrap(), config, None).unwrap()
}

/// Pools bags of `keys` (split by `lengths`) from `row_of` as `nn.EmbeddingBag` would.
fn reference(
    keys: &[i64],
    lengths: &[i64],
    weights: Option<&[f32]>,
    mode: PoolingMode,
    row_of: impl Fn(u64) -> Vec<f32>,
) -> Vec<f32> {
    let mut out = Vec::new();
    let mut at = 0;
    for &n in lengths {
        let rows: Vec<Vec<f32>> = (at..at + n as usize)
            .map(|p| row_of(keys[p] as u64))
            .collect();
        let mut bag = vec![
            if mode == PoolingMode::Max {
                f32::NEG_INFINITY
            } else {
                0.0
            };
            DIM
        ];
        for (i, row) in rows.iter().enumerate() {
            for j in 0..DIM {
                bag[j] = match (mode, weights) {
                    (PoolingMode::Max, _) => bag[j].max(row[j]),
                    (_, Some(w)) => w[at + i].mul_add(row[j], bag[j]),
                    (_, None) => bag[j] + row[j],
                };
            }
        }
        if rows.is_empty() {
            bag.fill(0.0);
        } else if mode == PoolingMode::Mean {
            bag.iter_mut().for_each(|v| *v /= rows.len() as f32);
        }
        out.extend(bag);
        at += n as usize;
    }
    out
}

/// A batch of skewed keys (so that caches hit) in bags of 0–6, with `unknown` of them not in
/// the table.
fn batch(seed: u64, unknown: usize) -> (Vec<i64>, Vec<i64>) {
    let keys = keys();
    let mut rng = Xorshift::new(seed);
    let lengths: Vec<i64> = (0..64).map(|_| rng.below(7) as i64).collect();
    let n = lengths.iter().sum::<i64>() as usize;
    let mut ids: Vec<i64> = (0..n)
        .map(|_| keys[(rng.below(40) * rng.below(50)) as usize] as i64)
        .collect();
    for _ in 0..unknown.min(n) {
        let p = rng.below(n as u64) as usize;
        ids[p] = (rng.next_u64() | 1) as i64; // odd keys: keys() holds none of these by chance
    }
    (ids, lengths)
}

fn lookup(
    e: &Engine,
    ids: &[i64],
    lengths: &[i64],
    weights: Option<&[f32]>,
    mode: PoolingMode,
) -> Result<Vec<f32>, EngineError> {
    let mut t = TableLookup::new(
        "ids",
        Indices::I64(ids),
        Bags::Lengths(Indices::I64(lengths)),
    )
    .with_mode(mode);
    if let Some(w) = weights {
        t = t.with_weights(w);
    }
    e.lookup(&Batch::new(vec![t])).map(|(_, out)| out)
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "at {i}: {x} vs {y}"
        );
    }
}

fn tiers(path: &Path, unknown: Unknown) -> Vec<Engine> {
    let row = (DIM * 4) as u64;
    vec![
        engine(path, Tier::Dram, None, unknown),
        engine(path, Tier::Ssd, None, unknown),
        // a quarter of the rows' bytes beside the index: hits and misses
        engine(
            path,
            Tier::Ssd,
            Some(nearrec_cache::KeyIndex::bytes_for(KEYS as u64) + KEYS as u64 * row / 4),
            unknown,
        ),
    ]
}

#[test]
fn keyed_lookups_pool_the_keys_rows_on_every_tier_and_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let path = store(tmp.path());
    let m = model();
    for e in tiers(&path, Unknown::Error) {
        for seed in 0..4 {
            let (ids, lengths) = batch(seed, 0);
            let w: Vec<f32> = (0..ids.len()).map(|i| 0.25 + i as f32 * 0.01).collect();
            for (mode, weights) in [
                (PoolingMode::Sum, None),
                (PoolingMode::Sum, Some(&w[..])),
                (PoolingMode::Mean, None),
                (PoolingMode::Max, None),
            ] {
                let got = lookup(&e, &ids, &lengths, weights, mode).unwrap();
                close(
                    &got,
                    &reference(&ids, &lengths, weights, mode, |k| m[&k].clone()),
                );
            }
        }
        let report = e.key_report();
        assert_eq!(report.len(), 1);
        assert_eq!(report[0].keys, KEYS as u64);
        assert!(report[0].bytes_per_key <= 16.0, "{report:?}");
        assert!(report[0].hits > 0 && report[0].unknown_refused == 0);
    }
}

#[test]
fn an_unknown_key_is_named_by_position_or_answers_zeros_or_its_init_row() {
    let tmp = tempfile::tempdir().unwrap();
    let path = store(tmp.path());
    let m = model();
    let (ids, lengths) = batch(9, 12);
    let unknown = ids
        .iter()
        .filter(|k| !m.contains_key(&(**k as u64)))
        .count();
    assert!(unknown > 0);
    let first = ids
        .iter()
        .position(|k| !m.contains_key(&(*k as u64)))
        .unwrap();
    for e in tiers(&path, Unknown::Error) {
        let err = lookup(&e, &ids, &lengths, None, PoolingMode::Sum).unwrap_err();
        match err {
            EngineError::UnknownKey {
                ref table,
                position,
                key,
            } => {
                assert_eq!((table.as_str(), position, key), ("ids", first, ids[first]));
            }
            other => panic!("{other}"),
        }
        assert_eq!(e.key_report()[0].unknown_refused, 1);
    }
    let zero = vec![0f32; DIM];
    for e in tiers(&path, Unknown::Zero) {
        for mode in [PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Max] {
            let got = lookup(&e, &ids, &lengths, None, mode).unwrap();
            let row = |k: u64| m.get(&k).cloned().unwrap_or_else(|| zero.clone());
            close(&got, &reference(&ids, &lengths, None, mode, row));
        }
        assert_eq!(e.key_report()[0].unknown_zero, 3 * unknown as u64);
    }
    let init = |k: u64| {
        let mut row = vec![0f32; DIM];
        let p = KeyPolicy::default();
        nearrec_cache::init_row(p.seed, p.init_scale, k, &mut row);
        row
    };
    let w: Vec<f32> = (0..ids.len()).map(|i| 1.0 - i as f32 * 0.003).collect();
    for e in tiers(&path, Unknown::Init) {
        for (mode, weights) in [
            (PoolingMode::Sum, Some(&w[..])),
            (PoolingMode::Mean, None),
            (PoolingMode::Max, None),
        ] {
            let got = lookup(&e, &ids, &lengths, weights, mode).unwrap();
            let row = |k: u64| m.get(&k).cloned().unwrap_or_else(|| init(k));
            close(&got, &reference(&ids, &lengths, weights, mode, row));
        }
        assert_eq!(e.key_report()[0].unknown_init, 3 * unknown as u64);
        // rows read by key are the keys' rows, an unknown one its init row
        let some: Vec<i64> = ids[..10].to_vec();
        let mut out = vec![0f32; some.len() * DIM];
        e.read_rows(0, &some, &mut out).unwrap();
        let want: Vec<f32> = some
            .iter()
            .flat_map(|&k| {
                m.get(&(k as u64))
                    .cloned()
                    .unwrap_or_else(|| init(k as u64))
            })
            .collect();
        close(&out, &want);
    }
}

#[test]
fn padding_is_refused_and_the_index_must_fit_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let path = store(tmp.path());
    let e = engine(&path, Tier::Dram, None, Unknown::Zero);
    let ids = [1i64, 2];
    let t = TableLookup::new(
        "ids",
        Indices::I64(&ids),
        Bags::Fixed {
            batch: 1,
            bag_size: 2,
        },
    )
    .with_padding_idx(0);
    let err = e.lookup(&Batch::new(vec![t])).unwrap_err().to_string();
    assert!(
        err.contains("padding_idx") && err.contains("\"ids\""),
        "{err}"
    );
    let config = EngineConfig {
        tier: Tier::Ssd,
        dram_budget_bytes: Some(1024),
        ..EngineConfig::default()
    };
    let err = Engine::from_reader(&StoreReader::open(&path).unwrap(), config, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("indexes take") && err.contains("1024"),
        "{err}"
    );
}

#[test]
fn a_key_given_two_rows_or_a_row_two_keys_is_a_corrupted_store() {
    // the writer refuses repeated keys; a keys file changed on disk (its checksum with it) is
    // caught where the index is built
    let tmp = tempfile::tempdir().unwrap();
    let path = write_keyed_store(
        tmp.path().join("s"),
        "ids",
        &[4, 9, 7],
        2,
        DType::Fp32,
        pattern,
    );
    for (entries, want) in [
        (
            [(4u64, 1u32), (9, 2), (4, 3)],
            "key 4 is given to rows 1 and 3",
        ),
        (
            [(4, 1), (9, 2), (7, 2)],
            "row 2 is given to two keys (one is 7)",
        ),
    ] {
        let mut manifest = StoreReader::open(&path).unwrap().manifest().clone();
        let keys = manifest.tables[0].keys.as_mut().unwrap();
        let bytes: Vec<u8> = entries
            .iter()
            .flat_map(|(k, r)| [k.to_le_bytes().as_slice(), r.to_le_bytes().as_slice()].concat())
            .collect();
        std::fs::write(path.join(&keys.file), &bytes).unwrap();
        keys.crc32c = crc32c::crc32c(&bytes);
        manifest.publish(&path).unwrap();
        let config = EngineConfig::default();
        let err =
            Engine::from_reader(&StoreReader::open(&path).unwrap(), config, None).unwrap_err();
        assert!(
            matches!(
                &err,
                EngineError::Format(nearrec_format::FormatError::Corrupted { .. })
            ) && err.to_string().contains(want),
            "{err}"
        );
    }
}

#[test]
fn a_batch_large_enough_to_resolve_on_the_workers_answers_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let path = store(tmp.path());
    let m = model();
    let keys = keys();
    let mut rng = Xorshift::new(77);
    let ids: Vec<i64> = (0..30_000)
        .map(|_| keys[rng.below(KEYS as u64) as usize] as i64)
        .collect();
    let lengths = vec![30i64; 1000];
    for e in tiers(&path, Unknown::Error) {
        let got = lookup(&e, &ids, &lengths, None, PoolingMode::Sum).unwrap();
        close(
            &got,
            &reference(&ids, &lengths, None, PoolingMode::Sum, |k| m[&k].clone()),
        );
        // a key not held, late in the batch (in another task's chunk): named at its position
        let mut bad = ids.clone();
        bad[29_001] = 3; // odd: keys() holds it only by a 2^-60 chance
        match lookup(&e, &bad, &lengths, None, PoolingMode::Sum).unwrap_err() {
            EngineError::UnknownKey { position, key, .. } => {
                assert_eq!((position, key), (29_001, 3))
            }
            other => panic!("{other}"),
        }
    }
}
