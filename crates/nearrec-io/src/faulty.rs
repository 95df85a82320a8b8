use std::sync::Mutex;

use crate::device::{BlockDevice, ReadOp};
use crate::error::{IoError, Result};

/// What an armed [`FaultyDevice`] does to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The read fails as if the device returned `EIO`.
    Eio,
    /// The read returns fewer bytes than asked (a file that shrank underneath).
    ShortRead,
}

/// A fault to inject: the next `batches` batches fail with `kind` after `after` reads of each
/// have completed (those are delivered; the rest are not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub after: usize,
    pub batches: usize,
}

/// A device that fails on purpose, for fault-injection tests of whatever sits on top: it wraps a
/// working device and, while a [`Fault`] is armed, makes batches fail partway through. Unarmed,
/// it is the device it wraps.
#[derive(Debug)]
pub struct FaultyDevice {
    inner: Box<dyn BlockDevice>,
    fault: Mutex<Option<Fault>>,
}

impl FaultyDevice {
    pub fn new(inner: Box<dyn BlockDevice>) -> Self {
        Self {
            inner,
            fault: Mutex::new(None),
        }
    }

    pub fn arm(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
    }

    /// The fault for this batch, if one is armed (and counts it down).
    fn take(&self) -> Option<Fault> {
        let mut slot = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        let f = (*slot)?;
        *slot = (f.batches > 1).then_some(Fault {
            batches: f.batches - 1,
            ..f
        });
        Some(f)
    }
}

impl BlockDevice for FaultyDevice {
    fn kind(&self) -> &'static str {
        "faulty"
    }

    fn direct(&self) -> bool {
        self.inner.direct()
    }

    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn file_lens(&self) -> &[u64] {
        self.inner.file_lens()
    }

    fn read_batch(
        &self,
        ops: &[ReadOp],
        buf: &mut [u8],
        done: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let Some(fault) = self.take() else {
            return self.inner.read_batch(ops, buf, done);
        };
        let mut delivered = 0;
        let mut failed = None;
        self.inner.read_batch(ops, buf, &mut |i, bytes| {
            if delivered < fault.after {
                delivered += 1;
                done(i, bytes);
            } else if failed.is_none() {
                failed = Some(i);
            }
        })?;
        let Some(i) = failed else {
            return Ok(()); // fewer reads than `after`: the batch got through
        };
        let (path, op) = ("<faulty device>".into(), ops[i]);
        Err(match fault.kind {
            FaultKind::Eio => IoError::Read {
                path,
                offset: op.offset,
                len: op.len as usize,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            },
            FaultKind::ShortRead => IoError::ShortRead {
                path,
                offset: op.offset,
                len: op.len as usize,
                got: op.len as usize / 2,
            },
        })
    }
}
