//! Fully connected layers in PyTorch's layout (`weight` is `[out, in]`, `y = x Wᵀ + b`), fp32,
//! multiplied by the `gemm` crate; a large product is split across the worker pool by its
//! output columns.
//!
//! Why `gemm`: at the shapes recommendation models serve (batch 16–64, layers of 128–2560
//! wide), split by output columns over two threads, with the narrower layers' weights held
//! transposed, it runs at 96–185 GFLOP/s where PyTorch's `nn.Linear` runs at 69–152: ahead on
//! every layer but the 1024-wide ones at batch 16 (96–102 against 111–115);
//! `matrixmultiply` cut by rows gave 38–116 (each thread packed the whole weight matrix), and
//! `faer` (built on `gemm`) adds nothing here: `bench/results/gemm-compare.md`.

use std::ops::Range;

use rayon::prelude::*;

use super::ModelError;

/// Multiply-adds above which a product is split across the pool's threads.
const PARALLEL_FLOPS: usize = 1 << 21;

/// Output columns a thread takes at least, in whole multiples, when a product is split.
///
/// The split is by output columns, each thread packing only its own rows of the weight:
/// `gemm`'s own split ran the 512 → 256 layer at 40 (batch 16) and 105 GFLOP/s (batch 64) on
/// two threads, level with or below one thread (56, 91), where halving the columns ran it at 74
/// and 159; on the other layers the two splits were level (`bench/gemm/run.py`,
/// `bench/results/gemm-compare.md`).
const SPLIT_COLUMNS: usize = 16;

/// `y` as the threads of a split product share it, each writing only its own columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: `Linear::accumulate` hands each thread a disjoint block of columns, and `y` outlives
// the split (the threads are joined before it returns).
unsafe impl Send for Out {}
// SAFETY: as for `Send`: shared only to hand out those disjoint blocks.
unsafe impl Sync for Out {}

/// What follows a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None,
    Relu,
    Sigmoid,
    Tanh,
}

impl Activation {
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "none" => Self::None,
            "relu" => Self::Relu,
            "sigmoid" => Self::Sigmoid,
            "tanh" => Self::Tanh,
            _ => return None,
        })
    }

    pub(crate) fn apply(self, v: &mut [f32]) {
        match self {
            Self::None => {}
            // `max` would turn NaN into 0; PyTorch's relu keeps it
            Self::Relu => v.iter_mut().filter(|x| **x < 0.0).for_each(|x| *x = 0.0),
            Self::Sigmoid => v.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
            Self::Tanh => v.iter_mut().for_each(|x| *x = x.tanh()),
        }
    }
}

/// Outputs up to which a layer keeps its weight transposed, `inputs × outputs` row-major.
///
/// `gemm` multiplies the transposed product, so `nn.Linear`'s `[out, in]` weight is the operand
/// it packs: a strided gather of the whole matrix on every call, whatever the batch (a third of
/// Wide & Deep's time at batch 16). Held transposed, the layers of up to 512 outputs ran
/// 1.1–3.5× faster at batch 16 and 64, split or on one thread; the 1024-wide first layers
/// (memory-bound at batch 16: their weight is read once a call either way) ran up to 13 %
/// slower, so they keep PyTorch's layout (`bench/gemm/run.py`, `bench/results/gemm-compare.md`).
const TRANSPOSED_OUTPUTS: usize = 512;

/// One FC layer: `outputs × inputs` weights (given row-major, as `nn.Linear.weight`, and held
/// transposed up to `TRANSPOSED_OUTPUTS`), a bias, an activation.
#[derive(Debug, Clone)]
pub struct Linear {
    inputs: usize,
    outputs: usize,
    /// `[outputs, inputs]`, or `[inputs, outputs]` when `transposed`.
    weight: Vec<f32>,
    transposed: bool,
    bias: Vec<f32>,
    activation: Activation,
}

impl Linear {
    /// Checks that `weight` holds `outputs × inputs` values and `bias` `outputs`.
    pub fn new(
        weight: Vec<f32>,
        bias: Vec<f32>,
        outputs: usize,
        inputs: usize,
        activation: Activation,
    ) -> Result<Self, ModelError> {
        if outputs == 0 || inputs == 0 {
            return Err(ModelError(format!(
                "a layer needs at least one input and output, not {outputs}×{inputs}"
            )));
        }
        if weight.len() != outputs * inputs {
            return Err(ModelError(format!(
                "weight has {} values, not {outputs}×{inputs}",
                weight.len()
            )));
        }
        if bias.len() != outputs {
            return Err(ModelError(format!(
                "bias has {} values, not {outputs}",
                bias.len()
            )));
        }
        let transposed = outputs <= TRANSPOSED_OUTPUTS;
        let weight = if transposed {
            (0..inputs * outputs)
                .map(|j| weight[(j % outputs) * inputs + j / outputs])
                .collect()
        } else {
            weight
        };
        Ok(Self {
            inputs,
            outputs,
            weight,
            transposed,
            bias,
            activation,
        })
    }

