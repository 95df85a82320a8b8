//! Delta files written from Python (`nearrec.feed.Publisher`): a trainer's changed rows as
//! `nearrec_format::delta` writes them (`docs/format.md` §17).

use std::collections::BTreeMap;
use std::path::PathBuf;

use nearrec_format::DType;
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
/// its upserted rows and its deleted ids, the header in the schema's metadata. With `dtype`
/// (other than fp32), the rows are written encoded in it, as a store's writer encodes them.
#[pyfunction]
#[pyo3(signature = (path, sequence, step, wall_time_ms, upserts, deletes, dtype = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_write(
    py: Python<'_>,
    path: PathBuf,
    sequence: u64,
    step: Option<u64>,
    wall_time_ms: Option<u64>,
    upserts: Vec<Upserts<'_>>,
    deletes: Vec<(String, PyReadonlyArray1<'_, i64>)>,
    dtype: Option<&str>,
) -> PyResult<()> {
    let dtype = dtype
        .map(|d| d.parse::<DType>().map_err(|e| format_err(py, e)))
        .transpose()?
        .filter(|&d| d != DType::Fp32);
    let mut tables: BTreeMap<String, Changes> = BTreeMap::new();
    for (name, ids, rows) in &upserts {
        let t = tables
            .entry(name.clone())
            .or_insert_with(|| Changes::new(name, dtype.is_some()));
        t.upserts.extend_from_slice(ids.as_slice()?);
        let rows = rows.as_array();
        match (&mut t.values, dtype) {
            (Values::F32(values), None) => values.extend(rows.iter()),
            (Values::Encoded(bytes), Some(d)) => {
                let dim = rows.ncols() as u32;
                d.check_dim(dim).map_err(|reason| {
                    crate::error::raise(py, "InvalidRequest", reason, Some(name), None)
                })?;
                let width = d.row_bytes(dim) as usize;
                for row in rows.rows() {
                    let at = bytes.len();
                    bytes.resize(at + width, 0);
                    let row: Vec<f32> = row.iter().copied().collect();
                    d.encode_row(&row, &mut bytes[at..]);
                }
            }
            _ => unreachable!("the values made for the dtype"),
        }
    }
    for (name, ids) in &deletes {
        let t = tables
            .entry(name.clone())
            .or_insert_with(|| Changes::new(name, dtype.is_some()));
        t.deletes.extend_from_slice(ids.as_slice()?);
    }
    let header = Header {
        sequence,
        step,
        wall_time_ms,
    };
    let tables: Vec<Changes> = tables.into_values().collect();
    detach(py, || delta::write(&path, &header, &tables, dtype))?.map_err(|e| format_err(py, e))
}

/// The sequences of the delta files in `directory`, ascending (`nearrec_format::delta::list`:
/// two files of one sequence are refused, naming them).
#[pyfunction]
pub(crate) fn delta_sequences(py: Python<'_>, directory: PathBuf) -> PyResult<Vec<u64>> {
    let files = detach(py, || delta::list(&directory))?.map_err(|e| format_err(py, e))?;
    Ok(files.into_iter().map(|(sequence, _)| sequence).collect())
}
