//! A live store's delta on the read path: at any snapshot, on every tier (DRAM, SSD plain, SSD
//! behind a row cache, a hot partition and a resident table), a lookup pools each row as the
//! delta's history says it was at the snapshot's version — written rows with their new values,
//! removed rows as zero rows — and every other row from the table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nearrec_cache::{CacheConfig, Policy};
use nearrec_engine::delta::{DeltaView, TableDelta};
use nearrec_engine::{Bags, Batch, Engine, EngineConfig, Indices, PoolingMode, TableLookup, Tier};
use nearrec_format::DType;
use nearrec_plan::{Placement, TablePlacement};
use proptest::prelude::*;

const ROWS: u64 = 500;
/// Table `b`'s `padding_idx`: a row that is written often (the lookups skip it all the same).
const PADDING: u64 = 3;
const TABLES: [(&str, u32, DType); 3] = [
    ("a", 16, DType::Fp32),
    ("b", 8, DType::Fp16),
    ("c", 12, DType::Int8),
];

fn store(dir: &Path) -> PathBuf {
    let tables = TABLES.map(|(name, dim, dtype)| (name, ROWS, dim, dtype));
    nearrec_testkit::write_store(dir.join("store"), &tables, nearrec_testkit::pattern)
}

fn configs() -> Vec<(&'static str, EngineConfig)> {
    let tp = |hot: u64, cache: u64, resident: bool| TablePlacement {
        hot_rows: (0..hot).map(|r| r * 7).collect(),
        cache_bytes: cache,
        resident,
    };
    let ssd = |placement: Option<Placement>| EngineConfig {
        tier: Tier::Ssd,
        threads: 2,
        inline_lookups: 0,
        placement,
        cache: CacheConfig {
            policy: Policy::Lru,
            ways: 4,
            ..CacheConfig::default()
        },
        ..EngineConfig::default()
    };
    let tiers = Placement {
        tables: BTreeMap::from([
            ("a".to_owned(), tp(30, 64 << 10, false)),
            ("b".to_owned(), tp(0, 0, true)),
            ("c".to_owned(), tp(0, 16 << 10, false)),
        ]),
    };
    vec![
        (
            "dram",
            EngineConfig {
                tier: Tier::Dram,
                threads: 2,
                inline_lookups: 0,
                task_lookups: 16,
                ..EngineConfig::default()
            },
        ),
        ("ssd", ssd(None)),
        ("ssd + hot, cache, resident", ssd(Some(tiers))),
    ]
}

/// Per table, per row, its history: `(version, Some(encoded) | None = removed)`.
type History = Vec<BTreeMap<u64, Vec<(u64, Option<Vec<u8>>)>>>;

/// What row `r` of table `t` decodes to at `version` (base rows from `base`).
fn row_at(history: &History, base: &[Vec<f32>], t: usize, r: u64, version: u64) -> Vec<f32> {
    let (_, dim, dtype) = TABLES[t];
    let entry = history[t]
        .get(&r)
        .and_then(|e| e.iter().rev().find(|(v, _)| *v <= version));
    match entry {
        Some((_, Some(bytes))) => {
            let mut out = vec![0f32; dim as usize];
            dtype.decode_row(bytes, &mut out);
            out
        }
        Some((_, None)) => vec![0f32; dim as usize],
        None => base[t][(r * u64::from(dim)) as usize..][..dim as usize].to_vec(),
    }
}

struct Sample {
    indices: Vec<i64>,
    offsets: Vec<i64>,
    weights: Vec<f32>,
}

fn request(s: &Sample) -> Batch<'_> {
    Batch::new(
        TABLES
            .iter()
            .enumerate()
            .map(|(t, &(name, _, _))| {
                let req = TableLookup::new(
                    name,
                    Indices::I64(&s.indices),
                    Bags::Offsets {
                        offsets: Indices::I64(&s.offsets),
                        include_last_offset: false,
                    },
                );
                match t {
                    0 => req.with_weights(&s.weights),
                    1 => req
                        .with_mode(PoolingMode::Mean)
                        .with_padding_idx(PADDING as i64),
                    _ => req.with_mode(PoolingMode::Max),
                }
            })
            .collect(),
    )
}

