//! Row data types and their byte encodings.
//!
//! A row of `dim` values is stored as:
//! - `Fp32`: `dim` little-endian IEEE-754 binary32 values (`4 * dim` bytes);
//! - `Fp16`: `dim` binary16 values (`2 * dim` bytes);
//! - `Bf16`: `dim` bfloat16 values (`2 * dim` bytes);
//! - `Int8`: `dim` unsigned 8-bit codes followed by an fp32 `scale` and an fp32 `bias`
//!   (`dim + 8` bytes), decoded as `code * scale + bias` — FBGEMM's fused 8-bit row-wise layout;
//! - `Int4` / `Int2`: `dim` 4- / 2-bit codes packed low bits first (two / four to a byte),
//!   followed by an fp16 `scale` and an fp16 `bias` (`dim / 2 + 4` / `dim / 4 + 4` bytes),
//!   decoded as `code * scale + bias` — FBGEMM's fused n-bit row-wise layout ("SBHalf"), as its
//!   quantize operator writes it;
//! - `Fp8`: `dim` 8-bit floats, 1 sign, 4 exponent (bias 7) and 3 mantissa bits, without
//!   infinities or NaN (FBGEMM's "HFP8" as its inference TBE reads it with its default exponent
//!   bias; the same bits as `float8_e4m3fn` for every finite value).
//!
//! A row-wise quantised value (int8 / int4 / int2) is `fma(scale, code, bias)`: one rounding, so
//! that a row read equals the row pooled alone. Bags sum them as FBGEMM does,
//! `acc = fma(scale·w, code, acc + bias·w)` (see `nearrec-kernels`). For int4 / int2, whose
//! fp16 scale times a code is exact, the fused and unfused forms agree.

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
    /// 4-bit codes with a per-row fp16 scale and bias (FBGEMM "fused 4-bit row-wise").
    Int4,
    /// 2-bit codes with a per-row fp16 scale and bias (FBGEMM "fused 2-bit row-wise").
    Int2,
    /// e4m3 floats, exponent bias 7, no infinities or NaN (FBGEMM's HFP8).
    Fp8,
}

/// The largest magnitude the fp8 encoder writes: the largest e4m3 value that `float8_e4m3fn`
/// also reads as finite (FBGEMM's decoder reads the code above it, `0x7f`, as 480).
pub const FP8_MAX: f32 = 448.0;

/// Each fp8 code's value.
static FP8_VALUES: [f32; 256] = fp8_values();

const fn fp8_values() -> [f32; 256] {
    let mut out = [0f32; 256];
    let mut c = 0;
    while c < 256 {
        let (e, m) = ((c >> 3) & 15, c & 7);
        // normal: (8 + m) · 2^(e - 10); subnormal (e = 0): m · 2^-9
        let v = if e == 0 {
            m as f32 / 512.0
        } else {
            let bits = (((e + 120) as u32) << 23) | ((m as u32) << 20);
            f32::from_bits(bits)
        };
        out[c] = if c & 0x80 != 0 { -v } else { v };
        c += 1;
    }
    out
}

/// The fp8 code nearest `v` (ties to even), saturating at ±[`FP8_MAX`]; NaN gives `FP8_MAX`.
pub fn fp8_encode(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    if a >= FP8_MAX || a.is_nan() {
        return sign | 0x7e;
    }
    let code = if a < 1.0 / 64.0 {
        // subnormal: steps of 2^-9; 8 steps is the smallest normal, code 0x08
        let steps = a * 512.0;
        let r = steps.round_ties_even();
        r as u8
    } else {
        let bits = a.to_bits();
        let e = (bits >> 23) - 120; // 1..=15
        let (m, rest) = ((bits >> 20) & 7, bits & 0xf_ffff);
        let up = rest > 0x8_0000 || (rest == 0x8_0000 && m & 1 == 1);
        // a carry out of the mantissa moves to the next exponent, as it should
        (((e << 3) | m) + u32::from(up)).min(0x7e) as u8
    };
    sign | code
}

