use crate::device::{BlockDevice, ReadOp, check_batch, dest};
use crate::error::Result;

/// Files held in memory: the boring twin of the real devices, for tests and for models that
/// supply their own timing. Reads complete in reverse order, so callers cannot come to depend on
/// `ops` order.
#[derive(Debug, Clone)]
pub struct MemDevice {
    files: Vec<Vec<u8>>,
    lens: Vec<u64>,
    block: usize,
}

impl MemDevice {
    /// A device over `files` with `block`-byte alignment (a power of two).
    pub fn new(files: Vec<Vec<u8>>, block: usize) -> Self {
        assert!(block.is_power_of_two(), "block size must be a power of two");
        let lens = files.iter().map(|f| f.len() as u64).collect();
        Self { files, lens, block }
    }
}

impl BlockDevice for MemDevice {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn direct(&self) -> bool {
        true
    }

    fn block_size(&self) -> usize {
        self.block
    }

    fn file_lens(&self) -> &[u64] {
        &self.lens
    }

    fn read_batch(
        &self,
        ops: &[ReadOp],
        buf: &mut [u8],
        done: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        check_batch(ops, buf, self.block, &self.lens)?;
        for (i, op) in ops.iter().enumerate().rev() {
            let src = &self.files[op.file as usize][op.offset as usize..][..op.len as usize];
            buf[op.buf_at..op.buf_at + src.len()].copy_from_slice(src);
            done(i, dest(buf, op));
        }
        Ok(())
    }
}
