//! The facade end to end: a store opened from a TOML config on every tier, lookups held to the
//! rows themselves, pipelines (submit, stream, sub-batches) held to plain lookups, a placement
//! from the config applied, and the stored model's `infer` held to the same model built by hand.

use nearrec::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};

use nearrec::{
    Bags, Batch, Error, IndexVec, Indices, OwnedBags, OwnedBatch, OwnedLookup, PlanSource,
    PoolingMode, Store, StoreConfig, TableLookup, Tier,
};
use nearrec_engine::dense::{Activation, DenseModel, Interaction, Linear, Mlp};
use nearrec_format::DType;
use proptest::prelude::*;

const ROWS: u64 = 500;
const DIM: u32 = 8;
const TABLES: [&str; 3] = ["t0", "t1", "t2"];

use nearrec_testkit::pattern as value;

fn store(dir: &Path) -> PathBuf {
    let tables = TABLES.map(|name| (name, ROWS, DIM, DType::Fp32));
    nearrec_testkit::write_store(dir.join("store"), &tables, value)
}

fn configs() -> Vec<StoreConfig> {
    [
        "tier = \"dram\"",
        "tier = \"ssd\"",
        "tier = \"ssd\"\ndram_budget = \"8KiB\"\ncache_policy = \"lru\"",
        "tier = \"ssd\"\ndevice = \"rm-ssd\"",
        "tier = \"auto\"\ndram_budget = 1024",
    ]
    .iter()
    .map(|t| StoreConfig::from_toml(t).unwrap())
    .collect()
}

/// A random batch: per table, `bags` bags of 0–6 ids, given as lengths.
fn batch(seed: u64, bags: usize) -> OwnedBatch {
    let mut rng = nearrec_testkit::Xorshift::new(seed);
    let mut next = move || rng.next_u64();
    let tables = TABLES
        .iter()
        .map(|name| {
            let lengths: Vec<i64> = (0..bags).map(|_| (next() % 7) as i64).collect();
            let n: i64 = lengths.iter().sum();
            let ids: Vec<i64> = (0..n).map(|_| (next() % ROWS) as i64).collect();
            OwnedLookup::with_lengths(*name, ids, lengths)
        })
        .collect();
    OwnedBatch::new(tables)
}

/// The pooled sums computed from the rows' values directly.
fn expected(b: &OwnedBatch) -> Vec<f32> {
    let bags = match &b.tables[0].bags {
        OwnedBags::Lengths(IndexVec::I64(l)) => l.len(),
        _ => unreachable!(),
    };
    let width = DIM as usize * b.tables.len();
    let mut out = vec![0f32; bags * width];
    for (k, t) in b.tables.iter().enumerate() {
        let (OwnedBags::Lengths(IndexVec::I64(lengths)), IndexVec::I64(ids)) =
            (&t.bags, &t.indices)
        else {
            unreachable!()
        };
        let tid = TABLES.iter().position(|n| *n == t.table).unwrap();
        let mut at = 0;
        for (bag, &l) in lengths.iter().enumerate() {
            for &id in &ids[at..at + l as usize] {
                for d in 0..DIM as usize {
                    out[bag * width + k * DIM as usize + d] +=
                        value(tid, id as u64 * u64::from(DIM) + d as u64);
                }
            }
            at += l as usize;
        }
    }
    out
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{i}: {x} vs {y}");
    }
}

#[test]
fn lookups_on_every_tier_equal_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    for config in configs() {
        let s = Store::open(&path, &config).unwrap();
        for seed in 0..4 {
            let b = batch(seed, 33);
            let got = s.lookup(&nearrec::AsBatch::as_batch(&b)).unwrap();
            assert_eq!(got.0.batch, 33);
            assert_eq!(got.0.width(), 3 * DIM as usize);
            close(&got.0.values, &expected(&b));
        }
        let expect_tier = match config.tier {
            Tier::Auto => Tier::Ssd, // 1 KiB does not hold 48 KB of tables
            t => t,
        };
        assert_eq!(s.tier(), expect_tier, "{config:?}");
    }
}

