//! Arrays as the protocol carries them: little-endian `bytes`, `N × size_of::<T>()` of them.
//! Decoding copies into an aligned vector (a message's bytes have no alignment); a length that
//! is not a whole number of elements is an error naming the table and the field.

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
    let size = size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(ragged(table, field, bytes.len(), size));
    }
    let mut out = vec![T::zeroed(); bytes.len() / size];
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
}
