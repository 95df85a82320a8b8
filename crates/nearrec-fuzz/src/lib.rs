//! What each fuzz target checks, as one function of the fuzzer's bytes: a panic is a finding.
//! `fuzz/` (cargo-fuzz, nightly, libFuzzer) wraps each in a `fuzz_target!`; on stable, this
//! crate's test runs every seed and every input the fuzzer kept (`fuzz/corpus/TARGET/`) through
//! the same function, so a crash found once stays fixed. `make fuzz` runs every target for a set
//! time; `fuzz/RESULTS.md` records the runs.
//!
//! A parser must refuse what it cannot read with an error, never panic; what it reads must
//! survive being written back (the written form parses to the same value). A request must be
//! answered or refused the same way by every tier that serves it: a wrong answer is a finding,
//! not only a crash. The targets live here but for `delta.rs` (a trainer's delta files and
//! TorchEasyRec's dumps) and `wal.rs` (the write-ahead log's recovery).

use std::path::Path;
use std::sync::OnceLock;

use nearrec::format::HEADER_BYTES;
use nearrec::format::{DType, Manifest, TableHeader};
use nearrec::plan::ShardPlan;
use nearrec::{AsBatch as _, Store, StoreApi, StoreConfig};
use nearrec_wire::v1 as pb;
use prost::Message as _;

mod delta;
mod wal;

pub use delta::{delta_file, tzrec_dump};
pub use wal::wal_replay;

/// A target: what it checks of one input.
pub type Check = fn(&[u8]);

/// Every target, by the name its corpus folder and its `fuzz_target` have.
pub const TARGETS: [(&str, Check); 11] = [
    ("manifest", manifest),
    ("placement_plan", placement_plan),
    ("store_dir", store_dir),
    ("wal_replay", wal_replay),
    ("table_header", table_header),
    ("shard_plan", shard_plan),
    ("trace_file", trace_file),
    ("lookup_request", lookup_request),
    ("wire_messages", wire_messages),
    ("delta_file", delta_file),
    ("tzrec_dump", tzrec_dump),
];

/// A store's manifest (`MANIFEST`): refused, or read and written back to itself.
pub fn manifest(data: &[u8]) {
    if let Ok(m) = Manifest::decode(data) {
        let again = Manifest::decode(&m.encode()).expect("a written manifest reads back");
        assert_eq!(again, m, "a manifest changed on its way through encode");
    }
}

/// A table file's header (its first 64 bytes carry the fields): refused, or read and written
/// back to the same fields.
pub fn table_header(data: &[u8]) {
    if let Ok(h) = TableHeader::decode(data) {
        let written = h.encode();
        assert_eq!(
            &written[..HEADER_BYTES],
            &data[..HEADER_BYTES],
            "a header read is not the bytes it was read from"
        );
        assert_eq!(TableHeader::decode(&written), Ok(h));
    }
}

/// A sharded store's plan (`shards.json`): refused, or read and written back to itself.
pub fn shard_plan(data: &[u8]) {
    let origin = Path::new("fuzz");
    if let Ok(plan) = ShardPlan::parse(data, origin) {
        let again =
            ShardPlan::parse(plan.to_json().as_bytes(), origin).expect("a written plan reads back");
        assert_eq!(again, plan, "a plan changed on its way through JSON");
    }
}

/// A `.nrtrace` file, opened and checked whole (header, arrays, checksums): refused, or every
/// table's bags and ids within the file and each other (offsets ascending within the ids).
pub fn trace_file(data: &[u8]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("t.nrtrace");
    std::fs::write(&path, data).expect("the trace written");
    let Ok(trace) = nearrec::plan::TraceFile::open(&path) else {
        return;
    };
    for i in 0..trace.header().tables.len() {
        let t = trace.table(i);
        let n = t.indices.len() as i64;
        assert!(
            t.offsets.windows(2).all(|w| w[0] <= w[1])
                && t.offsets.iter().all(|&o| (0..=n).contains(&o)),
            "table {i}: a trace that opened has offsets outside its ids"
        );
    }
}

/// Rows of each table of the store the targets read.
pub const ROWS: u64 = 97;

/// The keys of the fuzz store's keyed table `k`, one a row: spread over the 64-bit range.
pub fn keys() -> Vec<u64> {
    (1..=ROWS)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect()
}

