//! Batch execution of pooled embedding lookups.
//!
//! A [`Batch`] names, per table, the indices of a batch of bags and the pooling; the [`Engine`]
//! validates it ([`Engine::prepare`]), splits it into (table, bag-run) tasks across a fork-safe
//! worker pool and pools every bag straight into its cell of the `[batch, Σ dim]` output
//! ([`Engine::execute`]). Tables are resident in DRAM ([`Tier::Dram`]) or read per batch from
//! their files with direct I/O ([`Tier::Ssd`], `ssd.rs`), behind the same request type.
//! [`Engine::infer`] runs a whole model's dense layers ([`dense`]) next to the embeddings and
//! returns only its outputs (RM-SSD's offload).

mod cells;
mod config;
pub mod delta;
pub mod dense;
mod engine;
mod error;
mod files;
mod infer;
mod request;
mod ssd;
mod stats;
mod tiers;

pub use config::{EngineConfig, Tier};
pub use engine::{Engine, Prepared};
pub use error::{EngineError, Result};
pub use infer::InferTimes;
pub use nearrec_format::Memory;
pub use request::{Bags, Batch, Indices, PoolingMode, TableLookup};
pub use stats::{Histogram, IoStats, Stages};
pub use tiers::TierReport;
