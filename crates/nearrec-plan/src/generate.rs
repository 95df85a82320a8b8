//! Synthetic traces: uniform, Zipf(α) over a random permutation of the rows, and DLRM's
//! stack-distance generator in RecSSD's continuous variant and DLRM's per-bag one, over the whole
//! table or RecSSD's strided ids (`../shared/specs/traces.md`). Every generator is seeded.

use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::{Deserialize, Serialize};

use crate::error::{PlanError, Result};
use crate::profile::{Distances, LOCALITY_SEED};
use crate::stack::LruStack;

/// How a table's row ids are drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Generator {
    Uniform,
    /// Consecutive rows from a random start, wrapping: RecSSD's SEQ pattern (contiguous ids,
    /// the most page locality a trace can have).
    Sequential,
    /// Zipf(α) ranks mapped to rows through a seeded random permutation.
    Zipf {
        alpha: f64,
    },
    /// DLRM's LRU-stack generator fed by RecSSD's locality knob `k` (higher: less locality).
    StackDistance {
        k: f64,
        #[serde(default)]
        variant: Variant,
        #[serde(default)]
        ids: Ids,
    },
}

/// How the stack-distance generator fills bags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// RecSSD: one stream per table, twice as long as needed with the first half discarded as
    /// warm-up, cut into bags of exactly the pooling factor; distances scaled by it; repeats kept.
    #[default]
    Continuous,
    /// Upstream DLRM: the first-reference count restarts at every bag (the stack persists), and
    /// each bag keeps its distinct ids (so bags can be shorter than the pooling factor).
    PerBag,
}

/// Which rows the stack's ids stand for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Ids {
    /// A seeded random permutation of every row of the table.
    #[default]
    Full,
    /// RecSSD: id `i` is row `i × stride` (stride 128 touches ~7,800 rows of a 1M-row table).
    Strided { stride: u64 },
}

/// One table of a trace to generate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    pub name: String,
    pub rows: u64,
    /// Lookups per bag (the pooling factor L).
    pub pooling: u32,
    pub generator: Generator,
}

/// One table's generated bags, in CSR form.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableTrace {
    /// `bags + 1` offsets into `indices`.
    pub offsets: Vec<i64>,
    pub indices: Vec<i64>,
    /// For stack-distance traces: the share of draws that took a never-used id.
    pub first_reference_share: Option<f64>,
}

