//! A store cut into the shards of a plan (`nearrec shard`): the plan from the store's tables and
//! a trace ([`nearrec_plan::shards`]), then each shard written as an ordinary store — its
//! parts' rows copied as they are stored (no re-encoding, every sector checked against its sum
//! on the way), then the table's hot rows — as version 1 of the repository `DIR/shard-K`
//! (`nearrec_format::Repository`), and the plan written last, at `DIR/shards.json`: a directory
//! without a plan is not a sharded store, so a cut that fails half-way is never taken for one.
//! A later store cut by the same plan is published as the next version of every shard at once
//! ([`publish_cut`]), for a sharded store to swap to (`nearrec-cluster`'s `versions.rs`).
//!
//! A keyed table is cut by key hash: part `k` of `n` holds the keys with
//! `nearrec_plan::key_part(key, n) == k`, renumbered in its own keyed table with its default
//! row and an even share of the table's spare rows.
//!
//! Each shard's manifest says which plan it was cut by, and which shard of it it is (its
//! `params`' `shard`, a [`ShardTag`]): a store's `info` reports it, so that a router checks
//! every replica is the shard it takes it for. Every shard keeps the store's model: a shard
//! that holds every table whole runs it (whole-model offload on that node), else a router
//! reads it from a shard and runs the dense part itself.

use std::path::Path;

use nearrec_engine::Tier;
use nearrec_format::{
    FormatError, Pointer, Publish, Repository, StoreOptions, StoreReader, TableSpec,
};
use nearrec_plan::key_part;
use nearrec_plan::shards::{SHARD_PLAN, ShardOptions, ShardPlan, plan_shards};
use nearrec_plan::{TraceFile, trace_tables};

use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::model::{CONFIG_ATTACHMENT, WEIGHTS_ATTACHMENT};
use crate::store::Store;
use crate::versions::Located;

pub use crate::api::ShardTag;

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
    let logged = store.snapshot().version();
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

/// Writes `plan`'s shards from `reader`'s store under `out`, each as version 1 of its
/// repository `out/shard-K`, the plan last.
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
    // the shards a cut here left, and those a larger plan left
    for k in 0.. {
        let old = ShardPlan::shard_dir(out, k);
        if !old.exists() {
            if k >= plan.shards {
                break;
            }
            continue;
        }
        std::fs::remove_dir_all(&old).map_err(|source| io(&old, source))?;
    }
    for k in 0..plan.shards {
        let repo = Repository::create(&ShardPlan::shard_dir(out, k))?;
        publish_shard(reader, plan, k, &repo, 1)?;
        // served by its pointer, not as the newest: a version published later is served
        // only once a swap moves every shard to it
        repo.set_pointer(&Pointer {
            current: 1,
            history: Vec::new(),
        })?;
    }
    plan.write(out)?;
    Ok(())
}

/// Cuts the store at `source` by the plan of the sharded store at `dir` and publishes its
/// shards as the next version of every shard's repository — one number on every shard, above
/// every version any of them holds — without serving it: a swap of the sharded store to that
/// version serves it (every shard at once). Returns the version. A cut interrupted half-way
/// leaves a version on some shards only, never swapped to (a swap stages it on every replica
/// first, and one that lacks it refuses); the next publish takes a number above it.
pub fn publish_cut(source: &Path, dir: &Path) -> Result<u64> {
    let plan = ShardPlan::read(dir)?;
    let (reader, _) = served(source)?;
    let mut repos = Vec::with_capacity(plan.shards);
    for k in 0..plan.shards {
        let shard = ShardPlan::shard_dir(dir, k);
        let repo = Repository::detect(&shard).ok_or_else(|| {
            Error::invalid(format!(
                "{} is not a repository of versions (a cut made before shards had versions):                  cut the store again (nearrec shard --out) to publish versions into it",
                shard.display()
            ))
        })?;
        repos.push(repo);
    }
    let mut version = 1;
    for repo in &repos {
        version = version.max(repo.next_version()?);
    }
    for (k, repo) in repos.iter().enumerate() {
        publish_shard(&reader, &plan, k, repo, version)?;
    }
    Ok(version)
}

