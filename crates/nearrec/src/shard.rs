//! A store cut into the shards of a plan (`nearrec shard`): the plan from the store's tables and
//! a trace ([`nearrec_plan::shards`]), then each shard written as an ordinary store at
//! `DIR/shard-K` — its parts' rows copied as they are stored (no re-encoding, every sector
//! checked against its sum on the way), then the table's hot rows — and the plan written last,
//! at `DIR/shards.json`: a directory without a plan is not a sharded store, so a cut that fails
//! half-way is never taken for one.
//!
//! Each shard's manifest says which plan it was cut by, and which shard of it it is (its
//! `params`' `shard`, a [`ShardTag`]): a store's `info` reports it, so that a router checks
//! every replica is the shard it takes it for. A shard that holds every
//! table of a kept model whole keeps the model too (whole-model offload on that node).

use std::path::Path;

use nearrec_engine::Tier;
use nearrec_format::{FormatError, StoreOptions, StoreReader, TableSpec};
use nearrec_plan::shards::{SHARD_PLAN, ShardOptions, ShardPlan, plan_shards};
use nearrec_plan::{TraceFile, trace_tables};
use serde::{Deserialize, Serialize};

use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::model::{CONFIG_ATTACHMENT, WEIGHTS_ATTACHMENT};
use crate::store::Store;

/// What a shard store says of itself (its manifest's `params.shard`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardTag {
    /// The plan's id.
    pub plan: String,
    pub shard: usize,
    /// The sharded store's name.
    pub store: String,
}

/// Rows copied per read.
const CHUNK_ROWS: u64 = 16 << 10;

/// Plans the shards of the store at `source` (read by `trace` where one is given) and writes
/// them under `out`; returns the plan. `out` must not hold a sharded store unless `overwrite`.
pub fn shard_store(
    source: &Path,
    trace: Option<&Path>,
    options: &ShardOptions,
    out: &Path,
    overwrite: bool,
) -> Result<ShardPlan> {
    let (reader, name) = served(source)?;
    let plan = plan_of(&reader, &name, trace, options)?;
    write_shards(&reader, &plan, out, overwrite)?;
    Ok(plan)
}

/// The shard plan of the store at `source`, balanced by `trace` where one is given.
pub fn plan_store(
    source: &Path,
    trace: Option<&Path>,
    options: &ShardOptions,
) -> Result<ShardPlan> {
    let (reader, name) = served(source)?;
    plan_of(&reader, &name, trace, options)
}

fn plan_of(
    reader: &StoreReader,
    name: &str,
    trace: Option<&Path>,
    options: &ShardOptions,
) -> Result<ShardPlan> {
    let trace = trace.map(TraceFile::open).transpose()?;
    let traced = trace.as_ref().map(trace_tables);
    Ok(plan_shards(
        name,
        reader.tables(),
        traced.as_deref(),
        options,
    )?)
}

/// Writes `plan`'s shards of the store at `source` under `out` (the plan must be one made for
/// its tables).
pub fn cut_store(source: &Path, plan: &ShardPlan, out: &Path, overwrite: bool) -> Result<()> {
    write_shards(&served(source)?.0, plan, out, overwrite)
}

/// The store `source` serves (a repository's current version), open for reading its table
/// files, and its name; refused if it holds writes not yet folded into those files: a cut
/// copies table files.
fn served(source: &Path) -> Result<(StoreReader, String)> {
    let config = StoreConfig {
        tier: Tier::Ssd,
        ..StoreConfig::default()
    };
    let store = Store::open(source, &config)?;
    let (dir, name) = (store.path(), store.name());
    let logged = store.version();
    let folded = store.manifest().lsn.unwrap_or(0);
    if logged > folded {
        return Err(Error::invalid(format!(
            "the store at {} holds writes up to version {logged} that its table files do not \
             (they hold {folded}): compact it first (nearrec compact)",
            source.display()
        )));
    }
    Ok((StoreReader::open(&dir)?, name))
}

