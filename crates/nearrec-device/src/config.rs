//! What a simulated drive is made of: flash geometry and timing, the controller, the host side.
//! Three parameter sets ship: RM-SSD's emulated SSD, RecSSD's Cosmos+ OpenSSD, and one fitted to
//! this machine's disk ([`crate::calibrate`]).

use serde::{Deserialize, Serialize};

use crate::error::{DeviceError, Result};

/// The flash array: channels × dies × planes, each plane with one page register.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlashConfig {
    pub channels: u32,
    /// Dies (ways) sharing each channel's bus.
    pub dies_per_channel: u32,
    /// Planes per die; each reads independently (multi-plane address rules are not modelled).
    pub planes_per_die: u32,
    pub page_bytes: u32,
    /// A whole-page read: array read (flush) plus moving the page over the channel, ns.
    pub page_read_ns: u64,
    /// The flush's share of `page_read_ns` (RM-SSD: 0.7); the rest moves a full page.
    pub flush_share: f64,
    /// Granularity of a conventional (block-path) channel transfer: `page_bytes` for a controller
    /// that drains whole pages, smaller where it fetches only the sectors asked for.
    pub transfer_unit_bytes: u32,
}

impl FlashConfig {
    /// Page registers in the array.
    pub fn units(&self) -> u32 {
        self.channels * self.dies_per_channel * self.planes_per_die
    }

    pub fn flush_ns(&self) -> u64 {
        (self.page_read_ns as f64 * self.flush_share).round() as u64
    }

    /// Moving `bytes` over a channel.
    pub fn transfer_ns(&self, bytes: u64) -> u64 {
        let page_transfer = self.page_read_ns as f64 * (1.0 - self.flush_share);
        (page_transfer * bytes as f64 / f64::from(self.page_bytes)).round() as u64
    }

    /// Bytes a block-path read of `bytes` inside one page moves over the channel.
    pub fn block_transfer_bytes(&self, bytes: u64) -> u64 {
        let unit = u64::from(self.transfer_unit_bytes);
        (bytes.div_ceil(unit) * unit).min(u64::from(self.page_bytes))
    }
}

/// The drive's controller: firmware cores, controller DRAM, and the FPGA of an RM-SSD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControllerConfig {
    /// Cores running firmware (the FTL) and in-device pooling on an embedded CPU.
    pub cores: u32,
    /// Firmware work per NVMe block command (decode, map, DMA set-up), ns.
    pub command_ns: u64,
    /// Firmware work to schedule one flash read inside an in-device operation, ns.
    pub page_issue_ns: u64,
    /// RecSSD: processing one (row, bag) pair of the configuration (sorting into pages), ns.
    pub pair_ns: u64,
    /// Embedded CPU: fixed cost to find one row in a page buffer and start accumulating it, ns.
    pub row_ns: u64,
    /// Embedded CPU: one scalar fp32 accumulate, ns.
    pub elem_ns: f64,
    /// EMB-SSD: fp32 lanes of the embedded SIMD unit (NEON: 4).
    pub simd_lanes: u32,
    /// Controller DRAM given to an in-device row cache (RecSSD, EMB-SSD), bytes.
    pub dram_cache_bytes: u64,
    pub fpga: FpgaConfig,
}

/// RM-SSD's FPGA: clock, initiation interval, memories (Section IV-C, Table VI).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FpgaConfig {
    pub mhz: f64,
    /// Initiation interval II of a kernel (RM-SSD: 8).
    pub ii: u32,
    /// Off-chip DRAM bytes per cycle (D_width, 64).
    pub dram_width_bytes: u32,
    /// On-chip memory for weights (BRAM), bytes.
    pub bram_bytes: u64,
    /// Largest kernel side 2^K_max.
    pub k_max: u32,
    /// The EV translator's cycles per index (pipelined).
    pub translate_cycles: u32,
}

impl FpgaConfig {
    pub fn cycles_ns(&self, cycles: f64) -> f64 {
        cycles * 1e3 / self.mhz
    }
}

