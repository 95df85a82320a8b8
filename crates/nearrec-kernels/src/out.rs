//! A pooled answer in the dtype its caller asks for (`out_dtype`): float32 as pooled; fp16 or
//! bf16, each value rounded to nearest, ties to even (torch's `.half()` / `.bfloat16()`); or
//! int8, each bag's vector of each table quantised row-wise as FBGEMM's
//! `FloatToFused8BitRowwiseQuantized` does (its codes, then a float32 scale and bias: the fused
//! layout TorchRec's quantised comms send) and dequantised as `Fused8BitRowwiseQuantizedToFloat`
//! does (`code × scale + bias`, one fused multiply-add).
//!
//! An answer is `[batch, Σ widths]` float32, tables side by side. [`encode`] gives the bytes
//! that cross a wire, [`decode`] reads them back, and [`round`] is the two in place — what an
//! embedded store answers — so that a caller gets the same values wherever the store is.

use half::slice::HalfFloatSliceExt as _;
use half::{bf16, f16};
use multiversion::multiversion;

/// The dtype of a pooled answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OutDtype {
    /// float32, as pooled.
    #[default]
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// Row-wise int8 with a float32 scale and bias per bag and table (FBGEMM's fused layout).
    Int8,
}

/// Bytes of the scale and bias an int8 vector carries after its codes.
pub const INT8_TAIL: usize = 8;

impl OutDtype {
    pub const ALL: [OutDtype; 4] = [Self::F32, Self::F16, Self::Bf16, Self::Int8];

    /// Its name in requests: `fp32`, `fp16`, `bf16`, `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "fp32",
            Self::F16 => "fp16",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }

    /// The dtype `name` names (`fp32` / `float32`, `fp16` / `float16`, `bf16` / `bfloat16`,
    /// `int8`).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "fp32" | "float32" => Self::F32,
            "fp16" | "float16" => Self::F16,
            "bf16" | "bfloat16" => Self::Bf16,
            "int8" => Self::Int8,
            _ => return None,
        })
    }

    /// The bytes of an answer of `bags` bags of tables `widths` wide.
    pub fn bytes(self, bags: usize, widths: &[usize]) -> usize {
        let width: usize = widths.iter().sum();
        let row = match self {
            Self::F32 => width * 4,
            Self::F16 | Self::Bf16 => width * 2,
            Self::Int8 => width + INT8_TAIL * widths.iter().filter(|&&w| w > 0).count(),
        };
        bags.saturating_mul(row)
    }
}

/// `values` (`[bags, Σ widths]` float32) as `dtype`'s bytes, appended to `out`: little-endian
/// values; for int8, per bag, each table's codes followed by its scale and bias.
pub fn encode(values: &[f32], widths: &[usize], dtype: OutDtype, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + dtype.bytes(bags(values, widths), widths), 0);
    let bytes = &mut out[start..];
    match dtype {
        OutDtype::F32 => bytes.copy_from_slice(bytemuck::cast_slice(values)),
        OutDtype::F16 => narrow::<f16>(values, bytes),
        OutDtype::Bf16 => narrow::<bf16>(values, bytes),
        OutDtype::Int8 => {
            let mut at = 0;
            for segment in segments(values, widths) {
                let (codes, rest) = bytes[at..].split_at_mut(segment.len());
                let (scale, bias) = quantize(segment, codes);
                rest[..4].copy_from_slice(&scale.to_le_bytes());
                rest[4..8].copy_from_slice(&bias.to_le_bytes());
                at += segment.len() + INT8_TAIL;
            }
        }
    }
}

