//! RM-SSD's MLP acceleration engine, timed by its equations 1a–1c, with kernel sizes chosen by
//! the kernel search of Section IV-C4 (equations 2–5, rules one to four).
//!
//! Reading of the paper used here (where it is silent):
//! - A layer whose weights live in on-chip memory (BRAM) costs `R·C / (kr·kc) · II` cycles per
//!   sample. A layer moved to the FPGA's DRAM (rule one: the largest layers go first, until the
//!   rest fits) streams its weights once per batch at `D_width` bytes a cycle (rule two:
//!   `kr = D_width / 4` floats, `kc = II`), so its time does not grow with the batch. That is what
//!   makes rule three's batch-size decision and Fig. 12's RMC3 curve (throughput rising with the
//!   batch until the embeddings dominate) come out.
//! - Rule four picks, layer by layer along the pipeline, the smallest power-of-two kernel area
//!   (at least II, one reused PE) whose per-sample time stays within the target — the slower of the
//!   embedding layer and the DRAM-bound layers — then the largest `kr` the previous layer's `kc`
//!   allows (equation 3) with `kc ≥ 2`. This gives Table V's kernels for RMC1–3.

use serde::Serialize;

use crate::config::FpgaConfig;

/// One FC layer on the FPGA, with the kernel the search gave it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerKernel {
    /// `b0, b1, …` bottom; `b` and `e`: the first top layer's bottom and embedding parts (intra-layer
    /// decomposition); `t1, t2, …` the rest of the top MLP.
    pub name: String,
    pub r: usize,
    pub c: usize,
    pub kr: u32,
    pub kc: u32,
    /// Weights streamed from the FPGA's DRAM (rule one) rather than held on chip.
    pub dram: bool,
}

impl LayerKernel {
    /// Cycles for this layer over `n` samples.
    pub fn cycles(&self, n: usize, ii: u32) -> f64 {
        let per = (self.r * self.c) as f64 / f64::from(self.kr * self.kc) * f64::from(ii);
        if self.dram { per } else { per * n as f64 }
    }
}

/// The engine for one model: kernels, the batch rule three picked, and the times of eq. 1.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MlpEngine {
    /// Bottom layers, then `b`.
    pub bottom: Vec<LayerKernel>,
    pub emb: LayerKernel,
    /// `t1, t2, …`.
    pub top: Vec<LayerKernel>,
    /// Rule three's batch size.
    pub n_batch: usize,
    #[serde(skip)]
    fpga: FpgaConfig,
}

fn pairs_cycles(layers: &[LayerKernel], n: usize, ii: u32) -> f64 {
    layers
        .chunks(2)
        .map(|p| p.iter().map(|l| l.cycles(n, ii)).fold(0.0, f64::max))
        .sum()
}

impl MlpEngine {
    /// Plans the engine for a model with `bottom` widths (input first; empty when there is no
    /// bottom MLP), `top` widths (its input, the concatenation, first) and `emb_width` pooled
    /// embedding floats per sample, given the embedding layer's time per sample.
    pub fn plan(
        bottom: &[usize],
        top: &[usize],
        emb_width: usize,
        emb_ns_per_sample: f64,
        fpga: &FpgaConfig,
    ) -> Self {
        let c0 = top.get(1).copied().unwrap_or(1);
        let bottom_out = bottom.last().copied().unwrap_or(0);
        let mut shapes: Vec<(String, usize, usize)> = bottom
            .windows(2)
            .enumerate()
            .map(|(i, w)| (format!("b{i}"), w[0], w[1]))
            .collect();
        if bottom_out > 0 {
            shapes.push(("b".into(), bottom_out, c0));
        }
        shapes.push(("e".into(), emb_width.max(1), c0));
        for (j, w) in top.windows(2).enumerate().skip(1) {
            shapes.push((format!("t{j}"), w[0], w[1]));
        }
        // Rule one: the largest layers move to DRAM until the rest fits on chip.
        let mut dram = vec![false; shapes.len()];
        let mut on_chip: u64 = shapes.iter().map(|s| 4 * (s.1 * s.2) as u64).sum();
        let mut by_size: Vec<usize> = (0..shapes.len()).collect();
        by_size.sort_by_key(|&i| std::cmp::Reverse(shapes[i].1 * shapes[i].2));
        for i in by_size {
            if on_chip <= fpga.bram_bytes {
                break;
            }
            dram[i] = true;
            on_chip -= 4 * (shapes[i].1 * shapes[i].2) as u64;
        }
        let ii = fpga.ii;
        let kmax = 1u32 << fpga.k_max;
        let dram_kr = (fpga.dram_width_bytes / 4).max(1);
        let dram_cycles = shapes
            .iter()
            .zip(&dram)
            .filter(|(_, d)| **d)
            .map(|(s, _)| (s.1 * s.2) as f64 / f64::from(dram_kr * ii) * f64::from(ii))
            .fold(0.0, f64::max);
        let emb_cycles = emb_ns_per_sample * fpga.mhz / 1e3;
        let target = emb_cycles.max(dram_cycles).max(1.0);
        // Rule four along the pipeline; `kc_prev` bounds the next layer's `kr` (eq. 3).
        let mut kc_prev = kmax;
        let mut kc_b = None;
        let mut out = Vec::with_capacity(shapes.len());
        for ((name, r, c), d) in shapes.into_iter().zip(dram) {
            let (kr, kc) = if d {
                (dram_kr, ii)
            } else {
                let need = ((r * c) as f64 * f64::from(ii) / target).ceil() as u32;
                let area = need.max(ii).next_power_of_two().min(kmax * kmax);
                if c == 1 {
                    (kc_prev.min(area), 1)
                } else if name == "e" && kc_b.is_some() {
                    // eq. 3: the embedding part shares the bottom part's column kernel.
                    let kc = kc_b.unwrap_or(2);
                    ((area / kc).clamp(1, kmax), kc)
                } else {
                    let kr = (area / 2).min(kc_prev).clamp(1, kmax);
                    (kr, (area / kr).min(kmax))
                }
            };
            if name == "b" {
                kc_b = Some(kc);
            }
            if name != "e" || kc_b.is_none() {
                kc_prev = kc;
            }
            out.push(LayerKernel {
                name,
                r,
                c,
                kr,
                kc,
                dram: d,
            });
        }
        let e = out
            .iter()
            .position(|l| l.name == "e")
            .expect("the embedding part exists");
        let top_layers = out.split_off(e + 1);
        let emb = out.pop().expect("the embedding part exists");
        let mut engine = Self {
            bottom: out,
            emb,
            top: top_layers,
            n_batch: 1,
            fpga: fpga.clone(),
        };
        // Rule three: grow the batch until the MLPs no longer outlast the embedding layer.
        let mlp = |eng: &Self, n| eng.bottom_ns(n).max(eng.top_ns(n));
        while engine.n_batch < 1024
            && mlp(&engine, engine.n_batch) > emb_ns_per_sample * engine.n_batch as f64
        {
            let next = engine.n_batch * 2;
            if mlp(&engine, next) / next as f64
                >= mlp(&engine, engine.n_batch) / engine.n_batch as f64
            {
                break; // the MLPs scale with the batch: a larger one cannot catch up
            }
            engine.n_batch = next;
        }
        engine
    }

