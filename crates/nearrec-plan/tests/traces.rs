//! The generators against the published locality numbers, and the trace file round trip.

use nearrec_plan::{
    Generator, Ids, PlanError, Profile, TableData, TableSpec, TraceFile, Variant, write_trace,
};

fn sd(k: f64, variant: Variant, ids: Ids) -> TableSpec {
    TableSpec {
        name: "t".into(),
        rows: 1_000_000,
        pooling: 80,
        generator: Generator::StackDistance { k, variant, ids },
    }
}

/// RecSSD / traces.md: K = 0 / 1 / 2 give about 14 / 55 / 71 % first references, and an LRU cache
/// of 2,000 rows at L = 80 hits about 84 / 44 / 29 %.
#[test]
fn continuous_traces_reproduce_the_published_locality() {
    for (k, share, hit) in [(0.0, 0.14, 0.84), (1.0, 0.55, 0.44), (2.0, 0.71, 0.29)] {
        let t = sd(k, Variant::Continuous, Ids::Full)
            .generate(5_000, 11)
            .unwrap();
        assert_eq!(t.indices.len(), 5_000 * 80);
        assert_eq!(t.offsets.len(), 5_001);
        let drawn = t.first_reference_share.unwrap();
        assert!(
            (drawn - share).abs() < 0.02,
            "K={k}: first-reference share {drawn}"
        );
        let p = Profile::of(t.indices.iter().map(|&i| i as u64));
        // the profile sees the same first references (ids used in warm-up aside)
        let seen = p.first_reference_share();
        assert!(
            seen >= drawn && seen - drawn < 0.02,
            "K={k}: profiled {seen} vs drawn {drawn}"
        );
        let h = p.lru_hit_ratio(2_000);
        assert!((h - hit).abs() < 0.03, "K={k}: LRU(2000) hit ratio {h}");
    }
}

#[test]
fn recssd_strided_ids_touch_few_rows() {
    let t = sd(1.0, Variant::Continuous, Ids::Strided { stride: 128 })
        .generate(2_000, 3)
        .unwrap();
    assert!(t.indices.iter().all(|&i| i % 128 == 0 && i < 1_000_000));
    let distinct = Profile::of(t.indices.iter().map(|&i| i as u64)).working_set();
    assert!(distinct <= 7_813, "{distinct}");
}

#[test]
fn per_bag_variant_keeps_distinct_ids_per_bag() {
    let t = sd(0.0, Variant::PerBag, Ids::Full)
        .generate(300, 5)
        .unwrap();
    assert_eq!(t.offsets.len(), 301);
    let mut short = 0;
    for w in t.offsets.windows(2) {
        let bag = &t.indices[w[0] as usize..w[1] as usize];
        assert!(!bag.is_empty() && bag.len() <= 80);
        assert!(bag.windows(2).all(|p| p[0] < p[1]), "sorted and distinct");
        short += usize::from(bag.len() < 80);
    }
    // high locality inside a bag: most bags repeat some id
    assert!(short > 250, "{short}");
}

#[test]
fn generators_are_seeded_and_zipf_is_skewed() {
    let spec = TableSpec {
        name: "z".into(),
        rows: 100_000,
        pooling: 20,
        generator: Generator::Zipf { alpha: 1.05 },
    };
    let (a, b, c) = (
        spec.generate(1_000, 1).unwrap(),
        spec.generate(1_000, 1).unwrap(),
        spec.generate(1_000, 2).unwrap(),
    );
    assert_eq!(a, b);
    assert_ne!(a.indices, c.indices);
    let p = Profile::of(a.indices.iter().map(|&i| i as u64));
    assert!(p.lru_hit_ratio(1_000) > 0.5, "{}", p.lru_hit_ratio(1_000));
    let uniform = TableSpec {
        generator: Generator::Uniform,
        ..spec.clone()
    }
    .generate(1_000, 1)
    .unwrap();
    let pu = Profile::of(uniform.indices.iter().map(|&i| i as u64));
    assert!(pu.lru_hit_ratio(1_000) < 0.05);
    let bad = TableSpec {
        generator: Generator::Zipf { alpha: -1.0 },
        ..spec
    };
    assert!(matches!(bad.generate(1, 1), Err(PlanError::BadSpec { table, .. }) if table == "z"));
}

