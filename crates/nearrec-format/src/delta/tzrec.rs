//! TorchEasyRec's delta embedding dumps (`tzrec/utils/delta_embedding_dump.py`, schema
//! version 2) read as deltas (`docs/format.md` §17, "TorchEasyRec's dumps"): a trainer of
//! `world_size` ranks dumps the rows its steps touched every N steps as Parquet —
//! `{prefix}_step_{N}.parquet` with one rank, `step_{N}/{prefix}_step_{N}_rank_{r}_of_{w}.parquet`
//! with several (a step whole once every rank's file is there; a rank may write an empty one) —
//! of `(global_step, rank, world_size, embedding_name, embedding_role, feature_name, table_fqn,
//! key_id, embedding)` rows, all upserts: `key_id` is a TorchRec table's global row or a dynamic
//! table's key (a u64's bits in an i64; −1 is reserved), `embedding` a list of float32.
//!
//! A step is read as one delta whose sequence is its global step; steps come every N apart,
//! so the feeder keeps the step in the cursor's `step` and counts the steps as its sequence
//! (`DeltaSource::consecutive`).

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, Int8Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use rustc_hash::FxHashMap;

use super::read::{Columns, Reader, Refusal};
use super::{Changes, Delta, Header, Shape, Values};
use crate::error::{FormatError, Result};

/// The file name prefix TorchEasyRec writes by default (`file_prefix` in its config).
pub const PREFIX: &str = "delta_embedding";
/// The dump schema's version this reader takes.
pub const SCHEMA_VERSION: &str = "2";
const VERSION_KEY: &str = "tzrec.delta_embedding.schema_version";
const KEY_ENCODING_KEY: &str = "tzrec.delta_embedding.dynamic_key_encoding";
const KEY_ENCODING: &str = "UINT64_BIT_PATTERN_IN_SIGNED_INT64";
const INVALID_KEY_KEY: &str = "tzrec.delta_embedding.invalid_key";

/// One dumped step: its rank files, rank 0 first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub step: u64,
    /// The step's directory (several ranks) or its one file.
    pub path: PathBuf,
    pub files: Vec<PathBuf>,
}

/// The whole steps dumped in `dir` with file prefix `prefix`, in order, up to the first step
/// whose ranks have not all written theirs (the steps after it wait for it). A step both in one
/// file and in a directory of ranks, or ranks that disagree on their number, is refused.
pub fn steps(dir: &Path, prefix: &str) -> Result<Vec<Step>> {
    let mut steps: Vec<Step> = Vec::new();
    let mut partial: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| FormatError::io(dir, e))? {
        let entry = entry.map_err(|e| FormatError::io(dir, e))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if let Some(step) = single(&name, prefix) {
            steps.push(Step {
                step,
                path: entry.path(),
                files: vec![entry.path()],
            });
        } else if let Some(step) = name.strip_prefix("step_").and_then(number)
            && entry.path().is_dir()
        {
            match ranks(&entry.path(), prefix, step)? {
                Some(files) => steps.push(Step {
                    step,
                    path: entry.path(),
                    files,
                }),
                None => partial.push(step),
            }
        }
    }
    steps.sort_by_key(|s| s.step);
    if let Some(w) = steps.windows(2).find(|w| w[0].step == w[1].step) {
        return Err(bad(
            &w[1].path,
            format!(
                "step {} is also {}: one dump a step",
                w[0].step,
                w[0].path.display()
            ),
        ));
    }
    if let Some(&first) = partial.iter().min() {
        steps.retain(|s| s.step < first);
    }
    Ok(steps)
}

/// `{prefix}_step_{N}.parquet`'s N.
fn single(name: &str, prefix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?
        .strip_prefix("_step_")?
        .strip_suffix(".parquet")
        .and_then(number)
}