/// The small store the targets read, written at `path`: tables `a` (fp32, dim 4), `b` (int8,
/// dim 8) and `q` (int4, dim 8) of [`ROWS`] rows, the testkit's pattern; a keyed table `k`
/// (fp16, dim 4) of [`keys`] and 3 spare rows; and a model kept with them (its `model.json` and `dense.npz`
/// attachments): one linear layer over 2 dense features and `a`'s and `b`'s pooled vectors,
/// then a sigmoid. What the seeds are made from.
pub fn write_store(path: &Path) -> std::path::PathBuf {
    use nearrec::format::{StoreOptions, StoreWriter, TableSpec};
    use nearrec::model::{GraphSpec, ModelConfig, OpSpec, Tensor};
    let path = path.to_path_buf();
    let mut writer = StoreWriter::create(&path, StoreOptions::default()).expect("a new store");
    for (t, (name, dim, dtype)) in [
        ("a", 4u32, DType::Fp32),
        ("b", 8, DType::Int8),
        ("k", 4, DType::Fp16),
        ("q", 8, DType::Int4),
    ]
    .into_iter()
    .enumerate()
    {
        let spec = TableSpec::new(name, ROWS, dim, dtype);
        let values: Vec<f32> = (0..ROWS * u64::from(dim))
            .map(|i| nearrec_testkit::pattern(t, i))
            .collect();
        let mut table = match name {
            "k" => writer.keyed_table(spec, 3),
            _ => writer.table(spec),
        }
        .expect("a table");
        table.write_f32(&values).expect("its rows");
        match name {
            "k" => writer.finish_table_keyed(table, &keys()),
            _ => writer.finish_table(table),
        }
        .expect("the table");
    }
    writer.commit().expect("the store");
    let graph = GraphSpec {
        dense: 2,
        ops: vec![OpSpec::Linear {
            input: vec![(0, 0, 2), (1, 0, 12)],
            weight: "w".into(),
            bias: Some("b".into()),
            activation: "sigmoid".into(),
        }],
        output: vec![(2, 0, 1)],
    };
    let config = ModelConfig {
        model: "graph".into(),
        variant: "deeprecsys".into(),
        interaction: "cat".into(),
        tasks: 1,
        tables: Some(vec!["a".into(), "b".into()]),
        features: None,
        pooling: None,
        sequence: false,
        graph: Some(graph),
    };
    let w: Vec<f32> = (0..14).map(|i| (i as f32 - 6.5) / 64.0).collect();
    let weights = [
        Tensor {
            name: "w",
            shape: &[1, 14],
            values: &w,
        },
        Tensor {
            name: "b",
            shape: &[1],
            values: &[0.125],
        },
    ];
    nearrec::model::save(&path, &config, &weights).expect("the model is kept");
    path
}

/// A temporary directory, in memory where the machine has one (its syncs are free): what is
/// fuzzed is the bytes written there, not the disk.
fn scratch() -> tempfile::TempDir {
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm"),
        false => tempfile::tempdir(),
    }
    .expect("a temporary directory")
}

/// The kept model's outputs, or its error, for 3 samples of 2 dense features whose bags hold
/// every row of both tables.
fn infer(store: &Store) -> nearrec::Result<Vec<f32>> {
    let dense = [0.5, -1.0, 0.25, 2.0, -0.75, 0.0];
    let ids: Vec<i64> = (0..ROWS as i64).collect();
    let offsets = [0i64, 30, 60];
    let tables = ["a", "b"]
        .iter()
        .map(|t| {
            nearrec::TableLookup::new(
                t,
                nearrec::Indices::I64(&ids),
                nearrec::Bags::Offsets {
                    offsets: nearrec::Indices::I64(&offsets),
                    include_last_offset: false,
                },
            )
        })
        .collect();
    let batch = nearrec::Batch::new(tables);
    Ok(nearrec::Inference::infer(store, &dense, &batch)?.outputs)
}

/// Where [`write_store`]'s store is kept for the targets that open it.
fn store_path() -> &'static Path {
    static STORE: OnceLock<(tempfile::TempDir, std::path::PathBuf)> = OnceLock::new();
    let (_, path) = STORE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = write_store(&dir.path().join("s"));
        (dir, path)
    });
    path
}

/// [`write_store`]'s store, opened on the DRAM tier and on the SSD tier (the request target's).
pub fn stores() -> &'static [Store; 2] {
    static STORES: OnceLock<[Store; 2]> = OnceLock::new();
    STORES.get_or_init(|| {
        let path = store_path();
        let open = |toml: &str| {
            Store::open(path, &StoreConfig::from_toml(toml).expect("a config"))
                .expect("the store opens")
        };
        // the resident gather, and block reads through a row cache of a few rows
        [
            open("tier = \"dram\""),
            open("tier = \"ssd\"\ndram_budget = \"2KiB\"\nthreads = 1"),
        ]
    })
}

