use std::path::PathBuf;

use crate::device::BlockDevice;
use crate::error::{IoError, Result};
use crate::files::Files;
use crate::pread::PreadDevice;
use crate::uring::UringDevice;

/// Which back-end [`open_device`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// io_uring with `O_DIRECT` where both work; otherwise `pread`, with one line on stderr
    /// saying why.
    #[default]
    Auto,
    Uring,
    Pread,
}

/// How the device for a store's table files is built. `Default` gives the recommended settings.
#[derive(Debug, Clone, PartialEq)]
pub struct IoConfig {
    pub kind: DeviceKind,
    /// Bypass the page cache (`O_DIRECT`). With `false`, reads go through the page cache, which
    /// then holds whatever it likes: use only for comparisons.
    pub direct: bool,
    /// Reads in flight per io_uring ring.
    pub queue_depth: u32,
    /// io_uring rings (threads that can read at once).
    pub rings: usize,
    /// Read threads of the pread device (its queue depth).
    pub pread_threads: usize,
}

impl Default for IoConfig {
    fn default() -> Self {
        Self {
            kind: DeviceKind::Auto,
            direct: true,
            queue_depth: 128,
            rings: 2,
            pread_threads: 16,
        }
    }
}

impl IoConfig {
    pub fn with_kind(mut self, kind: DeviceKind) -> Self {
        self.kind = kind;
        self
    }

    pub fn with_direct(mut self, direct: bool) -> Self {
        self.direct = direct;
        self
    }

    pub fn with_queue_depth(mut self, queue_depth: u32) -> Self {
        self.queue_depth = queue_depth;
        self
    }

    pub fn with_rings(mut self, rings: usize) -> Self {
        self.rings = rings;
        self
    }

    pub fn with_pread_threads(mut self, threads: usize) -> Self {
        self.pread_threads = threads;
        self
    }
}

/// Opens the block device for `paths` as `config` asks. With [`DeviceKind::Auto`], failures of
/// io_uring or of `O_DIRECT` fall back (to `pread`, then to buffered reads) with one line on
/// stderr; an explicit kind fails instead.
pub fn open_device(paths: &[PathBuf], config: &IoConfig) -> Result<Box<dyn BlockDevice>> {
    let uring = |files| -> Result<Box<dyn BlockDevice>> {
        Ok(Box::new(UringDevice::new(
            files,
            config.queue_depth,
            config.rings,
        )?))
    };
    let pread =
        |files| -> Box<dyn BlockDevice> { Box::new(PreadDevice::new(files, config.pread_threads)) };
    match config.kind {
        DeviceKind::Uring => uring(Files::open(paths, config.direct)?),
        DeviceKind::Pread => Ok(pread(Files::open(paths, config.direct)?)),
        DeviceKind::Auto => {
            let files = match Files::open(paths, config.direct) {
                Err(e @ IoError::Open { .. }) if config.direct => {
                    eprintln!(
                        "nearrec: direct I/O unavailable ({e}); reading through the page cache"
                    );
                    Files::open(paths, false)?
                }
                other => other?,
            };
            let reopen_direct = files.direct;
            match uring(files) {
                Ok(dev) => Ok(dev),
                Err(e) => {
                    eprintln!("nearrec: io_uring unavailable ({e}); using pread threads");
                    Ok(pread(Files::open(paths, reopen_direct)?))
                }
            }
        }
    }
}