/// Writes `plan`'s shards from `reader`'s store under `out`, the plan last.
pub fn write_shards(
    reader: &StoreReader,
    plan: &ShardPlan,
    out: &Path,
    overwrite: bool,
) -> Result<()> {
    let plan_path = out.join(SHARD_PLAN);
    if plan_path.exists() {
        if !overwrite {
            return Err(FormatError::AlreadyExists { path: out.into() }.into());
        }
        // first of all, so that a cut that fails half-way leaves no sharded store
        std::fs::remove_file(&plan_path).map_err(|source| io(&plan_path, source))?;
    }
    let sources = reader.tables();
    let model = [CONFIG_ATTACHMENT, WEIGHTS_ATTACHMENT];
    let keeps_model = model
        .iter()
        .all(|a| reader.attachments().iter().any(|x| x.name == *a));
    for k in 0..plan.shards {
        let tag = ShardTag {
            plan: plan.id.clone(),
            shard: k,
            store: plan.store.clone(),
        };
        let options = StoreOptions {
            overwrite,
            params: serde_json::json!({ "shard": tag }),
        };
        let mut writer =
            nearrec_format::StoreWriter::create(ShardPlan::shard_dir(out, k), options)?;
        let held = plan.shard_tables(k);
        for &(t, p) in &held {
            let table = &plan.tables[t];
            let i = sources
                .iter()
                .position(|s| {
                    (s.name.as_str(), s.rows, s.dim, s.dtype)
                        == (table.name.as_str(), table.rows, table.dim, table.dtype)
                })
                .ok_or_else(|| Error::InvalidRequest {
                    table: Some(table.name.clone()),
                    position: None,
                    reason: format!(
                        "plan {} names {} rows × dim {} {}, which the store at {} does not hold",
                        plan.id,
                        table.rows,
                        table.dim,
                        table.dtype.name(),
                        reader.path().display()
                    ),
                })?;
            let sums = reader.sector_sums(i)?;
            let mut spec = TableSpec::new(&table.name, table.shard_rows(p), table.dim, table.dtype);
            spec.block_bytes = sources[i].block_bytes;
            let mut w = writer.table(spec)?;
            let part = table.parts[p];
            let ids = (part.first..part.first + part.rows).chain(table.hot.iter().copied());
            let ids: Vec<u64> = ids.collect();
            let mut bytes = Vec::new();
            for chunk in ids.chunks(CHUNK_ROWS as usize) {
                bytes.resize(chunk.len() * sources[i].row_bytes as usize, 0);
                reader.read_rows_encoded(i, chunk, sums.as_ref(), &mut bytes)?;
                w.write_encoded(&bytes)?;
            }
            writer.finish_table(w)?;
        }
        let whole = held.len() == plan.tables.len()
            && held.iter().all(|&(t, _)| plan.tables[t].parts.len() == 1);
        if keeps_model && whole {
            for name in model {
                if let Some(bytes) = reader.read_attachment(name)? {
                    writer.attach(name, &bytes)?;
                }
            }
        }
        writer.commit()?;
    }
    // shards a larger plan left here
    for k in plan.shards.. {
        let stale = ShardPlan::shard_dir(out, k);
        if !stale.exists() {
            break;
        }
        std::fs::remove_dir_all(&stale).map_err(|source| io(&stale, source))?;
    }
    plan.write(out)?;
    Ok(())
}

impl ShardTag {
    /// The tag of the store `manifest` describes, if it is a shard.
    pub fn of(manifest: &nearrec_format::Manifest) -> Option<Self> {
        serde_json::from_value(manifest.params.get("shard")?.clone()).ok()
    }
}

/// The tag of the store at `dir`, if it is a shard.
pub fn shard_tag(dir: &Path) -> Result<Option<ShardTag>> {
    Ok(ShardTag::of(StoreReader::open(dir)?.manifest()))
}

fn io(path: &Path, source: std::io::Error) -> Error {
    FormatError::Io {
        path: path.into(),
        source,
    }
    .into()
}
