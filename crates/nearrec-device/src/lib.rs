//! The flash device model: a simulated SSD that the engine runs on unchanged, and the papers'
//! in-storage designs timed on it.
//!
//! - [`sim`]: the discrete-event core — host threads, the link, controller cores, dies (page
//!   registers) and channel buses as FIFO servers on a simulated clock;
//! - [`config`]: [`DeviceConfig`] — flash geometry and timing (a page read split into flush and
//!   transfer), controller (firmware and in-device pooling costs, controller DRAM, RM-SSD's FPGA),
//!   host (kernel or user-space I/O path, PCIe, host pooling and MLP rates); three parameter sets,
//!   `rm-ssd` (RM-SSD's emulated SSD), `cosmos-plus` (RecSSD's Cosmos+ OpenSSD), `this-disk`;
//! - [`ftl`]: files → extents → logical pages → channel / die / plane, striped linearly;
//! - [`flash`]: [`FlashDevice`], the model as a [`nearrec_io::BlockDevice`] serving real bytes;
//! - [`workload`], [`modes`], [`mlp`], [`run`]: a model's tables and batches, the seven designs
//!   ([`Mode`]), RM-SSD's MLP engine and kernel search, whole simulations ([`simulate`]);
//! - [`calibrate`]: fitting the parameter set to a measured disk (a queue-depth curve);
//! - `error.rs`: `DeviceError`.
//!
//! Python reaches it as `nearrec.simulate`. `tests/devices.rs` runs `nearrec-io`'s block-device
//! suite on the model; `tests/engine.rs` holds the engine on it to the DRAM tier (the engine is a
//! dev-dependency: tests may reach up the ladder, code may not); `tests/modes.rs` checks what each
//! design reads.

pub mod calibrate;
pub mod config;
mod error;
pub mod flash;
pub mod ftl;
pub mod mlp;
pub mod modes;
pub mod run;
pub mod sim;
pub mod workload;

pub use config::DeviceConfig;
pub use error::{DeviceError, Result};
pub use flash::{FlashDevice, FlashStats};
pub use modes::{BatchReport, Mode, Simulator};
pub use run::{SimReport, SimSpec, simulate};
pub use workload::{RowPlacement, TableBatch, TableShape, Workload};
