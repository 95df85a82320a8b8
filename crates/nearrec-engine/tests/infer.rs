//! Whole-model offload: `Engine::infer` gives what pooling with `Engine::lookup` and then running
//! the layers plainly (triple loops, the first layer whole, no decomposition) gives, for every
//! model family, on the DRAM tier, the SSD tier and the SSD tier with some tables kept whole;
//! requests that do not fit the model are typed errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nearrec_engine::dense::{Activation, DenseModel, Interaction, Linear, Mlp};
use nearrec_engine::{Bags, Batch, Engine, EngineConfig, EngineError, Indices, TableLookup, Tier};
use nearrec_format::DType;

const ROWS: u64 = 700;
const DIM: usize = 8;
const TABLES: [(&str, DType); 4] = [
    ("t0", DType::Fp32),
    ("t1", DType::Fp16),
    ("t2", DType::Fp32),
    ("t3", DType::Int8),
];

fn store(dir: &Path) -> PathBuf {
    let tables = TABLES.map(|(name, dtype)| (name, ROWS, DIM as u32, dtype));
    nearrec_testkit::write_store(dir.join("store"), &tables, nearrec_testkit::pattern)
}

/// Seeded values in [-0.5, 0.5).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = nearrec_testkit::Xorshift::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
        .collect()
}

/// A layer's parts, kept for the plain twin.
#[derive(Clone)]
struct Layer {
    w: Vec<f32>,
    b: Vec<f32>,
    out: usize,
    inp: usize,
    act: Activation,
}

fn layers(sizes: &[usize], last: Activation, seed: u64) -> Vec<Layer> {
    sizes
        .windows(2)
        .enumerate()
        .map(|(i, s)| Layer {
            w: values(s[0] * s[1], seed * 100 + i as u64),
            b: values(s[1], seed * 100 + 50 + i as u64),
            out: s[1],
            inp: s[0],
            act: if i + 2 == sizes.len() {
                last
            } else {
                Activation::Relu
            },
        })
        .collect()
}

fn mlp(layers: &[Layer]) -> Mlp {
    Mlp::new(
        layers
            .iter()
            .map(|l| Linear::new(l.w.clone(), l.b.clone(), l.out, l.inp, l.act).unwrap())
            .collect(),
    )
    .unwrap()
}

/// The plain twin of a stack of layers over `x` (`[batch, in]`).
fn plain(layers: &[Layer], x: &[f32], batch: usize) -> Vec<f32> {
    let mut x = x.to_vec();
    for l in layers {
        let mut y = vec![0f32; batch * l.out];
        for b in 0..batch {
            for o in 0..l.out {
                let mut s = f64::from(l.b[o]);
                for i in 0..l.inp {
                    s += f64::from(x[b * l.inp + i]) * f64::from(l.w[o * l.inp + i]);
                }
                let s = s as f32;
                y[b * l.out + o] = match l.act {
                    Activation::None => s,
                    Activation::Relu => s.max(0.0),
                    Activation::Sigmoid => 1.0 / (1.0 + (-s).exp()),
                    Activation::Tanh => s.tanh(),
                };
            }
        }
        x = y;
    }
    x
}

/// Columns of `[batch, width]` rows.
fn cols(m: &[f32], width: usize, from: usize, n: usize) -> Vec<Vec<f32>> {
    m.chunks(width)
        .map(|r| r[from..from + n].to_vec())
        .collect()
}

/// A model, its plain twin (dense features, pooled `[batch, 4·DIM]` → outputs) and its dense
/// width.
type Twin = Box<dyn Fn(&[f32], &[f32], usize) -> Vec<f32>>;

