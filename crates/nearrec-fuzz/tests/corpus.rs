//! Every input in `fuzz/seeds/TARGET/` (valid inputs written by this test, and each crash found
//! once, kept under a name) and `fuzz/corpus/TARGET/` (what the fuzzer kept, minimized) through
//! its target's function, on stable: CI's smoke run of the fuzz targets, and every crash found a
//! regression test for good. With `NEARREC_FUZZ_SEEDS=1` it first writes the valid seeds.

use nearrec::prelude::*;
use std::path::{Path, PathBuf};

/// `fuzz/KIND/TARGET`: `seeds` or `corpus`.
fn inputs(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(target)
}

#[test]
fn every_kept_input_passes_its_target() {
    if std::env::var_os("NEARREC_FUZZ_SEEDS").is_some() {
        seeds::write();
    }
    for (target, check) in nearrec_fuzz::TARGETS {
        let mut all: Vec<PathBuf> = Vec::new();
        for kind in ["seeds", "corpus"] {
            let dir = inputs(kind, target);
            let found = match std::fs::read_dir(&dir) {
                // a target the fuzzer has not run yet has seeds only
                Err(e) if kind == "corpus" && e.kind() == std::io::ErrorKind::NotFound => continue,
                found => found.unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
            };
            all.extend(found.map(|e| e.unwrap().path()));
        }
        all.sort();
        assert!(all.len() > 1, "{target}: {} inputs", all.len());
        for input in all {
            // (an input a running fuzzer replaced by a smaller one is gone: not a failure)
            let data = match std::fs::read(&input) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                read => read.unwrap(),
            };
            let run = std::panic::catch_unwind(|| check(&data));
            assert!(run.is_ok(), "{target}: {} fails", input.display());
        }
    }
}

/// The request seeds reach the engine (a seed every decoder refuses would start the fuzzer
/// far from what it is for): each answered by both tiers, the one with an id past its table
/// refused naming it.
#[test]
fn the_request_seeds_are_answered_or_refused_where_they_should_be() {
    use nearrec::AsBatch as _;
    use prost::Message as _;
    let dir = inputs("seeds", "lookup_request");
    for name in ["sum", "mean-padding", "max", "weighted", "out-of-range"] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let req = nearrec_wire::v1::LookupRequest::decode(bytes.as_slice()).unwrap();
        let batch = nearrec_wire::convert::batch(&req.tables).unwrap();
        let got = nearrec_fuzz::stores()[0].lookup(&batch.as_batch());
        match name {
            "out-of-range" => {
                let e = got.unwrap_err();
                assert_eq!(
                    (e.kind(), e.table()),
                    (nearrec::ErrorKind::IndexOutOfRange, Some("a"))
                );
            }
            _ => assert_eq!(got.unwrap().0.batch, 4, "{name}"),
        }
    }
}

/// Valid inputs of every target, for the fuzzer to start from.
/// The plan seeds load, and hold what they were written with: a seed every loader refuses
/// would start the fuzzer far from the placement it is for.
#[test]
fn the_plan_seeds_load() {
    let dir = inputs("seeds", "placement_plan");
    for (name, tables) in [("hot-and-cached", 2), ("resident", 1)] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let len = usize::from(u16::from_le_bytes([bytes[0], bytes[1]]));
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("plan.toml"), &bytes[2..2 + len]).unwrap();
        std::fs::write(tmp.path().join("plan.hot.npz"), &bytes[2 + len..]).unwrap();
        let placement = nearrec::plan::load_plan(&tmp.path().join("plan.toml")).unwrap();
        assert_eq!(placement.tables.len(), tables, "{name}");
        if name == "hot-and-cached" {
            assert_eq!(placement.tables["a"].hot_rows, [1, 5, 9]);
            assert_eq!(placement.tables["b"].cache_bytes, 2048);
        }
    }
}

mod seeds {
    use super::inputs;
    use nearrec::AsBatch as _;
    use nearrec_wire::convert;
    use nearrec_wire::v1 as pb;
    use prost::Message as _;

