//! Arrays as the protocol carries them: little-endian `bytes`, `N × size_of::<T>()` of them.
//! Decoding copies into an aligned vector (a message's bytes have no alignment: where tonic
//! puts a message, and where a field falls in it, are the sender's and the transport's); a
//! length that is not a whole number of elements is an error naming the table and the field.
//!
//! [`Spare`] keeps vectors that served one request for the next (the node's steady path
//! allocates none for its arrays), and [`Spare::lend`] an answer's bytes that go back to it once
//! the transport has encoded them.

use std::sync::Arc;
use std::sync::Mutex;

use bytemuck::Pod;
use bytes::Bytes;

/// A decoding error: `field` of `table` is not a whole number of `T`.
pub fn ragged(table: &str, field: &str, len: usize, size: usize) -> nearrec::Error {
    nearrec::Error::InvalidRequest {
        table: Some(table.to_owned()),
        position: None,
        reason: format!("{field} holds {len} bytes, not a whole number of {size}-byte elements"),
    }
}

/// `bytes` as elements of `T` (little-endian, as every supported host is).
pub fn decode<T: Pod>(bytes: &[u8], table: &str, field: &str) -> nearrec::Result<Vec<T>> {
    let mut out = vec![T::zeroed(); whole::<T>(bytes, table, field)?];
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(bytes);
    Ok(out)
}

/// How many `T` `bytes` holds, or the error naming `field` of `table` if not a whole number.
fn whole<T>(bytes: &[u8], table: &str, field: &str) -> nearrec::Result<usize> {
    let size = size_of::<T>();
    match bytes.len().is_multiple_of(size) {
        true => Ok(bytes.len() / size),
        false => Err(ragged(table, field, bytes.len(), size)),
    }
}

/// [`decode`] into a vector `spare` kept, if it has one.
pub fn decode_in<T: Element>(
    bytes: &[u8],
    table: &str,
    field: &str,
    spare: &Spare,
) -> nearrec::Result<Vec<T>> {
    let len = whole::<T>(bytes, table, field)?;
    let mut out = spare.take::<T>();
    if out.capacity() < len {
        // too small: growing it would copy what it held, fresh zeroed memory costs less
        out = vec![T::zeroed(); len];
    }
    // a kept vector keeps its length: only what it lacks is zeroed before the copy
    out.resize(len, T::zeroed());
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(bytes);
    Ok(out)
}

/// A vector's elements as a message's bytes, without copying them.
pub fn encode<T: Pod + Send + Sync>(values: Vec<T>) -> Bytes {
    Bytes::from_owner(Owned(values))
}

/// A slice's elements as a message's bytes (copied).
pub fn encode_slice<T: Pod>(values: &[T]) -> Bytes {
    Bytes::copy_from_slice(bytemuck::cast_slice(values))
}

struct Owned<T>(Vec<T>);

/// Vectors kept between requests, by element type: what a request decoded into, or pooled
/// into, is given back once its answer is encoded and taken by the next one, so that a node
/// serving request after request does not allocate (and free) its arrays each time. Bounded:
/// at most [`Spare::SHELF`] vectors of each type, none over [`Spare::LARGEST`] bytes, at most
/// `most` bytes of them in all; past that a vector given back is freed.
#[derive(Debug)]
pub struct Spare {
    most: usize,
    i32s: Shelf<i32>,
    i64s: Shelf<i64>,
    f32s: Shelf<f32>,
    u8s: Shelf<u8>,
    kept: Mutex<usize>,
}

type Shelf<T> = Mutex<Vec<Vec<T>>>;

/// The element types a [`Spare`] keeps vectors of.
pub trait Element: Pod + Send + Sync {
    #[doc(hidden)]
    fn shelf(spare: &Spare) -> &Shelf<Self>;
}

macro_rules! elements {
    ($($t:ty => $field:ident),*) => {$(
        impl Element for $t {
            fn shelf(spare: &Spare) -> &Shelf<Self> {
                &spare.$field
            }
        }
    )*};
}
elements!(i32 => i32s, i64 => i64s, f32 => f32s, u8 => u8s);

impl Spare {
    /// Vectors kept of each element type, at most.
    pub const SHELF: usize = 32;
    /// The largest vector kept, in bytes (a larger request's arrays are its own).
    pub const LARGEST: usize = 4 << 20;