    pub fn inputs(&self) -> usize {
        self.inputs
    }

    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// `[batch, outputs]` from `x`, `[batch, inputs]`.
    pub fn forward(&self, x: &[f32], batch: usize) -> Vec<f32> {
        let mut y = vec![0f32; batch * self.outputs];
        self.accumulate(x, self.inputs, 0..self.inputs, batch, &mut y);
        self.finish(&mut y);
        y
    }

    /// Adds the product of an input block with its weight slice into `y` (`[batch, outputs]`):
    /// `x` holds `batch` rows of `x_stride` values whose first `cols.len()` are the layer's
    /// inputs `cols`. Summing these over blocks that cover every input, then [`Self::finish`],
    /// is the layer (RM-SSD's decomposed first top layer).
    pub fn accumulate(
        &self,
        x: &[f32],
        x_stride: usize,
        cols: Range<usize>,
        batch: usize,
        y: &mut [f32],
    ) {
        let k = cols.len();
        assert!(cols.end <= self.inputs, "columns beyond the layer's inputs");
        assert!(k <= x_stride, "an input row shorter than its block");
        assert!(
            batch == 0 || x.len() >= (batch - 1) * x_stride + k,
            "input too short"
        );
        assert_eq!(y.len(), batch * self.outputs, "output has the wrong size");
        if batch == 0 || k == 0 {
            return;
        }
        let n = self.outputs;
        let threads = rayon::current_num_threads();
        let parts = if batch * k * n >= PARALLEL_FLOPS {
            threads.min(n / SPLIT_COLUMNS).max(1)
        } else {
            1
        };
        let out = Out(y.as_mut_ptr());
        // blocks of whole `SPLIT_COLUMNS`, the last one taking what is left
        let block = n.div_ceil(parts).next_multiple_of(SPLIT_COLUMNS);
        let product = |c0: usize| {
            let nc = block.min(n - c0);
            // SAFETY: c0 + nc ≤ n, and `x` and `y` hold what the asserts above say; the
            // blocks of the split (c0 = 0, block, 2·block, …) write disjoint columns of y.
            unsafe { self.product(x, x_stride, cols.clone(), batch, out, c0, nc) }
        };
        if parts == 1 {
            product(0);
        } else {
            (0..n).into_par_iter().step_by(block).for_each(product);
        }
    }