fn models() -> Vec<(&'static str, DenseModel, Twin, usize)> {
    let mut out: Vec<(&'static str, DenseModel, Twin, usize)> = Vec::new();
    for interaction in [Interaction::Cat, Interaction::Dot] {
        let bottom = layers(&[5, 16, DIM], Activation::Relu, 1);
        let top_in = match interaction {
            Interaction::Cat => 5 * DIM,
            Interaction::Dot => DIM + 10,
        };
        let top = layers(&[top_in, 12, 1], Activation::Sigmoid, 2);
        let model = DenseModel::dlrm(mlp(&bottom), interaction, mlp(&top), 4).unwrap();
        let twin: Twin = Box::new(move |dense, pooled, batch| {
            let x = plain(&bottom, dense, batch);
            let mut z = Vec::new();
            for b in 0..batch {
                let mut vs = vec![x[b * DIM..][..DIM].to_vec()];
                vs.extend(
                    cols(pooled, 4 * DIM, 0, 4 * DIM)[b]
                        .chunks(DIM)
                        .map(<[f32]>::to_vec),
                );
                match interaction {
                    Interaction::Cat => vs.iter().for_each(|v| z.extend(v)),
                    Interaction::Dot => {
                        z.extend(&vs[0]);
                        for i in 1..5 {
                            for j in 0..i {
                                z.push(vs[i].iter().zip(&vs[j]).map(|(a, b)| a * b).sum());
                            }
                        }
                    }
                }
            }
            plain(&top, &z, batch)
        });
        out.push((
            if interaction == Interaction::Cat {
                "dlrm-cat"
            } else {
                "dlrm-dot"
            },
            model,
            twin,
            5,
        ));
    }
    for tasks in [0usize, 3] {
        let trunk = layers(
            &[4 * DIM + 6, 20, if tasks == 0 { 1 } else { 10 }],
            if tasks == 0 {
                Activation::Sigmoid
            } else {
                Activation::Relu
            },
            3,
        );
        let heads: Vec<Vec<Layer>> = (0..tasks)
            .map(|t| layers(&[10, 7, 1], Activation::Sigmoid, 10 + t as u64))
            .collect();
        let model = DenseModel::wide_and_deep(
            mlp(&trunk),
            heads.iter().map(|h| mlp(h)).collect(),
            vec![DIM; 4],
        )
        .unwrap();
        let twin: Twin = Box::new(move |dense, pooled, batch| {
            let mut z = Vec::new();
            for b in 0..batch {
                z.extend(&pooled[b * 4 * DIM..][..4 * DIM]);
                z.extend(&dense[b * 6..][..6]);
            }
            let h = plain(&trunk, &z, batch);
            if heads.is_empty() {
                return h;
            }
            let outs: Vec<Vec<f32>> = heads.iter().map(|l| plain(l, &h, batch)).collect();
            (0..batch)
                .flat_map(|b| outs.iter().map(move |o| o[b]))
                .collect()
        });
        out.push((if tasks == 0 { "wnd" } else { "mtwnd" }, model, twin, 6));
    }
    let path = layers(&[2 * DIM, 12, 6], Activation::Relu, 4);
    let predict = layers(&[DIM + 6, 5], Activation::Relu, 5);
    let model = DenseModel::ncf(mlp(&path), mlp(&predict), DIM).unwrap();
    let twin: Twin = Box::new(move |_, pooled, batch| {
        let ab: Vec<f32> = (0..batch)
            .flat_map(|b| pooled[b * 4 * DIM + 2 * DIM..][..2 * DIM].to_vec())
            .collect();
        let m = plain(&path, &ab, batch);
        let mut z = Vec::new();
        for b in 0..batch {
            let row = &pooled[b * 4 * DIM..];
            z.extend((0..DIM).map(|i| row[i] + row[DIM + i]));
            z.extend(&m[b * 6..][..6]);
        }
        plain(&predict, &z, batch)
    });
    out.push(("ncf", model, twin, 0));
    out
}

/// Each table's bags: `batch` bags of 0..6 rows, some repeated across bags and tables.
fn request_parts(batch: usize, seed: u64) -> Vec<(Vec<i64>, Vec<i64>)> {
    (0..4)
        .map(|t| {
            let r = values(batch * 8, seed * 10 + t);
            let (mut idx, mut offsets) = (Vec::new(), Vec::new());
            for b in 0..batch {
                offsets.push(idx.len() as i64);
                let n = ((r[b * 8] + 0.5) * 6.0) as usize;
                for j in 0..n {
                    let u = r[b * 8 + 1 + j % 7] + 0.5;
                    idx.push(((u * u * ROWS as f32) as i64).min(ROWS as i64 - 1));
                }
            }
            (idx, offsets)
        })
        .collect()
}

fn request<'a>(parts: &'a [(Vec<i64>, Vec<i64>)]) -> Batch<'a> {
    Batch::new(
        parts
            .iter()
            .zip(TABLES)
            .map(|((idx, off), (name, _))| {
                TableLookup::new(
                    name,
                    Indices::I64(idx),
                    Bags::Offsets {
                        offsets: Indices::I64(off),
                        include_last_offset: false,
                    },
                )
            })
            .collect(),
    )
}

