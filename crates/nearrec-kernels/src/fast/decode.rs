//! Row decoding, one `Decode` a dtype: what the bag loop adds, adds weighted and takes the
//! maximum of, straight from a row's stored bytes (fp32, fp16, bf16, fp8, row-wise int8 / int4 /
//! int2).

use nearrec_format::DType;

/// Row decoding for one dtype: `acc[j] += row[j]`, `acc[j] = fma(w, row[j], acc[j])` and
/// `acc[j] = max(acc[j], row[j])`.
///
/// A weighted row is added with a fused multiply-add, as PyTorch's CPU kernels do: rounding
/// `w * row[j]` first turns a product past `f32::MAX` into an infinity that PyTorch's fused step
/// never forms (`-inf + inf = NaN` where PyTorch gives `-inf`). In the AVX2 / AVX-512 builds of
/// the loop it is one instruction; the generic build (CPUs without FMA) calls `fmaf`.
pub(super) trait Decode {
    const DTYPE: DType;
    /// Whether the bag loop inlines this dtype's step by force (see `accumulate`).
    const INLINE_STEP: bool = false;
    fn add(row: &[u8], acc: &mut [f32]);
    fn axpy(row: &[u8], w: f32, acc: &mut [f32]);
    fn max(row: &[u8], acc: &mut [f32]);
}

pub(super) struct Fp32;
pub(super) struct Fp16;
pub(super) struct Bf16;
pub(super) struct Int8;

#[inline(always)]
fn u16_at(row: &[u8], j: usize) -> u16 {
    u16::from_le_bytes([row[2 * j], row[2 * j + 1]])
}

/// IEEE binary16 → binary32, branch-free so it vectorises; exact for every input (tested against
/// `half` over all 65,536 values).
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let shifted = (h & 0x7fff) << 13;
    // Re-bias the exponent by multiplying by 2^112; subnormals come out right by the same multiply.
    let scaled = f32::from_bits(shifted) * f32::from_bits(0x7780_0000);
    let bits = if (h & 0x7c00) == 0x7c00 {
        shifted | 0x7f80_0000
    } else {
        scaled.to_bits()
    };
    f32::from_bits(bits | ((h & 0x8000) << 16))
}

/// `step(acc[j], row[j])` over an fp32 row, eight lanes at a time (so the loop vectorises).
#[inline(always)]
fn f32_lanes(row: &[u8], acc: &mut [f32], step: impl Fn(&mut f32, f32)) {
    let dim = acc.len();
    let vals = f32_row(row, dim);
    let (mut a8, mut v8) = (acc.chunks_exact_mut(8), vals.chunks_exact(8));
    for (a, v) in (&mut a8).zip(&mut v8) {
        for j in 0..8 {
            step(&mut a[j], v[j]);
        }
    }
    for (a, &v) in a8.into_remainder().iter_mut().zip(v8.remainder()) {
        step(a, v);
    }
}

/// The row's values as `f32`s: fp32 rows are 4-byte aligned (`TableView::new` checks the
/// buffer; row offsets are multiples of 4), so this is a plain reinterpretation, which the
/// compiler turns into wide vector loads.
#[inline(always)]
fn f32_row(row: &[u8], dim: usize) -> &[f32] {
    assert!(row.len() >= dim * 4);
    debug_assert_eq!(row.as_ptr() as usize % 4, 0);
    // SAFETY: length checked above; alignment is a TableView invariant for fp32 tables.
    unsafe { std::slice::from_raw_parts(row.as_ptr().cast::<f32>(), dim) }
}

impl Decode for Fp32 {
    const DTYPE: DType = DType::Fp32;
    #[inline(always)]
    fn add(row: &[u8], acc: &mut [f32]) {
        f32_lanes(row, acc, |a, v| *a += v);
    }
    #[inline(always)]
    fn axpy(row: &[u8], w: f32, acc: &mut [f32]) {
        f32_lanes(row, acc, |a, v| *a = w.mul_add(v, *a));
    }
    #[inline(always)]
    fn max(row: &[u8], acc: &mut [f32]) {
        let dim = acc.len();
        for (a, &v) in acc.iter_mut().zip(f32_row(row, dim)) {
            *a = a.max(v);
        }
    }
}