/// The host: its I/O stack, the link to the drive, its CPU for pooling and MLPs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostConfig {
    /// Threads issuing synchronous I/O (SSD-S's reader, EMB-MMIO's loads).
    pub io_threads: u32,
    /// Commands in flight on the asynchronous block path (io_uring, a user-space driver).
    pub queue_depth: u32,
    /// Kernel file path per I/O: system call, page cache miss handling, file system, block layer,
    /// interrupt, ns.
    pub kernel_io_ns: u64,
    /// User-space path per I/O (polled driver, registered buffers), ns.
    pub user_io_ns: u64,
    /// A page-cache hit on the kernel path (system call and copy), ns.
    pub page_cache_hit_ns: u64,
    /// Host DRAM for caching table data (SSD-S's page cache, RecSSD's static partition), bytes.
    pub dram_bytes: u64,
    /// Link bandwidth (PCIe), bytes per µs (= MB/s).
    pub link_mb_s: f64,
    /// Fixed cost of one DMA transfer, ns.
    pub dma_ns: u64,
    /// One 64-byte memory-mapped I/O load, ns (no paper gives it; 150 puts RM-SSD's EMB-MMIO near
    /// the 60 % of SSD-S its Fig. 10 shows).
    pub mmio_ns: u64,
    /// Host pooling: per row, plus per element, ns.
    pub pool_row_ns: f64,
    pub pool_elem_ns: f64,
    /// Host MLPs: sustained GFLOP/s, the rate weights stream from memory (a small batch's
    /// layers are matrix-vector products, bound by reading the weights), and a fixed cost per
    /// layer call (framework dispatch, activation), ns.
    pub mlp_gflops: f64,
    pub mlp_weight_gb_s: f64,
    pub mlp_layer_ns: u64,
}

impl HostConfig {
    /// Moving `bytes` over the link by DMA.
    pub fn dma_transfer_ns(&self, bytes: u64) -> u64 {
        self.dma_ns + (bytes as f64 / self.link_mb_s * 1e3).round() as u64
    }

    /// Reading `bytes` by memory-mapped loads.
    pub fn mmio_transfer_ns(&self, bytes: u64) -> u64 {
        bytes.div_ceil(64) * self.mmio_ns
    }
}

/// A whole simulated drive and the host it sits in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceConfig {
    pub name: String,
    pub flash: FlashConfig,
    pub controller: ControllerConfig,
    pub host: HostConfig,
}

const US: u64 = 1_000;

fn default_fpga() -> FpgaConfig {
    // RM-SSD: 200 MHz, II = 8, 64-byte DDR4 words; BRAM of the XCVU9P (2,160 × 36 Kb).
    FpgaConfig {
        mhz: 200.0,
        ii: 8,
        dram_width_bytes: 64,
        bram_bytes: 2160 * 36 * 1024 / 8,
        k_max: 4,
        translate_cycles: 1,
    }
}

fn default_host() -> HostConfig {
    HostConfig {
        io_threads: 1,
        queue_depth: 128,
        kernel_io_ns: 8 * US,
        user_io_ns: 2 * US,
        page_cache_hit_ns: 1_500,
        dram_bytes: 0,
        link_mb_s: 3_500.0,
        dma_ns: 1_000,
        mmio_ns: 150,
        pool_row_ns: 15.0,
        pool_elem_ns: 0.25,
        mlp_gflops: 50.0,
        mlp_weight_gb_s: 10.0,
        mlp_layer_ns: 30 * US,
    }
}

impl DeviceConfig {
    /// RM-SSD's emulated SSD (Table II): 4 channels, 4 KiB pages, T_page = 20 µs split 70/30,
    /// 45K random 4 KiB IOPS on the block path (22 µs of command handling each).
    pub fn rm_ssd() -> Self {
        Self {
            name: "rm-ssd".into(),
            flash: FlashConfig {
                channels: 4,
                dies_per_channel: 1,
                planes_per_die: 1,
                page_bytes: 4096,
                page_read_ns: 20 * US,
                flush_share: 0.7,
                transfer_unit_bytes: 4096,
            },
            controller: ControllerConfig {
                cores: 1,
                command_ns: 22 * US,
                page_issue_ns: 0,
                pair_ns: 0,
                row_ns: 0,
                elem_ns: 0.0,
                simd_lanes: 1,
                dram_cache_bytes: 0,
                fpga: default_fpga(),
            },
            host: default_host(),
        }
    }

    /// RecSSD's Cosmos+ OpenSSD: 8 channels × 8 ways, 16 KiB pages, ~10.7K page reads/s per
    /// channel (bus-bound: ~1.4 GB/s sequential), a 1 GHz dual-core ARM running the FTL.
    pub fn cosmos_plus() -> Self {
        Self {
            name: "cosmos-plus".into(),
            flash: FlashConfig {
                channels: 8,
                dies_per_channel: 8,
                planes_per_die: 1,
                page_bytes: 16384,
                page_read_ns: 154 * US,
                flush_share: 0.39,
                transfer_unit_bytes: 16384,
            },
            controller: ControllerConfig {
                cores: 1,
                command_ns: 24 * US,
                page_issue_ns: 5 * US,
                pair_ns: 300,
                row_ns: US,
                elem_ns: 10.0,
                simd_lanes: 4,
                dram_cache_bytes: 64 << 20,
                fpga: default_fpga(),
            },
            host: HostConfig {
                link_mb_s: 1_600.0,
                ..default_host()
            },
        }
    }