/// The value of fp8 code `c`.
#[inline(always)]
pub fn fp8_decode(c: u8) -> f32 {
    FP8_VALUES[c as usize]
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::Fp32,
        DType::Fp16,
        DType::Bf16,
        DType::Int8,
        DType::Int4,
        DType::Int2,
        DType::Fp8,
    ];

    /// Bytes one encoded row of `dim` values takes, before any layout padding (for int4 / int2,
    /// of a `dim` the dtype takes: [`DType::check_dim`]).
    #[inline]
    pub fn row_bytes(self, dim: u32) -> u64 {
        let dim = u64::from(dim);
        match self {
            DType::Fp32 => 4 * dim,
            DType::Fp16 | DType::Bf16 => 2 * dim,
            DType::Int8 => dim + 8,
            DType::Int4 => dim.div_ceil(2) + 4,
            DType::Int2 => dim.div_ceil(4) + 4,
            DType::Fp8 => dim,
        }
    }

    /// Why a row of `dim` values cannot be stored as this dtype, if it cannot: int4 and int2
    /// codes fill whole bytes (FBGEMM's layout has no partial byte).
    pub fn check_dim(self, dim: u32) -> Result<(), String> {
        match self {
            DType::Int4 if !dim.is_multiple_of(2) => Err(format!(
                "int4 rows pack two values to a byte, so dim must be even, not {dim}"
            )),
            DType::Int2 if !dim.is_multiple_of(4) => Err(format!(
                "int2 rows pack four values to a byte, so dim must be a multiple of 4, not {dim}"
            )),
            _ => Ok(()),
        }
    }

    /// Bits of one row-wise quantised code (8, 4 or 2), `None` for the float dtypes.
    #[inline]
    pub fn code_bits(self) -> Option<u32> {
        match self {
            DType::Int8 => Some(8),
            DType::Int4 => Some(4),
            DType::Int2 => Some(2),
            _ => None,
        }
    }

    /// The first format version whose readers know this dtype.
    pub fn since_version(self) -> u32 {
        match self {
            DType::Fp32 | DType::Fp16 | DType::Bf16 | DType::Int8 => 1,
            DType::Int4 | DType::Int2 | DType::Fp8 => 6,
        }
    }

    /// Whether rows are quantised (int8 / int4 / int2 / fp8): they hold finite values only.
    pub fn is_quantized(self) -> bool {
        self.code_bits().is_some() || self == DType::Fp8
    }

    /// Whether encoding may change a value (every dtype but fp32).
    pub fn is_lossy(self) -> bool {
        self != DType::Fp32
    }

    /// The code stored in table headers.
    pub fn code(self) -> u8 {
        match self {
            DType::Fp32 => 1,
            DType::Fp16 => 2,
            DType::Bf16 => 3,
            DType::Int8 => 4,
            DType::Int4 => 5,
            DType::Int2 => 6,
            DType::Fp8 => 7,
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
            DType::Int4 => "int4",
            DType::Int2 => "int2",
            DType::Fp8 => "fp8",
        }
    }

    /// Encodes one row of fp32 values into `out` (exactly `row_bytes(values.len())` bytes).
    ///
    /// Int8 rows are quantised with `scale = (max - min) / 255`, `bias = min`, codes rounded to
    /// nearest; a constant row gets `scale = 0` and decodes exactly. Int4 / int2 rows are
    /// quantised as FBGEMM's `FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf` does, byte for
    /// byte (`docs/format.md` §4). Fp8 rounds to nearest, ties to even, saturating at
    /// ±[`FP8_MAX`].
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
                let (min, max) = min_max(values);
                let scale = (max - min) / 255.0;
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                let (codes, tail) = out.split_at_mut(values.len());
                for (c, v) in codes.iter_mut().zip(values) {
                    *c = ((v - min) * inv).round().clamp(0.0, 255.0) as u8;
                }
                tail[..4].copy_from_slice(&scale.to_le_bytes());
                tail[4..8].copy_from_slice(&min.to_le_bytes());
            }
            DType::Int4 | DType::Int2 => encode_nbit(self.code_bits().unwrap_or(4), values, out),
            DType::Fp8 => {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = fp8_encode(v);
                }
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
            DType::Int8 | DType::Int4 | DType::Int2 => {
                let (scale, bias) = self.scale_bias(row, out.len());
                for (j, o) in out.iter_mut().enumerate() {
                    *o = scale.mul_add(self.code_at(row, j) as f32, bias);
                }
            }
            DType::Fp8 => {
                for (o, &c) in out.iter_mut().zip(row) {
                    *o = fp8_decode(c);
                }
            }
        }
    }

    /// The `(scale, bias)` of a row-wise quantised row of `dim` values, as fp32; `(1, 0)` for
    /// the float dtypes.
    #[inline]
    pub fn scale_bias(self, row: &[u8], dim: usize) -> (f32, f32) {
        match self {
            DType::Int8 => int8_scale_bias(row, dim),
            DType::Int4 => nbit_scale_bias(row, dim.div_ceil(2)),
            DType::Int2 => nbit_scale_bias(row, dim.div_ceil(4)),
            _ => (1.0, 0.0),
        }
    }

    /// Code `j` of a row-wise quantised row (0 for the float dtypes).
    #[inline]
    pub fn code_at(self, row: &[u8], j: usize) -> u32 {
        match self {
            DType::Int8 => u32::from(row[j]),
            DType::Int4 => u32::from(row[j / 2] >> (4 * (j % 2))) & 0xf,
            DType::Int2 => u32::from(row[j / 4] >> (2 * (j % 4))) & 0x3,
            _ => 0,
        }
    }
}

