//! Fitting the model to a real disk: the parallel units, per-read array time and per-command costs
//! that reproduce its measured random-read rate at several queue depths.

use serde::{Deserialize, Serialize};

use crate::config::DeviceConfig;
use crate::flash::block_command;
use crate::ftl::Ftl;
use crate::sim::{self, Command, Servers};

/// One measurement: `reads_per_s` random reads of `bytes` at `queue_depth` in flight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DiskPoint {
    pub queue_depth: u32,
    pub bytes: u32,
    pub reads_per_s: f64,
    /// How much this point counts in the fit (1 by default): weigh up the depths a workload runs
    /// at, since the model's knee is sharper than a real disk's.
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// The model's read rate for random single-page reads of `bytes` at `queue_depth`.
pub fn predicted_rate(cfg: &DeviceConfig, queue_depth: u32, bytes: u32) -> f64 {
    let f = &cfg.flash;
    let n = 2048u32.max(queue_depth * 32);
    let page = u64::from(f.page_bytes);
    let ftl = Ftl::contiguous(&[page << 30], f);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let cmds: Vec<Command> = (0..n)
        .map(|_| {
            // xorshift: a spread of pages over every unit.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = ftl.page_of((x % (1 << 30)) * page);
            block_command(
                cfg,
                cfg.host.user_io_ns,
                &[(at, u64::from(bytes))],
                u64::from(bytes),
            )
        })
        .collect();
    let servers = Servers {
        host: cfg.host.io_threads,
        controller: cfg.controller.cores,
        units: f.units(),
        channels: f.channels,
    };
    let out = sim::run(&cmds, servers, queue_depth);
    f64::from(n) / (out.end_ns as f64 / 1e9)
}

/// The fit's quality: the largest relative error over the points.
pub fn worst_error(cfg: &DeviceConfig, points: &[DiskPoint]) -> f64 {
    points
        .iter()
        .map(|p| (predicted_rate(cfg, p.queue_depth, p.bytes) / p.reads_per_s - 1.0).abs())
        .fold(0.0, f64::max)
}

/// Searches units (channels of one die), array time and command cost for the parameter set
/// whose read rates best match `points` (weighted least squares on the log of the rate), taking
/// `base` for everything else; `base` itself wins if nothing on the grid matches better.
pub fn fit(base: &DeviceConfig, points: &[DiskPoint]) -> DeviceConfig {
    let cost = |cfg: &DeviceConfig| -> f64 {
        points
            .iter()
            .map(|p| {
                (predicted_rate(cfg, p.queue_depth, p.bytes) / p.reads_per_s)
                    .ln()
                    .powi(2)
            })
            .sum()
    };
    // Never worse than where it started.
    let mut best = base.clone();
    let mut best_cost = cost(base);
    // Depth 1 fixes the sum of the serial costs; deep queues fix the units' throughput and the
    // command cost; so a coarse grid over those three, refined once, is enough.
    let qd1 = points
        .iter()
        .filter(|p| p.queue_depth == 1)
        .map(|p| 1e9 / p.reads_per_s)
        .next()
        .unwrap_or(100_000.0);
    for units in [1u32, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64] {
        for cmd_share in [0.0, 0.02, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3] {
            for host_share in [0.0, 0.02, 0.05, 0.08, 0.1, 0.15] {
                let mut c = base.clone();
                c.flash.channels = units;
                c.flash.dies_per_channel = 1;
                c.flash.planes_per_die = 1;
                c.controller.command_ns = (qd1 * cmd_share) as u64;
                c.host.user_io_ns = (qd1 * host_share) as u64;
                let link = c.host.dma_transfer_ns(4096) as f64;
                let array = qd1 * (1.0 - cmd_share - host_share) - link;
                if array <= 1_000.0 {
                    continue;
                }
                c.flash.page_read_ns = (array
                    / (c.flash.flush_share
                        + (1.0 - c.flash.flush_share)
                            * f64::from(c.flash.transfer_unit_bytes.max(512))
                            / f64::from(c.flash.page_bytes)))
                    as u64;
                let k = cost(&c);
                if k < best_cost {
                    best_cost = k;
                    best = c;
                }
            }
        }
    }
    // The grid ties the array time to the depth-1 latency and steps the units coarsely; free the
    // array time around the best point to land the deep-queue rate between the steps.
    let grid_best = best.clone();
    for pct in (70..=130).step_by(2) {
        let mut c = grid_best.clone();
        c.flash.page_read_ns = grid_best.flash.page_read_ns * pct / 100;
        let k = cost(&c);
        if k < best_cost {
            best_cost = k;
            best = c;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_known_drive() {
        let truth = {
            let mut c = DeviceConfig::this_disk();
            c.flash.channels = 8;
            c.controller.command_ns = 10_000;
            c
        };
        let points: Vec<DiskPoint> = [1, 16, 128]
            .into_iter()
            .map(|qd| DiskPoint {
                queue_depth: qd,
                bytes: 4096,
                reads_per_s: predicted_rate(&truth, qd, 4096),
                weight: 1.0,
            })
            .collect();
        let fitted = fit(&DeviceConfig::this_disk(), &points);
        assert!(worst_error(&fitted, &points) < 0.1, "{fitted:?}");
        // More in flight never reads slower, and the deep-queue rate is bounded by the units.
        let r1 = predicted_rate(&truth, 1, 4096);
        let r128 = predicted_rate(&truth, 128, 4096);
        assert!(r128 > 4.0 * r1);
        assert!(r128 <= 1e9 / truth.controller.command_ns as f64 * 1.01);
    }
}