/// `bytes` ([`encode`]'s of an answer of tables `widths` wide) into `out`, its float32 values
/// (`[bags, Σ widths]`); the bytes an answer of `out`'s size takes if `bytes` is not that long.
pub fn decode(
    bytes: &[u8],
    widths: &[usize],
    dtype: OutDtype,
    out: &mut [f32],
) -> Result<(), usize> {
    let want = dtype.bytes(bags(out, widths), widths);
    if bytes.len() != want {
        return Err(want);
    }
    match dtype {
        OutDtype::F32 => bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes),
        OutDtype::F16 => widen::<f16>(bytes, out),
        OutDtype::Bf16 => widen::<bf16>(bytes, out),
        OutDtype::Int8 => {
            let mut at = 0;
            for segment in segments_mut(out, widths) {
                let (codes, tail) = bytes[at..].split_at(segment.len());
                let scale = f32::from_le_bytes(tail[..4].try_into().expect("four bytes"));
                let bias = f32::from_le_bytes(tail[4..8].try_into().expect("four bytes"));
                dequantize(codes, scale, bias, segment);
                at += segment.len() + INT8_TAIL;
            }
        }
    }
    Ok(())
}

/// `values` as `dtype` gives them back: [`encode`] then [`decode`], in place.
pub fn round(values: &mut [f32], widths: &[usize], dtype: OutDtype) {
    match dtype {
        OutDtype::F32 => {}
        OutDtype::F16 => round_half::<f16>(values),
        OutDtype::Bf16 => round_half::<bf16>(values),
        OutDtype::Int8 => {
            let mut codes = Vec::new();
            for segment in segments_mut(values, widths) {
                codes.resize(segment.len(), 0);
                let (scale, bias) = quantize(segment, &mut codes);
                dequantize(&codes, scale, bias, segment);
            }
        }
    }
}

/// Values converted a block at a time (the slice conversions use F16C where the CPU has it).
const BLOCK: usize = 256;

trait Half: Copy + Default + bytemuck::Pod {
    fn from_f32s(dst: &mut [Self], src: &[f32]);
    fn to_f32s(src: &[Self], dst: &mut [f32]);
}