fn number(s: &str) -> Option<u64> {
    (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// A step directory's rank files in rank order, once all of them are there (`None` before).
fn ranks(dir: &Path, prefix: &str, step: u64) -> Result<Option<Vec<PathBuf>>> {
    let head = format!("{prefix}_step_{step}_rank_");
    let mut found: Vec<(u64, u64, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| FormatError::io(dir, e))? {
        let entry = entry.map_err(|e| FormatError::io(dir, e))?;
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&head))
            .and_then(|n| n.strip_suffix(".parquet"))
        else {
            continue;
        };
        if let Some((r, w)) = rest.split_once("_of_")
            && let (Some(r), Some(w)) = (number(r), number(w))
        {
            found.push((w, r, entry.path()));
        }
    }
    found.sort();
    let Some(&(world, _, _)) = found.first() else {
        return Ok(None);
    };
    if let Some((w, _, p)) = found.iter().find(|(w, _, _)| *w != world) {
        return Err(bad(
            p,
            format!("ranks of step {step} disagree on their number: {world} and {w}"),
        ));
    }
    if let Some((_, r, p)) = found.iter().find(|(_, r, _)| *r >= world) {
        return Err(bad(p, format!("rank {r} of {world}")));
    }
    Ok((found.len() as u64 == world).then(|| found.into_iter().map(|(_, _, p)| p).collect()))
}

fn bad(path: &Path, reason: String) -> FormatError {
    FormatError::BadDelta {
        path: path.to_owned(),
        row: None,
        column: None,
        reason,
    }
}

/// Step `step` read whole as one delta of sequence and step `step.step`, every row checked against
/// `shape_of(embedding_name)` as a delta file's are (a known table, its dim, a row in range, a
/// value finite, a key named once a file), and against the dump's own contract (the file's
/// step, rank and number of ranks; no reserved key). A key two ranks both dumped (a
/// data-parallel table's) must hold the same values in both. The producer's wall time is the
/// newest file's modification time.
pub fn read_step(step: &Step, shape_of: impl Fn(&str) -> Option<Shape>) -> Result<Delta> {
    let world = step.files.len() as i64;
    let mut tables: Vec<Changes> = Vec::new();
    // (table, id) → (the file, its index among the table's upserts)
    let mut seen: FxHashMap<(usize, i64), usize> = FxHashMap::default();
    let mut wall_time_ms = None;
    for (rank, path) in step.files.iter().enumerate() {
        let read = read_file(path, step.step, rank as i64, world, &shape_of)?;
        let modified = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .map_err(|e| FormatError::io(path, e))?;
        let ms = modified
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        wall_time_ms = wall_time_ms.max(Some(ms));
        for changes in read {
            merge(&mut tables, &mut seen, changes, rank, &step.files)?;
        }
    }
    Ok(Delta {
        path: step.path.clone(),
        header: Header {
            sequence: step.step,
            step: Some(step.step),
            wall_time_ms,
        },
        tables,
    })
}

/// One table's rows of rank `rank`'s file added to the step's: a key another rank dumped too is
/// kept once when its values are the same, refused when not.
fn merge(
    tables: &mut Vec<Changes>,
    seen: &mut FxHashMap<(usize, i64), usize>,
    changes: Changes,
    rank: usize,
    files: &[PathBuf],
) -> Result<()> {
    let at = match tables.iter().position(|t| t.table == changes.table) {
        Some(at) => at,
        None => {
            tables.push(Changes::new(&changes.table, false));
            tables.len() - 1
        }
    };
    let to = &mut tables[at];
    let (Values::F32(add), Values::F32(into)) = (&changes.values, &mut to.values) else {
        unreachable!("a dump's rows are float32")
    };
    let dim = add.len().checked_div(changes.upserts.len()).unwrap_or(0);
    for (i, &id) in changes.upserts.iter().enumerate() {
        let row = &add[i * dim..(i + 1) * dim];
        match seen.get(&(at, id)) {
            Some(&j) => {
                if &into[j * dim..(j + 1) * dim] != row {
                    return Err(bad(
                        &files[rank],
                        format!(
                            "key {id} of {:?} holds other values than an earlier rank's file \
                             gave it (a step names a key's values once)",
                            changes.table
                        ),
                    ));
                }
            }
            None => {
                seen.insert((at, id), to.upserts.len());
                to.upserts.push(id);
                into.extend_from_slice(row);
            }
        }
    }
    Ok(())
}