/// A fixed batch of 2⁴⁰ empty bags is a few bytes of request and terabytes of answer: a typed
/// error on every tier and path, never an abort in the allocator (nor the OOM killer).
#[test]
fn a_huge_batch_of_empty_bags_is_refused_before_anything_is_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    for config in configs() {
        let s = Store::open(&path, &config).unwrap();
        let empty: [i64; 0] = [];
        let b = Batch::new(
            TABLES
                .iter()
                .map(|t| {
                    TableLookup::new(
                        t,
                        Indices::I64(&empty),
                        Bags::Fixed {
                            batch: 1 << 40,
                            bag_size: 0,
                        },
                    )
                })
                .collect(),
        );
        for result in [
            s.lookup(&b).map(|_| ()),
            s.lookup_split(&b, 64).map(|_| ()),
            s.lookup_rows(&b).map(|_| ()),
            s.prepare(&b).map(|_| ()),
        ] {
            let e = result.unwrap_err();
            assert_eq!(e.kind(), nearrec::ErrorKind::InsufficientMemory, "{e}");
        }
    }
}

#[test]
fn submit_and_stream_equal_lookups_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let s = Store::open(&path, &StoreConfig::default().with_tier(Tier::Ssd)).unwrap();
    let batches: Vec<OwnedBatch> = (0..9).map(|i| batch(i, 17)).collect();
    let pending: Vec<_> = batches.iter().map(|b| s.submit(b.clone())).collect();
    for (p, b) in pending.into_iter().zip(&batches) {
        close(&p.wait().unwrap().values, &expected(b));
    }
    for depth in [1, 2, 5] {
        let got: Vec<_> = s
            .stream(batches.clone(), depth)
            .collect::<Result<_, _>>()
            .unwrap();
        for (g, b) in got.iter().zip(&batches) {
            close(&g.values, &expected(b));
        }
    }
    // an error arrives through the handle, typed
    let mut bad = batch(1, 4);
    bad.tables[1].indices = IndexVec::I64(vec![ROWS as i64; 24]);
    bad.tables[1].bags = OwnedBags::Lengths(IndexVec::I64(vec![6; 4]));
    match s.submit(bad).wait() {
        Err(Error::Engine(nearrec_engine::EngineError::IndexOutOfRange { table, .. })) => {
            assert_eq!(table, "t1")
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Sub-batches pool exactly what the whole batch pools, for every way of giving bags and
    /// every mode, on the SSD tier.
    #[test]
    fn sub_batches_equal_the_whole(seed in 0u64..1000, bags in 0usize..40, sub in 1usize..12,
                                   how in 0usize..3, mode in 0usize..3, weighted: bool,
                                   padding: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = store(dir.path());
        let s = Store::open(&path, &StoreConfig::default().with_tier(Tier::Ssd)).unwrap();
        let owned = batch(seed, bags);
        let mode = [PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Max][mode];
        let weighted = weighted && mode == PoolingMode::Sum;
        let offsets: Vec<Vec<i64>> = owned.tables.iter().map(|t| {
            let OwnedBags::Lengths(IndexVec::I64(l)) = &t.bags else { unreachable!() };
            let mut o = vec![0i64];
            for x in l { o.push(o.last().unwrap() + x); }
            o
        }).collect();
        let fixed: Vec<i64> = (0..bags as i64 * 3).map(|i| (i * 37) % ROWS as i64).collect();
        // one weight per index of either way of giving the bags (fixed bags have their own ids)
        let weights: Vec<Vec<f32>> = owned.tables.iter()
            .map(|t| (0..t.indices_len().max(fixed.len())).map(|i| 0.5 + i as f32 * 0.01).collect())
            .collect();
        let tables: Vec<TableLookup<'_>> = owned.tables.iter().enumerate().map(|(k, t)| {
            let IndexVec::I64(ids) = &t.indices else { unreachable!() };
            let OwnedBags::Lengths(IndexVec::I64(l)) = &t.bags else { unreachable!() };
            let (indices, bags_of) = match how {
                0 => (Indices::I64(ids), Bags::Lengths(Indices::I64(l))),
                1 => (Indices::I64(ids), Bags::Offsets {
                    offsets: Indices::I64(&offsets[k][..bags.max(1)]),
                    include_last_offset: false,
                }),
                _ => (Indices::I64(&fixed), Bags::Fixed { batch: bags, bag_size: 3 }),
            };
            let mut r = TableLookup::new(t.table.as_str(), indices, bags_of).with_mode(mode);
            if weighted { r = r.with_weights(&weights[k][..indices.len()]); }
            if padding { r = r.with_padding_idx(ids.first().copied().unwrap_or(0)); }
            r
        }).collect();
        let b = Batch::new(tables);
        match s.lookup(&b) {
            Ok(whole) => {
                let parts = s.lookup_split(&b, sub).unwrap();
                prop_assert_eq!(parts.batch, whole.0.batch);
                close(&parts.values, &whole.0.values);
            }
            // (offsets of an empty batch, say): the split fails the same way
            Err(e) => prop_assert_eq!(
                s.lookup_split(&b, sub).unwrap_err().to_string(), e.to_string()),
        }
    }
}

