//! The feeder (`docs/live.md`, "Delta feeds"): delta files (`docs/format.md` §17) applied in
//! sequence order to any store that writes — embedded, on a node, sharded — each file one
//! atomic call that moves the feed's cursor with its rows ([`Writes::feed`]), so that a feeder
//! killed at any moment and started again applies each file exactly once: it starts after the
//! cursor the store holds, and a file the store took before a kill is not taken again.
//!
//! A file larger than [`FeedOptions::part_bytes`] is applied in several calls, in order, the
//! cursor moved by the last only: a reader may see its first calls' rows before the rest, and
//! a feeder killed between them applies the file again from its start. Its rows are set, not
//! added to (an upsert writes a row's values, a delete lets a row go), so the store ends as
//! if the file had been applied once.
//!
//! Where deltas come from is a [`DeltaSource`]: a directory of delta files ([`DirSource`]), or
//! of TorchEasyRec's delta embedding dumps ([`TzrecSource`]); a broker's consumer is another
//! implementation of the same calls.

use std::path::PathBuf;
use std::time::Duration;

use std::collections::BTreeMap;

use nearrec_format::delta::{self, Delta, Shape, Values, tzrec};
use nearrec_format::{FeedCursor, FormatError};

use crate::api::{StoreApi, Writes};
use crate::error::{Error, Result};
pub use crate::live::gap;
use crate::live::{RowValues, RowWrite, WriteOptions};
use crate::model::{self, OwnedWeight};

/// Where a feed's delta files come from.
pub trait DeltaSource: Send {
    /// The sequence numbers of the deltas there now, in order.
    fn list(&mut self) -> Result<Vec<u64>>;

    /// Its sequences run 1, 2, 3, … so that one missing is a gap, refused (`true`, a delta
    /// directory's); `false`: they are the producer's steps, every so many apart, each next one
    /// listed the next to apply — the store's cursor then holds the step, and as its sequence
    /// the deltas of the feed applied so far (a store's cursor moves one at a time).
    fn consecutive(&self) -> bool {
        true
    }

    /// Delta `sequence`, read whole and checked against the store's tables (`shapes`), and the
    /// dense weights that go with it, if the producer wrote them.
    fn read(
        &mut self,
        sequence: u64,
        shapes: &dyn Fn(&str) -> Option<Shape>,
    ) -> Result<(Delta, Option<Vec<OwnedWeight>>)>;
}

/// Delta files in a directory, named by their sequence (`<sequence>.arrow` / `.parquet`, the
/// dense weights `<sequence>.dense.npz` beside them), found by listing it. A producer writes
/// each file under another name and renames it (as [`delta::write`] does): a watching feeder
/// reads a file that does not read yet again at its next pass.
#[derive(Debug)]
pub struct DirSource {
    dir: PathBuf,
    files: Vec<(u64, PathBuf)>,
}

impl DirSource {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: Vec::new(),
        }
    }
}

impl DeltaSource for DirSource {
    fn list(&mut self) -> Result<Vec<u64>> {
        self.files = delta::list(&self.dir)?;
        Ok(self.files.iter().map(|(s, _)| *s).collect())
    }

    fn read(
        &mut self,
        sequence: u64,
        shapes: &dyn Fn(&str) -> Option<Shape>,
    ) -> Result<(Delta, Option<Vec<OwnedWeight>>)> {
        let path = match self.files.iter().find(|(s, _)| *s == sequence) {
            Some((_, p)) => p.clone(),
            None => self
                .dir
                .join(delta::file_name(sequence, delta::Encoding::Arrow)),
        };
        let d = delta::read(&path, shapes)?;
        let dense = match d.dense() {
            None => None,
            Some(p) => {
                let bytes =
                    nearrec_format::files::read_regular(&p, 0).map_err(|e| FormatError::Io {
                        path: p.clone(),
                        source: e,
                    })?;
                let arrays = nearrec_format::npz::read_npz_f32(&bytes).map_err(|reason| {
                    FormatError::BadDelta {
                        path: p.clone(),
                        row: None,
                        column: None,
                        reason: format!("its dense weights: {reason}"),
                    }
                })?;
                Some(
                    arrays
                        .into_iter()
                        .map(|(name, a)| {
                            (
                                name,
                                a.shape.iter().map(|&n| n as usize).collect(),
                                a.values,
                            )
                        })
                        .collect(),
                )
            }
        };
        Ok((d, dense))
    }
}

