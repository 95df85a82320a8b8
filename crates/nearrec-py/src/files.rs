//! A store's files without opening it: verify, scrub, leftovers, a repository's versions, the
//! manifest, a keyed table's keys, attachments.

use std::path::PathBuf;

use nearrec_format::{ProgressFn, Publish, Repository, StoreReader, TableCheck};
use numpy::PyArray1;
use pyo3::prelude::*;

use crate::error::{detach, format_err, raise};
use crate::progress;

/// Checks every data byte of a store; returns `[(table, bytes, error or None)]`.
#[pyfunction]
#[pyo3(signature = (path, progress = false))]
pub(crate) fn verify_store(py: Python<'_>, path: PathBuf, progress: bool) -> PyResult<Checks> {
    checked(py, &path, progress, "verifying", |reader, cb| {
        reader.verify(cb)
    })
}

/// One pass of a scrub over a store (`nearrec::scrub`): every table's data read at most `rate`
/// bytes a second (0: as fast as the disk goes), each range from the device; returns
/// `[(table, bytes, error or None)]`.
#[pyfunction]
#[pyo3(signature = (path, rate = 0, progress = false))]
pub(crate) fn scrub_store(
    py: Python<'_>,
    path: PathBuf,
    rate: u64,
    progress: bool,
) -> PyResult<Checks> {
    checked(py, &path, progress, "scrubbing", |reader, cb| {
        nearrec::scrub(reader, rate, cb)
    })
}

/// Each table's check: `(table, bytes, error or None)`.
type Checks = Vec<(String, u64, Option<String>)>;

/// `check` of the store at `path`, the GIL released, behind a progress bar saying `what`.
fn checked(
    py: Python<'_>,
    path: &std::path::Path,
    progress: bool,
    what: &'static str,
    check: impl FnOnce(&StoreReader, Option<&ProgressFn>) -> Vec<TableCheck> + Send,
) -> PyResult<Checks> {
    let reader = StoreReader::open(path).map_err(|e| format_err(py, e))?;
    let total = reader.tables().iter().map(|t| t.data_bytes).sum();
    let bar = progress::bar(progress, total, what);
    let cb = progress::callback(&bar);
    let checks = detach(py, || check(&reader, cb.as_ref()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(checks
        .into_iter()
        .map(|c| (c.table, c.bytes, c.error))
        .collect())
}

/// One leftover of a killed writer: `(path, bytes, reason)`.
type Leftover = (PathBuf, u64, String);

/// Removes what killed writers left at `path` (`nearrec_format::gc`): `(removed, kept)`.
#[pyfunction]
pub(crate) fn store_gc(py: Python<'_>, path: PathBuf) -> PyResult<(Vec<Leftover>, Vec<Leftover>)> {
    let report = detach(py, || nearrec_format::gc(&path))?.map_err(|e| format_err(py, e))?;
    let rows = |v: Vec<nearrec_format::Leftover>| {
        v.into_iter()
            .map(|l| (l.path, l.bytes, l.reason))
            .collect::<Vec<_>>()
    };
    Ok((rows(report.removed), rows(report.kept)))
}

/// Adds the closed store at `store` to the repository of versions at `repository` (made if
/// missing) as its next version, copied or (`move`) renamed in; returns the version.
#[pyfunction]
#[pyo3(name = "repo_publish", signature = (repository, store, r#move = false))]
pub(crate) fn repo_publish(
    py: Python<'_>,
    repository: PathBuf,
    store: PathBuf,
    r#move: bool,
) -> PyResult<u64> {
    let how = if r#move { Publish::Move } else { Publish::Copy };
    detach(py, || {
        Repository::create(&repository).and_then(|r| r.publish(&store, how))
    })?
    .map_err(|e| format_err(py, e))
}

/// A repository's versions, the one served and those served before it.
type VersionsTuple = (Vec<u64>, u64, Vec<u64>);

/// The repository of versions at `path`: `(versions, current, history)`, or `None` if `path`
/// is not one.
#[pyfunction]
pub(crate) fn repo_versions(py: Python<'_>, path: PathBuf) -> PyResult<Option<VersionsTuple>> {
    let Some(repo) = Repository::detect(&path) else {
        return Ok(None);
    };
    let read = || -> nearrec_format::Result<_> {
        let history = repo.pointer()?.map(|p| p.history).unwrap_or_default();
        Ok((repo.versions()?, repo.current()?, history))
    };
    detach(py, read)?.map(Some).map_err(|e| format_err(py, e))
}

/// Opens and validates a store's manifest and table headers; returns the manifest as JSON.
#[pyfunction]
pub(crate) fn read_manifest(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let reader = StoreReader::open(&path).map_err(|e| format_err(py, e))?;
    Ok(manifest_json(&reader))
}

/// The keys keyed table `table` of the store at `path` holds (its keys file read and checked),
/// in the file's order, as int64 bits.
#[pyfunction]
pub(crate) fn read_keys<'py>(
    py: Python<'py>,
    path: PathBuf,
    table: &str,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let reader = StoreReader::open(&path).map_err(|e| format_err(py, e))?;
    let Some(i) = reader.manifest().table_index(table) else {
        let available: Vec<&str> = reader.tables().iter().map(|t| t.name.as_str()).collect();
        return Err(raise(
            py,
            "UnknownTable",
            format!(
                "unknown table {table:?}; the store has: {}",
                available.join(", ")
            ),
            Some(table),
            None,
        ));
    };
    let entries = detach(py, || reader.keys(i))?.map_err(|e| format_err(py, e))?;
    let Some(entries) = entries else {
        return Err(raise(
            py,
            "InvalidRequest",
            format!("table {table:?} is not keyed: its rows are addressed by position"),
            Some(table),
            None,
        ));
    };
    let keys: Vec<i64> = entries.iter().map(|&(k, _)| k as i64).collect();
    Ok(PyArray1::from_vec(py, keys))
}

/// Adds (or replaces) attachment `name` of the store at `path`; returns the manifest as JSON.
#[pyfunction]
pub(crate) fn store_attach(
    py: Python<'_>,
    path: PathBuf,
    name: &str,
    data: &[u8],
) -> PyResult<String> {
    let manifest =
        detach(py, || nearrec_format::attach(&path, name, data))?.map_err(|e| format_err(py, e))?;
    Ok(serde_json::to_string(&manifest).expect("manifest serialises"))
}

/// Attachment `name` of the store at `path`, checked (`None`: there is none of that name).
#[pyfunction]
pub(crate) fn store_read_attachment<'py>(
    py: Python<'py>,
    path: PathBuf,
    name: &str,
) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
    let bytes = detach(py, || {
        StoreReader::open(&path).and_then(|r| r.read_attachment(name))
    })?
    .map_err(|e| format_err(py, e))?;
    Ok(bytes.map(|b| pyo3::types::PyBytes::new(py, &b)))
}

fn manifest_json(reader: &StoreReader) -> String {
    serde_json::to_string(reader.manifest()).expect("manifest serialises")
}