trait Len {
    fn indices_len(&self) -> usize;
}

impl Len for OwnedLookup {
    fn indices_len(&self) -> usize {
        match &self.indices {
            IndexVec::I32(v) => v.len(),
            IndexVec::I64(v) => v.len(),
        }
    }
}

#[test]
fn a_placement_in_the_config_is_applied_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let toml = "tier = \"ssd\"\n[plan.tables.t0]\nresident = true\n[plan.tables.t1]\nhot_rows = [1, 2, 3]\ncache_bytes = \"4KiB\"\n";
    let config = StoreConfig::from_toml(toml).unwrap();
    let s = Store::open(&path, &config).unwrap();
    let report = s.tier_report().unwrap();
    assert!(report[0].resident);
    assert_eq!(report[1].hot_rows, 3);
    assert!(report[1].cache_rows > 0);
    assert!(!report[2].resident && report[2].hot_rows == 0 && report[2].cache_rows == 0);
    let b = batch(3, 20);
    close(
        &s.lookup(&nearrec::AsBatch::as_batch(&b)).unwrap().0.values,
        &expected(&b),
    );
    assert_eq!(s.manifest().tables.len(), TABLES.len());
    let checks = s.verify(None).unwrap();
    assert!(checks.iter().all(|c| c.error.is_none()), "{checks:?}");
    assert_eq!(checks.len(), TABLES.len());
    let stats = s.stats().unwrap();
    let get = |k: &str| stats.get(k).unwrap();
    assert!(get("lookups_resident") > 0.0 && get("lookups_ssd") > 0.0);

    // a hot row past the table, a table the store lacks: typed, named
    for (toml, table) in [
        ("tier = \"dram\"\n[plan.tables.t2]\nhot_rows = [500]", "t2"),
        ("[plan.tables.zz]\nresident = true", "zz"),
    ] {
        let e = Store::open(&path, &StoreConfig::from_toml(toml).unwrap()).unwrap_err();
        assert!(e.to_string().contains(table), "{e}");
    }
    let c = StoreConfig::default().with_plan(PlanSource::File(dir.path().join("missing.toml")));
    assert!(Store::open(&path, &c).is_err());
}

/// `.npy` bytes of a float32 array.
fn npy(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    out
}

struct Layer {
    inputs: usize,
    outputs: usize,
    weight: Vec<f32>,
    bias: Vec<f32>,
}

fn layers(sizes: &[usize], seed: u32) -> Vec<Layer> {
    sizes
        .windows(2)
        .enumerate()
        .map(|(l, w)| Layer {
            inputs: w[0],
            outputs: w[1],
            weight: (0..w[0] * w[1])
                .map(|i| {
                    (((i as u32).wrapping_mul(2654435761) ^ seed ^ l as u32) % 200) as f32 * 0.005
                        - 0.5
                })
                .collect(),
            bias: (0..w[1]).map(|i| i as f32 * 0.01 - 0.02).collect(),
        })
        .collect()
}

fn mlp(ls: &[Layer], last: Activation) -> Mlp {
    let n = ls.len();
    Mlp::new(
        ls.iter()
            .enumerate()
            .map(|(j, l)| {
                let act = if j + 1 == n { last } else { Activation::Relu };
                Linear::new(l.weight.clone(), l.bias.clone(), l.outputs, l.inputs, act).unwrap()
            })
            .collect(),
    )
    .unwrap()
}