/// The tiers [`store_dir`] opens a damaged store on: the DRAM tier, each table's checksum
/// verified as it loads; the SSD tier, every read checked against its sector's sum.
const CHECKED_TIERS: [&str; 2] = [
    "tier = \"dram\"\nverify_checksums = true",
    "tier = \"ssd\"\ndram_budget = \"2KiB\"\nthreads = 1\nverify_reads = true",
];

/// What a store answers [`store_dir`]: every row of each table (or its error), then the kept
/// model's outputs (or its error).
struct Answers {
    rows: Vec<nearrec::Result<Vec<f32>>>,
    outputs: nearrec::Result<Vec<f32>>,
}

impl Answers {
    /// `store`'s answers, asked in one order: the SSD tier sums a bag's cached rows and read
    /// rows in an order its cache decides, so the same calls in the same order on a store
    /// just opened give the same bits.
    fn of(store: &Store) -> Self {
        let ids: Vec<i64> = (0..ROWS as i64).collect();
        let keys: Vec<i64> = keys().into_iter().map(|k| k as i64).collect();
        let rows = [
            ("a", 4, &ids),
            ("b", 8, &ids),
            ("k", 4, &keys),
            ("q", 8, &ids),
        ]
        .iter()
        .map(|&(t, dim, ids)| {
            let mut out = vec![0f32; ROWS as usize * dim];
            store.read_rows(t, ids, &mut out).map(|()| out)
        })
        .collect();
        Self {
            rows,
            outputs: infer(store),
        }
    }
}

/// [`write_store`]'s files (name, bytes, in name order), and what a store just opened from them
/// answers on each of [`CHECKED_TIERS`], undamaged: what [`store_dir`] changes bytes of and
/// compares with.
struct Pristine {
    files: Vec<(String, Vec<u8>)>,
    answers: Vec<(Vec<Vec<f32>>, Vec<f32>)>,
}

fn pristine() -> &'static Pristine {
    static PRISTINE: OnceLock<Pristine> = OnceLock::new();
    PRISTINE.get_or_init(|| {
        let path = store_path();
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(path)
            .expect("the store's directory")
            .map(|e| {
                let e = e.expect("an entry");
                let bytes = std::fs::read(e.path()).expect("a store file");
                (e.file_name().to_string_lossy().into_owned(), bytes)
            })
            .collect();
        files.sort();
        let answers = CHECKED_TIERS
            .iter()
            .map(|toml| {
                let config = StoreConfig::from_toml(toml).expect("a config");
                let store = Store::open(path, &config).expect("the store opens");
                let a = Answers::of(&store);
                let rows = a.rows.into_iter().map(|r| r.expect("an undamaged read"));
                (rows.collect(), a.outputs.expect("the kept model runs"))
            })
            .collect();
        Pristine { files, answers }
    })
}

/// A store directory with bytes of one of its files changed — which file, which bytes and how
/// taken from the input: its first byte picks the file, then each group of four a byte (three
/// bytes of offset, one to xor it with) — opened on each of `CHECKED_TIERS`, every row read
/// (a keyed table's by key) and the kept model run: each tier refuses (a typed error at open,
/// at the read or at the model's load) or answers as the store was written. A row or an output
/// served other than written is a finding — damage served silently — not only a crash.
pub fn store_dir(data: &[u8]) {
    let Some((&which, changes)) = data.split_first() else {
        return;
    };
    let changes: Vec<[u8; 4]> = changes
        .chunks_exact(4)
        .take(16)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .filter(|c| c[3] != 0)
        .collect();
    if changes.is_empty() {
        return;
    }
    let pristine = pristine();
    let (name, bytes) = &pristine.files[usize::from(which) % pristine.files.len()];
    if bytes.is_empty() {
        return;
    }
    let mut damaged = bytes.clone();
    for &[a, b, c, flip] in &changes {
        let at = u32::from_le_bytes([a, b, c, 0]) as usize % bytes.len();
        damaged[at] ^= flip;
    }
    if damaged == *bytes {
        return; // the changes undid each other
    }
    let dir = scratch();
    let path = dir.path().join("s");
    std::fs::create_dir(&path).expect("the store's directory");
    for (n, b) in &pristine.files {
        let b = if n == name { &damaged } else { b };
        std::fs::write(path.join(n), b).expect("a store file");
    }
    let what = || format!("{} byte(s) of {name} changed ({changes:?})", changes.len());
    for (toml, (rows, outputs)) in CHECKED_TIERS.iter().zip(&pristine.answers) {
        let config = StoreConfig::from_toml(toml).expect("a config");
        let Ok(store) = Store::open(&path, &config) else {
            continue;
        };
        let got = Answers::of(&store);
        for ((table, got), want) in ["a", "b", "k", "q"].iter().zip(&got.rows).zip(rows) {
            if let Ok(got) = got {
                assert!(
                    got == want,
                    "{toml:?}: {}, and table {table} was served other than written",
                    what()
                );
            }
        }
        if let Ok(got) = &got.outputs {
            assert!(
                got == outputs,
                "{toml:?}: {}, and the kept model answered {got:?}, not {outputs:?}",
                what(),
            );
        }
    }
}

