//! Opening an engine: a store's tables loaded whole into DRAM or opened for the SSD tier
//! ([`Engine::open`], [`Engine::from_reader`], [`Engine::with_device`]), and what opening needs —
//! the table files and their sector sums, the DRAM budget's check.

use std::path::Path;
use std::sync::Arc;

use nearrec_format::{AlignedBuf, ProgressFn, SectorSums, StoreReader};
use rayon::prelude::*;

use super::Engine;
use crate::config::{EngineConfig, Tier};
use crate::error::{EngineError, Result};
use crate::files::TableFiles;
use crate::keyed::{self, Clock, Keys};
use crate::ssd::SsdTier;
use crate::tiers;
use nearrec_format::Memory;
use nearrec_io::{Workers, fork_gate};

impl Engine {
    /// Opens the store at `path` and loads every table into DRAM.
    pub fn open(
        path: impl AsRef<Path>,
        config: EngineConfig,
        progress: Option<&ProgressFn>,
    ) -> Result<Self> {
        Self::from_reader(&StoreReader::open(path)?, config, progress)
    }

    /// Serves an opened store's tables from SSD through `device` (file `i` of the device holds
    /// table `i`'s file): a flash-device model, or a fault-injecting device in tests.
    pub fn with_device(
        reader: &StoreReader,
        config: EngineConfig,
        device: Box<dyn nearrec_io::BlockDevice>,
    ) -> Result<Self> {
        config.validate()?;
        let _inside = fork_gate();
        if device.file_lens().len() != reader.tables().len() {
            return Err(EngineError::Config(format!(
                "the device has {} files but the store has {} tables",
                device.file_lens().len(),
                reader.tables().len()
            )));
        }
        let config = config.with_tier(Tier::Ssd);
        let memory = Memory::probe();
        check_budget(&config, &memory)?;
        let budget = tiers_budget(reader, &config, &memory)?;
        let clock = Arc::new(Clock::new(config.keyed.manual_clock));
        let keys = keyed::load(reader, &config.keyed, &memory, &clock)?;
        let files = TableFiles::new(
            device,
            reader.orders().to_vec(),
            sector_sums(reader, &config, &memory)?,
        );
        let dram = tiers::place(reader, &config, budget, &memory, &files, None)?;
        let ssd = SsdTier::new(files, dram, &config);
        let workers = Workers::shared("pool", config.resolved_threads());
        let mut engine =
            Self::assemble(reader, config, workers, Vec::new(), Some(ssd), keys, clock);
        engine.device_given = true;
        Ok(engine)
    }

    /// Loads every table of an opened (validated) store into DRAM, or opens its files for the
    /// SSD tier, as `config.tier` says.
    pub fn from_reader(
        reader: &StoreReader,
        config: EngineConfig,
        progress: Option<&ProgressFn>,
    ) -> Result<Self> {
        config.validate()?;
        if let Some(p) = &config.placement {
            tiers::check_placement(p, reader.tables())?;
        }
        let _inside = fork_gate();
        let total = reader.tables().iter().map(|t| t.data_bytes).sum();
        let memory = Memory::probe();
        check_budget(&config, &memory)?;
        let tier = config.resolved_tier(total + keyed::index_bytes(reader, &config.keyed), &memory);
        let config = config.with_tier(tier);
        let budget = tiers_budget(reader, &config, &memory)?;
        let clock = Arc::new(Clock::new(config.keyed.manual_clock));
        let keys = keyed::load(reader, &config.keyed, &memory, &clock)?;
        let workers = Workers::shared("pool", config.resolved_threads());
        let (dram, ssd) = match config.tier {
            Tier::Dram | Tier::Auto => {
                memory.check(
                    || {
                        format!(
                            "loading the store's {} tables whole (tier=\"dram\")",
                            reader.tables().len()
                        )
                    },
                    total,
                )?;
                let dram = workers.get()?.install(|| {
                    (0..reader.tables().len())
                        .into_par_iter()
                        .map(|i| {
                            reader
                                .read_table(i, config.verify_checksums, progress)
                                .map(Arc::new)
                        })
                        .collect::<Result<Vec<_>, _>>()
                })?;
                (dram, None)
            }
            Tier::Ssd => {
                let files = table_files(reader, &config, &memory)?;
                let tiers = tiers::place(reader, &config, budget, &memory, &files, progress)?;
                (Vec::new(), Some(SsdTier::new(files, tiers, &config)))
            }
        };
        Ok(Self::assemble(
            reader, config, workers, dram, ssd, keys, clock,
        ))
    }

    pub(super) fn assemble(
        reader: &StoreReader,
        config: EngineConfig,
        workers: Arc<Workers>,
        dram: Vec<Arc<AlignedBuf>>,
        ssd: Option<SsdTier>,
        keys: Vec<Option<Arc<Keys>>>,
        clock: Arc<Clock>,
    ) -> Self {
        let tables = reader.manifest().tables.clone();
        let by_name = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tables,
            by_name,
            dram,
            ssd,
            keys,
            clock,
            device_given: false,
            workers,
            config,
        }
    }
}

/// The table files of `reader`'s store as the SSD tier reads them.
pub(super) fn table_files(
    reader: &StoreReader,
    config: &EngineConfig,
    memory: &Memory,
) -> Result<TableFiles> {
    let paths: Vec<_> = reader
        .tables()
        .iter()
        .map(|t| reader.path().join(&t.file))
        .collect();
    TableFiles::open(
        &paths,
        config,
        reader.orders().to_vec(),
        sector_sums(reader, config, memory)?,
    )
}

/// Every table's sector checksums, for the SSD tier to check reads against (`None` for tables
/// of older stores, and for all with `verify_reads` off).
fn sector_sums(
    reader: &StoreReader,
    config: &EngineConfig,
    memory: &Memory,
) -> Result<Vec<Option<SectorSums>>> {
    if !config.verify_reads {
        return Ok(vec![None; reader.tables().len()]);
    }
    let bytes = reader
        .tables()
        .iter()
        .filter(|t| t.sums.is_some())
        .map(|t| SectorSums::bytes_for(t.data_bytes))
        .sum();
    memory.check(|| "the tables' sector checksums".into(), bytes)?;
    (0..reader.tables().len())
        .map(|i| reader.sector_sums(i).map_err(EngineError::from))
        .collect()
}

/// The DRAM the tiers in front of the SSD tier may take: the budget, less what the keyed
/// tables' indexes take of it (an explicit budget they do not fit is refused).
fn tiers_budget(reader: &StoreReader, config: &EngineConfig, memory: &Memory) -> Result<u64> {
    let index = keyed::index_bytes(reader, &config.keyed);
    let budget = config.dram_tiers_budget(memory);
    match config.dram_budget_bytes {
        Some(b) if index > b => Err(EngineError::Config(format!(
            "the keyed tables' indexes take {index} bytes of DRAM, more than dram_budget_bytes \
             = {b}"
        ))),
        _ => Ok(budget.saturating_sub(index)),
    }
}

/// An explicit DRAM budget above what the process may ever have is refused: it could not be
/// kept, and the tiers planned in it would fail to allocate later.
fn check_budget(config: &EngineConfig, memory: &Memory) -> Result<()> {
    match config.dram_budget_bytes {
        Some(b) if b > memory.limit => {
            Err(EngineError::InsufficientMemory(nearrec_format::Shortfall {
                what: "dram_budget_bytes".into(),
                asked: b,
                available: memory.available,
                limit: memory.limit,
            }))
        }
        _ => Ok(()),
    }
}
