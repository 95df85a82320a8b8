//! Faults on the write path (issue 40): the disk refusing the log's write (ENOSPC) or its sync
//! (EIO), a compaction's new table file (ENOSPC) or its manifest (EIO), injected at the
//! format crate's failpoints. Each time the failing call is refused with a typed error and
//! nothing of it is served; every write acknowledged before stays served; a log that failed
//! refuses every later write until the store is opened again, which recovers every
//! acknowledged write — and the refused one only where its record reached the kernel before its
//! sync failed, whole (as a write cut by a crash).
//!
//! Failpoints are the process's: this file is its own test binary, and one test runs every
//! fault in turn.

use nearrec::prelude::*;
use std::path::Path;

use nearrec::{ErrorKind, Store, StoreConfig};
use nearrec_format::DType;

const ROWS: u64 = 64;
const DIM: usize = 4;

fn config() -> StoreConfig {
    let mut c = StoreConfig::from_toml("tier = \"ssd\"\ndram_budget = \"4KiB\"").unwrap();
    c.writable = true;
    c.auto_compact = false;
    c
}

/// Row `id` after write `k`: every value `k`.
fn row(k: u64) -> Vec<f32> {
    vec![k as f32; DIM]
}

/// Each row's last acknowledged write (0: none since the store was made with zeros).
struct Model([u64; ROWS as usize]);

impl Model {
    fn write(&mut self, s: &Store, k: u64) -> nearrec::Result<u64> {
        let id = (k * 7) % ROWS;
        let v = s.write("t", &[id as i64], &row(k))?;
        self.0[id as usize] = k;
        Ok(v)
    }

    fn check(&self, s: &Store, what: &str) {
        let ids: Vec<i64> = (0..ROWS as i64).collect();
        let mut got = vec![0f32; ROWS as usize * DIM];
        s.read_rows("t", &ids, &mut got).unwrap();
        for (id, &k) in self.0.iter().enumerate() {
            assert_eq!(&got[id * DIM..][..DIM], row(k), "{what}: row {id}");
        }
    }
}

fn store(dir: &Path) -> std::path::PathBuf {
    nearrec_testkit::write_store(
        dir.join("store"),
        &[("t", ROWS, DIM as u32, DType::Fp32)],
        |_, _| 0.0,
    )
}

#[test]
fn a_write_the_disk_refuses_is_refused_and_loses_no_acknowledged_write() {
    for (point, on) in [
        ("wal::write", "write"),
        ("wal::sync", "write"),
        ("table::write", "compact"),
        ("manifest::publish", "compact"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = store(dir.path());
        let mut model = Model([0; ROWS as usize]);
        let s = Store::open(&path, &config()).unwrap();
        for k in 1..=20 {
            model.write(&s, k).unwrap();
        }
        if on == "compact" {
            s.compact().unwrap();
            for k in 21..=30 {
                model.write(&s, k).unwrap();
            }
        }
        let version = s.version().unwrap();
        fail::cfg(point, "return").unwrap();
        let failed = match on {
            "write" => {
                let id = (31 * 7) % ROWS;
                s.write("t", &[id as i64], &row(31)).map(|_| ())
            }
            _ => s.compact().map(|_| ()),
        };
        fail::remove(point);
        let e = failed.expect_err(point);
        assert_eq!(e.kind(), ErrorKind::StoreIo, "{point}: {e}");
        // nothing of it served; everything acknowledged still is
        assert_eq!(s.version().unwrap(), version, "{point}");
        model.check(&s, point);
        match on {
            // the log may have dropped what it wrote: it takes nothing more until reopened
            "write" => {
                let e = model.write(&s, 32).expect_err(point);
                assert_eq!(e.kind(), ErrorKind::StoreIo, "{point}: {e}");
            }
            // a compaction that failed leaves the log as it was: writes go on, and the next
            // compaction succeeds
            _ => {
                model.write(&s, 32).unwrap();
                s.compact().unwrap();
                model.check(&s, point);
            }
        }
        // closing says the log failed, and lets go of the store all the same
        let closed = s.close();
        assert_eq!(closed.is_err(), on == "write", "{point}: {closed:?}");
        let again = Store::open(&path, &config()).unwrap();
        // a write refused after its record reached the kernel (its sync failed) is like one cut
        // by a crash: recovered whole, or not at all — never part of it
        if on == "write" && again.version().unwrap() > version {
            assert_eq!(point, "wal::sync", "{point}: a refused write came back");
            assert_eq!(again.version().unwrap(), version + 1, "{point}");
            model.0[((31 * 7) % ROWS) as usize] = 31;
        }
        model.check(&again, point);
        // and it takes writes again
        model.write(&again, 40).unwrap();
        model.check(&again, point);
    }
}
