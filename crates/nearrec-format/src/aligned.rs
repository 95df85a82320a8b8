//! A heap buffer aligned to a block boundary, as direct I/O and wide SIMD loads want.
//!
//! Large buffers (tables resident in DRAM) are mapped directly and backed by transparent huge
//! pages where the kernel offers them (`madvise(MADV_HUGEPAGE)`, which works when THP is set to
//! `madvise` as well as `always`). Random row gathers over a table of hundreds of MiB miss the TLB
//! on almost every row with 4 KiB pages; with 2 MiB pages the whole table fits the TLB's reach.
//! `nearrec bench sls` measured 10–50 % more lookups/s from this on a 1 GiB RMC1 store.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// Alignment of every `AlignedBuf`, in bytes.
pub const BUF_ALIGN: usize = 4096;

/// Size (and alignment) of a huge page; buffers at least this large are mapped and advised.
const HUGE_PAGE: usize = 2 << 20;

/// A zero-initialised, 4 KiB-aligned, fixed-size byte buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// `Some((base, bytes))` when the buffer lives in its own anonymous mapping.
    map: Option<(NonNull<u8>, usize)>,
}

impl Default for AlignedBuf {
    /// An empty buffer.
    fn default() -> Self {
        Self::zeroed(0)
    }
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access hands out `&[u8]`, or atomic words (`as_words`).
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes. Panics only if the allocator fails (as `Vec` does).
    pub fn zeroed(len: usize) -> Self {
        Self::try_zeroed(len).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(len)))
    }

    /// Allocates `len` zero bytes, or `None` when the memory cannot be had.
    pub fn try_zeroed(len: usize) -> Option<Self> {
        if len == 0 {
            return Some(Self {
                ptr: NonNull::<[u8; BUF_ALIGN]>::dangling().cast(),
                len: 0,
                map: None,
            });
        }
        if len >= HUGE_PAGE
            && let Some(buf) = Self::mapped(len)
        {
            return Some(buf);
        }
        let layout = Layout::from_size_align(len, BUF_ALIGN).ok()?;
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        Some(Self {
            ptr: NonNull::new(raw)?,
            len,
            map: None,
        })
    }

    /// A huge-page-aligned anonymous mapping (zero-filled by the kernel), advised to use huge
    /// pages; `None` if the mapping fails (the caller falls back to the heap).
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<Self> {
        let bytes = len.checked_add(2 * HUGE_PAGE)? & !(HUGE_PAGE - 1);
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = NonNull::new(base.cast::<u8>())?;
        let skip = base.as_ptr().align_offset(HUGE_PAGE);
        // SAFETY: skip < HUGE_PAGE and skip + len <= bytes, so ptr..ptr + len is inside the mapping.
        let ptr = unsafe { base.add(skip) };
        // Advice only: without THP the buffer is simply backed by small pages.
        // SAFETY: the range lies inside the mapping made above.
        unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        Some(Self {
            ptr,
            len,
            map: Some((base, bytes)),
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn mapped(_len: usize) -> Option<Self> {
        None
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, BUF_ALIGN).expect("buffer size overflows")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer as 8-byte atomic words (its length must be a multiple of 8), for structures
    /// that threads read and write at once without a lock (the row cache's tags and heads).
    /// A buffer used this way must not also be read through [`Self::as_slice`] while shared.
    pub fn as_words(&self) -> &[std::sync::atomic::AtomicU64] {
        assert!(self.len.is_multiple_of(8), "a whole number of words");
        if self.len == 0 {
            // the dangling pointer of an empty buffer is not aligned for words
            return &[];
        }
        // SAFETY: the allocation is 4 KiB-aligned (so 8-aligned), initialised (zeroed) and lives
        // as long as `self`; AtomicU64 has u64's layout, and its interior mutability makes
        // writes through `&self` sound.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast(), self.len / 8) }
    }

    /// Overwrites `bytes.len()` bytes at `at` while others may hold the buffer shared: how a
    /// live store's compaction brings a table kept in DRAM to its new rows (`docs/live.md`).
    ///
    /// # Safety
    /// No thread reads or writes those bytes meanwhile: the caller has made sure that no reader
    /// can want them (every reader takes those rows from elsewhere until this returns and it
    /// publishes the change with a release). Readers of other bytes are not disturbed; the
    /// write goes through the buffer's own pointer, never through a reference to its bytes.
    pub unsafe fn write_shared(&self, at: usize, bytes: &[u8]) {
        assert!(
            at.checked_add(bytes.len())
                .is_some_and(|end| end <= self.len),
            "in bounds"
        );
        // SAFETY: in bounds (above); no one touches these bytes meanwhile (the contract)
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(at), bytes.len());
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.map {
            #[cfg(target_os = "linux")]
            Some((base, bytes)) => {
                // SAFETY: the mapping was made in `mapped` with exactly this base and size.
                unsafe { libc::munmap(base.as_ptr().cast(), bytes) };
            }
            // SAFETY: allocated in `zeroed` with this exact layout.
            _ if self.len != 0 => unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) },
            _ => {}
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let mut b = AlignedBuf::zeroed(10_000);
        assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[9_999] = 1;
        assert_eq!(b.as_slice()[9_999], 1);
        assert!(AlignedBuf::zeroed(0).is_empty());
        assert!(AlignedBuf::try_zeroed(usize::MAX / 2).is_none());
    }

    #[test]
    fn huge_buffers_are_mapped_aligned_and_zeroed() {
        let len = HUGE_PAGE * 2 + 12_345;
        let mut b = AlignedBuf::zeroed(len);
        assert_eq!(b.len(), len);
        assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
        #[cfg(target_os = "linux")]
        assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[len - 1] = 7;
        assert_eq!(b.as_slice()[len - 1], 7);
    }
}