#[test]
fn trace_files_round_trip_and_reject_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.nrtrace");
    let specs = [
        sd(1.0, Variant::Continuous, Ids::Full),
        TableSpec {
            name: "u".into(),
            rows: 1000,
            pooling: 3,
            generator: Generator::Uniform,
        },
    ];
    let traces: Vec<_> = specs.iter().map(|s| s.generate(50, 9).unwrap()).collect();
    let data: Vec<_> = specs
        .iter()
        .zip(&traces)
        .map(|(s, t)| TableData::generated(s, t))
        .collect();
    let header = write_trace(&path, 16, 9, &data, false).unwrap();
    assert!(matches!(
        write_trace(&path, 16, 9, &data, false),
        Err(PlanError::Exists { .. })
    ));
    let file = TraceFile::open(&path).unwrap();
    assert_eq!(file.header(), &header);
    for (i, t) in traces.iter().enumerate() {
        let s = file.table(i);
        assert_eq!(s.offsets, &t.offsets[..]);
        assert_eq!(s.indices, &t.indices[..]);
        assert_eq!(s.entry.offsets_at % 64, 0);
    }
    // a truncated file is refused, not mis-read
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 8]).unwrap();
    assert!(matches!(
        TraceFile::open(&path),
        Err(PlanError::BadTrace { .. })
    ));
    // an index outside its table is refused
    let mut bad = traces[1].clone();
    bad.indices[7] = 1000;
    let data = [TableData::generated(&specs[1], &bad)];
    let err = write_trace(&path, 16, 9, &data, true).unwrap_err();
    assert!(err.to_string().contains("position 7"), "{err}");
}

/// A keyed table's trace holds keys — any u64's bits, past the rows and negative as i64 — in a
/// version-3 file; a trace without keyed tables stays version 2; a version-2 file claiming keys
/// is refused, and a DRAM plan refuses keys it was not given as rows.
#[test]
fn keyed_traces_hold_keys_in_version_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.nrtrace");
    let offsets = [0i64, 2, 3];
    let keys = [u64::MAX as i64, 1 << 40, 7];
    let rows = [0i64, 1, 2];
    let table = |name, keyed, indices| TableData {
        name,
        rows: 8,
        pooling: 2,
        generator: None,
        first_reference_share: None,
        keys: keyed,
        offsets: &offsets,
        indices,
    };
    let version = |p: &std::path::Path| std::fs::read(p).unwrap()[8];
    // keys past the rows are refused in a table of rows
    let err = write_trace(&path, 4, 0, &[table("k", false, &keys)], false).unwrap_err();
    assert!(err.to_string().contains("position 0"), "{err}");

    write_trace(&path, 4, 0, &[table("r", false, &rows)], false).unwrap();
    assert_eq!(version(&path), 2);
    assert!(!TraceFile::open(&path).unwrap().header().tables[0].keys);

    let header = write_trace(
        &path,
        4,
        0,
        &[table("r", false, &rows), table("k", true, &keys)],
        true,
    )
    .unwrap();
    assert_eq!(version(&path), 3);
    let file = TraceFile::open(&path).unwrap();
    assert_eq!(file.header(), &header);
    assert!(file.verified());
    let k = file.table(1);
    assert!(k.entry.keys && !file.table(0).entry.keys);
    assert_eq!(k.indices, &keys[..]);

    // a plan of DRAM takes rows: keys are mapped first, with the store open
    let store = [nearrec_plan::PlanTable {
        name: "k".into(),
        rows: 8,
        row_bytes: 16,
        data_bytes: 128,
    }];
    let traced = nearrec_plan::trace_tables(&file);
    let err = nearrec_plan::check_trace(&store, &traced[1..]).unwrap_err();
    assert!(err.to_string().contains("holds keys"), "{err}");

    // the version is not under the header's checksum: a file that says 2 and holds keys is
    // refused by name, not read as rows
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 2;
    std::fs::write(&path, &bytes).unwrap();
    let err = TraceFile::open(&path).unwrap_err();
    assert!(
        err.to_string().contains("keys in a version-2 file"),
        "{err}"
    );
    bytes[8] = 4;
    std::fs::write(&path, &bytes).unwrap();
    let err = TraceFile::open(&path).unwrap_err();
    assert!(err.to_string().contains("version 4"), "{err}");
}
