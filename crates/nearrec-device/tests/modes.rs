//! The seven designs on the flash model: every mode runs every model shape on every parameter
//! set; each reads what its design reads; bad batches are typed errors naming table and position.

use nearrec_device::{
    DeviceConfig, DeviceError, Mode, RowPlacement, SimSpec, Simulator, TableBatch, TableShape,
    Workload, simulate,
};
use nearrec_format::DType;
use nearrec_plan::{Generator, Ids, Variant};

/// The eight benchmark models' shapes (shared/specs/models.md), with tables cut to `rows` rows.
fn models(rows: u64) -> Vec<(&'static str, Workload, u32)> {
    let w = |tables: usize, dim: u32, bottom: &[usize], top: &[usize]| Workload {
        tables: (0..tables)
            .map(|t| TableShape::new(format!("t{t}"), rows, dim, DType::Fp32))
            .collect(),
        bottom: bottom.to_vec(),
        top: top.to_vec(),
        placement: RowPlacement::Packed,
    };
    vec![
        ("rmc1", w(8, 32, &[128, 64, 32], &[288, 256, 64, 1]), 80),
        ("rmc2", w(32, 64, &[256, 128, 64], &[2112, 128, 64, 1]), 120),
        (
            "rmc3",
            w(10, 32, &[2560, 1024, 256, 32], &[352, 512, 256, 1]),
            20,
        ),
        ("wnd", w(27, 32, &[], &[1376, 1024, 512, 256, 1]), 1),
        ("mtwnd", w(43, 32, &[], &[1888, 1024, 512, 256, 128, 1]), 1),
        ("ncf", w(4, 64, &[], &[256, 256, 128, 64, 1]), 1),
        ("din", w(4, 32, &[], &[128, 200, 80, 2]), 3),
        ("dien", w(4, 32, &[], &[128, 200, 80, 2]), 3),
    ]
}

fn spec(w: Workload, device: DeviceConfig, mode: Mode, pooling: u32, batch: usize) -> SimSpec {
    SimSpec {
        workload: w,
        device,
        mode,
        batch,
        batches: 3,
        warmup: 2,
        pooling,
        generator: Generator::StackDistance {
            k: 1.0,
            variant: Variant::Continuous,
            ids: Ids::Full,
        },
        seed: 5,
    }
}

#[test]
fn every_mode_runs_every_model_on_every_device() {
    for device in DeviceConfig::PRESETS {
        for (name, w, pooling) in models(100_000) {
            for mode in Mode::ALL {
                let mut d = DeviceConfig::preset(device).unwrap();
                d.host.dram_bytes = 1 << 20;
                let r = simulate(&spec(w.clone(), d, mode, pooling, 4)).unwrap();
                let what = format!("{device} {name} {}", mode.name());
                assert_eq!(r.samples, 12, "{what}");
                assert_eq!(
                    r.lookups,
                    12 * u64::from(pooling) * w.tables.len() as u64,
                    "{what}"
                );
                assert!(r.latency_p50_ms > 0.0 && r.throughput > 0.0, "{what}");
                assert!(r.latency_p99_ms >= r.latency_p50_ms, "{what}");
                assert!(r.link_bytes > 0, "{what}: something crosses the link");
                assert_eq!(r.kernels.is_some(), mode == Mode::RmSsd, "{what}");
            }
        }
    }
}

/// One table of 100K rows of dim 32, `n` bags of `per` lookups from `rows`.
fn one_table(rows: &[i64]) -> (Workload, Vec<i64>) {
    let w = Workload {
        tables: vec![TableShape::new("t", 100_000, 32, DType::Fp32)],
        bottom: vec![],
        top: vec![32, 1],
        placement: RowPlacement::Packed,
    };
    let offsets = (0..=rows.len() as i64 / 4).map(|b| b * 4).collect();
    (w, offsets)
}

fn run(mode: Mode, device: DeviceConfig, rows: &[i64]) -> nearrec_device::BatchReport {
    let (w, offsets) = one_table(rows);
    let mut sim = Simulator::new(device, w, mode).unwrap();
    let b = [TableBatch {
        indices: rows,
        offsets: &offsets,
    }];
    sim.warm(&[b.to_vec()]).unwrap();
    sim.run_batch(&b).unwrap()
}