    /// `y[.., c0 .. c0 + nc] += x · W[c0 .. c0 + nc, cols]ᵀ` on this thread.
    ///
    /// # Safety
    /// `y` points at `batch × outputs` values, `c0 + nc ≤ outputs`, `x` holds `batch` rows of
    /// `x_stride ≥ cols.len()` values (the last row may stop after its `cols.len()`), `cols`
    /// lies within the inputs, and no other thread touches these columns of `y` meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        &self,
        x: &[f32],
        x_stride: usize,
        cols: Range<usize>,
        batch: usize,
        y: Out,
        c0: usize,
        nc: usize,
    ) {
        let k = cols.len();
        // Wᵀ's block, `k × nc`: its start and (column, row) strides
        let (at, cs, rs) = if self.transposed {
            (cols.start * self.outputs + c0, 1, self.outputs)
        } else {
            (c0 * self.inputs + cols.start, self.inputs, 1)
        };
        let w = &self.weight[at..];
        // SAFETY: dst = y's columns c0.., `batch × nc` (column stride 1, row stride outputs),
        // in bounds as c0 + nc ≤ outputs; lhs = `batch × k` at x (row stride x_stride; the
        // caller keeps the last row in bounds); rhs = the block's rows of Wᵀ, `k × nc`,
        // element (i, o) = weight[(c0 + o)·inputs + cols.start + i] (column stride inputs, row
        // stride 1), or weight[(cols.start + i)·outputs + c0 + o] held transposed (column
        // stride 1, row stride outputs); in bounds as cols.end ≤ inputs and c0 + nc ≤ outputs.
        // Neither input overlaps y. y += x·Wᵀ (alpha 1 on the read dst, beta 1 on the product).
        unsafe {
            gemm::gemm(
                batch,
                nc,
                k,
                y.0.add(c0),
                1,
                self.outputs as isize,
                true,
                x.as_ptr(),
                1,
                x_stride as isize,
                w.as_ptr(),
                cs as isize,
                rs as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }

    /// Adds the bias to every row of `y` and applies the activation.
    pub fn finish(&self, y: &mut [f32]) {
        for row in y.chunks_exact_mut(self.outputs) {
            row.iter_mut().zip(&self.bias).for_each(|(a, b)| *a += b);
        }
        self.activation.apply(y);
    }
}

/// FC layers applied in order.
#[derive(Debug, Clone)]
pub struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    /// Checks that each layer takes the previous one's outputs.
    pub fn new(layers: Vec<Linear>) -> Result<Self, ModelError> {
        if layers.is_empty() {
            return Err(ModelError("an MLP needs at least one layer".into()));
        }
        for (i, pair) in layers.windows(2).enumerate() {
            if pair[0].outputs != pair[1].inputs {
                return Err(ModelError(format!(
                    "layer {} has {} outputs but layer {} takes {} inputs",
                    i,
                    pair[0].outputs,
                    i + 1,
                    pair[1].inputs
                )));
            }
        }
        Ok(Self { layers })
    }

    pub fn inputs(&self) -> usize {
        self.layers[0].inputs
    }

    pub fn outputs(&self) -> usize {
        self.layers[self.layers.len() - 1].outputs
    }

    pub fn first(&self) -> &Linear {
        &self.layers[0]
    }

    /// Every layer on `x` (`[batch, inputs]`).
    pub fn forward(&self, x: &[f32], batch: usize) -> Vec<f32> {
        self.forward_from(0, x.to_vec(), batch)
    }

    /// Layers `from..` on `x`, the output of layer `from - 1`.
    pub fn forward_from(&self, from: usize, x: Vec<f32>, batch: usize) -> Vec<f32> {
        self.layers[from..]
            .iter()
            .fold(x, |x, layer| layer.forward(&x, batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain triple loop the SGEMM path is held to (`weight`: as given, `[out, in]`).
    fn naive(l: &Linear, weight: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        let mut y = vec![0f32; batch * l.outputs];
        for b in 0..batch {
            for o in 0..l.outputs {
                let mut s = l.bias[o] as f64;
                for i in 0..l.inputs {
                    s += x[b * l.inputs + i] as f64 * weight[o * l.inputs + i] as f64;
                }
                y[b * l.outputs + o] = s as f32;
            }
        }
        l.activation.apply(&mut y);
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32)
            .map(|v| v / (1u32 << 24) as f32 - 0.5)
            .collect()
    }

    #[test]
    fn blocks_sum_to_the_layer() {
        // on one thread and split by columns across two and three (the large shapes pass
        // `PARALLEL_FLOPS`; 250 outputs leave a short last block), both weight layouts
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(check_blocks);
        }
    }

    fn check_blocks() {
        for (batch, inputs, outputs) in [
            (1, 7, 3),
            (5, 64, 33),
            (256, 352, 512),
            (40, 600, 250),
            (24, 300, 1030),
            (2, 5, 600),
            (3, 1, 1),
        ] {
            // held transposed up to `TRANSPOSED_OUTPUTS`, as given beyond
            let weight = values(outputs * inputs, 1);
            let l = Linear::new(
                weight.clone(),
                values(outputs, 2),
                outputs,
                inputs,
                Activation::Relu,
            )
            .unwrap();
            let x = values(batch * inputs, 3);
            let want = naive(&l, &weight, &x, batch);
            let got = l.forward(&x, batch);
            // two blocks, the second given as its own strided view of x
            let cut = inputs / 3;
            let mut y = vec![0f32; batch * outputs];
            l.accumulate(&x, inputs, 0..cut, batch, &mut y);
            l.accumulate(&x[cut..], inputs, cut..inputs, batch, &mut y);
            l.finish(&mut y);
            for (g, w) in got.iter().chain(&y).zip(want.iter().chain(&want)) {
                assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        let err = Linear::new(vec![0.0; 6], vec![0.0; 2], 2, 4, Activation::None).unwrap_err();
        assert!(err.0.contains("6 values"), "{err}");
        let a = Linear::new(vec![0.0; 6], vec![0.0; 2], 2, 3, Activation::None).unwrap();
        let b = Linear::new(vec![0.0; 3], vec![0.0; 1], 1, 3, Activation::None).unwrap();
        let err = Mlp::new(vec![a, b]).unwrap_err();
        assert!(err.0.contains("layer 0 has 2 outputs"), "{err}");
    }
}