impl Decode for Fp16 {
    const DTYPE: DType = DType::Fp16;
    #[inline(always)]
    fn add(row: &[u8], acc: &mut [f32]) {
        let row = &row[..acc.len() * 2];
        for (j, a) in acc.iter_mut().enumerate() {
            *a += f16_to_f32(u16_at(row, j));
        }
    }
    #[inline(always)]
    fn axpy(row: &[u8], w: f32, acc: &mut [f32]) {
        let row = &row[..acc.len() * 2];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = w.mul_add(f16_to_f32(u16_at(row, j)), *a);
        }
    }
    #[inline(always)]
    fn max(row: &[u8], acc: &mut [f32]) {
        let row = &row[..acc.len() * 2];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = a.max(f16_to_f32(u16_at(row, j)));
        }
    }
}

impl Decode for Bf16 {
    const DTYPE: DType = DType::Bf16;
    #[inline(always)]
    fn add(row: &[u8], acc: &mut [f32]) {
        let row = &row[..acc.len() * 2];
        for (j, a) in acc.iter_mut().enumerate() {
            *a += f32::from_bits(u32::from(u16_at(row, j)) << 16);
        }
    }
    #[inline(always)]
    fn axpy(row: &[u8], w: f32, acc: &mut [f32]) {
        let row = &row[..acc.len() * 2];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = w.mul_add(f32::from_bits(u32::from(u16_at(row, j)) << 16), *a);
        }
    }
    #[inline(always)]
    fn max(row: &[u8], acc: &mut [f32]) {
        let row = &row[..acc.len() * 2];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = a.max(f32::from_bits(u32::from(u16_at(row, j)) << 16));
        }
    }
}

/// The sixteen `BITS`-bit codes at the start of `bytes` (`2 * BITS` bytes: 8 / `BITS` codes to
/// a byte, low bits first) as `f32`s, written so that it vectorises: int4 and int2 codes are
/// 32-bit words (two for int4, one for int2) broadcast over the lanes and shifted by a different
/// amount in each (`vpsrlvd`), masked and converted; int8 codes are widened and converted.
/// In cache, this made an int4 row of dim 32 / 64 1.5× / 2.2× faster than taking each code
/// from its own byte (`examples/row_cost.rs`), int2 rows 1.8× / 3.7×.
#[inline(always)]
fn sixteen_codes<const BITS: usize>(bytes: &[u8]) -> [f32; 16] {
    let bytes = &bytes[..2 * BITS];
    match BITS {
        8 => std::array::from_fn(|j| f32::from(bytes[j])),
        4 => {
            let words: [u32; 2] = std::array::from_fn(|w| {
                u32::from_le_bytes(bytes[4 * w..4 * w + 4].try_into().expect("four bytes"))
            });
            std::array::from_fn(|j| ((words[j / 8] >> (4 * (j % 8))) & 15) as f32)
        }
        _ => {
            let word = u32::from_le_bytes(bytes.try_into().expect("four bytes"));
            std::array::from_fn(|j| ((word >> (2 * j)) & 3) as f32)
        }
    }
}

/// `$a = $step` for each value `$a` of `$acc` (`$a` its old value) and its code `$q` (an
/// `f32`) in a packed row of `$bits`-bit codes, sixteen values a step ([`sixteen_codes`]). A
/// macro, not a closure, so that the step is compiled inside the calling loop, with its target
/// features.
macro_rules! code_lanes {
    ($bits:expr, $codes:expr, $acc:expr, |$a:ident, $q:ident| $step:expr) => {{
        let step_bytes: usize = 2 * $bits;
        let codes: &[u8] = $codes;
        let acc: &mut [f32] = $acc;
        let mut sixteens = acc.chunks_exact_mut(16);
        for (lanes, bytes) in (&mut sixteens).zip(codes.chunks_exact(step_bytes)) {
            let q16 = sixteen_codes::<{ $bits }>(bytes);
            for j in 0..16 {
                let ($a, $q) = (lanes[j], q16[j]);
                lanes[j] = $step;
            }
        }
        let rest = sixteens.into_remainder();
        if !rest.is_empty() {
            // the last codes, fewer than sixteen, padded with zeros to a step's bytes
            let mut bytes = [0u8; 16];
            let tail = &codes[codes.len() - (rest.len() * $bits).div_ceil(8)..];
            bytes[..tail.len()].copy_from_slice(tail);
            let q16 = sixteen_codes::<{ $bits }>(&bytes);
            for (l, &$q) in rest.iter_mut().zip(&q16) {
                let $a = *l;
                *l = $step;
            }
        }
    }};
}

