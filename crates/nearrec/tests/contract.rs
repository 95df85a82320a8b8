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
