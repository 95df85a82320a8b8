//! Delta files written from Python (`nearrec.feed.Publisher`): a trainer's changed rows as
//! `nearrec_format::delta` writes them (`docs/format.md` §17).

use std::collections::BTreeMap;
use std::path::PathBuf;

use nearrec_format::delta::{self, Changes, Header, Values};
use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use crate::error::{detach, format_err};

/// One table's upserts: its name, the ids, their float32 rows `[len(ids), dim]`.
type Upserts<'py> = (
    String,
    PyReadonlyArray1<'py, i64>,
    PyReadonlyArray2<'py, f32>,
);

/// Writes delta file `path` (named `<sequence>.arrow` or `.parquet`) atomically: per table
/// its upserted rows and its deleted ids, the header in the schema's metadata.
#[pyfunction]
#[pyo3(signature = (path, sequence, step, wall_time_ms, upserts, deletes))]
pub(crate) fn delta_write(
    py: Python<'_>,
    path: PathBuf,
    sequence: u64,
    step: Option<u64>,
    wall_time_ms: Option<u64>,
    upserts: Vec<Upserts<'_>>,
    deletes: Vec<(String, PyReadonlyArray1<'_, i64>)>,
) -> PyResult<()> {
    let mut tables: BTreeMap<String, Changes> = BTreeMap::new();
    for (name, ids, rows) in &upserts {
        let t = tables
            .entry(name.clone())
            .or_insert_with(|| Changes::new(name, false));
        t.upserts.extend_from_slice(ids.as_slice()?);
        let Values::F32(values) = &mut t.values else {
            unreachable!("float32 rows")
        };
        values.extend(rows.as_array().iter());
    }
    for (name, ids) in &deletes {
        let t = tables
            .entry(name.clone())
            .or_insert_with(|| Changes::new(name, false));
        t.deletes.extend_from_slice(ids.as_slice()?);
    }
    let header = Header {
        sequence,
        step,
        wall_time_ms,
    };
    let tables: Vec<Changes> = tables.into_values().collect();
    detach(py, || delta::write(&path, &header, &tables, None))?.map_err(|e| format_err(py, e))
}