/// Row-wise quantised rows are summed as FBGEMM's TBE sums them, so that a table of its bytes
/// pools to its answer bit for bit: `acc = fma(scale, code, acc + bias)`, and with a weight
/// `scale·w` and `bias·w` in place of scale and bias. Max decodes each value first
/// (`fma(scale, code, bias)`, as [`DType::decode_row`] does).
impl Decode for Int8 {
    const DTYPE: DType = DType::Int8;
    const INLINE_STEP: bool = true;
    #[inline(always)]
    fn add(row: &[u8], acc: &mut [f32]) {
        let dim = acc.len();
        let (scale, bias) = nearrec_format::int8_scale_bias(row, dim);
        code_lanes!(8, &row[..dim], acc, |a, q| scale.mul_add(q, a + bias));
    }
    #[inline(always)]
    fn axpy(row: &[u8], w: f32, acc: &mut [f32]) {
        let dim = acc.len();
        let (scale, bias) = nearrec_format::int8_scale_bias(row, dim);
        let (scale, bias) = (scale * w, bias * w);
        code_lanes!(8, &row[..dim], acc, |a, q| scale.mul_add(q, a + bias));
    }
    #[inline(always)]
    fn max(row: &[u8], acc: &mut [f32]) {
        let dim = acc.len();
        let (scale, bias) = nearrec_format::int8_scale_bias(row, dim);
        code_lanes!(8, &row[..dim], acc, |a, q| a.max(scale.mul_add(q, bias)));
    }
}

/// `BITS`-bit row-wise rows: packed codes, then an fp16 scale and bias (`DType::Int4` /
/// `DType::Int2`), summed as [`Int8`] is.
pub(super) struct NBit<const BITS: usize>;
pub(super) type Int4 = NBit<4>;
pub(super) type Int2 = NBit<2>;

impl<const BITS: usize> NBit<BITS> {
    /// The row's codes and its `(scale, bias)`.
    #[inline(always)]
    fn split(row: &[u8], dim: usize) -> (&[u8], f32, f32) {
        let packed = dim.div_ceil(8 / BITS);
        let (codes, tail) = row.split_at(packed);
        let (scale, bias) = f16_pair(tail[..4].try_into().expect("a scale and a bias"));
        (codes, scale, bias)
    }
}

/// Two fp16 values (little-endian, back to back: an int4 / int2 row's scale and bias) as
/// `f32`s: one `vcvtph2ps` where the CPU has F16C (every AVX2 CPU; the bag loop's AVX2 and
/// AVX-512 builds inline it), [`f16_to_f32`] twice elsewhere, which cost about a third of an
/// int4 row of dim 32 in cache.
#[inline(always)]
fn f16_pair(bytes: [u8; 4]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") {
        use std::arch::x86_64::{_mm_cvtph_ps, _mm_cvtsi32_si128, _mm_cvtss_f32, _mm_movehdup_ps};
        // SAFETY: F16C is there (checked above; the check is a load of a cached flag); the
        // intrinsics only move and convert values in registers.
        unsafe {
            let pair = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(bytes)));
            return (_mm_cvtss_f32(pair), _mm_cvtss_f32(_mm_movehdup_ps(pair)));
        }
    }
    (
        f16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]])),
        f16_to_f32(u16::from_le_bytes([bytes[2], bytes[3]])),
    )
}

impl<const BITS: usize> Decode for NBit<BITS> {
    const DTYPE: DType = if BITS == 4 { DType::Int4 } else { DType::Int2 };
    const INLINE_STEP: bool = true;
    #[inline(always)]
    fn add(row: &[u8], acc: &mut [f32]) {
        let (codes, scale, bias) = Self::split(row, acc.len());
        code_lanes!(BITS, codes, acc, |a, q| scale.mul_add(q, a + bias));
    }
    #[inline(always)]
    fn axpy(row: &[u8], w: f32, acc: &mut [f32]) {
        let (codes, scale, bias) = Self::split(row, acc.len());
        let (scale, bias) = (scale * w, bias * w);
        code_lanes!(BITS, codes, acc, |a, q| scale.mul_add(q, a + bias));
    }
    #[inline(always)]
    fn max(row: &[u8], acc: &mut [f32]) {
        let (codes, scale, bias) = Self::split(row, acc.len());
        code_lanes!(BITS, codes, acc, |a, q| a.max(scale.mul_add(q, bias)));
    }
}