    /// Fitted to this machine's disk (`nearrec bench flash-check`, 2026-11-23; the fit from the
    /// start of that run, `bench/results/flash-check.md`): a virtio disk with 512-byte blocks and
    /// no flash of its own to model, so its "array" is the parallel units and per-read time that
    /// reproduce its measured queue-depth curve (8.1K reads/s at depth 1, ~50K at 128). The disk
    /// drifts by 2× within minutes: refit with `nearrec.simulate.calibrate` before relying on it.
    pub fn this_disk() -> Self {
        Self {
            name: "this-disk".into(),
            flash: FlashConfig {
                channels: 6,
                dies_per_channel: 1,
                planes_per_die: 1,
                page_bytes: 4096,
                page_read_ns: 125_642,
                flush_share: 0.9,
                transfer_unit_bytes: 512,
            },
            controller: ControllerConfig {
                cores: 1,
                command_ns: 0,
                ..Self::rm_ssd().controller
            },
            host: HostConfig {
                user_io_ns: 6_194,
                link_mb_s: 2_000.0,
                ..default_host()
            },
        }
    }

    /// The shipped parameter sets by name.
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "rm-ssd" => Ok(Self::rm_ssd()),
            "cosmos-plus" => Ok(Self::cosmos_plus()),
            "this-disk" => Ok(Self::this_disk()),
            _ => Err(DeviceError::Config(format!(
                "unknown device {name:?}: expected rm-ssd, cosmos-plus or this-disk"
            ))),
        }
    }

    pub const PRESETS: [&'static str; 3] = ["rm-ssd", "cosmos-plus", "this-disk"];

    /// Rejects geometry or timing that cannot describe a drive.
    pub fn validate(&self) -> Result<()> {
        let f = &self.flash;
        let bad = |m: &str| Err(DeviceError::Config(format!("device {:?}: {m}", self.name)));
        if f.channels == 0 || f.dies_per_channel == 0 || f.planes_per_die == 0 {
            return bad("channels, dies per channel and planes per die must be at least 1");
        }
        if !f.page_bytes.is_power_of_two() || f.page_bytes < 512 {
            return bad("the page size must be a power of two of at least 512 bytes");
        }
        if f.transfer_unit_bytes == 0 || f.transfer_unit_bytes > f.page_bytes {
            return bad("the transfer unit must be between 1 byte and a page");
        }
        if f.page_read_ns == 0 || !(0.0..=1.0).contains(&f.flush_share) {
            return bad("a page read needs a positive time and a flush share in [0, 1]");
        }
        let c = &self.controller;
        if c.cores == 0 || c.simd_lanes == 0 || c.fpga.ii == 0 || c.fpga.mhz <= 0.0 {
            return bad("controller cores, SIMD lanes, the FPGA clock and II must be positive");
        }
        if !(c.fpga.dram_width_bytes.is_power_of_two() && c.fpga.dram_width_bytes >= 4) {
            return bad("the FPGA's DRAM width must be a power of two of at least 4 bytes");
        }
        let h = &self.host;
        if h.io_threads == 0
            || h.queue_depth == 0
            || h.link_mb_s <= 0.0
            || h.mlp_gflops <= 0.0
            || h.mlp_weight_gb_s <= 0.0
        {
            return bad("host threads, queue depth, link bandwidth and MLP rates must be positive");
        }
        Ok(())
    }

    /// Reads a parameter set from JSON (as `serde_json::to_string` of this type writes it).
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: Self = serde_json::from_str(text)
            .map_err(|e| DeviceError::Config(format!("device configuration: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rm_ssd_matches_table_two() {
        let d = DeviceConfig::rm_ssd();
        // C_EV = 0.293 EV_size + 2800 cycles at 5 ns: a 128-byte vector reads in ~14.19 µs.
        let ev = 128u64;
        let t_ev = d.flash.flush_ns() + d.flash.transfer_ns(ev);
        let c_ev = 0.293 * ev as f64 + 2800.0;
        assert!(
            (t_ev as f64 - c_ev * 5.0).abs() < 10.0,
            "{t_ev} ns vs {} ns",
            c_ev * 5.0
        );
        assert_eq!(d.flash.flush_ns() + d.flash.transfer_ns(4096), 20_000);
        // 45K IOPS on the block path: one command every 22 µs.
        assert!((1e9 / d.controller.command_ns as f64 - 45_000.0).abs() < 1_000.0);
    }

    #[test]
    fn presets_validate_and_round_trip_through_json() {
        for name in DeviceConfig::PRESETS {
            let d = DeviceConfig::preset(name).unwrap();
            d.validate().unwrap();
            let back = DeviceConfig::from_json(&serde_json::to_string(&d).unwrap()).unwrap();
            assert_eq!(back, d);
        }
        assert!(DeviceConfig::preset("optane").is_err());
        let mut d = DeviceConfig::rm_ssd();
        d.flash.page_bytes = 3000;
        assert!(
            d.validate()
                .unwrap_err()
                .to_string()
                .contains("power of two")
        );
    }
}