/// A placement plan as `nearrec plan` writes it — the input's first two bytes (little-endian)
/// the length of its TOML, the rest its archive of hot rows (`plan.hot.npz`, which the TOML
/// names) — loaded, and what loads applied to the SSD tier of [`write_store`]'s store: it is
/// refused (a typed error when the plan is read, or when the store opens with it), or the
/// store serves every row as written. Never a crash, an allocation the budget does not allow,
/// or a wrong row.
pub fn placement_plan(data: &[u8]) {
    let [lo, hi, rest @ ..] = data else {
        return;
    };
    let (toml, npz) = rest.split_at((usize::from(*lo) | usize::from(*hi) << 8).min(rest.len()));
    let dir = scratch();
    let plan = dir.path().join("plan.toml");
    std::fs::write(&plan, toml).expect("the plan written");
    std::fs::write(dir.path().join("plan.hot.npz"), npz).expect("its hot rows written");
    let Ok(placement) = nearrec::plan::load_plan(&plan) else {
        return;
    };
    let mut config = StoreConfig::from_toml("tier = \"ssd\"\ndram_budget = \"64KiB\"\nthreads = 1")
        .expect("a config");
    config.plan = Some(nearrec::PlanSource::Placement(placement));
    let Ok(store) = Store::open(store_path(), &config) else {
        return;
    };
    let got = Answers::of(&store);
    for ((table, got), want) in ["a", "b"]
        .iter()
        .zip(&got.rows)
        .zip(&pristine().answers[0].0)
    {
        if let Ok(got) = got {
            assert!(
                got == want,
                "a plan that loaded had table {table} served other than written"
            );
        }
    }
}

/// A storage node's `LookupRequest` as its bytes arrive: refused by the decoder or the
/// conversion, or answered by the DRAM tier and the SSD tier alike — the same pooled values
/// (to float rounding), or the same kind of error naming the same table and position.
pub fn lookup_request(data: &[u8]) {
    let Ok(req) = pb::LookupRequest::decode(data) else {
        return;
    };
    let Ok(batch) = nearrec_wire::convert::batch(&req.tables) else {
        return;
    };
    let batch = batch.as_batch();
    // bounded work: a request the fuzzer blew up is refused by a node's limits, not run here
    let ids: usize = batch.tables.iter().map(|t| t.indices.len()).sum();
    let bags: usize = (batch.tables.iter())
        .map(|t| t.declared_bags())
        .max()
        .unwrap_or(0);
    if ids > 1 << 16 || bags > 1 << 14 {
        return;
    }
    let [dram, ssd] = stores();
    let (a, b) = (
        StoreApi::lookup(dram, &batch),
        StoreApi::lookup(ssd, &batch),
    );
    match (a, b) {
        (Ok((a, _)), Ok((b, _))) => {
            assert_eq!((a.batch, &a.tables), (b.batch, &b.tables), "shapes differ");
            for (i, (x, y)) in a.values.iter().zip(&b.values).enumerate() {
                let same = x == y
                    || (x.is_nan() && y.is_nan())
                    || (x - y).abs() <= 1e-4 * (1.0 + x.abs().max(y.abs()));
                assert!(same, "value {i}: the DRAM tier {x}, the SSD tier {y}");
            }
        }
        (Err(a), Err(b)) => assert_eq!(
            (a.kind(), a.table(), a.position()),
            (b.kind(), b.table(), b.position()),
            "the tiers refuse differently: {a} / {b}"
        ),
        (a, b) => panic!(
            "one tier answers, the other refuses: {:?} / {:?}",
            a.map(|_| ()),
            b.map(|_| ())
        ),
    }
}

