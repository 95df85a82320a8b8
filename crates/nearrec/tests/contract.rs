//! The store's conformance suite (`tests/suite/`) over the embedded store: on the DRAM tier,
//! and on the SSD tier behind DRAM tiers smaller than its tables.

#[macro_use]
mod suite;

use std::path::Path;
use std::sync::Arc;

use nearrec::{Store, StoreConfig};

use suite::Opened;

fn embedded(path: &Path, toml: &str, writable: bool) -> Opened {
    let mut config = StoreConfig::from_toml(toml).unwrap();
    config.writable = writable;
    Opened {
        store: Arc::new(Store::open(path, &config).unwrap()),
        keep: Box::new(()),
    }
}

mod dram {
    use super::*;

    fn open(path: &Path, writable: bool) -> Opened {
        embedded(path, "tier = \"dram\"", writable)
    }

    store_api_suite!(open);
}

mod ssd {
    use super::*;

    /// A hot partition and a row cache in 16 KiB, the rest read with direct I/O.
    fn open(path: &Path, writable: bool) -> Opened {
        let toml = "tier = \"ssd\"\ndram_budget = \"16KiB\"\ncache_policy = \"lru\"";
        embedded(path, toml, writable)
    }

    store_api_suite!(open);
}

/// Closing a writable store lets go of its writer lock before `close` returns.
#[test]
fn a_closed_writer_lets_go_of_its_lock_at_once() {
    let (_dir, path) = suite::fixture();
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let store = Store::open(&path, &config).unwrap();
    let held = store.clone(); // another reference: closing must not wait for it
    let e = Store::open(&path, &config).unwrap_err();
    assert_eq!(e.kind(), nearrec::ErrorKind::StoreLocked);
    store.close().unwrap();
    let again = Store::open(&path, &config).unwrap();
    assert!(again.writable() && !held.writable());
    let e = held.remove("t0", &[1]).unwrap_err();
    assert_eq!(e.kind(), nearrec::ErrorKind::StoreReadOnly, "{e}");
}

/// A read-only store that follows its writer runs the weights the writer's model update wrote.
#[test]
fn a_follower_runs_the_weights_its_writer_updated() {
    let (_dir, path) = suite::fixture();
    let dim = suite::DIM as usize;
    let old = vec![0.25f32; dim];
    suite::keep_model(&path, &old, 0.0);
    let writer = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let writer = Store::open(&path, &writer).unwrap();
    let follower = StoreConfig {
        follow_ms: Some(20),
        ..StoreConfig::default()
    };
    let follower = Store::open(&path, &follower).unwrap();
    let batch = nearrec::OwnedBatch::new(vec![nearrec::OwnedLookup::with_lengths(
        "t0",
        vec![3i64, 8],
        vec![1i64, 1],
    )]);
    let infer = |s: &Store| s.infer(&[], &nearrec::AsBatch::as_batch(&batch)).unwrap();
    let before = infer(&follower).outputs;
    let new = vec![-0.5f32; dim];
    let weights = [
        nearrec::model::Tensor {
            name: "top.weight",
            shape: &[1, dim],
            values: &new,
        },
        nearrec::model::Tensor {
            name: "top.bias",
            shape: &[1],
            values: &[1.0],
        },
    ];
    writer.update_model(&weights).unwrap();
    let want = infer(&writer).outputs;
    assert_ne!(want, before);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while infer(&follower).outputs != want {
        assert!(std::time::Instant::now() < deadline, "not followed in 10 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
