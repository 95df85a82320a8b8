//! `Raw`: the data of a contiguous 1-D int32 / int64 / float32 array or tensor, as the engine
//! reads it, taken from a Python object that the holder keeps alive while it is read.

use nearrec::Indices;

/// A contiguous 1-D array's data, of an array (or tensor) its holder keeps alive.
#[derive(Clone, Copy)]
pub(crate) enum Raw {
    I32(*const i32, usize),
    I64(*const i64, usize),
    F32(*const f32, usize),
}

// SAFETY: the pointers are into numpy arrays or tensors their holder keeps references to (which
// keeps them from being freed); reading them from another thread is what the GIL-free
// lookup does. Writes by the caller while a lookup runs are the caller's race, as with torch.
unsafe impl Send for Raw {}
// SAFETY: as above; the data is only read.
unsafe impl Sync for Raw {}

impl Raw {
    /// # Safety
    /// The array the pointer came from must be alive for `'a`.
    pub(crate) unsafe fn indices<'a>(self) -> Indices<'a> {
        // SAFETY: the caller's promise; numpy gives a valid (possibly dangling for 0) pointer
        unsafe {
            match self {
                Raw::I32(p, n) => Indices::I32(slice(p, n)),
                Raw::I64(p, n) => Indices::I64(slice(p, n)),
                Raw::F32(..) => unreachable!("weights are not indices"),
            }
        }
    }

    /// # Safety
    /// As [`Raw::indices`].
    pub(crate) unsafe fn floats<'a>(self) -> &'a [f32] {
        match self {
            // SAFETY: the caller's promise
            Raw::F32(p, n) => unsafe { slice(p, n) },
            _ => unreachable!("weights are float32"),
        }
    }
}

/// # Safety
/// `p` points at `n` valid values (any pointer for `n == 0`).
unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}
