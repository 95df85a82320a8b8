//! The hashes the DRAM tiers place rows and keys with.

/// SplitMix64's finaliser: spreads ids (often small, strided or sequential) over 64 bits.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fibonacci hashing: one multiplication by 2^64 / φ, whose *high* bits are well spread even
/// for sequential or strided ids — for a hit path that scales the hash onto a table (only the
/// high bits pick the place; [`scale`] takes them) and has no instructions to spare.
#[inline(always)]
pub(crate) fn fibonacci(z: u64) -> u64 {
    z.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// `hash` scaled onto `0..n`: a multiply, not a division, on every lookup (Lemire's reduction).
pub(crate) fn scale(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}