/// A message one end of a node's connection receives from the other — an answer a client
/// takes from a node, a write or a model update a node takes from a client; the first byte
/// says which — decoded and converted as that end does: refused with an error, or a value that
/// keeps its type's promises (a pooled answer's floats fill its `[batch, Σ dim]`; each table's
/// raw rows are distinct ids, ascending, `dim` floats each) and that the other end's
/// conversion writes back to itself.
pub fn wire_messages(data: &[u8]) {
    use nearrec_wire::convert;
    let [kind, rest @ ..] = data else {
        return;
    };
    match kind % 6 {
        0 => {
            let Ok(r) = pb::LookupResponse::decode(rest) else {
                return;
            };
            if let Ok(p) = convert::unpooled(&r) {
                assert_eq!(Some(p.values.len()), p.batch.checked_mul(p.width()));
                // read in the dtype it came in and written back in it: fp32 bit for bit, fp16 /
                // bf16 but for NaNs' payloads, int8 (quantised again) its shape
                let dtype = convert::unout_dtype(r.dtype, "dtype").expect("a dtype it read");
                let back = convert::unpooled(&convert::pooled(r.id, r.version, p.clone(), dtype));
                let key = |p: &nearrec::Pooled| {
                    let values = match dtype {
                        nearrec::OutDtype::F32 => bits(&p.values),
                        nearrec::OutDtype::Int8 => Vec::new(),
                        _ => bits(
                            &p.values
                                .iter()
                                .map(|v| if v.is_nan() { f32::NAN } else { *v })
                                .collect::<Vec<_>>(),
                        ),
                    };
                    (p.batch, p.tables.clone(), values)
                };
                assert_eq!(back.as_ref().map(key).ok(), Some(key(&p)));
            }
            if let Ok(tables) = convert::unraw(&r) {
                for t in &tables {
                    assert_eq!(Some(t.values.len()), t.ids.len().checked_mul(t.dim));
                    assert!(
                        t.ids.windows(2).all(|w| w[0] < w[1]),
                        "table {:?}: ids not distinct and ascending",
                        t.table
                    );
                }
                let back = convert::unraw(&convert::raw(r.id, r.version, tables.clone()));
                let key = |ts: &Vec<nearrec::Rows>| -> Vec<_> {
                    (ts.iter())
                        .map(|t| (t.table.clone(), t.dim, t.ids.clone(), bits(&t.values)))
                        .collect()
                };
                assert_eq!(back.as_ref().map(key).ok(), Some(key(&tables)));
            }
        }
        1 => {
            let Ok(r) = pb::InfoResponse::decode(rest) else {
                return;
            };
            if let Ok(info) = convert::uninfo(r) {
                let back = convert::uninfo(convert::info(&info.name, info.clone()));
                assert_eq!(back.ok(), Some(info));
            }
        }
        2 => {
            let Ok(r) = pb::StatsResponse::decode(rest) else {
                return;
            };
            let (stats, tiers) = convert::unstats(r);
            let again = convert::unstats(convert::stats(stats.clone(), tiers.clone()));
            assert_eq!(format!("{again:?}"), format!("{:?}", (stats, tiers)));
        }
        3 => {
            let Ok(r) = pb::TransactionState::decode(rest) else {
                return;
            };
            if let Ok(t) = convert::untransaction(&r) {
                let back = convert::untransaction(&convert::transaction(&t)).expect("its own");
                assert_eq!((back.tx, back.state, &back.note), (t.tx, t.state, &t.note));
            }
        }
        4 => {
            let Ok(r) = pb::WriteRequest::decode(rest) else {
                return;
            };
            if let Ok(writes) = convert::unwrites(&r.writes) {
                let back = convert::unwrites(&convert::writes(&convert::row_writes(&writes)));
                let key = |ws: &Vec<convert::OwnedWrite>| -> Vec<_> {
                    (ws.iter())
                        .map(|(t, ids, v)| {
                            // values compared by their bits (a NaN is itself), encoded rows as
                            // their bytes
                            let v = v.as_ref().map(|v| match v {
                                nearrec::OwnedValues::F32(f) => (bits(f), Vec::new()),
                                nearrec::OwnedValues::Encoded(b) => (Vec::new(), b.clone()),
                            });
                            (t.clone(), ids.clone(), v)
                        })
                        .collect()
                };
                assert_eq!(back.as_ref().map(key).ok(), Some(key(&writes)));
            }
        }
        _ => {
            let Ok(r) = pb::UpdateModelRequest::decode(rest) else {
                return;
            };
            if let Ok(weights) = convert::unweights(&r.weights) {
                let back = convert::unweights(&convert::weights(&convert::tensors(&weights)));
                let key = |ws: &Vec<convert::OwnedWeight>| -> Vec<_> {
                    (ws.iter())
                        .map(|(n, shape, v)| (n.clone(), shape.clone(), bits(v)))
                        .collect()
                };
                assert_eq!(back.as_ref().map(key).ok(), Some(key(&weights)));
            }
        }
    }
}

/// Floats as their bits: NaN equal to itself, as a message carries it.
fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}