/// Rank `rank`'s file of `world`, read and checked, its rows by table.
fn read_file<F: Fn(&str) -> Option<Shape>>(
    path: &Path,
    step: u64,
    rank: i64,
    world: i64,
    shape_of: &F,
) -> Result<Vec<Changes>> {
    let refused = |row: Option<u64>, column: Option<&str>, reason: String| FormatError::BadDelta {
        path: path.to_owned(),
        row,
        column: column.map(str::to_owned),
        reason,
    };
    let bytes = crate::files::read_regular(path, 0).map_err(|e| FormatError::io(path, e))?;
    let (schema, batches) = super::read::parquet_batches(bytes)
        .map_err(|e| refused(None, None, format!("not a readable Parquet file: {e}")))?;
    let invalid = contract(&schema).map_err(|(column, reason)| refused(None, column, reason))?;
    let at = |name: &'static str, want: &dyn Fn(&DataType) -> bool| {
        let i = schema
            .index_of(name)
            .map_err(|_| refused(None, Some(name), "the file has no such column".into()))?;
        let t = schema.field(i).data_type();
        if want(t) {
            Ok(i)
        } else {
            Err(refused(
                None,
                Some(name),
                format!("{t} is not the dump's type"),
            ))
        }
    };
    let (step_at, rank_at, world_at) = (
        at("global_step", &|t| t == &DataType::Int64)?,
        at("rank", &|t| t == &DataType::Int32)?,
        at("world_size", &|t| t == &DataType::Int32)?,
    );
    let name_at = at("embedding_name", &|t| {
        matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
    })?;
    let key_at = at("key_id", &|t| t == &DataType::Int64)?;
    let values_at = at(
        "embedding",
        &|t| matches!(t, DataType::List(f) | DataType::LargeList(f) if f.data_type() == &DataType::Float32),
    )?;
    // the dump's columns as a delta's: table, id, op (all upserts), values
    let as_delta = std::sync::Arc::new(Schema::new(vec![
        schema.field(name_at).clone().with_name("table"),
        Field::new("id", DataType::Int64, true),
        Field::new("op", DataType::Int8, false),
        schema.field(values_at).clone().with_name("values"),
    ]));
    let columns = Columns {
        table: 0,
        id: 1,
        op: 2,
        values: 3,
        encoded: None,
    };
    let mut reader = Reader::new(shape_of, columns);
    let mut first = 0u64;
    let rename = |(row, column, reason): Refusal| {
        let column = match column {
            "table" => "embedding_name",
            "id" => "key_id",
            "values" => "embedding",
            other => other,
        };
        refused(Some(row), Some(column), reason)
    };
    for batch in batches {
        let n = batch.num_rows();
        let int32 = |i: usize| batch.column(i).as_primitive::<Int32Type>();
        let (steps, ranks, worlds) = (
            batch.column(step_at).as_primitive::<Int64Type>(),
            int32(rank_at),
            int32(world_at),
        );
        let keys = batch.column(key_at).as_primitive::<Int64Type>();
        for i in 0..n {
            let row = Some(first + i as u64);
            let expect = |column: &'static str, got: Option<i64>, want: i64| match got {
                Some(g) if g == want => Ok(()),
                got => Err(refused(
                    row,
                    Some(column),
                    format!(
                        "{} where the file is {column} {want}",
                        got.map_or("null".into(), |g| g.to_string())
                    ),
                )),
            };
            expect(
                "global_step",
                steps.is_valid(i).then(|| steps.value(i)),
                step as i64,
            )?;
            expect(
                "rank",
                ranks.is_valid(i).then(|| i64::from(ranks.value(i))),
                rank,
            )?;
            expect(
                "world_size",
                worlds.is_valid(i).then(|| i64::from(worlds.value(i))),
                world,
            )?;
            if keys.is_valid(i) && keys.value(i) == invalid {
                return Err(refused(
                    row,
                    Some("key_id"),
                    format!("{invalid} is the dump's reserved invalid key"),
                ));
            }
        }
        let columns: Vec<ArrayRef> = vec![
            batch.column(name_at).clone(),
            batch.column(key_at).clone(),
            std::sync::Arc::new(Int8Array::from(vec![0i8; n])),
            batch.column(values_at).clone(),
        ];
        let batch = RecordBatch::try_new(as_delta.clone(), columns).map_err(|e| {
            refused(
                Some(first),
                None,
                format!("a batch that does not read: {e}"),
            )
        })?;
        reader.batch(&batch).map_err(rename)?;
        first += n as u64;
    }
    Ok(reader.into_tables())
}

