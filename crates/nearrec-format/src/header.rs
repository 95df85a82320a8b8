//! The fixed header at the start of every table file (byte diagram in docs/format.md).

use crate::dtype::DType;
use crate::layout::{DATA_OFFSET, RowLayout};

pub const TABLE_MAGIC: [u8; 8] = *b"NRTABLE\0";
/// Bytes of the header that carry fields; the rest of the first block is zero.
pub const HEADER_BYTES: usize = 64;
/// The table file's own version: unchanged by row orders, which live beside the file.
pub const TABLE_VERSION: u32 = 1;
/// Offset of the header checksum, which covers bytes `0..HEADER_CRC_AT`.
const HEADER_CRC_AT: usize = 60;

/// The decoded fields of a table header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableHeader {
    pub version: u32,
    pub dtype: DType,
    pub dim: u32,
    pub block_bytes: u32,
    pub rows: u64,
    pub row_bytes: u64,
    pub data_offset: u64,
    pub data_bytes: u64,
    /// CRC-32C of the whole data region, padding included.
    pub data_crc32c: u32,
}

impl TableHeader {
    pub fn layout(&self) -> RowLayout {
        RowLayout::new(self.rows, self.row_bytes, u64::from(self.block_bytes))
    }

    /// Encodes the header into the first `DATA_OFFSET` bytes of a table file.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; DATA_OFFSET as usize];
        b[0..8].copy_from_slice(&TABLE_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12] = self.dtype.code();
        b[16..20].copy_from_slice(&self.dim.to_le_bytes());
        b[20..24].copy_from_slice(&self.block_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.rows.to_le_bytes());
        b[32..40].copy_from_slice(&self.row_bytes.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.data_bytes.to_le_bytes());
        b[56..60].copy_from_slice(&self.data_crc32c.to_le_bytes());
        let crc = crc32c::crc32c(&b[..HEADER_CRC_AT]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header; the error string says which check failed.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < HEADER_BYTES {
            return Err(format!(
                "table header is {} bytes, expected {HEADER_BYTES}",
                b.len()
            ));
        }
        if b[0..8] != TABLE_MAGIC {
            return Err("bad table magic (not a nearrec table file)".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let stored_crc = u32_at(HEADER_CRC_AT);
        let crc = crc32c::crc32c(&b[..HEADER_CRC_AT]);
        if stored_crc != crc {
            return Err(format!(
                "table header checksum mismatch (stored {stored_crc:#010x}, computed {crc:#010x})"
            ));
        }
        let dtype =
            DType::from_code(b[12]).ok_or_else(|| format!("unknown dtype code {}", b[12]))?;
        // zero in every header written (format.md §3); read as part of the dtype by no one, so
        // a header that sets them is not one we wrote (found by fuzzing: they were ignored)
        if b[13..16] != [0; 3] {
            return Err(format!(
                "table header bytes 13..16 are {:?}, not the zeros every header has",
                &b[13..16]
            ));
        }
        Ok(Self {
            version: u32_at(8),
            dtype,
            dim: u32_at(16),
            block_bytes: u32_at(20),
            rows: u64_at(24),
            row_bytes: u64_at(32),
            data_offset: u64_at(40),
            data_bytes: u64_at(48),
            data_crc32c: u32_at(56),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TableHeader {
        TableHeader {
            version: 1,
            dtype: DType::Int8,
            dim: 32,
            block_bytes: 4096,
            rows: 12345,
            row_bytes: 40,
            data_offset: DATA_OFFSET,
            data_bytes: 4096 * 122,
            data_crc32c: 0xdead_beef,
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(TableHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn bytes_after_the_dtype_must_be_zero() {
        let mut b = sample().encode();
        b[15] = 1;
        let crc = crc32c::crc32c(&b[..HEADER_CRC_AT]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        let e = TableHeader::decode(&b).unwrap_err();
        assert!(e.contains("13..16"), "{e}");
    }

    #[test]
    fn any_flipped_bit_is_caught() {
        let bytes = sample().encode();
        for i in 0..HEADER_BYTES {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(
                TableHeader::decode(&b).is_err(),
                "flip at byte {i} not caught"
            );
        }
    }
}