    /// A spare that keeps nothing: every vector taken is new.
    pub fn none() -> &'static Spare {
        static NONE: Spare = Spare::new(0);
        &NONE
    }

    /// A spare keeping at most `most` bytes of vectors.
    pub const fn new(most: usize) -> Self {
        Self {
            most,
            i32s: Mutex::new(Vec::new()),
            i64s: Mutex::new(Vec::new()),
            f32s: Mutex::new(Vec::new()),
            u8s: Mutex::new(Vec::new()),
            kept: Mutex::new(0),
        }
    }

    /// A kept vector (its length as it was given back, its contents unspecified), or a new,
    /// empty one.
    pub fn take<T: Element>(&self) -> Vec<T> {
        if self.most == 0 {
            return Vec::new();
        }
        let Some(v) = lock(T::shelf(self)).pop() else {
            return Vec::new();
        };
        *lock(&self.kept) -= v.capacity() * size_of::<T>();
        v
    }

    /// Keeps `v` for a later [`Spare::take`], or frees it if this spare is full.
    pub fn give<T: Element>(&self, v: Vec<T>) {
        let bytes = v.capacity() * size_of::<T>();
        if bytes == 0 || bytes > Self::LARGEST {
            return;
        }
        let mut kept = lock(&self.kept);
        let mut shelf = lock(T::shelf(self));
        if *kept + bytes <= self.most && shelf.len() < Self::SHELF {
            *kept += bytes;
            shelf.push(v);
        }
    }

    /// `values` as a message's bytes, without copying them, given back to `spare` once the
    /// message lets go of them (the transport has encoded it).
    pub fn lend<T: Element>(spare: &Arc<Spare>, values: Vec<T>) -> Bytes {
        Bytes::from_owner(Lent(values, spare.clone()))
    }

    /// The bytes this spare keeps now.
    pub fn kept(&self) -> usize {
        *lock(&self.kept)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // a vector pushed or popped is whole: a panic elsewhere leaves nothing half done here
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A vector lent to a message's bytes, given back to its spare when they are dropped.
struct Lent<T: Element>(Vec<T>, Arc<Spare>);

impl<T: Element> AsRef<[u8]> for Lent<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl<T: Element> Drop for Lent<T> {
    fn drop(&mut self) {
        self.1.give(std::mem::take(&mut self.0));
    }
}

impl<T: Pod> AsRef<[u8]> for Owned<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_ragged_lengths() {
        let v = vec![1.5f32, -2.0, 3.25];
        let b = encode(v.clone());
        assert_eq!(b.len(), 12);
        assert_eq!(decode::<f32>(&b, "t", "rows").unwrap(), v);
        let e = decode::<i64>(&b[..12], "t0", "ids").unwrap_err();
        assert_eq!(e.kind(), nearrec::ErrorKind::InvalidRequest);
        assert_eq!(e.table(), Some("t0"));
        assert!(e.to_string().contains("ids holds 12 bytes"), "{e}");
        assert_eq!(decode::<i32>(&[], "t", "ids").unwrap(), Vec::<i32>::new());
    }

    #[test]
    fn spare_vectors_come_back_bounded() {
        let spare = Arc::new(Spare::new(1 << 10));
        let v: Vec<i64> = decode_in(&encode(vec![7i64; 16]), "t", "ids", &spare).unwrap();
        let at = v.as_ptr();
        spare.give(v);
        assert_eq!(spare.kept(), 128);
        // taken again, shorter: the same memory, its length cut, its values the new ones
        let w: Vec<i64> = decode_in(&encode(vec![3i64; 4]), "t", "ids", &spare).unwrap();
        assert_eq!((w.as_ptr(), w.as_slice()), (at, &[3i64; 4][..]));
        assert_eq!(spare.kept(), 0);
        // an answer's bytes go back once dropped, zeroed when taken again
        let bytes = Spare::lend(&spare, w);
        assert_eq!(bytes.len(), 32);
        drop(bytes);
        assert_eq!(spare.kept(), 128);
        assert_eq!(spare.take::<i64>().capacity(), 16);
        // past the bound: freed, not kept
        spare.give(vec![0f32; 300]);
        assert_eq!(spare.kept(), 0);
        spare.give(vec![0u8; 1000]);
        spare.give(vec![0u8; 100]);
        assert_eq!(spare.kept(), 1000);
        Spare::none().give(vec![1i32]);
        assert_eq!(Spare::none().kept(), 0);
    }
}