fn configs() -> Vec<(&'static str, EngineConfig)> {
    let ssd = EngineConfig {
        tier: Tier::Ssd,
        threads: 3,
        inline_lookups: 0,
        ..EngineConfig::default()
    };
    vec![
        (
            "dram",
            EngineConfig {
                threads: 3,
                inline_lookups: 0,
                ..EngineConfig::default()
            },
        ),
        ("ssd", ssd.clone()),
        (
            "ssd+dram-tiers",
            EngineConfig {
                // room for two tables whole and caches: tables pooled on both paths at once
                dram_budget_bytes: Some(2 * ROWS * DIM as u64 * 4 + 4096),
                ..ssd
            },
        ),
    ]
}

#[test]
fn offload_matches_the_plain_model_on_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    for (tier, config) in configs() {
        let engine = Engine::open(&path, config, None).unwrap();
        for (name, model, twin, dense_width) in models() {
            for batch in [1usize, 7, 64] {
                let parts = request_parts(batch, batch as u64);
                let req = request(&parts);
                let dense = values(batch * dense_width, 99);
                let (_, pooled) = engine.lookup(&req).unwrap();
                let want = twin(&dense, &pooled, batch);
                let (got, times) = engine.infer(&model, &dense, &req).unwrap();
                // the same layers on vectors pooled elsewhere (a node's, a sharded store's)
                let apart = model.forward(&dense, &pooled, batch).unwrap();
                for got in [&got, &apart] {
                    assert_eq!(got.len(), batch * model.outputs(), "{tier} {name} {batch}");
                    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                            "{tier} {name} batch {batch}: output {k}: {g} vs {w}"
                        );
                    }
                }
                assert!(times.total >= times.embeddings, "{times:?}");
                // the embeddings' stages are parts of their wall time; only the SSD tier waits
                let s = times.stages;
                assert!(
                    s.route + s.io_wait + s.pool <= times.embeddings,
                    "{times:?}"
                );
                assert!(
                    s.route > Duration::ZERO && s.pool > Duration::ZERO,
                    "{times:?}"
                );
                assert_eq!(
                    tier == "dram",
                    s.io_wait == Duration::ZERO,
                    "{tier} {times:?}"
                );
            }
        }
    }
}

#[test]
fn requests_that_do_not_fit_the_model_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(store(dir.path()), EngineConfig::default(), None).unwrap();
    let (_, model, _, width) = models().remove(0);
    let parts = request_parts(3, 1);
    let req = request(&parts);
    // pooled vectors that do not fit the model
    let err = model
        .forward(&values(3 * width, 1), &[0.0; 5], 3)
        .unwrap_err();
    assert!(err.0.contains("pooled values"), "{err}");
    // dense features of the wrong size
    let err = engine
        .infer(&model, &values(3 * width + 1, 1), &req)
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Model(e) if e.0.contains("16 values for a batch of 3")),
        "{err}"
    );
    // one table short
    let short = Batch::new(request(&parts).tables.into_iter().take(3).collect());
    let err = engine
        .infer(&model, &values(3 * width, 1), &short)
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Model(e) if e.0.contains("takes 4 tables")),
        "{err}"
    );
    // a bad index still names its table and position
    let mut bad = parts.clone();
    bad[2] = (vec![0, ROWS as i64], vec![0, 1, 2]);
    let err = engine
        .infer(&model, &values(3 * width, 1), &request(&bad))
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::IndexOutOfRange { table, position: 1, .. } if table == "t2"),
        "{err}"
    );
    // a model whose layers do not fit together
    let bottom = mlp(&layers(&[5, DIM], Activation::Relu, 1));
    let top = mlp(&layers(&[5 * DIM + 1, 1], Activation::Sigmoid, 2));
    let err = DenseModel::dlrm(bottom, Interaction::Cat, top, 4).unwrap_err();
    assert!(err.0.contains("takes 41 inputs"), "{err}");
}
