//! Coalescing held to the batches run alone: random small batches of one shape (any bag
//! encoding, either index width, every pooling mode, weights, padding) pooled as one batch and
//! split answer what each answers by itself, on the DRAM and SSD tiers; batches that
//! differ in shape or are malformed do not coalesce.

use nearrec::prelude::*;
use std::path::Path;

use nearrec::{
    AsBatch, IndexVec, OwnedBags, OwnedBatch, OwnedLookup, PoolingMode, Shape, Store, StoreConfig,
    coalesce,
};
use nearrec_format::DType;
use proptest::prelude::*;

const ROWS: u64 = 300;
const DIM: u32 = 4;
const TABLES: [&str; 2] = ["a", "b"];

fn open(dir: &Path, tier: &str) -> Store {
    let path = dir.join("store");
    if !path.exists() {
        let tables = TABLES.map(|name| (name, ROWS, DIM, DType::Fp32));
        nearrec_testkit::write_store(&path, &tables, nearrec_testkit::pattern);
    }
    Store::open(
        &path,
        &StoreConfig::from_toml(&format!("tier = \"{tier}\"")).unwrap(),
    )
    .unwrap()
}

/// How a part's bags are written.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    Lengths,
    Offsets,
    OffsetsWithLast,
    Fixed,
}

/// The shape every part of one case shares.
#[derive(Debug, Clone)]
struct Kind {
    mode: PoolingMode,
    weights: bool,
    padding: Option<i64>,
}

fn kind() -> impl Strategy<Value = Kind> {
    (0..3usize, any::<bool>(), prop::option::of(-3i64..3)).prop_map(|(m, w, padding)| {
        let mode = [PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Max][m];
        Kind {
            mode,
            weights: w && mode == PoolingMode::Sum,
            padding,
        }
    })
}

/// One part: per table `bags` bags (each of `size` ids when fixed, 0–4 otherwise).
fn part(kind: Kind) -> impl Strategy<Value = OwnedBatch> {
    (
        0..4usize,
        0..5usize,
        any::<bool>(),
        0..3usize,
        prop::collection::vec(0..5usize, 8),
        prop::collection::vec(0..ROWS as i64, 40),
    )
        .prop_map(move |(enc, bags, narrow, size, lens, ids)| {
            let encoding = [
                Encoding::Lengths,
                Encoding::Offsets,
                Encoding::OffsetsWithLast,
                Encoding::Fixed,
            ][enc];
            let tables = TABLES
                .iter()
                .enumerate()
                .map(|(t, name)| {
                    let lengths: Vec<usize> = match encoding {
                        Encoding::Fixed => vec![size; bags],
                        _ => (0..bags).map(|b| lens[(b + t) % lens.len()]).collect(),
                    };
                    let n: usize = lengths.iter().sum();
                    let rows: Vec<i64> = (0..n).map(|i| ids[(i * 3 + t) % ids.len()]).collect();
                    let ix = |v: Vec<i64>| -> IndexVec {
                        if narrow {
                            IndexVec::I32(v.iter().map(|&i| i as i32).collect())
                        } else {
                            IndexVec::I64(v)
                        }
                    };
                    let mut starts = vec![0i64];
                    for l in &lengths {
                        starts.push(starts.last().unwrap() + *l as i64);
                    }
                    let bags = match encoding {
                        Encoding::Lengths => {
                            OwnedBags::Lengths(ix(lengths.iter().map(|&l| l as i64).collect()))
                        }
                        Encoding::Offsets => OwnedBags::Offsets {
                            offsets: ix(starts[..bags].to_vec()),
                            include_last_offset: false,
                        },
                        Encoding::OffsetsWithLast => OwnedBags::Offsets {
                            offsets: ix(starts),
                            include_last_offset: true,
                        },
                        Encoding::Fixed => OwnedBags::Fixed {
                            batch: bags,
                            bag_size: size,
                        },
                    };
                    OwnedLookup {
                        table: (*name).to_owned(),
                        indices: ix(rows),
                        bags,
                        per_sample_weights: kind
                            .weights
                            .then(|| (0..n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect()),
                        mode: kind.mode,
                        padding_idx: kind.padding,
                    }
                })
                .collect();
            OwnedBatch::new(tables)
        })
}

fn case() -> impl Strategy<Value = Vec<OwnedBatch>> {
    kind().prop_flat_map(|k| prop::collection::vec(part(k), 2..6))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn coalesced_batches_answer_what_each_answers_alone(parts in case()) {
        let dir = tempfile::tempdir().unwrap();
        for tier in ["dram", "ssd"] {
            let store = open(dir.path(), tier);
            let refs: Vec<&OwnedBatch> = parts.iter().collect();
            let merged = coalesce(&refs).expect("parts of one shape coalesce");
            prop_assert_eq!(merged.bags.len(), parts.len());
            let pooled = store.lookup(&merged.batch.as_batch()).unwrap();
            for (k, (got, part)) in pooled.0.split(&merged.bags).into_iter().zip(&parts).enumerate() {
                let alone = store.lookup(&part.as_batch()).unwrap();
                prop_assert_eq!((got.batch, &got.tables), (alone.0.batch, &alone.0.tables));
                // the SSD tier adds a bag's rows as their reads land: equal up to rounding
                let close = got.values.iter().zip(&alone.0.values)
                    .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0));
                prop_assert!(close, "part {} on {}: {:?} != {:?}", k, tier, got.values, alone.0.values);
            }
        }
    }
}

