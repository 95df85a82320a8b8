//! The engine runs unchanged on the flash model: pooled results through it equal the DRAM tier's
//! on every parameter set, and the simulated time and traffic follow from the reads it issued.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nearrec_device::{DeviceConfig, FlashDevice};
use nearrec_engine::{Bags, Batch, Engine, EngineConfig, Indices, PoolingMode, TableLookup};
use nearrec_format::{DType, StoreReader};
use nearrec_io::{BlockDevice, MemDevice};

const ROWS: u64 = 5000;
const TABLES: [(&str, u32, DType); 3] = [
    ("a", 32, DType::Fp32),
    ("b", 16, DType::Fp16),
    ("c", 64, DType::Fp32),
];

fn store(dir: &Path) -> PathBuf {
    let tables = TABLES.map(|(name, dim, dtype)| (name, ROWS, dim, dtype));
    nearrec_testkit::write_store(dir.join("store"), &tables, nearrec_testkit::pattern)
}

fn indices(seed: u64, n: usize) -> Vec<i64> {
    let mut rng = nearrec_testkit::Xorshift::new(seed);
    (0..n).map(|_| rng.below(ROWS) as i64).collect()
}

fn run(engine: &Engine, idx: &[i64], offsets: &[i64]) -> Vec<f32> {
    let tables = TABLES
        .iter()
        .enumerate()
        .map(|(t, &(name, _, _))| {
            let req = TableLookup::new(
                name,
                Indices::I64(idx),
                Bags::Offsets {
                    offsets: Indices::I64(offsets),
                    include_last_offset: false,
                },
            );
            if t == 1 {
                req.with_mode(PoolingMode::Mean)
            } else {
                req
            }
        })
        .collect();
    engine.lookup(&Batch::new(tables)).unwrap().1
}

fn files(reader: &StoreReader) -> Vec<Vec<u8>> {
    reader
        .tables()
        .iter()
        .map(|t| std::fs::read(reader.path().join(&t.file)).unwrap())
        .collect()
}

#[test]
fn pooled_results_through_every_parameter_set_equal_the_dram_tier() {
    let dir = tempfile::tempdir().unwrap();
    let reader = StoreReader::open(store(dir.path())).unwrap();
    let dram = Engine::from_reader(&reader, EngineConfig::default(), None).unwrap();
    for name in DeviceConfig::PRESETS {
        let cfg = DeviceConfig::preset(name).unwrap();
        let dev = Arc::new(FlashDevice::new(MemDevice::new(files(&reader), 512), cfg));
        let ssd =
            Engine::with_device(&reader, EngineConfig::default(), Box::new(dev.clone())).unwrap();
        let mut reads_before = 0;
        for (s, bags) in [(1u64, 1usize), (2, 16), (3, 128)] {
            let idx = indices(s, bags * 20);
            let offsets: Vec<i64> = (0..bags as i64).map(|b| b * 20).collect();
            let want = run(&dram, &idx, &offsets);
            let got = run(&ssd, &idx, &offsets);
            assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{name}: cell {k}: {g} vs {w}"
                );
            }
            let st = dev.stats();
            assert!(
                st.flash_reads > reads_before,
                "{name}: the batch read flash"
            );
            reads_before = st.flash_reads;
        }
        let st = dev.stats();
        assert_eq!(st.batch_ns.len() as u64, st.batches);
        assert_eq!(st.batch_ns.iter().sum::<u64>(), st.busy_ns);
        assert!(st.channel_bytes >= st.flash_reads * 512 && st.link_bytes >= st.commands * 512);
    }
}

#[test]
fn a_slower_drive_takes_longer_for_the_same_reads() {
    let dir = tempfile::tempdir().unwrap();
    let reader = StoreReader::open(store(dir.path())).unwrap();
    let time = |cfg: DeviceConfig| {
        let dev = Arc::new(FlashDevice::new(MemDevice::new(files(&reader), 512), cfg));
        let ssd =
            Engine::with_device(&reader, EngineConfig::default(), Box::new(dev.clone())).unwrap();
        let idx = indices(9, 64 * 20);
        let offsets: Vec<i64> = (0..64).map(|b| b * 20).collect();
        run(&ssd, &idx, &offsets);
        (dev.stats().busy_ns, dev.kind())
    };
    // Without the 22 µs command cost the flash is the bottleneck, so its timing shows.
    let mut base = DeviceConfig::rm_ssd();
    base.controller.command_ns = 0;
    let (fast, kind) = time(base.clone());
    assert_eq!(kind, "flash-model");
    let mut narrow = base.clone();
    narrow.flash.channels = 1;
    assert!(
        time(narrow).0 > 2 * fast,
        "one channel is much slower than four"
    );
    let mut slow_pages = base;
    slow_pages.flash.page_read_ns *= 2;
    assert!(time(slow_pages).0 > fast * 3 / 2, "pages twice as slow");
}
