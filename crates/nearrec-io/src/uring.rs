use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};

use io_uring::{IoUring, opcode, types};

use crate::device::{BlockDevice, ReadOp, check_batch, dest};
use crate::error::{IoError, Result};
use crate::files::Files;

/// io_uring reads: every read of a batch goes into the submission queue (up to `queue_depth`
/// in flight), one `io_uring_enter` submits them and waits, and each completion is handed to the
/// caller as it is reaped. Files are registered with each ring (fixed files: no fd lookup per
/// read). Several rings let several threads read at once; each ring is rebuilt in a forked child
/// (a ring's queues are shared memory with the kernel and must not be shared with the parent).
#[derive(Debug)]
pub struct UringDevice {
    files: Files,
    queue_depth: u32,
    rings: Vec<Mutex<Option<Ring>>>,
}

struct Ring {
    pid: u32,
    ring: IoUring,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("pid", &self.pid).finish()
    }
}

impl UringDevice {
    /// A device over `files` with `rings` rings of `queue_depth` entries. Builds one ring now, so
    /// a machine without io_uring is found out here (and the caller can fall back).
    pub(crate) fn new(files: Files, queue_depth: u32, rings: usize) -> Result<Self> {
        let dev = Self {
            files,
            queue_depth: queue_depth.clamp(1, 4096),
            rings: (0..rings.max(1)).map(|_| Mutex::new(None)).collect(),
        };
        let mut first = dev.rings[0].lock().unwrap_or_else(|e| e.into_inner());
        *first = Some(dev.build_ring()?);
        drop(first);
        Ok(dev)
    }

    pub fn queue_depth(&self) -> u32 {
        self.queue_depth
    }

    fn build_ring(&self) -> Result<Ring> {
        let setup = |e: std::io::Error| IoError::Setup {
            device: "io_uring",
            reason: e.to_string(),
        };
        let ring = IoUring::new(self.queue_depth.next_power_of_two()).map_err(setup)?;
        let fds: Vec<i32> = self.files.files.iter().map(|f| f.as_raw_fd()).collect();
        if !fds.is_empty() {
            ring.submitter().register_files(&fds).map_err(setup)?;
        }
        Ok(Ring {
            pid: std::process::id(),
            ring,
        })
    }

    /// A free ring of this process (one that another thread holds is skipped; if all are held,
    /// wait for one).
    fn ring(&self) -> Result<MutexGuard<'_, Option<Ring>>> {
        let pick = self
            .rings
            .iter()
            .find_map(|r| r.try_lock().ok())
            .unwrap_or_else(|| self.rings[0].lock().unwrap_or_else(|e| e.into_inner()));
        let mut guard = pick;
        let pid = std::process::id();
        if guard.as_ref().is_none_or(|r| r.pid != pid) {
            *guard = Some(self.build_ring()?);
        }
        Ok(guard)
    }
}

impl BlockDevice for UringDevice {
    fn kind(&self) -> &'static str {
        "io_uring"
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
        let mut guard = self.ring()?;
        let ring = &mut guard.as_mut().expect("ring() always leaves a ring").ring;
        let base = buf.as_mut_ptr();
        let (mut next, mut in_flight) = (0usize, 0usize);
        let mut first_error: Option<IoError> = None;
        loop {
            // Queue more reads, unless one has failed (then only drain what is in flight).
            {
                let mut sq = ring.submission();
                while first_error.is_none()
                    && next < ops.len()
                    && in_flight < self.queue_depth as usize
                {
                    let op = &ops[next];
                    // SAFETY: buf_at + len <= buf.len() (check_batch).
                    let dst = unsafe { base.add(op.buf_at) };
                    let sqe = opcode::Read::new(types::Fixed(op.file), dst, op.len)
                        .offset(op.offset)
                        .build()
                        .user_data(next as u64);
                    // SAFETY: the destination stays valid and untouched by us until its
                    // completion is reaped below; the loop does not exit with reads in flight.
                    if unsafe { sq.push(&sqe) }.is_err() {
                        break;
                    }
                    next += 1;
                    in_flight += 1;
                }
            }
            if in_flight == 0 {
                break;
            }
            submit_and_wait(ring);
            for cqe in ring.completion() {
                in_flight -= 1;
                let i = cqe.user_data() as usize;
                let op = &ops[i];
                let res = cqe.result();
                let path = || self.files.paths[op.file as usize].clone();
                if res < 0 {
                    first_error.get_or_insert(IoError::Read {
                        path: path(),
                        offset: op.offset,
                        len: op.len as usize,
                        source: std::io::Error::from_raw_os_error(-res),
                    });
                } else if res as u32 != op.len {
                    first_error.get_or_insert(IoError::ShortRead {
                        path: path(),
                        offset: op.offset,
                        len: op.len as usize,
                        got: res as usize,
                    });
                } else if first_error.is_none() {
                    done(i, dest(buf, op));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Submits the queued reads and waits for at least one completion. Retries interruptions; any
/// other failure with reads in flight would leave the kernel writing into a buffer the caller is
/// about to reuse, so the process aborts rather than risk silent corruption.
fn submit_and_wait(ring: &mut IoUring) {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                eprintln!("nearrec: io_uring_enter failed with reads in flight ({e}); aborting");
                std::process::abort();
            }
        }
    }
}