#[test]
fn infer_runs_the_stored_model_like_the_same_model_built_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let s0 = Store::open(&path, &StoreConfig::default()).unwrap();
    match s0.infer(&[], &nearrec::AsBatch::as_batch(&batch(1, 2))) {
        Err(Error::NoModel { .. }) => {}
        other => panic!("{other:?}"),
    }
    // a DLRM (cat) over three tables of dim 8: bottom 4-16-8, top 32-16-1
    let (bottom, top) = (layers(&[4, 16, 8], 1), layers(&[32, 16, 1], 2));
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (prefix, ls) in [("bottom", &bottom), ("top", &top)] {
        for (j, l) in ls.iter().enumerate() {
            // nn.Sequential numbers the ReLUs too: the linear layers are 0, 2, 4, ...
            zip.start_file(format!("{prefix}.{}.weight.npy", 2 * j), opts)
                .unwrap();
            zip.write_all(&npy(&[l.outputs, l.inputs], &l.weight))
                .unwrap();
            zip.start_file(format!("{prefix}.{}.bias.npy", 2 * j), opts)
                .unwrap();
            zip.write_all(&npy(&[l.outputs], &l.bias)).unwrap();
        }
    }
    let weights = zip.finish().unwrap().into_inner();
    nearrec::attach(&path, "dense.npz", &weights).unwrap();
    nearrec::attach(
        &path,
        "model.json",
        br#"{"model": "rmc1", "variant": "deeprecsys", "interaction": "cat", "tasks": 1}"#,
    )
    .unwrap();

    let by_hand = DenseModel::dlrm(
        mlp(&bottom, Activation::Relu),
        Interaction::Cat,
        mlp(&top, Activation::Sigmoid),
        3,
    )
    .unwrap();
    for config in configs() {
        let s = Store::open(&path, &config).unwrap();
        let b = batch(5, 6);
        let dense: Vec<f32> = (0..6 * 4).map(|i| i as f32 * 0.1 - 1.0).collect();
        let stored = s.infer(&dense, &nearrec::AsBatch::as_batch(&b)).unwrap();
        let hand = s
            .infer_with(&by_hand, &dense, &nearrec::AsBatch::as_batch(&b))
            .unwrap();
        assert_eq!((stored.batch, stored.width), (6, 1));
        // (tables' slices of the first top layer are added as their rows land, in whatever
        // order that is: equal to rounding)
        close(&stored.outputs, &hand.outputs);
        // the lookups in another order are matched to the inputs by name
        let mut shuffled = b.clone();
        shuffled.tables.reverse();
        let again = s
            .infer(&dense, &nearrec::AsBatch::as_batch(&shuffled))
            .unwrap();
        close(&again.outputs, &stored.outputs);
        // a missing or repeated table is named
        let mut short = b.clone();
        short.tables.pop();
        match s.infer(&dense, &nearrec::AsBatch::as_batch(&short)) {
            Err(Error::InvalidRequest { table, .. }) => assert_eq!(table.as_deref(), Some("t2")),
            other => panic!("{other:?}"),
        }
        let mut twice = b.clone();
        twice.tables[2] = twice.tables[0].clone();
        match s.infer(&dense, &nearrec::AsBatch::as_batch(&twice)) {
            Err(Error::InvalidRequest {
                table, position, ..
            }) => {
                assert_eq!((table.as_deref(), position), (Some("t0"), Some(2)))
            }
            other => panic!("{other:?}"),
        }
    }
    // the same model kept by the facade's own writer reads back the same
    let names: Vec<(String, Vec<usize>, &Vec<f32>)> = [("bottom", &bottom), ("top", &top)]
        .iter()
        .flat_map(|(prefix, ls)| {
            ls.iter().enumerate().flat_map(move |(j, l)| {
                [
                    (
                        format!("{prefix}.{}.weight", 2 * j),
                        vec![l.outputs, l.inputs],
                        &l.weight,
                    ),
                    (format!("{prefix}.{}.bias", 2 * j), vec![l.outputs], &l.bias),
                ]
            })
        })
        .collect();
    let tensors: Vec<nearrec::model::Tensor<'_>> = names
        .iter()
        .map(|(n, shape, v)| nearrec::model::Tensor {
            name: n,
            shape,
            values: v,
        })
        .collect();
    let config = nearrec::model::ModelConfig {
        model: "rmc1".into(),
        variant: "deeprecsys".into(),
        interaction: "cat".into(),
        tasks: 1,
        tables: Some(TABLES.iter().map(|t| t.to_string()).collect()),
        features: None,
        pooling: None,
        sequence: false,
        graph: None,
    };
    nearrec::model::save(&path, &config, &tensors).unwrap();
    let s = Store::open(&path, &StoreConfig::default()).unwrap();
    let b = batch(7, 5);
    let dense: Vec<f32> = (0..5 * 4).map(|i| i as f32 * 0.05).collect();
    close(
        &s.infer(&dense, &nearrec::AsBatch::as_batch(&b))
            .unwrap()
            .outputs,
        &s.infer_with(&by_hand, &dense, &nearrec::AsBatch::as_batch(&b))
            .unwrap()
            .outputs,
    );

    // damaged weights are a BadModel, not a panic
    nearrec::attach(&path, "dense.npz", b"PK not a zip").unwrap();
    let s = Store::open(&path, &StoreConfig::default()).unwrap();
    match s.infer(&[], &nearrec::AsBatch::as_batch(&batch(1, 2))) {
        Err(Error::BadModel { .. }) => {}
        other => panic!("{other:?}"),
    }
}
