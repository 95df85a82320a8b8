//! Row data types and their byte encodings.
//!
//! A row of `dim` values is stored as:
//! - `Fp32`: `dim` little-endian IEEE-754 binary32 values (`4 * dim` bytes);
//! - `Fp16`: `dim` binary16 values (`2 * dim` bytes);
//! - `Bf16`: `dim` bfloat16 values (`2 * dim` bytes);
//! - `Int8`: `dim` unsigned 8-bit codes followed by an fp32 `scale` and an fp32 `bias`
//!   (`dim + 8` bytes), decoded as `code * scale + bias` — FBGEMM's fused 8-bit row-wise layout.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::error::FormatError;

/// The element type of a table's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Fp32,
    Fp16,
    Bf16,
    /// 8-bit codes with a per-row fp32 scale and bias (FBGEMM "fused 8-bit row-wise").
    Int8,
}

impl DType {
    pub const ALL: [DType; 4] = [DType::Fp32, DType::Fp16, DType::Bf16, DType::Int8];

    /// Bytes one encoded row of `dim` values takes, before any layout padding.
    #[inline]
    pub fn row_bytes(self, dim: u32) -> u64 {
        let dim = u64::from(dim);
        match self {
            DType::Fp32 => 4 * dim,
            DType::Fp16 | DType::Bf16 => 2 * dim,
            DType::Int8 => dim + 8,
        }
    }

    /// The code stored in table headers.
    pub fn code(self) -> u8 {
        match self {
            DType::Fp32 => 1,
            DType::Fp16 => 2,
            DType::Bf16 => 3,
            DType::Int8 => 4,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Fp32 => "fp32",
            DType::Fp16 => "fp16",
            DType::Bf16 => "bf16",
            DType::Int8 => "int8",
        }
    }

    /// Encodes one row of fp32 values into `out` (exactly `row_bytes(values.len())` bytes).
    ///
    /// Int8 rows are quantised with `scale = (max - min) / 255`, `bias = min`, codes rounded to
    /// nearest; a constant row gets `scale = 0` and decodes exactly.
    pub fn encode_row(self, values: &[f32], out: &mut [u8]) {
        debug_assert_eq!(out.len() as u64, self.row_bytes(values.len() as u32));
        match self {
            DType::Fp32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(values) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            DType::Fp16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(values) {
                    o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                }
            }
            DType::Bf16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(values) {
                    o.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
                }
            }
            DType::Int8 => {
                let (min, max) = values
                    .iter()
                    .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                        (lo.min(v), hi.max(v))
                    });
                let (min, max) = if values.is_empty() {
                    (0.0, 0.0)
                } else {
                    (min, max)
                };
                let scale = (max - min) / 255.0;
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                let (codes, tail) = out.split_at_mut(values.len());
                for (c, v) in codes.iter_mut().zip(values) {
                    *c = ((v - min) * inv).round().clamp(0.0, 255.0) as u8;
                }
                tail[..4].copy_from_slice(&scale.to_le_bytes());
                tail[4..8].copy_from_slice(&min.to_le_bytes());
            }
        }
    }

    /// Decodes one encoded row into fp32 values: the reference for every pooling kernel.
    pub fn decode_row(self, row: &[u8], out: &mut [f32]) {
        match self {
            DType::Fp32 => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            DType::Fp16 => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            DType::Bf16 => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            DType::Int8 => {
                let dim = out.len();
                let (scale, bias) = int8_scale_bias(row, dim);
                for (o, &c) in out.iter_mut().zip(&row[..dim]) {
                    *o = f32::from(c) * scale + bias;
                }
            }
        }
    }
}

/// The `(scale, bias)` trailer of an int8 row of `dim` codes.
#[inline]
pub fn int8_scale_bias(row: &[u8], dim: usize) -> (f32, f32) {
    let t = &row[dim..dim + 8];
    (
        f32::from_le_bytes([t[0], t[1], t[2], t[3]]),
        f32::from_le_bytes([t[4], t[5], t[6], t[7]]),
    )
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "f32" => Ok(DType::Fp32),
            "fp16" | "float16" | "f16" | "half" => Ok(DType::Fp16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "int8" | "uint8" | "int8_rowwise" => Ok(DType::Int8),
            _ => Err(FormatError::UnknownDType(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::from_code(0), None);
        assert!("fp8".parse::<DType>().is_err());
    }

    #[test]
    fn encode_decode_is_close() {
        let values: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.013).collect();
        for d in DType::ALL {
            let mut buf = vec![0u8; d.row_bytes(37) as usize];
            d.encode_row(&values, &mut buf);
            let mut back = vec![0f32; 37];
            d.decode_row(&buf, &mut back);
            let tol = match d {
                DType::Fp32 => 0.0,
                DType::Fp16 => 1e-3,
                DType::Bf16 => 4e-3,
                DType::Int8 => (0.013 * 36.0) / 255.0,
            };
            for (a, b) in values.iter().zip(&back) {
                assert!((a - b).abs() <= tol, "{d}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn int8_constant_row_is_exact() {
        let values = [0.25f32; 8];
        let mut buf = vec![0u8; 16];
        DType::Int8.encode_row(&values, &mut buf);
        let mut back = [0f32; 8];
        DType::Int8.decode_row(&buf, &mut back);
        assert_eq!(back, values);
    }
}
