//! A table file's writer thread (`WritePipeline`): full chunks checksummed and appended in
//! order, their buffers handed back.

use super::*;

/// What a table's writer thread leaves: the file, the data region's CRC-32C and its sector sums.
pub(super) type Written = (File, u32, SectorSums);

/// A writer thread fed with full chunks; it checksums and appends them in order and hands the
/// buffers back for reuse.
pub(crate) struct WritePipeline {
    full: Option<SyncSender<(Vec<u8>, usize)>>,
    empty: Receiver<Vec<u8>>,
    pub(super) spare: usize,
    pub(super) thread: Option<JoinHandle<std::io::Result<Written>>>,
    pub(super) path: PathBuf,
}

impl WritePipeline {
    pub(crate) fn start(file: File, path: PathBuf, progress: Option<ProgressFn>) -> Self {
        Self::start_with(file, path, progress, false)
    }

    /// [`Self::start`]; with `steady`, each chunk's writeback starts as soon as it is written
    /// and the chunk before it is waited for, so that at most two chunks are ever dirty: the
    /// disk sees a steady stream instead of the kernel's bursts and a flush of everything at
    /// the end (a live store's compaction, beside lookups that read the same disk), and the
    /// written pages leave the page cache.
    pub(crate) fn start_with(
        file: File,
        path: PathBuf,
        progress: Option<ProgressFn>,
        steady: bool,
    ) -> Self {
        let (full_tx, full_rx) = sync_channel::<(Vec<u8>, usize)>(PIPELINE_DEPTH - 1);
        let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(PIPELINE_DEPTH);
        let thread = std::thread::Builder::new()
            .name("nearrec-writer".into())
            .spawn(move || {
                let mut crc = 0u32;
                let mut sums = SectorSums::of(&[]);
                let mut at = DATA_OFFSET;
                let mut previous: Option<(u64, u64)> = None;
                for (mut buf, len) in full_rx {
                    let data = &buf[..len];
                    crc = crc32c::crc32c_append(crc, data);
                    sums.extend(data);
                    fail::fail_point!("table::write", |_| Err(std::io::Error::from_raw_os_error(
                        libc::ENOSPC
                    )));
                    file.write_all_at(data, at)?;
                    if steady {
                        crate::sync::write_back(&file, at, len as u64, previous)?;
                        previous = Some((at, len as u64));
                    }
                    at += len as u64;
                    if let Some(p) = &progress {
                        p(len as u64);
                    }
                    buf.fill(0);
                    let _ = empty_tx.try_send(buf);
                }
                Ok((file, crc, sums))
            })
            .expect("spawn writer thread");
        Self {
            full: Some(full_tx),
            empty: empty_rx,
            spare: PIPELINE_DEPTH,
            thread: Some(thread),
            path,
        }
    }

    /// A zeroed chunk buffer: a recycled one, or a new one while fewer than `PIPELINE_DEPTH` exist.
    pub(crate) fn empty_buffer(&mut self, bytes: usize) -> Vec<u8> {
        if self.spare > 0 {
            self.spare -= 1;
            return vec![0u8; bytes];
        }
        // The writer thread returns every buffer it is sent; if it died, start a fresh one and
        // let `send` report its error.
        self.empty.recv().unwrap_or_else(|_| vec![0u8; bytes])
    }

    pub(crate) fn send(&mut self, buf: Vec<u8>, len: usize) -> Result<()> {
        let ok = self
            .full
            .as_ref()
            .is_some_and(|tx| tx.send((buf, len)).is_ok());
        if ok { Ok(()) } else { self.join().map(|_| ()) }
    }

    pub(crate) fn join(&mut self) -> Result<Written> {
        self.full = None;
        let handle = self.thread.take().ok_or_else(|| {
            FormatError::io(
                &self.path,
                std::io::Error::other("table writer already finished"),
            )
        })?;
        match handle.join() {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err(FormatError::io(&self.path, e)),
            Err(_) => Err(FormatError::io(
                &self.path,
                std::io::Error::other("writer thread panicked"),
            )),
        }
    }
}