/// The source of directory `dir` holding deltas of `format`: `"nearrec"` (delta files,
/// [`DirSource`]) or `"tzrec"` (TorchEasyRec's dumps of file prefix `prefix`, their
/// embedding names mapped by `tables`: [`TzrecSource`]).
pub fn dir_source(
    dir: impl Into<PathBuf>,
    format: &str,
    prefix: Option<&str>,
    tables: BTreeMap<String, String>,
) -> Result<Box<dyn DeltaSource>> {
    match format {
        "nearrec" if prefix.is_none() && tables.is_empty() => Ok(Box::new(DirSource::new(dir))),
        "nearrec" => Err(Error::invalid(
            "a file prefix and a map of table names are TorchEasyRec's dumps' (format \"tzrec\"): \
             delta files name their tables",
        )),
        "tzrec" => Ok(Box::new(TzrecSource::new(dir, prefix, tables))),
        other => Err(Error::invalid(format!(
            "delta format {other:?}: one of \"nearrec\" (docs/format.md §17) and \"tzrec\" \
             (TorchEasyRec's delta embedding dumps)"
        ))),
    }
}

/// TorchEasyRec's delta embedding dumps in a directory (its `delta_embedding_dump_config`'s
/// `output_dir`), each whole step one delta of sequence = its global step: the files of
/// `prefix` (its `file_prefix`, [`tzrec::PREFIX`] by default), one a step or one a rank of
/// it under `step_<N>/` (a step waits for all its ranks). An `embedding_name` is the table of
/// the same name, or the one `tables` maps it to.
#[derive(Debug)]
pub struct TzrecSource {
    dir: PathBuf,
    prefix: String,
    tables: BTreeMap<String, String>,
    steps: Vec<tzrec::Step>,
}

impl TzrecSource {
    pub fn new(
        dir: impl Into<PathBuf>,
        prefix: Option<&str>,
        tables: BTreeMap<String, String>,
    ) -> Self {
        Self {
            dir: dir.into(),
            prefix: prefix.unwrap_or(tzrec::PREFIX).to_owned(),
            tables,
            steps: Vec::new(),
        }
    }

    fn table<'n>(&'n self, embedding: &'n str) -> &'n str {
        self.tables.get(embedding).map_or(embedding, String::as_str)
    }
}

impl DeltaSource for TzrecSource {
    fn list(&mut self) -> Result<Vec<u64>> {
        self.steps = tzrec::steps(&self.dir, &self.prefix)?;
        Ok(self.steps.iter().map(|s| s.step).collect())
    }

    fn consecutive(&self) -> bool {
        false
    }

    fn read(
        &mut self,
        sequence: u64,
        shapes: &dyn Fn(&str) -> Option<Shape>,
    ) -> Result<(Delta, Option<Vec<OwnedWeight>>)> {
        let step = self
            .steps
            .iter()
            .find(|s| s.step == sequence)
            .ok_or_else(|| FormatError::BadDelta {
                path: self.dir.clone(),
                row: None,
                column: None,
                reason: format!("no whole dump of step {sequence} there"),
            })?;
        let mut d = tzrec::read_step(step, |name| shapes(self.table(name)))?;
        for t in &mut d.tables {
            t.table = self.table(&t.table).to_owned();
        }
        Ok((d, None))
    }
}

/// How a feeder runs.
#[derive(Debug, Clone)]
pub struct FeedOptions {
    /// The feed's name: its cursor's, in the store.
    pub name: String,
    /// The first sequence to apply when the store holds no cursor of the feed (else its
    /// first file's); with a cursor, the store's decides and a `from` past it is a gap. A
    /// source of steps: the first step (the ones before it are skipped).
    pub from: Option<u64>,
    pub write: WriteOptions,
    /// The most bytes (ids and rows) one call carries: a file that holds more is applied in
    /// parts of at most this. The default, 32 MiB, keeps a call inside a node's default
    /// message limit (64 MiB) and a store's default delta budget (256 MiB).
    pub part_bytes: usize,
}

impl Default for FeedOptions {
    fn default() -> Self {
        Self {
            name: "default".into(),
            from: None,
            write: WriteOptions::default(),
            part_bytes: 32 << 20,
        }
    }
}

/// One delta file the feeder applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Applied {
    /// Its sequence in the source (a source of steps: its step).
    pub sequence: u64,
    pub rows: u64,
    /// The calls it took: 1, or more for a file larger than [`FeedOptions::part_bytes`].
    pub calls: usize,
    /// The store's version that holds it.
    pub version: u64,
    /// `false`: the store had it already (a feeder before this one applied it).
    pub applied: bool,
    /// From the producer's wall time to the store logging it (`None`: the file gave none).
    pub lag: Option<Duration>,
    /// The feed's cursor after it.
    pub cursor: FeedCursor,
}

