//! Storage access for the SSD tier, behind one small trait.
//!
//! A [`BlockDevice`] reads aligned block ranges of a fixed set of files into one caller-owned
//! buffer and reports each read the moment it completes, in any order, so the engine can pool a
//! row as soon as its block lands. Three implementations pass one shared test suite
//! (`tests/devices.rs`):
//!
//! - [`UringDevice`]: io_uring with `O_DIRECT`, registered (fixed) files, the whole batch submitted
//!   together and kept at a configurable queue depth;
//! - [`PreadDevice`]: positional reads on a thread pool (`O_DIRECT` where the file system takes
//!   it), the fallback where io_uring or direct I/O is unavailable;
//! - [`MemDevice`]: files held in memory, for tests and for the flash-device model.
//!
//! [`FaultyDevice`] wraps any of them and fails batches on purpose, for fault-injection tests.
//!
//! [`open_device`] picks the best one the machine allows and says why when it falls back.
//!
//! [`measure_read_rate`] measures the disk's random-read rate through it (the flash model's
//! calibration, and the limit benchmarks compare against).
//!
//! Modules:
//! - `device.rs`: the trait, `ReadOp`, and `check_batch`, the validation every back-end runs;
//! - `uring.rs`, `pread.rs`, `mem.rs`, `faulty.rs`: the back-ends (io_uring rings are rebuilt in a
//!   forked child);
//! - `open.rs`: `IoConfig` (back-end, direct I/O, queue depth, rings), `DeviceKind`, `open_device`
//!   with its automatic fallback; `files.rs`: the open files and the direct-I/O alignment they
//!   need (from `statx`);
//! - `workers.rs`: thread pools that survive `fork()`, shared by every store of a process, one per
//!   role and thread count (`Workers`), and the fork gate (`fork_gate`: engine calls run inside
//!   it and a `pthread_atfork` handler waits for them, so no lock is held across a fork);
//! - `probe.rs`: `measure_read_rate`, direct block reads at a queue depth through io_uring;
//! - `error.rs`: `IoError`.
//!
//! The suite itself is `tests/suite/`, shared with `nearrec-device`, whose flash model runs it too.

mod device;
mod error;
mod faulty;
mod files;
mod mem;
mod open;
mod pread;
mod probe;
mod uring;
mod workers;

pub use device::{BlockDevice, ReadOp, check_batch};
pub use error::{IoError, Result};
pub use faulty::{Fault, FaultKind, FaultyDevice};
pub use mem::MemDevice;
pub use open::{DeviceKind, IoConfig, open_device};
pub use pread::PreadDevice;
pub use probe::{ReadRate, measure_read_rate};
pub use uring::UringDevice;
pub use workers::{ForkGuard, Workers, fork_gate};
