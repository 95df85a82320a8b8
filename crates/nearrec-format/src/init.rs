//! Seeded random row initialisation.

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng, SeedableRng};

/// DeepRecInfra's initialiser: every value drawn from U(−√(1/n), √(1/n)) with n the table's rows.
///
/// Each row has its own generator seeded from `(seed, table, row)`, so a row's values do not
/// depend on chunking or thread count and any row can be regenerated alone.
#[derive(Debug, Clone, Copy)]
pub struct UniformInit {
    seed: u64,
    table: u64,
    bound: f32,
}

impl UniformInit {
    pub fn new(seed: u64, table: u64, rows: u64) -> Self {
        let bound = (1.0 / rows.max(1) as f64).sqrt() as f32;
        Self { seed, table, bound }
    }

    pub fn bound(&self) -> f32 {
        self.bound
    }

    /// Fills `out` with row `row`'s values.
    pub fn fill(&self, row: u64, out: &mut [f32]) {
        let key = splitmix(
            splitmix(self.seed ^ 0x6e65_6172_7265_6321)
                ^ self.table.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ) ^ row;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(key);
        let scale = 2.0 * self.bound / (1u32 << 24) as f32;
        for pair in out.chunks_mut(2) {
            let r = rng.next_u64();
            for (k, v) in pair.iter_mut().enumerate() {
                let bits = ((r >> (32 * k)) as u32) >> 8; // 24 uniform bits
                *v = bits as f32 * scale - self.bound;
            }
        }
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_bounds_deterministic_and_spread() {
        let init = UniformInit::new(7, 2, 10_000);
        let b = init.bound();
        assert!((b - 0.01).abs() < 1e-7);
        let mut a = vec![0f32; 33];
        let mut c = vec![0f32; 33];
        init.fill(5, &mut a);
        init.fill(5, &mut c);
        assert_eq!(a, c);
        init.fill(6, &mut c);
        assert_ne!(a, c);
        assert!(a.iter().all(|v| (-b..b).contains(v)));
        let mean: f32 = (0..1000)
            .map(|r| {
                init.fill(r, &mut c);
                c.iter().sum::<f32>() / 33.0
            })
            .sum::<f32>()
            / 1000.0;
        assert!(mean.abs() < b * 0.05, "mean {mean}");
        let mut other = vec![0f32; 33];
        UniformInit::new(8, 2, 10_000).fill(5, &mut other);
        assert_ne!(a, other);
    }
}