/// Applies a source's deltas to a store, in order, each once.
pub struct Feeder<'a> {
    store: &'a dyn StoreApi,
    source: Box<dyn DeltaSource + 'a>,
    options: FeedOptions,
}

impl std::fmt::Debug for Feeder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feeder")
            .field("store", &self.store.describe())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<'a> Feeder<'a> {
    /// A feeder of `store` (which must write: [`Writes`]) from `source`.
    pub fn new(
        store: &'a dyn StoreApi,
        source: Box<dyn DeltaSource + 'a>,
        options: FeedOptions,
    ) -> Result<Self> {
        store.able(store.writes(), "feed")?;
        Ok(Self {
            store,
            source,
            options,
        })
    }

    fn writes(&self) -> &dyn Writes {
        self.store.writes().expect("checked by new")
    }

    /// The store's cursor of this feed: the last sequence it applied.
    pub fn cursor(&self) -> Result<Option<FeedCursor>> {
        Ok(self
            .writes()
            .feed_status()?
            .get(&self.options.name)
            .copied())
    }

    /// Applies every delta the source holds after the store's cursor, in order; `each` is
    /// told of each as it is applied. A gap in the sequence stops it (typed, naming the file
    /// that follows it) after the files before the gap; nothing of a refused file is applied.
    /// The next file is read while one is applied (one file ahead, on a thread of its own).
    pub fn apply_pending(&mut self, each: &mut dyn FnMut(&Applied)) -> Result<Vec<Applied>> {
        let held = self.cursor()?;
        // where the store is in the source's order: its last sequence, or for a source of
        // steps its last step (the cursor's own sequence then counts the deltas applied)
        let consecutive = self.source.consecutive();
        let cursor = held.map(|c| {
            if consecutive {
                c.sequence
            } else {
                c.step.unwrap_or(0)
            }
        });
        let mut dense = held.map_or(1, |c| c.sequence + 1);
        let mut expected = match (cursor, self.options.from) {
            (Some(c), _) => Some(c + 1),
            (None, from) => from,
        };
        // the files to apply, up to a gap (refused once the files before it are applied)
        let mut todo = Vec::new();
        let mut gap = None;
        for sequence in self.source.list()? {
            if cursor.is_some_and(|c| sequence <= c)
                || self.options.from.is_some_and(|f| sequence < f)
            {
                continue;
            }
            if let Some(e) = expected
                && consecutive
                && sequence != e
            {
                gap = Some(Error::Format(FormatError::BadDelta {
                    path: PathBuf::from(delta::file_name(sequence, delta::Encoding::Arrow)),
                    row: None,
                    column: None,
                    reason: format!(
                        "feed {:?} needs sequence {e} next{}, and the first file after it is {sequence}",
                        self.options.name,
                        cursor
                            .map_or_else(String::new, |c| format!(" (the store has applied {c})")),
                    ),
                }));
                break;
            }
            todo.push(sequence);
            expected = Some(sequence + 1);
        }
        // the store's tables as this pass found them: a file naming a table created since is
        // refused now and read again at the next pass
        let info = self.store.info()?;
        let shapes = move |table: &str| {
            info.tables.iter().find(|t| t.name == table).map(|t| Shape {
                rows: t.rows,
                dim: t.dim,
                dtype: t.dtype,
                keyed: t.keys.is_some(),
            })
        };
        let Self {
            store,
            source,
            options,
        } = self;
        let (store, options) = (*store, &*options);
        let writes = store.writes().expect("checked by new");
        let done = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            scope.spawn(move || {
                for sequence in todo {
                    let read = source.read(sequence, &shapes);
                    let failed = read.is_err();
                    // a send fails once the applier has stopped
                    if tx.send((sequence, read)).is_err() || failed {
                        return;
                    }
                }
            });
            let mut done = Vec::new();
            for (sequence, read) in rx {
                let (mut delta, weights) = read?;
                if !consecutive {
                    delta.header.sequence = dense;
                    delta.header.step = Some(sequence);
                    dense += 1;
                }
                let applied = apply_one(store, writes, options, sequence, delta, weights)?;
                each(&applied);
                done.push(applied);
            }
            Ok::<_, Error>(done)
        })?;
        match gap {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }
}

