//! What the workspace's tests share, so that no test crate writes its own copy: a small store
//! of patterned rows ([`write_store`], [`pattern`]; one keyed table, [`write_keyed_store`]), damage done to one of its bytes
//! ([`flip_bits`]), a seeded generator ([`Xorshift`]) and the two halves of a crash test
//! ([`Crash`]).
//! A dev-dependency only; nothing ships it.

use std::path::{Path, PathBuf};

use nearrec_format::{DType, StoreOptions, StoreReader, StoreWriter, TableSpec};

/// One table of a test store: name, rows, dim, dtype.
pub type Table<'a> = (&'a str, u64, u32, DType);

/// Value `i` (row-major) of table `t` the tests' stores hold unless they say otherwise: spread
/// over [-1.5, 1.5), distinct enough that a row read from the wrong place shows.
pub fn pattern(t: usize, i: u64) -> f32 {
    ((i * 7919 + t as u64 * 31) % 1013) as f32 * 0.003 - 1.5
}

/// A store of `tables` at `path`, value `i` (row-major) of table `t` being `value(t, i)`
/// (before the table's dtype); committed, and its path returned.
pub fn write_store(
    path: impl AsRef<Path>,
    tables: &[Table<'_>],
    value: impl Fn(usize, u64) -> f32,
) -> PathBuf {
    let path = path.as_ref().to_path_buf();
    let mut w = StoreWriter::create(&path, StoreOptions::default()).expect("a new store");
    for (t, &(name, rows, dim, dtype)) in tables.iter().enumerate() {
        let mut table = w
            .table(TableSpec::new(name, rows, dim, dtype))
            .expect("a table");
        let values: Vec<f32> = (0..rows * u64::from(dim)).map(|i| value(t, i)).collect();
        table.write_f32(&values).expect("the rows");
        w.finish_table(table).expect("the table");
    }
    w.commit().expect("the commit");
    path
}

/// A store of one keyed table `name` at `path`: key `keys[r]`'s row holds `value(0, i)` at its
/// value `i` (row-major over the keys' rows, before the dtype); committed, and its path returned.
pub fn write_keyed_store(
    path: impl AsRef<Path>,
    name: &str,
    keys: &[u64],
    dim: u32,
    dtype: DType,
    value: impl Fn(usize, u64) -> f32,
) -> PathBuf {
    let path = path.as_ref().to_path_buf();
    let mut w = StoreWriter::create(&path, StoreOptions::default()).expect("a new store");
    let mut table = w
        .keyed_table(TableSpec::new(name, keys.len() as u64, dim, dtype), 0)
        .expect("a keyed table");
    let values: Vec<f32> = (0..keys.len() as u64 * u64::from(dim))
        .map(|i| value(0, i))
        .collect();
    table.write_f32(&values).expect("the rows");
    w.finish_table_keyed(table, keys).expect("the table");
    w.commit().expect("the commit");
    path
}

/// Flips the bits `mask` of byte `at` of table `t`'s data region (rows in id order, after its
/// file's header) in the store at `path`, as a disk's rot would.
pub fn flip_bits(path: &Path, t: usize, at: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let reader = StoreReader::open(path).expect("the store");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path.join(&reader.tables()[t].file))
        .expect("its table file");
    let at = nearrec_format::DATA_OFFSET + at;
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).expect("the byte");
    file.write_all_at(&[b[0] ^ mask], at)
        .expect("the byte changed");
}

/// A seeded generator (xorshift64): the tests' random batches are the same on every run.
#[derive(Debug, Clone)]
pub struct Xorshift(u64);

impl Xorshift {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (0 for `n` 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A crash test (a writer killed at a failpoint) in two halves of one test binary: the parent
/// runs the child test in a process of its own ([`Crash::run`]); the child makes calls,
/// acknowledging each ([`Crash::acknowledge`]), until the failpoint aborts it.
#[derive(Debug)]
pub struct Crash {
    /// The store the child writes.
    pub store: PathBuf,
    /// The failpoint that stops it.
    pub point: String,
    acked: String,
}

impl Crash {
    const STORE: &'static str = "NEARREC_CRASH_STORE";
    const POINT: &'static str = "NEARREC_CRASH_POINT";

    /// In the child half: the store and failpoint the parent gave (`None`: run as a plain test,
    /// the child half does nothing).
    pub fn child() -> Option<Self> {
        let (Ok(store), Ok(point)) = (std::env::var(Self::STORE), std::env::var(Self::POINT))
        else {
            return None;
        };
        Some(Self {
            store: store.into(),
            point,
            acked: String::new(),
        })
    }

    /// Call `k` returned: written down beside the store, for the parent to count.
    pub fn acknowledge(&mut self, k: u64) {
        self.acked.push_str(&format!("{k}\n"));
        std::fs::write(self.store.with_extension("acked"), &self.acked).expect("the acked file");
    }

    /// Runs test `child` of this test binary on `store`, stopped at failpoint `point`: it must
    /// end aborted (the failpoints abort; a panic or a clean exit would not); returns the calls
    /// it acknowledged.
    pub fn run(child: &str, store: &Path, point: &str) -> usize {
        use std::os::unix::process::ExitStatusExt;
        let exe = std::env::current_exe().expect("the test binary");
        let status = std::process::Command::new(exe)
            .args(["--exact", child, "--ignored", "--nocapture"])
            .env(Self::STORE, store)
            .env(Self::POINT, point)
            .status()
            .expect("the child runs");
        // how `std::process::abort` ends a process
        const SIGABRT: i32 = 6;
        assert_eq!(status.signal(), Some(SIGABRT), "{point}: {status}");
        let acked = std::fs::read_to_string(store.with_extension("acked")).expect("acked");
        acked.lines().count()
    }
}