impl TableSpec {
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| {
            Err(PlanError::BadSpec {
                table: self.name.clone(),
                reason,
            })
        };
        if self.rows == 0 || self.rows > i64::MAX as u64 {
            return bad(format!("rows must be in 1..2^63, not {}", self.rows));
        }
        match self.generator {
            Generator::Zipf { alpha } if !(alpha.is_finite() && alpha > 0.0) => {
                bad(format!("zipf alpha must be a positive number, not {alpha}"))
            }
            Generator::StackDistance { k, .. } if !(k.is_finite() && k >= 0.0) => {
                bad(format!("locality k must be ≥ 0, not {k}"))
            }
            Generator::StackDistance {
                ids: Ids::Strided { stride },
                ..
            } if stride == 0 || stride > self.rows => {
                bad(format!("stride {stride} must be in 1..={}", self.rows))
            }
            _ => Ok(()),
        }
    }

    /// Generates `bags` bags with `seed`.
    pub fn generate(&self, bags: u64, seed: u64) -> Result<TableTrace> {
        self.check()?;
        // its offsets and indices, checked before they are allocated
        let bytes = bags
            .saturating_add(1)
            .saturating_add(bags.saturating_mul(u64::from(self.pooling)))
            .saturating_mul(8);
        nearrec_format::Memory::probe().check(
            || format!("a trace of {bags} bags for table {:?}", self.name),
            bytes,
        )?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let perm = Permutation::new(self.rows, rng.random());
        let lookups = (bags * u64::from(self.pooling)) as usize;
        let fixed = |indices: Vec<i64>| TableTrace {
            offsets: (0..=bags as i64)
                .map(|b| b * i64::from(self.pooling))
                .collect(),
            indices,
            first_reference_share: None,
        };
        Ok(match self.generator {
            Generator::Uniform => fixed(
                (0..lookups)
                    .map(|_| rng.random_range(0..self.rows) as i64)
                    .collect(),
            ),
            Generator::Sequential => {
                let start = rng.random_range(0..self.rows);
                fixed(
                    (0..lookups as u64)
                        .map(|i| ((start + i) % self.rows) as i64)
                        .collect(),
                )
            }
            Generator::Zipf { alpha } => {
                let zipf = Zipf::new(self.rows as f64, alpha).map_err(|e| PlanError::BadSpec {
                    table: self.name.clone(),
                    reason: e.to_string(),
                })?;
                fixed(
                    (0..lookups)
                        .map(|_| perm.at(zipf.sample(&mut rng) as u64 - 1) as i64)
                        .collect(),
                )
            }
            Generator::StackDistance { k, variant, ids } => {
                let row = |id: u32| match ids {
                    Ids::Full => perm.at(u64::from(id)),
                    Ids::Strided { stride } => u64::from(id) * stride,
                };
                let id_count = match ids {
                    Ids::Full => self.rows,
                    Ids::Strided { stride } => self.rows.div_ceil(stride),
                };
                self.stack_distance(k, variant, id_count, bags, &mut rng, row)
            }
        })
    }

    fn stack_distance(
        &self,
        k: f64,
        variant: Variant,
        id_count: u64,
        bags: u64,
        rng: &mut Xoshiro256PlusPlus,
        row: impl Fn(u32) -> u64,
    ) -> TableTrace {
        let pooling = u64::from(self.pooling);
        let needed = bags * pooling;
        let (draws, dist) = match variant {
            Variant::Continuous => (
                2 * needed,
                Distances::locality(k, LOCALITY_SEED).scaled(pooling),
            ),
            Variant::PerBag => (needed, Distances::locality(k, LOCALITY_SEED)),
        };
        // only the front `draws` ids can ever be reached
        let ids = id_count.min(draws.max(1)).min(u64::from(u32::MAX)) as usize;
        let mut stack = LruStack::new(ids, draws as usize);
        let mut first_refs = 0u64;
        let mut kept_first_refs = 0u64;
        let mut draw = |first_refs: &mut u64, rng: &mut Xoshiro256PlusPlus| {
            let d = dist.draw(rng.random(), *first_refs);
            if d == 0 {
                *first_refs += 1;
            }
            (d == 0, row(stack.take(d)))
        };
        match variant {
            Variant::Continuous => {
                for _ in 0..needed {
                    draw(&mut first_refs, rng);
                }
                let indices = (0..needed)
                    .map(|_| {
                        let (first, r) = draw(&mut first_refs, rng);
                        kept_first_refs += u64::from(first);
                        r as i64
                    })
                    .collect();
                TableTrace {
                    offsets: (0..=bags as i64).map(|b| b * pooling as i64).collect(),
                    indices,
                    first_reference_share: Some(kept_first_refs as f64 / needed.max(1) as f64),
                }
            }
            Variant::PerBag => {
                let mut offsets = Vec::with_capacity(bags as usize + 1);
                let mut indices = Vec::with_capacity(needed as usize);
                offsets.push(0);
                let mut bag = Vec::with_capacity(pooling as usize);
                for _ in 0..bags {
                    let mut restart = 0u64;
                    bag.clear();
                    for _ in 0..pooling {
                        let (first, r) = draw(&mut restart, rng);
                        kept_first_refs += u64::from(first);
                        bag.push(r as i64);
                    }
                    bag.sort_unstable();
                    bag.dedup();
                    indices.extend_from_slice(&bag);
                    offsets.push(indices.len() as i64);
                }
                TableTrace {
                    offsets,
                    indices,
                    first_reference_share: Some(kept_first_refs as f64 / needed.max(1) as f64),
                }
            }
        }
    }
}

/// The seed of table `table` of a trace seeded with `seed` (tables draw independent streams).
pub fn table_seed(seed: u64, table: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (table as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// A seeded bijection of `0..n`, O(1) memory: a 4-round Feistel network over the smallest
/// power-of-four domain that holds `n`, cycle-walked back into range.
#[derive(Debug, Clone, Copy)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    key: u64,
}

impl Permutation {
    pub fn new(n: u64, key: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        Self {
            n,
            half_bits: bits.div_ceil(2).max(1),
            key,
        }
    }

    fn round(&self, x: u64, r: u64) -> u64 {
        // splitmix64 finaliser of (x, key, round)
        let mut z = x ^ self.key.rotate_left(r as u32 * 16) ^ (r << 56);
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn once(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for round in 0..4 {
            (l, r) = (r, l ^ (self.round(r, round) & mask));
        }
        (l << self.half_bits) | r
    }

    /// The image of `i` (< n).
    pub fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = self.once(i);
        while x >= self.n {
            x = self.once(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 7, 64, 1000, 4097] {
            let p = Permutation::new(n, 42);
            let mut seen: Vec<u64> = (0..n).map(|i| p.at(i)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        let (a, b) = (Permutation::new(1000, 1), Permutation::new(1000, 2));
        assert!((0..1000).any(|i| a.at(i) != b.at(i)));
    }

    #[test]
    fn sequential_ids_run_on_and_wrap() {
        let spec = TableSpec {
            name: "t".into(),
            rows: 10,
            pooling: 4,
            generator: Generator::Sequential,
        };
        let tr = spec.generate(4, 3).unwrap();
        assert_eq!(tr.offsets, [0, 4, 8, 12, 16]);
        for w in tr.indices.windows(2) {
            assert_eq!(w[1], (w[0] + 1) % 10);
        }
    }
}
