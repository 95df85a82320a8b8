//! A whole simulation: a model's tables fed a generated trace, batch after batch, through one
//! design on one drive, summarised as the papers report it.

use nearrec_plan::{Generator, TableSpec};
use serde::{Deserialize, Serialize};

use crate::config::DeviceConfig;
use crate::error::{DeviceError, Result};
use crate::modes::{BatchReport, Mode, Simulator};
use crate::workload::{TableBatch, Workload};

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimSpec {
    pub workload: Workload,
    pub device: DeviceConfig,
    pub mode: Mode,
    /// Samples per batch.
    pub batch: usize,
    /// Batches measured.
    pub batches: usize,
    /// Batches run first to fill caches and profile hot rows, not measured.
    pub warmup: usize,
    /// Lookups per table per sample (the pooling factor).
    pub pooling: u32,
    pub generator: Generator,
    pub seed: u64,
}

/// The summary of a simulation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    pub mode: String,
    pub device: String,
    pub batch: usize,
    pub batches: usize,
    pub samples: usize,
    pub lookups: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_mean_ms: f64,
    /// Samples per second in steady state (RM-SSD pipelines batches; the rest run one at a time).
    pub throughput: f64,
    pub embed_ms: f64,
    pub mlp_ms: f64,
    pub flash_reads: u64,
    pub channel_bytes: u64,
    pub link_bytes: u64,
    /// Bytes the host read back over the link.
    pub link_read_bytes: u64,
    pub useful_bytes: u64,
    /// Bytes moved off the flash array ÷ bytes of the rows looked up.
    pub read_amplification: f64,
    pub host_ios: u64,
    pub host_hits: u64,
    pub device_hits: u64,
    /// RM-SSD: rule three's batch and the kernel of every layer (Table V's order).
    pub n_batch: Option<usize>,
    pub kernels: Option<Vec<(String, String)>>,
}

/// The p-th percentile (0..=100) of `v`, nearest rank.
fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let k = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[k.clamp(1, v.len()) - 1]
}

/// Generates the trace, warms the design up, runs the measured batches.
pub fn simulate(spec: &SimSpec) -> Result<SimReport> {
    if spec.batch == 0 || spec.batches == 0 || spec.pooling == 0 {
        return Err(DeviceError::Config(
            "batch, batches and pooling must be at least 1".into(),
        ));
    }
    let mut sim = Simulator::new(spec.device.clone(), spec.workload.clone(), spec.mode)?;
    let total = (spec.warmup + spec.batches) * spec.batch;
    let traces = spec
        .workload
        .tables
        .iter()
        .enumerate()
        .map(|(t, table)| {
            let ts = TableSpec {
                name: table.name.clone(),
                rows: table.rows,
                pooling: spec.pooling,
                generator: spec.generator.clone(),
            };
            ts.generate(total as u64, nearrec_plan::table_seed(spec.seed, t))
                .map_err(|e| DeviceError::Config(format!("trace for table {}: {e}", table.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    // Offsets of batch `i`, rebased to its first index.
    let slices: Vec<Vec<Vec<i64>>> = (0..spec.warmup + spec.batches)
        .map(|i| {
            traces
                .iter()
                .map(|tr| {
                    let o = &tr.offsets[i * spec.batch..=(i + 1) * spec.batch];
                    o.iter().map(|&x| x - o[0]).collect()
                })
                .collect()
        })
        .collect();
    let batch_of = |i: usize| -> Vec<TableBatch<'_>> {
        traces
            .iter()
            .zip(&slices[i])
            .map(|(tr, offs)| {
                let start = tr.offsets[i * spec.batch] as usize;
                let end = tr.offsets[(i + 1) * spec.batch] as usize;
                TableBatch {
                    indices: &tr.indices[start..end],
                    offsets: offs,
                }
            })
            .collect()
    };
    let warm: Vec<_> = (0..spec.warmup).map(batch_of).collect();
    sim.warm(&warm)?;
    let mut reports: Vec<BatchReport> = Vec::with_capacity(spec.batches);
    for i in spec.warmup..spec.warmup + spec.batches {
        reports.push(sim.run_batch(&batch_of(i))?);
    }
    Ok(summarise(spec, &sim, &reports))
}

fn summarise(spec: &SimSpec, sim: &Simulator, reports: &[BatchReport]) -> SimReport {
    let sum = |f: &dyn Fn(&BatchReport) -> u64| reports.iter().map(f).sum::<u64>();
    let mut lat: Vec<f64> = reports.iter().map(|r| r.latency_ns / 1e6).collect();
    let n = reports.len().max(1) as f64;
    let samples: usize = reports.iter().map(|r| r.samples).sum();
    let period: f64 = reports.iter().map(|r| r.period_ns).sum();
    let useful = sum(&|r| r.useful_bytes);
    let channel = sum(&|r| r.channel_bytes);
    let engine = sim.mlp_engine();
    SimReport {
        mode: spec.mode.name().into(),
        device: spec.device.name.clone(),
        batch: spec.batch,
        batches: reports.len(),
        samples,
        lookups: sum(&|r| r.lookups),
        latency_mean_ms: lat.iter().sum::<f64>() / n,
        latency_p50_ms: percentile(&mut lat, 50.0),
        latency_p99_ms: percentile(&mut lat, 99.0),
        throughput: if period > 0.0 {
            samples as f64 / (period / 1e9)
        } else {
            0.0
        },
        embed_ms: reports.iter().map(|r| r.embed_ns).sum::<f64>() / n / 1e6,
        mlp_ms: reports.iter().map(|r| r.mlp_ns).sum::<f64>() / n / 1e6,
        flash_reads: sum(&|r| r.flash_reads),
        channel_bytes: channel,
        link_bytes: sum(&|r| r.link_bytes),
        link_read_bytes: sum(&|r| r.link_read_bytes),
        useful_bytes: useful,
        read_amplification: if useful > 0 {
            channel as f64 / useful as f64
        } else {
            0.0
        },
        host_ios: sum(&|r| r.host_ios),
        host_hits: sum(&|r| r.host_hits),
        device_hits: sum(&|r| r.device_hits),
        n_batch: engine.map(|e| e.n_batch),
        kernels: engine.map(|e| e.kernel_table()),
    }
}