/// Writes shard `k` of `plan` from `reader`'s store beside `repo`'s versions, then publishes it
/// there as version `version`.
fn publish_shard(
    reader: &StoreReader,
    plan: &ShardPlan,
    k: usize,
    repo: &Repository,
    version: u64,
) -> Result<()> {
    let tmp = repo
        .path()
        .join(format!(".cut-{version}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|source| io(&tmp, source))?;
    }
    let written = write_shard(reader, plan, k, &tmp)
        .and_then(|()| Ok(repo.publish_at(&tmp, Publish::Move, version)?));
    if written.is_err() && tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written.map(drop)
}

/// Writes shard `k` of `plan` from `reader`'s store as a store at `to`.
fn write_shard(reader: &StoreReader, plan: &ShardPlan, k: usize, to: &Path) -> Result<()> {
    let sources = reader.tables();
    let model = [CONFIG_ATTACHMENT, WEIGHTS_ATTACHMENT];
    let keeps_model = model
        .iter()
        .all(|a| reader.attachments().iter().any(|x| x.name == *a));
    let tag = ShardTag {
        plan: plan.id.clone(),
        shard: k,
        store: plan.store.clone(),
        previous: None,
    };
    let options = StoreOptions {
        overwrite: false,
        params: serde_json::json!({ "shard": tag }),
    };
    let mut writer = nearrec_format::StoreWriter::create(to, options)?;
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
        if table.keyed {
            write_keyed_part(reader, i, table, p, sums.as_ref(), &mut writer)?;
            continue;
        }
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
    // every shard keeps the model: the one that holds every table whole runs it, else the
    // router does, reading it from any shard (`nearrec-cluster`'s `store/infer.rs`)
    if keeps_model {
        for name in model {
            if let Some(bytes) = reader.read_attachment(name)? {
                writer.attach(name, &bytes)?;
            }
        }
    }
    writer.commit()?;
    Ok(())
}

/// Part `p` of keyed table `i` of `reader`'s store (the plan's `table`) into `writer`: the
/// keys of the part ([`key_part`]), their rows copied as stored, its default row, and a share
/// of the table's spare rows (room for new keys, an even share each).
fn write_keyed_part(
    reader: &StoreReader,
    i: usize,
    table: &nearrec_plan::ShardedTable,
    p: usize,
    sums: Option<&nearrec_format::SectorSums>,
    writer: &mut nearrec_format::StoreWriter,
) -> Result<()> {
    let source = &reader.tables()[i];
    let entries = reader.keys(i)?.unwrap_or_default();
    let n = table.parts.len();
    let mine: Vec<(u64, u32)> = entries
        .iter()
        .copied()
        .filter(|&(key, _)| key_part(key, n) == p)
        .collect();
    let spare = (source.rows - 1 - entries.len() as u64).div_ceil(n as u64);
    let rb = source.row_bytes as usize;
    let mut zero = vec![0u8; rb];
    reader.read_rows_encoded(i, &[0], sums, &mut zero)?;
    let default = source.keys.as_ref().is_some_and(|k| k.default).then(|| {
        let mut row = vec![0f32; source.dim as usize];
        source.dtype.decode_row(&zero, &mut row);
        row
    });
    let mut spec = TableSpec::new(&table.name, mine.len() as u64, table.dim, table.dtype);
    spec.block_bytes = source.block_bytes;
    let mut w = writer.keyed_table_with_default(spec, spare, default.as_deref())?;
    let mut bytes = Vec::new();
    for chunk in mine.chunks(CHUNK_ROWS as usize) {
        let rows: Vec<u64> = chunk.iter().map(|e| u64::from(e.1)).collect();
        bytes.resize(rows.len() * rb, 0);
        reader.read_rows_encoded(i, &rows, sums, &mut bytes)?;
        w.write_encoded(&bytes)?;
    }
    let keys: Vec<u64> = mine.iter().map(|e| e.0).collect();
    writer.finish_table_keyed(w, &keys)?;
    Ok(())
}

/// The tag of the store at `dir` (the version a repository there serves), if it is a shard.
pub fn shard_tag(dir: &Path) -> Result<Option<ShardTag>> {
    Ok(ShardTag::of(Located::open(dir)?.reader.manifest()))
}

fn io(path: &Path, source: std::io::Error) -> Error {
    FormatError::Io {
        path: path.into(),
        source,
    }
    .into()
}
