//! Fully connected layers in PyTorch's layout (`weight` is `[out, in]`, `y = x Wᵀ + b`), fp32,
//! multiplied by the `gemm` crate; a large product is split across the worker pool by `gemm`
//! itself.
//!
//! Why `gemm`: at the shapes recommendation models serve (batch 64, layers of 256–2560 wide),
//! this crate's own two-thread split runs the wide layers at 129–163 GFLOP/s, level with
//! PyTorch's `nn.Linear` (121–152), where `matrixmultiply` cut by rows gave 92–113 (each thread
//! packed the whole weight matrix), and `faer` (built on `gemm`) adds nothing here:
//! `bench/results/gemm-compare.md`.

use std::ops::Range;

use super::ModelError;

/// Multiply-adds above which a product is split across the pool's threads.
const PARALLEL_FLOPS: usize = 1 << 21;

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

/// One FC layer: `outputs × inputs` weights (row-major, as `nn.Linear.weight`), a bias, an
/// activation.
#[derive(Debug, Clone)]
pub struct Linear {
    inputs: usize,
    outputs: usize,
    weight: Vec<f32>,
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
        Ok(Self {
            inputs,
            outputs,
            weight,
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
        let w = &self.weight[cols.start..];
        let threads = rayon::current_num_threads();
        let parallelism = if threads > 1 && batch * k * n >= PARALLEL_FLOPS {
            gemm::Parallelism::Rayon(threads)
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: dst = y, `batch × n` row-major (column stride 1, row stride n), exactly
        // batch·n long; lhs = `batch × k` at x (row stride x_stride; the assert above keeps the
        // last row in bounds); rhs = Wᵀ's rows `cols`, `k × n`, element (i, o) =
        // weight[o·inputs + cols.start + i] (column stride inputs, row stride 1; in bounds as
        // cols.end ≤ inputs). Neither input overlaps y. y += x·Wᵀ (alpha 1 on the read dst,
        // beta 1 on the product).
        unsafe {
            gemm::gemm(
                batch,
                n,
                k,
                y.as_mut_ptr(),
                1,
                n as isize,
                true,
                x.as_ptr(),
                1,
                x_stride as isize,
                w.as_ptr(),
                self.inputs as isize,
                1,
                1.0,
                1.0,
                false,
                false,
                false,
                parallelism,
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

    /// The plain triple loop the SGEMM path is held to.
    fn naive(l: &Linear, x: &[f32], batch: usize) -> Vec<f32> {
        let mut y = vec![0f32; batch * l.outputs];
        for b in 0..batch {
            for o in 0..l.outputs {
                let mut s = l.bias[o] as f64;
                for i in 0..l.inputs {
                    s += x[b * l.inputs + i] as f64 * l.weight[o * l.inputs + i] as f64;
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
        // on one thread and split across two (the large shapes pass `PARALLEL_FLOPS`)
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(check_blocks);
        }
    }

    fn check_blocks() {
        for (batch, inputs, outputs) in [(1, 7, 3), (5, 64, 33), (256, 352, 512), (3, 1, 1)] {
            let l = Linear::new(
                values(outputs * inputs, 1),
                values(outputs, 2),
                outputs,
                inputs,
                Activation::Relu,
            )
            .unwrap();
            let x = values(batch * inputs, 3);
            let want = naive(&l, &x, batch);
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