    fn put(target: &str, name: &str, bytes: &[u8]) {
        let dir = inputs("seeds", target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    pub fn write() {
        let tmp = tempfile::tempdir().unwrap();
        let store = nearrec_fuzz::write_store(&tmp.path().join("s"));
        put(
            "manifest",
            "store",
            &std::fs::read(store.join("MANIFEST")).unwrap(),
        );
        // a byte of each file changed: the file (in name order), the byte (24-bit), the xor
        let mut names: Vec<String> = std::fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for (k, name) in names.iter().enumerate() {
            for at in [9u32, 300] {
                let [a, b, c, _] = at.to_le_bytes();
                put(
                    "store_dir",
                    &format!("{name}-byte-{at}"),
                    &[k as u8, a, b, c, 0x10],
                );
            }
        }
        let reader = nearrec_format::StoreReader::open(&store).unwrap();
        for t in reader.tables() {
            let bytes = std::fs::read(store.join(&t.file)).unwrap();
            put("table_header", &t.name, &bytes[..64]);
        }
        let options = nearrec::plan::ShardOptions {
            shards: 2,
            replicas: 2,
            scheme: nearrec::plan::Scheme::Row,
            replicate_hot: 0,
        };
        let plan = nearrec::plan::plan_shards("s", reader.tables(), None, &options).unwrap();
        put("shard_plan", "row-2x2", plan.to_json().as_bytes());
        // placement plans: the TOML's length (2 bytes), the TOML, its archive of hot rows
        for (name, toml, hot) in [
            (
                "hot-and-cached",
                "hot_rows_file = \"plan.hot.npz\"\n[tables.a]\nhot_rows = 3\n\
                 cache_bytes = 1024\n[tables.b]\nresident = false\ncache_bytes = \"2KiB\"\n",
                vec![("a", vec![1u64, 5, 9]), ("b", vec![])],
            ),
            (
                "resident",
                "hot_rows_file = \"plan.hot.npz\"\n[tables.b]\nresident = true\n",
                vec![],
            ),
        ] {
            let mut npz = std::io::Cursor::new(Vec::new());
            let arrays: Vec<(&str, &[u64])> = hot.iter().map(|(t, r)| (*t, r.as_slice())).collect();
            nearrec_format::npz::write_npz(&mut npz, &arrays).unwrap();
            let len = (toml.len() as u16).to_le_bytes();
            put(
                "placement_plan",
                name,
                &[&len[..], toml.as_bytes(), npz.get_ref()].concat(),
            );
        }
        let rows = nearrec_fuzz::ROWS as i64;
        let ids: Vec<i64> = (0..40).map(|i| (i * 7) % rows).collect();
        let offsets: Vec<i64> = (0..=10).map(|b| b * 4).collect();
        let trace: Vec<nearrec::plan::TableData<'_>> = ["a", "b"]
            .map(|name| nearrec::plan::TableData {
                name,
                rows: nearrec_fuzz::ROWS,
                pooling: 4,
                generator: None,
                first_reference_share: None,
                keys: false,
                offsets: &offsets,
                indices: &ids,
            })
            .to_vec();
        let path = tmp.path().join("t.nrtrace");
        nearrec::plan::write_trace(&path, 4, 0, &trace, false).unwrap();
        put("trace_file", "two-tables", &std::fs::read(&path).unwrap());
        // delta files: float32 rows of two tables with a delete (Arrow IPC), keys of the keyed
        // table, and int8 rows taken as they are (Parquet)
        {
            use nearrec::format::delta::{self, Changes, Encoding, Header, Values};
            let header = Header {
                sequence: 1,
                step: Some(10),
                wall_time_ms: Some(1_700_000_000_000),
            };
            let f32s = vec![
                Changes {
                    table: "a".into(),
                    upserts: vec![1, 5],
                    values: Values::F32((0..8).map(|i| i as f32 * 0.5).collect()),
                    deletes: vec![9],
                    deleted: None,
                },
                Changes {
                    table: "k".into(),
                    upserts: vec![nearrec_fuzz::keys()[3] as i64, -1],
                    values: Values::F32(vec![0.25; 8]),
                    deletes: vec![nearrec_fuzz::keys()[0] as i64],
                    deleted: None,
                },
            ];
            let rb = nearrec::format::DType::Int8.row_bytes(8) as usize;
            let mut rows = vec![0u8; 2 * rb];
            for (k, row) in rows.chunks_exact_mut(rb).enumerate() {
                let v: Vec<f32> = (0..8).map(|j| (k * 8 + j) as f32 * 0.1).collect();
                nearrec::format::DType::Int8.encode_row(&v, row);
            }
            let int8 = vec![Changes {
                table: "b".into(),
                upserts: vec![0, 96],
                values: Values::Encoded(rows),
                deletes: vec![],
                deleted: None,
            }];
            for (name, tables, encoding, dtype, kind) in [
                ("float32", f32s, Encoding::Arrow, None, 0u8),
                (
                    "int8",
                    int8,
                    Encoding::Parquet,
                    Some(nearrec::format::DType::Int8),
                    1,
                ),
            ] {
                let path = tmp.path().join(delta::file_name(1, encoding));
                delta::write(&path, &header, &tables, dtype).unwrap();
                put(
                    "delta_file",
                    name,
                    &[&[kind][..], &std::fs::read(&path).unwrap()].concat(),
                );
            }
        }
        // lookups of every pooling mode, with weights and padding, and one id out of range
        for (name, mode, weights, padding, bad) in [
            ("sum", pb::PoolingMode::Sum, false, None, false),
            ("mean-padding", pb::PoolingMode::Mean, false, Some(3), false),
            ("max", pb::PoolingMode::Max, false, None, false),
            ("weighted", pb::PoolingMode::Sum, true, None, false),
            ("out-of-range", pb::PoolingMode::Sum, false, None, true),
        ] {
            let mut ids: Vec<i64> = (0..12).map(|i| (i * 13) % rows).collect();
            if bad {
                ids[5] = rows;
            }
            let lengths = [3i64, 0, 4, 5];
            let t = |table: &str| pb::TableLookup {
                table: table.into(),
                ids: ids
                    .iter()
                    .flat_map(|i| i.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
                index_type: pb::IndexType::Int64.into(),
                bags: Some(pb::table_lookup::Bags::Lengths(
                    lengths
                        .iter()
                        .flat_map(|i| i.to_le_bytes())
                        .collect::<Vec<u8>>()
                        .into(),
                )),
                mode: mode.into(),
                per_sample_weights: if weights {
                    (0..12)
                        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
                        .collect::<Vec<u8>>()
                        .into()
                } else {
                    Default::default()
                },
                padding_idx: padding,
            };
            let req = pb::LookupRequest {
                store: String::new(),
                tables: vec![t("a"), t("b")],
                ..Default::default()
            };
            put("lookup_request", name, &req.encode_to_vec());
        }
        // each message wire_messages takes, as one end writes it to the other
        let message = |kind: u8, m: &dyn Fn() -> Vec<u8>| [vec![kind], m()].concat();
        let (store, batch) = (&nearrec_fuzz::stores()[0], one_bag());
        let pooled = nearrec::StoreApi::lookup(store, &batch.as_batch())
            .unwrap()
            .0;
        let rows = nearrec::StoreApi::lookup_rows(store, &batch.as_batch())
            .unwrap()
            .0;
        let info = nearrec::StoreApi::info(store).unwrap();
        let (stats, tiers) = (
            nearrec::StoreApi::stats(store).unwrap(),
            nearrec::StoreApi::tier_report(store).unwrap(),
        );
        let tx = nearrec::Transaction {
            tx: 7,
            state: nearrec::TxState::ALL[0],
            note: "a note".into(),
            age: std::time::Duration::from_millis(1500),
        };
        let (ids, values) = ([1i64, 4], [0.5f32; 8]);
        let write = nearrec::RowWrite {
            table: "a",
            ids: &ids,
            values: Some(nearrec::RowValues::F32(&values)),
        };
        let weight = nearrec::model::Tensor {
            name: "top.0.weight",
            shape: &[2, 4],
            values: &values,
        };
        for (name, bytes) in [
            (
                "pooled",
                message(0, &|| {
                    convert::pooled(1, 2, pooled.clone(), nearrec::OutDtype::F32).encode_to_vec()
                }),
            ),
            (
                "pooled_int8",
                message(0, &|| {
                    convert::pooled(1, 2, pooled.clone(), nearrec::OutDtype::Int8).encode_to_vec()
                }),
            ),
            (
                "pooled_bf16",
                message(0, &|| {
                    convert::pooled(1, 2, pooled.clone(), nearrec::OutDtype::Bf16).encode_to_vec()
                }),
            ),
            (
                "raw",
                message(0, &|| convert::raw(1, 2, rows.clone()).encode_to_vec()),
            ),
            (
                "info",
                message(1, &|| convert::info("s", info.clone()).encode_to_vec()),
            ),
            (
                "stats",
                message(2, &|| {
                    convert::stats(stats.clone(), tiers.clone()).encode_to_vec()
                }),
            ),
            (
                "transaction",
                message(3, &|| convert::transaction(&tx).encode_to_vec()),
            ),
            (
                "write",
                message(4, &|| {
                    let writes = convert::writes(&[write]);
                    pb::WriteRequest {
                        writes,
                        ..Default::default()
                    }
                    .encode_to_vec()
                }),
            ),
            (
                "weights",
                message(5, &|| {
                    let weights = convert::weights(&[weight]);
                    pb::UpdateModelRequest {
                        weights,
                        ..Default::default()
                    }
                    .encode_to_vec()
                }),
            ),
        ] {
            put("wire_messages", name, &bytes);
        }
    }

    /// A batch of two bags of table `a`.
    fn one_bag() -> nearrec::OwnedBatch {
        nearrec::OwnedBatch::new(vec![nearrec::OwnedLookup::with_lengths(
            "a",
            vec![3, 1, 3, 9],
            vec![3, 1],
        )])
    }
}
