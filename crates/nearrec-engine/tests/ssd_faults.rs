//! The SSD tier over a failing device: every fault is a typed error (never a hang, never a
//! partial result passed off as success), and the store serves again once the fault clears.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nearrec_engine::{Bags, Batch, Engine, EngineConfig, EngineError, Indices, TableLookup};
use nearrec_format::{DType, StoreReader};
use nearrec_io::{DeviceKind, Fault, FaultKind, FaultyDevice, IoConfig, IoError, open_device};

const ROWS: u64 = 5000;
const DIM: u32 = 16;

fn store(dir: &Path) -> PathBuf {
    let tables = [
        ("t0", ROWS, DIM, DType::Fp32),
        ("t1", ROWS, DIM, DType::Fp32),
    ];
    nearrec_testkit::write_store(dir.join("store"), &tables, |t, i| {
        (i % 977) as f32 * 0.01 + t as f32
    })
}

fn lookup(engine: &Engine, idx: &[i64]) -> Result<Vec<f32>, EngineError> {
    let req = Batch::new(
        ["t0", "t1"]
            .iter()
            .map(|t| {
                TableLookup::new(
                    t,
                    Indices::I64(idx),
                    Bags::Fixed {
                        batch: idx.len() / 4,
                        bag_size: 4,
                    },
                )
            })
            .collect(),
    );
    engine.lookup(&req).map(|(_, out)| out)
}

/// Equal within fp32 rounding (the SSD tier sums rows in the order their reads land).
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: cell {k}: {g} vs {w}"
        );
    }
}

#[test]
fn faults_are_typed_errors_and_the_store_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let reader = StoreReader::open(&path).unwrap();
    let files: Vec<PathBuf> = reader.tables().iter().map(|t| path.join(&t.file)).collect();
    let idx: Vec<i64> = (0..400).map(|i| i * 37 % ROWS as i64).collect();
    let want = lookup(
        &Engine::from_reader(&reader, EngineConfig::default(), None).unwrap(),
        &idx,
    )
    .unwrap();
    for kind in [DeviceKind::Uring, DeviceKind::Pread] {
        let inner = open_device(&files, &IoConfig::default().with_kind(kind)).unwrap();
        let faulty = Arc::new(FaultyDevice::new(inner));
        let engine =
            Engine::with_device(&reader, EngineConfig::default(), Box::new(faulty.clone()))
                .unwrap();
        let before = lookup(&engine, &idx).unwrap();
        assert_close(&before, &want, &format!("{kind:?} before any fault"));
        for (fault, after) in [
            (FaultKind::Eio, 0),
            (FaultKind::Eio, 50),
            (FaultKind::ShortRead, 3),
        ] {
            faulty.arm(Fault {
                kind: fault,
                after,
                batches: 2,
            });
            for _ in 0..2 {
                match lookup(&engine, &idx) {
                    Err(EngineError::Io(IoError::Read { source, .. })) => {
                        assert_eq!(fault, FaultKind::Eio);
                        assert_eq!(source.raw_os_error(), Some(libc::EIO));
                    }
                    Err(EngineError::Io(IoError::ShortRead { .. })) => {
                        assert_eq!(fault, FaultKind::ShortRead)
                    }
                    other => panic!("{kind:?} {fault:?}: expected an I/O error, got {other:?}"),
                }
            }
            // the fault was transient: the same store answers again, and right
            let after = lookup(&engine, &idx).unwrap();
            assert_close(&after, &want, &format!("{kind:?} after {fault:?}"));
        }
        let stats = engine.io_stats().unwrap();
        assert!(
            stats
                .snapshot()
                .iter()
                .any(|(k, v)| k == "batches" && *v >= 4.0)
        );
    }
}

#[test]
fn a_device_for_another_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let reader = StoreReader::open(&path).unwrap();
    let one = open_device(&[path.join(&reader.tables()[0].file)], &IoConfig::default()).unwrap();
    let err = Engine::with_device(&reader, EngineConfig::default(), one).unwrap_err();
    assert!(err.to_string().contains("2 tables"), "{err}");
}