impl Half for f16 {
    fn from_f32s(dst: &mut [Self], src: &[f32]) {
        dst.convert_from_f32_slice(src);
    }
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

impl Half for bf16 {
    fn from_f32s(dst: &mut [Self], src: &[f32]) {
        narrow_bf16(src, bytemuck::cast_slice_mut(dst));
    }
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

/// `v` as bfloat16's bits, rounded to nearest even (a NaN stays a NaN, quiet): what
/// `half::bf16::from_f32` gives, in a form the compiler vectorises.
#[inline(always)]
fn bf16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    (if nan { (bits >> 16) | 0x40 } else { rounded }) as u16
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn narrow_bf16(values: &[f32], out: &mut [u16]) {
    for (h, &v) in out.iter_mut().zip(values) {
        *h = bf16_bits(v);
    }
}

fn narrow<H: Half>(values: &[f32], bytes: &mut [u8]) {
    if let Ok(halves) = bytemuck::try_cast_slice_mut::<u8, H>(bytes) {
        return H::from_f32s(halves, values);
    }
    let mut block = [H::default(); BLOCK];
    for (src, dst) in values.chunks(BLOCK).zip(bytes.chunks_mut(BLOCK * 2)) {
        let block = &mut block[..src.len()];
        H::from_f32s(block, src);
        for (b, h) in dst.chunks_exact_mut(2).zip(block.iter()) {
            b.copy_from_slice(bytemuck::bytes_of(h));
        }
    }
}

fn widen<H: Half>(bytes: &[u8], out: &mut [f32]) {
    let mut block = [H::default(); BLOCK];
    for (src, dst) in bytes.chunks(BLOCK * 2).zip(out.chunks_mut(BLOCK)) {
        let block = &mut block[..dst.len()];
        bytemuck::cast_slice_mut::<H, u8>(block).copy_from_slice(src);
        H::to_f32s(block, dst);
    }
}

fn round_half<H: Half>(values: &mut [f32]) {
    let mut block = [H::default(); BLOCK];
    for chunk in values.chunks_mut(BLOCK) {
        let block = &mut block[..chunk.len()];
        H::from_f32s(block, chunk);
        H::to_f32s(block, chunk);
    }
}

/// FBGEMM's row-wise quantisation of one vector into `codes`: its scale and bias. (Under
/// `multiversion`: the round to nearest even is one instruction with SSE4.1, a call without.)
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn quantize(values: &[f32], codes: &mut [u8]) -> (f32, f32) {
    // the least and most in 16 lanes (one running minimum would be a chain of dependent steps)
    let (mut lo, mut hi) = ([f32::INFINITY; 16], [f32::NEG_INFINITY; 16]);
    let chunks = values.chunks_exact(16);
    let rest = chunks.remainder();
    for chunk in chunks {
        for ((l, h), &v) in lo.iter_mut().zip(&mut hi).zip(chunk) {
            // (compared as `std::min_element` compares: one `vminps`, `vmaxps`)
            *l = if v < *l { v } else { *l };
            *h = if v > *h { v } else { *h };
        }
    }
    let lo = rest
        .iter()
        .chain(&lo)
        .copied()
        .fold(f32::INFINITY, f32::min);
    let hi = rest
        .iter()
        .chain(&hi)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let range = hi - lo;
    let inverse = 255.0 / (range + 1e-8);
    for (c, v) in codes.iter_mut().zip(values) {
        // FBGEMM's codes lie in 0..=255 for finite vectors; clamped, a NaN to 0
        let code = ((v - lo) * inverse).round_ties_even().clamp(0.0, 255.0);
        *c = if code.is_nan() {
            0
        } else {
            // SAFETY: not a NaN (`clamp` keeps one: 0 above), a whole number in 0..=255 (a
            // saturating `as u8` would not vectorise)
            unsafe { code.to_int_unchecked::<u8>() }
        };
    }
    (range / 255.0, lo)
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn dequantize(codes: &[u8], scale: f32, bias: f32, out: &mut [f32]) {
    for (v, &c) in out.iter_mut().zip(codes) {
        *v = f32::from(c).mul_add(scale, bias);
    }
}

fn bags(values: &[f32], widths: &[usize]) -> usize {
    let width: usize = widths.iter().sum();
    values.len().checked_div(width).unwrap_or(0)
}

/// Each bag's vector of each table, in order.
fn segments<'v>(values: &'v [f32], widths: &'v [usize]) -> impl Iterator<Item = &'v [f32]> {
    let width: usize = widths.iter().sum();
    (values.chunks_exact(width.max(1))).flat_map(move |row| {
        let mut rest = row;
        widths.iter().filter(|&&w| w > 0).map(move |&w| {
            let (segment, tail) = rest.split_at(w);
            rest = tail;
            segment
        })
    })
}

fn segments_mut<'v>(
    values: &'v mut [f32],
    widths: &'v [usize],
) -> impl Iterator<Item = &'v mut [f32]> {
    let width: usize = widths.iter().sum();
    (values.chunks_exact_mut(width.max(1))).flat_map(move |row| {
        let mut rest = row;
        widths.iter().filter(|&&w| w > 0).map(move |&w| {
            let (segment, tail) = std::mem::take(&mut rest).split_at_mut(w);
            rest = tail;
            segment
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(bags: usize, width: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761).max(1);
        (0..bags * width)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32 - 0.5) * 7.0
            })
            .collect()
    }

    #[test]
    fn halves_round_to_nearest_even_as_scalar_conversion_does() {
        let widths = [3, 5];
        let values = answer(7, 8, 1);
        for dtype in [OutDtype::F16, OutDtype::Bf16] {
            let mut rounded = values.clone();
            round(&mut rounded, &widths, dtype);
            let want: Vec<f32> = match dtype {
                OutDtype::F16 => values.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
                _ => values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
            };
            assert_eq!(rounded, want, "{dtype:?}");
        }
    }