    /// T_bot' for `n` samples (eq. 1b: adjacent layers composed in pairs), ns.
    pub fn bottom_ns(&self, n: usize) -> f64 {
        self.fpga
            .cycles_ns(pairs_cycles(&self.bottom, n, self.fpga.ii))
    }

    /// T_top' for `n` samples (eq. 1c), ns.
    pub fn top_ns(&self, n: usize) -> f64 {
        self.fpga
            .cycles_ns(pairs_cycles(&self.top, n, self.fpga.ii))
    }

    /// The embedding part of the first top layer for `n` samples (the second term of eq. 1a), ns.
    pub fn emb_layer_ns(&self, n: usize) -> f64 {
        self.fpga.cycles_ns(self.emb.cycles(n, self.fpga.ii))
    }

    /// `kr×kc` of every layer in Table V's order (`b0 b1 … b e t1 t2 …`; a last layer shows `kr`).
    pub fn kernel_table(&self) -> Vec<(String, String)> {
        self.bottom
            .iter()
            .chain(std::iter::once(&self.emb))
            .chain(&self.top)
            .map(|l| {
                let k = if l.c == 1 {
                    l.kr.to_string()
                } else {
                    format!("{}×{}", l.kr, l.kc)
                };
                (l.name.clone(), k)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DeviceConfig;

    fn table(bottom: &[usize], top: &[usize], emb: usize, emb_ns: f64) -> Vec<String> {
        let fpga = DeviceConfig::rm_ssd().controller.fpga;
        MlpEngine::plan(bottom, top, emb, emb_ns, &fpga)
            .kernel_table()
            .into_iter()
            .map(|(_, k)| k)
            .collect()
    }

    #[test]
    fn kernel_search_gives_table_five() {
        // Embedding time per sample: RMC1 640 rows, RMC3 200 rows at ~14 µs over 4 channels.
        let per_row = 14_200.0 / 4.0;
        assert_eq!(
            table(&[128, 64, 32], &[288, 256, 64, 1], 256, 640.0 * per_row),
            ["4×2", "2×4", "4×2", "4×2", "2×4", "4"]
        );
        assert_eq!(
            table(&[256, 128, 64], &[2112, 128, 64, 1], 2048, 3840.0 * per_row),
            ["4×2", "2×4", "4×2", "4×2", "2×4", "4"]
        );
        assert_eq!(
            table(
                &[2560, 1024, 256, 32],
                &[352, 512, 256, 1],
                320,
                200.0 * per_row
            ),
            ["16×8", "8×2", "2×4", "4×2", "4×2", "2×4", "4"]
        );
    }

    #[test]
    fn a_dram_bound_model_takes_a_larger_batch() {
        let fpga = DeviceConfig::rm_ssd().controller.fpga;
        let eng = MlpEngine::plan(
            &[2560, 1024, 256, 32],
            &[352, 512, 256, 1],
            320,
            200.0 * 3550.0,
            &fpga,
        );
        assert!(eng.bottom[0].dram && !eng.bottom[1].dram);
        assert!(
            eng.n_batch > 1,
            "RMC3's first layer outlasts one sample's embeddings"
        );
        // The DRAM layer costs the same for any batch; on-chip layers scale.
        assert_eq!(eng.bottom[0].cycles(1, 8), eng.bottom[0].cycles(4, 8));
        assert_eq!(eng.top[0].cycles(4, 8), 4.0 * eng.top[0].cycles(1, 8));
        let fast = MlpEngine::plan(
            &[128, 64, 32],
            &[288, 256, 64, 1],
            256,
            640.0 * 3550.0,
            &fpga,
        );
        assert_eq!(fast.n_batch, 1);
    }
}