/// e4m3 (exponent bias 7, no infinities or NaN) → binary32, branch-free and exact for every
/// code (tested against the format's table). A normal code's exponent and mantissa bits are
/// moved into place and its exponent re-biased by an integer add; a subnormal code (exponent
/// field 0) is its mantissa times 2^-9, converted from an integer: a select between the two.
/// No step computes with a subnormal `f32`: re-biasing by a multiply did (the code's bits in
/// place are one whenever the code's exponent is small), and each such multiply took a
/// microcode assist, ~20× the row's cost on tables of small values.
#[inline(always)]
fn fp8_to_f32(c: u8) -> f32 {
    let c = u32::from(c);
    let normal = ((c & 0x7f) << 20) + (120 << 23);
    let subnormal = ((c & 7) as f32 * f32::from_bits(0x3b00_0000)).to_bits(); // 2^-9
    let magnitude = if c & 0x78 == 0 { subnormal } else { normal };
    f32::from_bits(magnitude | ((c & 0x80) << 24))
}

/// fp8 rows (`DType::Fp8`): decoded, then added as fp32 rows are.
pub(super) struct Fp8;

impl Decode for Fp8 {
    const DTYPE: DType = DType::Fp8;
    #[inline(always)]
    fn add(row: &[u8], acc: &mut [f32]) {
        let row = &row[..acc.len()];
        for (a, &c) in acc.iter_mut().zip(row) {
            *a += fp8_to_f32(c);
        }
    }
    #[inline(always)]
    fn axpy(row: &[u8], w: f32, acc: &mut [f32]) {
        let row = &row[..acc.len()];
        for (a, &c) in acc.iter_mut().zip(row) {
            *a = w.mul_add(fp8_to_f32(c), *a);
        }
    }
    #[inline(always)]
    fn max(row: &[u8], acc: &mut [f32]) {
        let row = &row[..acc.len()];
        for (a, &c) in acc.iter_mut().zip(row) {
            *a = a.max(fp8_to_f32(c));
        }
    }
}

#[cfg(test)]
mod tests {
    use nearrec_format::DType;

    use super::{f16_pair, f16_to_f32, fp8_to_f32, sixteen_codes};

    #[test]
    fn fp8_conversion_is_exact_for_every_code() {
        for c in 0..=u8::MAX {
            let want = nearrec_format::fp8_decode(c);
            assert_eq!(fp8_to_f32(c).to_bits(), want.to_bits(), "{c:#04x}");
        }
    }

    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn f16_pairs_convert_exactly_in_both_lanes() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let other = h.rotate_left(7);
            let [a, b] = h.to_le_bytes();
            let [c, d] = other.to_le_bytes();
            for (got, bytes_first) in [
                (f16_pair([a, b, c, d]).0, true),
                (f16_pair([c, d, a, b]).1, false),
            ] {
                if want.is_nan() {
                    assert!(got.is_nan(), "{h:#06x} first={bytes_first}");
                } else {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{h:#06x} first={bytes_first}"
                    );
                }
            }
        }
    }

    /// The vectorised unpack against the format's code-by-code reading, over every byte value
    /// in every position of a step.
    #[test]
    fn sixteen_codes_are_the_format_s_codes() {
        fn check<const BITS: usize>(dtype: DType) {
            for v in 0..=u8::MAX {
                for at in 0..2 * BITS {
                    let mut bytes = [0x5au8; 16];
                    bytes[at] = v;
                    let got = sixteen_codes::<BITS>(&bytes);
                    for (j, &q) in got.iter().enumerate() {
                        assert_eq!(
                            q,
                            dtype.code_at(&bytes, j) as f32,
                            "{dtype:?} byte {at} = {v:#x}, code {j}"
                        );
                    }
                }
            }
        }
        check::<8>(DType::Int8);
        check::<4>(DType::Int4);
        check::<2>(DType::Int2);
    }
}