    #[test]
    fn decode_reads_back_what_round_gives_and_encode_sizes_hold() {
        for (bags, widths) in [
            (5, vec![4, 16]),
            (1, vec![1]),
            (0, vec![8]),
            (300, vec![64]),
        ] {
            let width: usize = widths.iter().sum();
            let values = answer(bags, width, bags as u32 + 3);
            for dtype in OutDtype::ALL {
                let mut bytes = vec![9u8; 3]; // appended after what is there
                encode(&values, &widths, dtype, &mut bytes);
                assert_eq!(bytes.len() - 3, dtype.bytes(bags, &widths), "{dtype:?}");
                let mut decoded = vec![0f32; values.len()];
                decode(&bytes[3..], &widths, dtype, &mut decoded).unwrap();
                let mut rounded = values.clone();
                round(&mut rounded, &widths, dtype);
                assert_eq!(decoded, rounded, "{dtype:?} bags {bags} widths {widths:?}");
                if dtype == OutDtype::F32 {
                    assert_eq!(decoded, values);
                }
                if bags > 0 {
                    let short = &bytes[3..bytes.len() - 1];
                    assert_eq!(
                        decode(short, &widths, dtype, &mut decoded),
                        Err(bytes.len() - 3)
                    );
                }
            }
        }
    }

    #[test]
    fn int8_quantises_each_bag_and_table_on_its_own() {
        // two tables of very different ranges: each keeps its own scale
        let widths = [4, 4];
        let values = vec![0.0, 1.0, 2.0, 3.0, 100.0, 200.0, 300.0, 355.0];
        let mut bytes = Vec::new();
        encode(&values, &widths, OutDtype::Int8, &mut bytes);
        assert_eq!(bytes.len(), 2 * (4 + 8));
        assert_eq!(&bytes[..4], &[0, 85, 170, 255]);
        assert_eq!(
            f32::from_le_bytes(bytes[4..8].try_into().unwrap()),
            3.0 / 255.0
        );
        assert_eq!(f32::from_le_bytes(bytes[8..12].try_into().unwrap()), 0.0);
        assert_eq!(&bytes[12..16], &[0, 100, 200, 255]);
        assert_eq!(f32::from_le_bytes(bytes[20..24].try_into().unwrap()), 100.0);
        // a constant vector: codes 0, scale 0, the value as its bias, read back exactly
        let mut flat = vec![2.5f32; 6];
        round(&mut flat, &[6], OutDtype::Int8);
        assert_eq!(flat, vec![2.5; 6]);
        // the ends of each vector come back (the least exactly, the most within a scale step)
        let mut rounded = values.clone();
        round(&mut rounded, &widths, OutDtype::Int8);
        assert_eq!((rounded[0], rounded[4]), (0.0, 100.0));
        assert!((rounded[7] - 355.0).abs() < 1e-3, "{}", rounded[7]);
    }

    #[test]
    fn bf16_bits_are_halfs_for_every_kind_of_value() {
        let mut x = 0x1234_5678u32;
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            f32::INFINITY,
        ];
        let mut values: Vec<f32> = specials.iter().flat_map(|&v| [v, -v]).collect();
        values.extend([
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc0_1234),
        ]);
        // ties: a half-way mantissa with an even and an odd bit above it
        values.extend([f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000)]);
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            values.push(f32::from_bits(x));
        }
        for v in values {
            let want = bf16::from_f32(v);
            let got = bf16_bits(v);
            if v.is_nan() {
                assert!(bf16::from_bits(got).is_nan(), "{v:?} -> {got:#x}");
            } else {
                assert_eq!(got, want.to_bits(), "{v:?} ({:#x})", v.to_bits());
            }
        }
    }

    #[test]
    fn names_parse_back() {
        for dtype in OutDtype::ALL {
            assert_eq!(OutDtype::parse(dtype.name()), Some(dtype));
        }
        assert_eq!(OutDtype::parse("bfloat16"), Some(OutDtype::Bf16));
        assert_eq!(OutDtype::parse("int4"), None);
    }
}
