use std::fs::File;
use std::path::{Path, PathBuf};

use crate::device::BlockDevice;
use crate::error::{IoError, Result};
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

/// The open files of a device, with what reading them demands.
#[derive(Debug)]
pub(crate) struct Files {
    pub(crate) files: Vec<File>,
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) lens: Vec<u64>,
    /// Alignment of offsets, lengths and buffers, in bytes.
    pub(crate) block: usize,
    pub(crate) direct: bool,
}

impl Files {
    /// Opens `paths` read-only, with `O_DIRECT` when `direct`. The block size is the largest
    /// direct-I/O alignment the files' file systems ask for (512 B on this project's disks),
    /// or 512 for buffered reads.
    pub(crate) fn open(paths: &[PathBuf], direct: bool) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut lens = Vec::with_capacity(paths.len());
        let mut block = 512usize;
        for p in paths {
            let open = |e| IoError::Open {
                path: p.clone(),
                source: e,
            };
            // (the table files of a store: no symbolic link, see nearrec_format::files)
            let flags = nearrec_format::files::IN_STORE | if direct { libc::O_DIRECT } else { 0 };
            let f = nearrec_format::files::open_regular(p, flags).map_err(open)?;
            lens.push(f.metadata().map_err(open)?.len());
            if direct {
                block = block.max(direct_io_alignment(p, &f)?);
            }
            files.push(f);
        }
        Ok(Self {
            files,
            paths: paths.to_vec(),
            lens,
            block,
            direct,
        })
    }
}

/// The offset and memory alignment direct I/O on `file` needs (`statx` `STATX_DIOALIGN`, Linux
/// 6.1+); 4096 where the kernel does not say, which every device we know accepts.
fn direct_io_alignment(path: &Path, file: &File) -> Result<usize> {
    use std::os::fd::AsRawFd;
    const STATX_DIOALIGN: u32 = 0x2000;
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd, an empty path with AT_EMPTY_PATH, and a properly sized out struct.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & STATX_DIOALIGN == 0 {
        return Ok(4096);
    }
    if stx.stx_dio_offset_align == 0 {
        return Err(IoError::Open {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the file system does not support direct I/O on this file",
            ),
        });
    }
    Ok(stx.stx_dio_offset_align.max(stx.stx_dio_mem_align) as usize)
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