/// Applies delta `sequence` (read): its dense weights (an update the next file's retry
/// repeats harmlessly), then its rows with the feed's cursor — in one call, or in parts of
/// `options.part_bytes` with the cursor in the last.
fn apply_one(
    store: &dyn StoreApi,
    writes_to: &dyn Writes,
    options: &FeedOptions,
    sequence: u64,
    delta: Delta,
    dense: Option<Vec<OwnedWeight>>,
) -> Result<Applied> {
    if let Some(weights) = &dense {
        let inference = store.able(store.inference(), "a delta's dense weights")?;
        inference.update_model(&model::tensors(weights))?;
    }
    // deletes first: a keyed table at its cap takes the file's new keys in the room its
    // deleted keys leave (a file names each id once, so the order changes nothing else);
    // encoded rows go as they are
    let mut writes = Vec::with_capacity(2 * delta.tables.len());
    for t in &delta.tables {
        if !t.deletes.is_empty() {
            writes.push(RowWrite {
                table: &t.table,
                ids: &t.deletes,
                values: None,
            });
        }
        if !t.upserts.is_empty() {
            writes.push(RowWrite {
                table: &t.table,
                ids: &t.upserts,
                values: Some(match &t.values {
                    Values::F32(v) => RowValues::F32(v),
                    Values::Encoded(b) => RowValues::Encoded(b),
                }),
            });
        }
    }
    let h = delta.header;
    let cursor = FeedCursor {
        sequence: h.sequence,
        step: h.step,
        wall_time_ms: h.wall_time_ms,
        applied_ms: 0,
        rows: delta.rows() as u64,
    };
    let mut parts = parts(&writes, options.part_bytes);
    let calls = parts.len();
    let last = parts.pop().unwrap_or_default();
    for part in &parts {
        writes_to.write_many(part, options.write)?;
    }
    let fed = writes_to.feed(&options.name, cursor, &last, options.write)?;
    let lag = fed
        .cursor
        .wall_time_ms
        .map(|w| Duration::from_millis(fed.cursor.applied_ms.saturating_sub(w)));
    Ok(Applied {
        sequence,
        rows: cursor.rows,
        calls,
        version: fed.version,
        applied: fed.applied,
        lag,
        cursor: fed.cursor,
    })
}

/// A file's writes cut, in order, into calls of at most `limit` bytes of ids and rows each: a
/// row is never cut, and one wider than `limit` is a call of its own. One call when it fits.
fn parts<'w>(writes: &[RowWrite<'w>], limit: usize) -> Vec<Vec<RowWrite<'w>>> {
    let mut parts = vec![Vec::new()];
    let mut room = limit;
    for w in writes {
        let n = w.ids.len();
        let row = 8 + w
            .values
            .map_or(0, |v| v.bytes().checked_div(n).unwrap_or(0));
        let mut at = 0;
        while at < n {
            let mut fit = (room / row).min(n - at);
            if fit == 0 {
                if parts.last().is_some_and(|p| !p.is_empty()) {
                    parts.push(Vec::new());
                    room = limit;
                    continue;
                }
                fit = 1;
            }
            let end = at + fit;
            parts.last_mut().expect("one at least").push(RowWrite {
                table: w.table,
                ids: &w.ids[at..end],
                values: w.values.map(|v| v.rows(at..end, n)),
            });
            room = room.saturating_sub(fit * row);
            at = end;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(writes: &[RowWrite<'_>], limit: usize) -> Vec<Vec<(String, Vec<i64>, usize)>> {
        parts(writes, limit)
            .iter()
            .map(|p| {
                p.iter()
                    .map(|w| {
                        let bytes = w.values.map_or(0, RowValues::bytes);
                        (w.table.to_owned(), w.ids.to_vec(), bytes)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_file_is_cut_into_calls_in_order_never_inside_a_row() {
        let ids: Vec<i64> = (0..10).collect();
        let values: Vec<f32> = (0..40).map(|v| v as f32).collect();
        let writes = [
            RowWrite {
                table: "d",
                ids: &ids[..3],
                values: None,
            },
            RowWrite {
                table: "a",
                ids: &ids,
                values: Some(RowValues::F32(&values)),
            },
        ];
        // it fits: one call, as it is
        assert_eq!(cut(&writes, 1 << 20).len(), 1);
        // 24 bytes a row of `a` (8 of id, 16 of values), 8 a delete: 50 bytes a call
        let got = cut(&writes, 50);
        let want = vec![
            vec![("d".into(), vec![0, 1, 2], 0), ("a".into(), vec![0], 16)],
            vec![("a".into(), vec![1, 2], 32)],
            vec![("a".into(), vec![3, 4], 32)],
            vec![("a".into(), vec![5, 6], 32)],
            vec![("a".into(), vec![7, 8], 32)],
            vec![("a".into(), vec![9], 16)],
        ];
        assert_eq!(got, want);
        // each call's values are its rows' own
        let p = parts(&writes, 50);
        assert_eq!(p[2][0].values, Some(RowValues::F32(&values[12..20])));
        // a row wider than the limit goes alone
        let got = cut(&writes[1..], 10);
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|c| c.len() == 1 && c[0].1.len() == 1));
    }
}