fn lengths(table: &str, ids: Vec<i64>, lengths: Vec<i64>) -> OwnedLookup {
    OwnedLookup::with_lengths(table, ids, lengths)
}

#[test]
fn batches_of_other_shapes_or_malformed_do_not_coalesce() {
    let good = OwnedBatch::new(vec![lengths("a", vec![1, 2], vec![2])]);
    let one = [&good];
    assert!(
        coalesce(&one).is_none(),
        "one part has nothing to merge with"
    );
    let other_table = OwnedBatch::new(vec![lengths("b", vec![1, 2], vec![2])]);
    assert!(coalesce(&[&good, &other_table]).is_none());
    let other_mode = OwnedBatch::new(vec![
        lengths("a", vec![1, 2], vec![2]).mode(PoolingMode::Mean),
    ]);
    assert_ne!(Shape::of(&good), Shape::of(&other_mode));
    assert!(coalesce(&[&good, &other_mode]).is_none());
    // lengths that miss an id, a negative length, tables with different bag counts
    let short = OwnedBatch::new(vec![lengths("a", vec![1, 2], vec![1])]);
    let negative = OwnedBatch::new(vec![lengths("a", vec![1, 2], vec![3, -1])]);
    let ragged = OwnedBatch::new(vec![
        lengths("a", vec![1, 2], vec![2]),
        lengths("a", vec![1, 2], vec![1, 1]),
    ]);
    let ragged_too = OwnedBatch::new(vec![
        lengths("a", vec![1, 2], vec![2]),
        lengths("a", vec![1, 2], vec![2]),
    ]);
    assert!(coalesce(&[&good, &short]).is_none());
    assert!(coalesce(&[&good, &negative]).is_none());
    assert!(coalesce(&[&ragged_too, &ragged]).is_none());
    // ids after the last offset belong to no bag: alone, the engine decides what they mean
    let trailing = OwnedBatch::new(vec![OwnedLookup {
        bags: OwnedBags::Offsets {
            offsets: IndexVec::I64(vec![0, 1]),
            include_last_offset: true,
        },
        ..lengths("a", vec![1, 2], vec![2])
    }]);
    assert!(coalesce(&[&good, &trailing]).is_none());
    assert!(coalesce(&[&good, &good]).is_some());
}
