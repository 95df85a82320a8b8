//! The open table files of a device, and what reading them demands (direct-I/O alignment).

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{IoError, Result};

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
