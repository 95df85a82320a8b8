//! Sector checksums: a CRC-32C of every 512-byte sector of a table's data region, so that a read
//! of any rows can be checked as it lands (format version 3).
//!
//! The SSD tier reads the sectors holding a row (512 B at least, aligned), never the whole table,
//! so the table's one CRC-32C cannot check it. The sums are kept beside the table file as
//! `table-NNNN.sums` (little-endian `u32`s, entry `s` the CRC-32C of bytes
//! `512 s .. 512 (s + 1)` of the data region) and named in the manifest with their own CRC-32C.
//! They take 4 bytes per 512 (0.8 % of the data) in memory while a store is served from SSD.

use serde::{Deserialize, Serialize};

/// Bytes covered by one sum: the smallest logical block of the disks we read with direct I/O.
pub const SECTOR_BYTES: u64 = 512;

/// How the manifest names a table's sums file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SumsMeta {
    /// File name relative to the store directory.
    pub file: String,
    pub crc32c: u32,
}

/// The CRC-32C of each sector of a table's data region.
#[derive(Clone, PartialEq, Eq)]
pub struct SectorSums(Vec<u32>);

impl SectorSums {
    /// The sums of `data` (a whole number of sectors).
    pub fn of(data: &[u8]) -> Self {
        let mut sums = Self(Vec::new());
        sums.extend(data);
        sums
    }

    /// Appends the sums of the next sectors of the data region.
    pub fn extend(&mut self, data: &[u8]) {
        debug_assert_eq!(data.len() as u64 % SECTOR_BYTES, 0);
        self.0
            .extend(data.chunks(SECTOR_BYTES as usize).map(crc32c::crc32c));
    }

    pub fn sectors(&self) -> u64 {
        self.0.len() as u64
    }

    /// Bytes the sums of a data region of `data_bytes` bytes take (in memory, and on disk).
    pub fn bytes_for(data_bytes: u64) -> u64 {
        4 * data_bytes.div_ceil(SECTOR_BYTES)
    }

    /// `Err(sector)`: the first sector of `data`, read at byte `offset` of the data region (a
    /// multiple of the sector size), whose bytes do not match its sum.
    pub fn check(&self, offset: u64, data: &[u8]) -> Result<(), u64> {
        let first = offset / SECTOR_BYTES;
        for (k, sector) in data.chunks(SECTOR_BYTES as usize).enumerate() {
            let s = first + k as u64;
            if self.0.get(s as usize) != Some(&crc32c::crc32c(sector)) {
                return Err(s);
            }
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        self.0.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    /// Decodes a sums file for a data region of `data_bytes` bytes, checked against `meta`.
    pub fn decode(bytes: &[u8], data_bytes: u64, meta: &SumsMeta) -> Result<Self, String> {
        let crc = crc32c::crc32c(bytes);
        if crc != meta.crc32c {
            return Err(format!(
                "sums file checksum mismatch (stored {:#010x}, computed {crc:#010x})",
                meta.crc32c
            ));
        }
        let want = Self::bytes_for(data_bytes);
        if bytes.len() as u64 != want {
            return Err(format!(
                "sums file has {} bytes, the data region's {} sectors need {want}",
                bytes.len(),
                data_bytes.div_ceil(SECTOR_BYTES),
            ));
        }
        Ok(Self(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect(),
        ))
    }
}

impl std::fmt::Debug for SectorSums {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SectorSums")
            .field("sectors", &self.0.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flipped_bit_is_caught_in_its_sector() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let sums = SectorSums::of(&data);
        assert_eq!(sums.sectors(), 8);
        assert_eq!(sums.check(1024, &data[1024..2048]), Ok(()));
        for bit in (0..4096 * 8).step_by(97) {
            let mut bad = data.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let sector = (bit / 8 / 512) as u64;
            assert_eq!(sums.check(0, &bad), Err(sector));
        }
        let meta = SumsMeta {
            file: "t.sums".into(),
            crc32c: crc32c::crc32c(&sums.encode()),
        };
        assert_eq!(
            SectorSums::decode(&sums.encode(), 4096, &meta),
            Ok(sums.clone())
        );
        assert!(SectorSums::decode(&sums.encode(), 8192, &meta).is_err());
        assert!(SectorSums::decode(&sums.encode()[4..], 4096, &meta).is_err());
    }
}