#[test]
fn each_design_reads_what_it_should() {
    // 64 lookups: 32 rows each looked up twice, the 32 rows packed into one 4 KiB block.
    let rows: Vec<i64> = (0..64).map(|i| (i % 32) as i64).collect();
    let d = DeviceConfig::rm_ssd();
    let page = run(Mode::EmbPageSum, d.clone(), &rows);
    assert_eq!((page.flash_reads, page.channel_bytes), (64, 64 * 4096));
    let vector = run(Mode::EmbVectorSum, d.clone(), &rows);
    assert_eq!((vector.flash_reads, vector.channel_bytes), (64, 64 * 128));
    assert!(
        vector.embed_ns < page.embed_ns,
        "vector-grained reads are shorter"
    );
    assert_eq!(
        vector.link_bytes,
        8 * (64 + 17) + 16 * 32 * 4,
        "indices in, pooled out"
    );
    let rm = run(Mode::RmSsd, d.clone(), &rows);
    assert_eq!(
        rm.link_bytes,
        8 * (64 + 17) + 64,
        "only CTRs (one MMIO word) come back"
    );
    let base = run(
        Mode::EmbSsd {
            merging: false,
            caching: false,
        },
        d.clone(),
        &rows,
    );
    assert_eq!(base.flash_reads, 64);
    let merged = run(
        Mode::EmbSsd {
            merging: true,
            caching: false,
        },
        d.clone(),
        &rows,
    );
    assert_eq!(merged.flash_reads, 1, "one NAND page holds every row");
    // Caching (warmed by the same batch) serves every row from controller DRAM.
    let mut with_dram = d.clone();
    with_dram.controller.dram_cache_bytes = 1 << 20;
    let cached = run(
        Mode::EmbSsd {
            merging: true,
            caching: true,
        },
        with_dram,
        &rows,
    );
    assert_eq!((cached.flash_reads, cached.device_hits), (0, 64));
    let mmio = run(Mode::EmbMmio, d.clone(), &rows);
    assert_eq!((mmio.flash_reads, mmio.host_ios), (64, 64));
    // SSD-S with a warm page cache reads nothing; with none, every lookup misses.
    let mut cached_host = d.clone();
    cached_host.host.dram_bytes = 1 << 20;
    let warm = run(Mode::SsdS, cached_host, &rows);
    assert_eq!((warm.flash_reads, warm.host_hits), (0, 64));
    let cold = run(Mode::SsdS, d.clone(), &rows);
    assert_eq!((cold.flash_reads, cold.link_bytes), (64, 64 * 4096));
    assert!(cold.latency_ns > vector.latency_ns);
}

#[test]
fn recssd_reads_each_distinct_page_once_and_keeps_hot_rows_on_the_host() {
    let mut d = DeviceConfig::cosmos_plus();
    d.controller.dram_cache_bytes = 0;
    // Rows 0..32 fill a quarter of one 16 KiB page; the host keeps 128 B × 8 = 1 KiB of hot rows.
    d.host.dram_bytes = 1024;
    let (w, _) = one_table(&[]);
    let mut sim = Simulator::new(d.clone(), w.clone(), Mode::RecSsd).unwrap();
    let warm_rows: Vec<i64> = (0..8).flat_map(|r| [r; 10]).collect();
    let warm_offsets: Vec<i64> = (0..=20).map(|b| b * 4).collect();
    sim.warm(&[vec![TableBatch {
        indices: &warm_rows,
        offsets: &warm_offsets,
    }]])
    .unwrap();
    let rows: Vec<i64> = (0..64).map(|i| (i % 32) as i64).collect();
    let offsets: Vec<i64> = (0..=16).map(|b| b * 4).collect();
    let r = sim
        .run_batch(&[TableBatch {
            indices: &rows,
            offsets: &offsets,
        }])
        .unwrap();
    assert_eq!(r.host_hits, 16, "rows 0..8, twice each");
    assert_eq!(r.flash_reads, 1);
    // One row per 16 KiB page: every distinct cold row is its own page read.
    let mut spread = w;
    spread.placement = RowPlacement::OnePerPage;
    let mut sim = Simulator::new(d, spread, Mode::RecSsd).unwrap();
    let r = sim
        .run_batch(&[TableBatch {
            indices: &rows,
            offsets: &offsets,
        }])
        .unwrap();
    assert_eq!(r.flash_reads, 32);
}

#[test]
fn bad_batches_name_the_table_and_position() {
    let (w, offsets) = one_table(&[0; 8]);
    let mut sim = Simulator::new(DeviceConfig::rm_ssd(), w, Mode::RmSsd).unwrap();
    let rows = [1, 2, 3, 100_000, 5, 6, 7, 8];
    let err = sim
        .run_batch(&[TableBatch {
            indices: &rows,
            offsets: &offsets,
        }])
        .unwrap_err();
    assert!(
        matches!(&err, DeviceError::Request { table, .. } if table == "t"),
        "{err}"
    );
    assert!(err.to_string().contains("position 3"), "{err}");
    let err = sim
        .run_batch(&[TableBatch {
            indices: &rows[..4],
            offsets: &offsets,
        }])
        .unwrap_err();
    assert!(err.to_string().contains("offsets"), "{err}");
    assert!(sim.run_batch(&[]).is_err());
    assert!(Mode::parse("emb-ssd:merge").is_ok() && Mode::parse("ssd-x").is_err());
}