fn min_max(values: &[f32]) -> (f32, f32) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    values
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// FBGEMM's n-bit row-wise quantisation (`FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`): the
/// bias is the row's minimum rounded to fp16, the scale its range over `2^bits - 1` rounded to
/// fp16 (1 when that is 0, or when its inverse overflows), codes `lrint((v - bias) / scale)`
/// clamped to the code range, packed low bits first; then scale and bias.
fn encode_nbit(bits: u32, values: &[f32], out: &mut [u8]) {
    let (min, max) = min_max(values);
    let min = f16::from_f32(min).to_f32();
    let range = max - min;
    let top = (1u32 << bits) - 1;
    let mut scale = f16::from_f32(if range == 0.0 {
        1.0
    } else {
        range / top as f32
    })
    .to_f32();
    let mut inv = 1.0 / scale;
    if scale == 0.0 || inv.is_infinite() {
        (scale, inv) = (1.0, 1.0);
    }
    let per = (8 / bits) as usize;
    let packed = values.len().div_ceil(per);
    let (codes, tail) = out.split_at_mut(packed);
    codes.fill(0);
    for (j, &v) in values.iter().enumerate() {
        let q = ((v - min) * inv).round_ties_even().clamp(0.0, top as f32) as u8;
        codes[j / per] |= q << (bits as usize * (j % per));
    }
    tail[..2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
    tail[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
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

/// The fp16 `(scale, bias)` trailer of an int4 / int2 row whose codes take `packed` bytes.
#[inline]
pub fn nbit_scale_bias(row: &[u8], packed: usize) -> (f32, f32) {
    let t = &row[packed..packed + 4];
    (
        f16::from_le_bytes([t[0], t[1]]).to_f32(),
        f16::from_le_bytes([t[2], t[3]]).to_f32(),
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
            "int4" | "uint4" | "int4_rowwise" => Ok(DType::Int4),
            "int2" | "uint2" | "int2_rowwise" => Ok(DType::Int2),
            "fp8" | "hfp8" | "e4m3" => Ok(DType::Fp8),
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
        assert_eq!(DType::from_code(8), None);
        assert!("fp4".parse::<DType>().is_err());
    }

    #[test]
    fn encode_decode_is_close() {
        let values: Vec<f32> = (0..36).map(|i| (i as f32 - 18.0) * 0.013).collect();
        let range = 0.013 * 35.0;
        for d in DType::ALL {
            let mut buf = vec![0u8; d.row_bytes(36) as usize];
            d.encode_row(&values, &mut buf);
            let mut back = vec![0f32; 36];
            d.decode_row(&buf, &mut back);
            let tol = match d {
                DType::Fp32 => 0.0,
                DType::Fp16 => 1e-3,
                DType::Bf16 => 4e-3,
                // half a step, plus the fp16 rounding of the bias and scale
                DType::Int8 => range / 255.0,
                DType::Int4 => range / 15.0 * 0.51 + 1e-3,
                DType::Int2 => range / 3.0 * 0.51 + 1e-3,
                // 3 mantissa bits: half of 1/8 relative
                DType::Fp8 => 0.234 / 16.0 + 1.0 / 1024.0,
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

    #[test]
    fn nbit_codes_pack_low_bits_first() {
        // codes 0..15 then 15..0: the row's minimum is 0 and its scale 1
        let values: Vec<f32> = (0..16).chain((0..16).rev()).map(|v| v as f32).collect();
        let mut buf = vec![0u8; DType::Int4.row_bytes(32) as usize];
        DType::Int4.encode_row(&values, &mut buf);
        assert_eq!(buf[0], 0x10);
        assert_eq!(buf[7], 0xfe);
        assert_eq!(buf[8], 0xef);
        assert_eq!(DType::Int4.scale_bias(&buf, 32), (1.0, 0.0));
        for (j, &v) in values.iter().enumerate() {
            assert_eq!(DType::Int4.code_at(&buf, j), v as u32);
        }
        let values = [0.0f32, 1.0, 2.0, 3.0, 3.0, 2.0, 1.0, 0.0];
        let mut buf = vec![0u8; DType::Int2.row_bytes(8) as usize];
        DType::Int2.encode_row(&values, &mut buf);
        assert_eq!(&buf[..2], &[0b11_10_01_00, 0b00_01_10_11]);
    }

    #[test]
    fn nbit_dims_fill_whole_bytes() {
        assert!(DType::Int4.check_dim(6).is_ok());
        assert!(DType::Int4.check_dim(7).is_err());
        assert!(DType::Int2.check_dim(12).is_ok());
        assert!(DType::Int2.check_dim(6).is_err());
        assert!(DType::Fp8.check_dim(7).is_ok());
        assert_eq!(DType::Int4.row_bytes(64), 36);
        assert_eq!(DType::Int2.row_bytes(64), 20);
    }

    #[test]
    fn fp8_every_code_round_trips_and_orders() {
        for c in 0..=255u8 {
            let v = fp8_decode(c);
            assert!(v.is_finite());
            if c & 0x7f != 0x7f {
                assert_eq!(fp8_encode(v), c, "{c:#04x} = {v}");
            }
        }
        assert_eq!(fp8_encode(-0.0), 0x80);
        assert_eq!(fp8_decode(0x7e), FP8_MAX);
        assert_eq!(fp8_decode(0x7f), 480.0);
        assert_eq!(fp8_decode(0x01), 1.0 / 512.0);
        assert_eq!(fp8_decode(0x08), 1.0 / 64.0);
        assert_eq!(fp8_decode(0x38), 1.0);
        // saturates; NaN to the largest
        assert_eq!(fp8_encode(1e9), 0x7e);
        assert_eq!(fp8_encode(-1e9), 0xfe);
        assert_eq!(fp8_encode(f32::NAN), 0x7e);
        // ties to even: 1 + 1/16 lies between 1 (even mantissa) and 1.125
        assert_eq!(fp8_encode(1.0625), 0x38);
        assert_eq!(fp8_encode(1.1875), 0x3a);
        // every value encodes to the nearest code
        let positive: Vec<f32> = (0..=0x7e).map(fp8_decode).collect();
        for i in 0..20_000 {
            let v = i as f32 * 0.0227 - 3.0;
            let got = fp8_decode(fp8_encode(v));
            let best = positive
                .iter()
                .map(|&p| (p.copysign(v) - v).abs())
                .fold(f32::INFINITY, f32::min);
            assert!((got - v).abs() <= best, "{v}: {got}");
        }
    }
}
