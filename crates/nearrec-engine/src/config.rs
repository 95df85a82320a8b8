use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// How an [`crate::Engine`] is built. `Default` gives the recommended settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// Worker threads for pooling; 0 means one per available core.
    pub threads: usize,
    /// Check each table's CRC-32C while loading it into DRAM (costs little next to the read).
    pub verify_checksums: bool,
    /// Lookups below which a request is pooled on the calling thread: waking workers costs more
    /// than it saves for tiny requests (batch-1 latency).
    pub inline_lookups: usize,
    /// Target lookups per parallel task; a task is a run of bags of one table.
    pub task_lookups: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 0,
            verify_checksums: true,
            inline_lookups: 4096,
            task_lookups: 8192,
        }
    }
}

impl EngineConfig {
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    pub fn with_verify_checksums(mut self, verify: bool) -> Self {
        self.verify_checksums = verify;
        self
    }

    pub fn validate(&self) -> Result<()> {
        if self.threads > 1024 {
            return Err(EngineError::Config(format!(
                "threads = {} is more than 1024",
                self.threads
            )));
        }
        if self.task_lookups == 0 {
            return Err(EngineError::Config(
                "task_lookups must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The thread count this config resolves to on this machine.
    pub fn resolved_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}
