use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which slot of a full set a new row replaces, and whether every miss is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Least recently used; every miss admitted.
    Lru,
    /// Least frequently used (hits counted since admission); every miss admitted.
    Lfu,
    /// LRU, a miss admitted into a full set with probability `admission_probability`.
    LruPa,
    /// LFU with probabilistic admission (HS-Rec's choice).
    #[default]
    LfuPa,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Lru, Policy::Lfu, Policy::LruPa, Policy::LfuPa];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::LruPa => "lru_pa",
            Policy::LfuPa => "lfu_pa",
        }
    }

    pub fn frequency(self) -> bool {
        matches!(self, Policy::Lfu | Policy::LfuPa)
    }

    pub fn probabilistic(self) -> bool {
        matches!(self, Policy::LruPa | Policy::LfuPa)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown cache policy {0:?}; expected lru, lfu, lru_pa or lfu_pa")]
pub struct PolicyParseError(pub String);

impl FromStr for Policy {
    type Err = PolicyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PolicyParseError(s.to_owned()))
    }
}

/// How a [`crate::RowCache`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheConfig {
    pub policy: Policy,
    /// For the `_pa` policies: the chance a miss enters a full set.
    pub admission_probability: f64,
    /// Slots per set.
    pub ways: usize,
    /// Seeds the admission draws (reproducible runs).
    pub seed: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            admission_probability: 0.5,
            ways: 16,
            seed: 0,
        }
    }
}