/// The model's pooled output of `s` at `version`.
fn model(history: &History, base: &[Vec<f32>], s: &Sample, version: u64) -> Vec<f32> {
    let width: usize = TABLES.iter().map(|t| t.1 as usize).sum();
    let bags = s.offsets.len();
    let mut out = vec![0f32; bags * width];
    let mut col = 0;
    for (t, &(_, dim, _)) in TABLES.iter().enumerate() {
        let dim = dim as usize;
        for b in 0..bags {
            let lo = s.offsets[b] as usize;
            let hi = s
                .offsets
                .get(b + 1)
                .map_or(s.indices.len(), |&o| o as usize);
            let cell = &mut out[b * width + col..][..dim];
            let rows: Vec<(usize, Vec<f32>)> = (lo..hi)
                .filter(|&p| t != 1 || s.indices[p] as u64 != PADDING)
                .map(|p| (p, row_at(history, base, t, s.indices[p] as u64, version)))
                .collect();
            if rows.is_empty() {
                continue;
            }
            for j in 0..dim {
                cell[j] = match t {
                    0 => rows.iter().map(|(p, r)| s.weights[*p] * r[j]).sum(),
                    1 => rows.iter().map(|(_, r)| r[j]).sum::<f32>() / rows.len() as f32,
                    _ => rows
                        .iter()
                        .map(|(_, r)| r[j])
                        .fold(f32::NEG_INFINITY, f32::max),
                };
            }
        }
        col += dim;
    }
    out
}

#[derive(Debug, Clone)]
enum Step {
    /// Table, row, `Some(seed)`: written with values from the seed; `None`: removed.
    Change(usize, u64, Option<u16>),
    /// A lookup at version `len - k` (k of the versions back, clamped).
    Look(u64, u64),
}

fn step() -> impl Strategy<Value = Step> {
    let row = prop_oneof![0u64..20, 0..ROWS]; // some rows written again and again
    prop_oneof![
        3 => (0usize..3, row, any::<Option<u16>>()).prop_map(|(t, r, s)| Step::Change(t, r, s)),
        1 => (any::<u64>(), 0u64..4).prop_map(|(seed, back)| Step::Look(seed, back)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn lookups_read_the_delta_at_their_version_on_every_tier(
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = store(dir.path());
        let engines: Vec<(&str, Engine)> = configs()
            .into_iter()
            .map(|(name, c)| (name, Engine::open(&path, c, None).unwrap()))
            .collect();
        let base: Vec<Vec<f32>> = (0..TABLES.len())
            .map(|t| {
                let rows: Vec<i64> = (0..ROWS as i64).collect();
                let mut out = vec![0f32; (ROWS * u64::from(TABLES[t].1)) as usize];
                engines[0].1.read_rows(t, &rows, &mut out).unwrap();
                out
            })
            .collect();
        let deltas: Vec<Option<Arc<TableDelta>>> = TABLES
            .iter()
            .map(|&(_, dim, dtype)| Some(Arc::new(TableDelta::new(dtype.row_bytes(dim) as usize, ROWS, 64))))
            .collect();
        let mut history: History = vec![BTreeMap::new(); TABLES.len()];
        let mut version = 0u64;
        for s in steps {
            match s {
                Step::Change(t, r, seed) => {
                    version += 1;
                    let (_, dim, dtype) = TABLES[t];
                    let bytes = seed.map(|seed| {
                        let values: Vec<f32> = (0..dim)
                            .map(|j| f32::from(seed % 97) * 0.01 - j as f32 * 0.02)
                            .collect();
                        let mut b = vec![0u8; dtype.row_bytes(dim) as usize];
                        dtype.encode_row(&values, &mut b);
                        b
                    });
                    // no pruning: every version stays readable
                    deltas[t].as_ref().unwrap().insert(version, r, bytes.as_deref(), 0);
                    history[t].entry(r).or_default().push((version, bytes));
                }
                Step::Look(seed, back) => {
                    let at = version.saturating_sub(back);
                    let mut rng = nearrec_testkit::Xorshift::new(seed);
                    let mut next = move || rng.next_u64();
                    let (mut indices, mut offsets) = (Vec::new(), Vec::new());
                    for _ in 0..6 {
                        offsets.push(indices.len() as i64);
                        for _ in 0..next() % 6 {
                            let r = if next() % 2 == 0 { next() % 20 } else { next() % ROWS };
                            indices.push(r as i64);
                        }
                    }
                    let weights = (0..indices.len()).map(|i| 0.5 + (i % 3) as f32).collect();
                    let sample = Sample { indices, offsets, weights };
                    let want = model(&history, &base, &sample, at);
                    let req = request(&sample);
                    for (name, engine) in &engines {
                        let prepared = engine.prepare(&req).unwrap();
                        let mut got = vec![0f32; want.len()];
                        engine
                            .execute_at(&req, &prepared, &mut got, DeltaView::new(&deltas, &[], 0, at))
                            .unwrap();
                        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                            prop_assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0),
                                         "{}: version {} cell {}: {} vs {}", name, at, k, g, w);
                        }
                    }
                }
            }
        }
    }
}
