use std::os::unix::fs::FileExt;
use std::sync::{Arc, mpsc};

use crate::device::{BlockDevice, ReadOp, check_batch};
use crate::error::{IoError, Result};
use crate::files::Files;
use crate::workers::Workers;

/// Positional reads (`pread`) on a pool of threads, one read per task: as many reads in flight
/// as there are threads. The fallback where io_uring or `O_DIRECT` is unavailable (tmpfs, old
/// kernels, seccomp profiles), and the reference the io_uring device is tested against.
#[derive(Debug)]
pub struct PreadDevice {
    files: Files,
    workers: Arc<Workers>,
}

impl PreadDevice {
    /// A device over `files` with `threads` read threads (the queue depth it can reach).
    pub(crate) fn new(files: Files, threads: usize) -> Self {
        Self {
            files,
            workers: Workers::shared("read", threads),
        }
    }

    pub fn threads(&self) -> usize {
        self.workers.threads()
    }
}

/// The batch buffer, shared with the read tasks; each task writes only its op's bytes, which
/// `check_batch` proved disjoint.
#[derive(Clone, Copy)]
struct SharedBuf(*mut u8);
// SAFETY: tasks write disjoint ranges (see above) and the buffer outlives the scope they run in.
unsafe impl Send for SharedBuf {}
// SAFETY: as above.
unsafe impl Sync for SharedBuf {}

impl BlockDevice for PreadDevice {
    fn kind(&self) -> &'static str {
        "pread"
    }

    fn direct(&self) -> bool {
        self.files.direct
    }

    fn block_size(&self) -> usize {
        self.files.block
    }

    fn file_lens(&self) -> &[u64] {
        &self.files.lens
    }

    fn read_batch(
        &self,
        ops: &[ReadOp],
        buf: &mut [u8],
        done: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        check_batch(ops, buf, self.files.block, &self.files.lens)?;
        let shared = SharedBuf(buf.as_mut_ptr());
        let pool = self.workers.get()?;
        let mut first_error = None;
        // Every task finishes before `in_place_scope` returns, so no read outlives the call.
        pool.in_place_scope(|scope| {
            let (tx, rx) = mpsc::channel::<(usize, Result<()>)>();
            for (i, op) in ops.iter().enumerate() {
                let tx = tx.clone();
                let files = &self.files;
                scope.spawn(move |_| {
                    let shared = shared;
                    // SAFETY: op i's destination is inside `buf` and no other task touches it.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(shared.0.add(op.buf_at), op.len as usize)
                    };
                    let _ = tx.send((i, read_exact(files, op, dst)));
                });
            }
            drop(tx);
            for (i, res) in rx {
                match res {
                    Ok(()) if first_error.is_none() => {
                        let op = &ops[i];
                        // SAFETY: op i's task has finished writing; nothing writes these bytes now.
                        let bytes = unsafe {
                            std::slice::from_raw_parts(shared.0.add(op.buf_at), op.len as usize)
                        };
                        done(i, bytes);
                    }
                    Ok(()) => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        });
        first_error.map_or(Ok(()), Err)
    }
}

/// Reads all of `dst` at the op's offset, retrying short reads; end of file is an error.
fn read_exact(files: &Files, op: &ReadOp, dst: &mut [u8]) -> Result<()> {
    let file = &files.files[op.file as usize];
    let mut got = 0usize;
    while got < dst.len() {
        match file.read_at(&mut dst[got..], op.offset + got as u64) {
            Ok(0) => {
                return Err(IoError::ShortRead {
                    path: files.paths[op.file as usize].clone(),
                    offset: op.offset,
                    len: dst.len(),
                    got,
                });
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(IoError::Read {
                    path: files.paths[op.file as usize].clone(),
                    offset: op.offset,
                    len: dst.len(),
                    source,
                });
            }
        }
    }
    Ok(())
}