/// The dump's schema metadata checked (the version this reads, dynamic keys as u64 bits); its
/// reserved invalid key.
fn contract(schema: &Schema) -> std::result::Result<i64, (Option<&'static str>, String)> {
    let meta = schema.metadata();
    match meta.get(VERSION_KEY) {
        Some(v) if v == SCHEMA_VERSION => {}
        Some(v) => {
            return Err((
                None,
                format!(
                    "schema metadata {VERSION_KEY:?} = {v:?}: this nearrec reads TorchEasyRec's \
                     delta dumps of schema version {SCHEMA_VERSION}"
                ),
            ));
        }
        None => {
            return Err((
                None,
                format!("no schema metadata {VERSION_KEY:?}: not a TorchEasyRec delta dump"),
            ));
        }
    }
    if let Some(e) = meta.get(KEY_ENCODING_KEY)
        && e != KEY_ENCODING
    {
        return Err((
            Some("key_id"),
            format!("schema metadata {KEY_ENCODING_KEY:?} = {e:?}: only {KEY_ENCODING} is known"),
        ));
    }
    meta.get(INVALID_KEY_KEY).map_or(Ok(-1), |v| {
        v.trim().parse().map_err(|_| {
            (
                None,
                format!("schema metadata {INVALID_KEY_KEY:?} = {v:?} is not a whole number"),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    #[test]
    fn whole_steps_are_listed_in_order_up_to_one_a_rank_has_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        touch(&d.join("delta_embedding_step_2000.parquet"));
        touch(&d.join("delta_embedding_step_1000.parquet"));
        touch(&d.join("delta_embedding_step_1000.parquet.rank0.tmp"));
        touch(&d.join("other_step_500.parquet"));
        for r in 0..2 {
            touch(&d.join(format!(
                "step_3000/delta_embedding_step_3000_rank_{r}_of_2.parquet"
            )));
        }
        touch(&d.join("step_4000/delta_embedding_step_4000_rank_1_of_2.parquet"));
        touch(&d.join("step_5000/delta_embedding_step_5000_rank_0_of_1.parquet"));
        let got = steps(d, PREFIX).unwrap();
        let listed: Vec<(u64, usize)> = got.iter().map(|s| (s.step, s.files.len())).collect();
        assert_eq!(listed, [(1000, 1), (2000, 1), (3000, 2)]);
        assert!(got[2].files[0].ends_with("delta_embedding_step_3000_rank_0_of_2.parquet"));
        // its rank 0 comes: the steps after it are whole
        touch(&d.join("step_4000/delta_embedding_step_4000_rank_0_of_2.parquet"));
        let got = steps(d, PREFIX).unwrap();
        assert_eq!(
            got.iter().map(|s| s.step).collect::<Vec<_>>(),
            [1000, 2000, 3000, 4000, 5000]
        );
        assert_eq!(steps(d, "other").unwrap().len(), 1);
        // one step twice, or ranks that disagree: refused, naming the file
        touch(&d.join("delta_embedding_step_3000.parquet"));
        let e = steps(d, PREFIX).unwrap_err().to_string();
        assert!(e.contains("step 3000 is also"), "{e}");
        std::fs::remove_file(d.join("delta_embedding_step_3000.parquet")).unwrap();
        touch(&d.join("step_4000/delta_embedding_step_4000_rank_2_of_3.parquet"));
        let e = steps(d, PREFIX).unwrap_err().to_string();
        assert!(
            e.contains("disagree on their number") && e.contains("rank_2_of_3"),
            "{e}"
        );
    }
}
