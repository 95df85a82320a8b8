use crate::error::{IoError, Result};

/// One read: `len` bytes at byte `offset` of file `file`, into `buf[buf_at..buf_at + len]`.
///
/// `offset`, `len` and the destination address must be multiples of the device's
/// [`BlockDevice::block_size`]; the reads of one batch must not overlap in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOp {
    pub file: u32,
    pub offset: u64,
    pub len: u32,
    pub buf_at: usize,
}

/// Reads aligned block ranges of a fixed set of files (a store's table files).
///
/// Implementations are shared by every thread of a process (`&self`) and survive `fork()`.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// What this back-end is, for logs and stats (`"io_uring"`, `"pread"`, `"memory"`).
    fn kind(&self) -> &'static str;

    /// Whether reads bypass the page cache (`O_DIRECT`).
    fn direct(&self) -> bool;

    /// The alignment, in bytes, of every read's offset, length and destination address.
    fn block_size(&self) -> usize;

    /// Bytes in each file.
    fn file_lens(&self) -> &[u64];

    /// Performs every read of `ops` into `buf`, calling `done(i, bytes)` on the calling thread for
    /// op `i` as soon as it completes, in completion order (not `ops` order). Returns once every
    /// read has completed, or with the first error, after every read already issued has finished
    /// (no read outlives the call). Ops are validated first ([`check_batch`]); a malformed batch
    /// reads nothing.
    fn read_batch(
        &self,
        ops: &[ReadOp],
        buf: &mut [u8],
        done: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()>;
}

/// A shared or boxed device is a device: one back-end can serve several engines, stay in a test's
/// hands (to arm a [`crate::FaultyDevice`]) while an engine reads through it, or sit, chosen at
/// run time, inside a wrapper such as the flash-device model.
macro_rules! forward_block_device {
    ($($ptr:ident)::+) => {
        impl<D: BlockDevice + ?Sized> BlockDevice for $($ptr)::+<D> {
            fn kind(&self) -> &'static str {
                (**self).kind()
            }

            fn direct(&self) -> bool {
                (**self).direct()
            }

            fn block_size(&self) -> usize {
                (**self).block_size()
            }

            fn file_lens(&self) -> &[u64] {
                (**self).file_lens()
            }

            fn read_batch(
                &self,
                ops: &[ReadOp],
                buf: &mut [u8],
                done: &mut dyn FnMut(usize, &[u8]),
            ) -> Result<()> {
                (**self).read_batch(ops, buf, done)
            }
        }
    };
}

forward_block_device!(std::sync::Arc);
forward_block_device!(Box);

/// Checks that every op of a batch is aligned, inside its file and inside `buf`, and that no two
/// write the same bytes of `buf`. Devices call it before issuing any read.
pub fn check_batch(ops: &[ReadOp], buf: &[u8], block: usize, file_lens: &[u64]) -> Result<()> {
    let bad = |op, reason: String| Err(IoError::InvalidRead { op, reason });
    let base = buf.as_ptr() as usize;
    let b = block as u64;
    for (i, op) in ops.iter().enumerate() {
        let Some(&flen) = file_lens.get(op.file as usize) else {
            return bad(
                i,
                format!(
                    "file {} does not exist ({} files)",
                    op.file,
                    file_lens.len()
                ),
            );
        };
        if op.len == 0 || op.offset % b != 0 || u64::from(op.len) % b != 0 {
            return bad(
                i,
                format!(
                    "offset {} and length {} must be non-zero multiples of the {block}-byte block",
                    op.offset, op.len
                ),
            );
        }
        if !(base + op.buf_at).is_multiple_of(block) {
            return bad(i, format!("destination is not {block}-byte aligned"));
        }
        if op
            .offset
            .checked_add(u64::from(op.len))
            .is_none_or(|end| end > flen)
        {
            return bad(
                i,
                format!(
                    "bytes {}..{} are past the end of file {} ({flen} bytes)",
                    op.offset,
                    op.offset.saturating_add(u64::from(op.len)),
                    op.file
                ),
            );
        }
        if op
            .buf_at
            .checked_add(op.len as usize)
            .is_none_or(|end| end > buf.len())
        {
            return bad(i, format!("does not fit the {}-byte buffer", buf.len()));
        }
    }
    let mut spans: Vec<(usize, usize, usize)> = ops
        .iter()
        .enumerate()
        .map(|(i, o)| (o.buf_at, o.buf_at + o.len as usize, i))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return bad(w[1].2, format!("overlaps read {} in the buffer", w[0].2));
        }
    }
    Ok(())
}

/// The part of `buf` op `op` reads into.
pub(crate) fn dest<'a>(buf: &'a [u8], op: &ReadOp) -> &'a [u8] {
    &buf[op.buf_at..op.buf_at + op.len as usize]
}
