//! The evicted keys' log (`docs/live.md`, "The evicted keys' log"): the keys a keyed table let
//! go of by itself — evicted at its cap, expired past its TTL — with their rows as they were
//! served, kept beside the store in `evicted/` as delta files (`docs/format.md` §17: `op =
//! delete`, float32 values), so that a trainer or a feature store can keep or admit them again.
//!
//! Entries are taken as the log's records are applied ([`Log::add`], from the snapshot the
//! record applies onto: the rows as readers saw them), held in memory and written as one file
//! when enough are pending, when the first of them has waited [`FLUSH_AFTER`], at every
//! compaction (before its manifest moves the tables past them) and when the store closes. A
//! file's step is the store's version of its last entry; on open, the newest file's says where
//! the log got to, and replay adds the entries after it again — so a crash loses none. The
//! files past the log's bound (`evicted_log` bytes) are removed, oldest first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nearrec_format::FormatError;
use nearrec_format::delta::{self, Changes, Encoding, Header, Values};

use super::{Snapshot, lock};
use crate::error::Result;

/// Where the log's files are, in the store's directory.
pub const DIR: &str = "evicted";
/// Entries pending that make a file.
const FLUSH_KEYS: usize = 1 << 16;
/// How long the first pending entry waits for others before the next entry writes them.
const FLUSH_AFTER: Duration = Duration::from_secs(10);

/// A store's evicted keys' log.
#[derive(Debug)]
pub(super) struct Log {
    dir: PathBuf,
    /// The most bytes its files keep.
    bound: u64,
    state: std::sync::Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The store's version the files hold entries up to.
    written: u64,
    /// The next file's sequence.
    next: u64,
    pending: Vec<Changes>,
    keys: usize,
    /// The version of the last entry pending.
    last: u64,
    since: Option<Instant>,
}

impl Log {
    /// The log of the store at `store`, its files kept to `bound` bytes: where its newest file
    /// says it got to.
    pub(super) fn open(store: &Path, bound: u64) -> Result<Self> {
        let dir = store.join(DIR);
        std::fs::create_dir_all(&dir).map_err(|e| FormatError::Io {
            path: dir.clone(),
            source: e,
        })?;
        let files = delta::list(&dir)?;
        let mut state = State {
            next: 1,
            ..State::default()
        };
        if let Some((sequence, path)) = files.last() {
            state.next = sequence + 1;
            state.written = delta::header_of(path)?.step.unwrap_or(0);
        }
        Ok(Self {
            dir,
            bound,
            state: std::sync::Mutex::new(state),
        })
    }

    /// Keys `keys` of table `table`, let go of by record `lsn`, with their rows as `before`
    /// (the snapshot the record applies onto) serves them; written once enough are pending.
    /// A record the files hold already (replayed after a crash) adds nothing.
    pub(super) fn add(&self, lsn: u64, table: &str, keys: &[u64], before: &Snapshot) -> Result<()> {
        let mut s = lock(&self.state);
        if lsn <= s.written || keys.is_empty() {
            return Ok(());
        }
        let engine = &before.engine;
        let id = engine.table_id(table)?;
        let dim = engine.tables()[id].dim as usize;
        let ids: Vec<i64> = keys.iter().map(|&k| k as i64).collect();
        let mut rows = vec![0f32; ids.len() * dim];
        engine.read_rows_at(id, &ids, &mut rows, before.view())?;
        let at = match s.pending.iter().position(|c| c.table == table) {
            Some(at) => at,
            None => {
                s.pending.push(Changes::new(table, false));
                s.pending.len() - 1
            }
        };
        let changes = &mut s.pending[at];
        changes.deletes.extend_from_slice(&ids);
        match changes
            .deleted
            .get_or_insert_with(|| Values::F32(Vec::new()))
        {
            Values::F32(v) => v.extend_from_slice(&rows),
            Values::Encoded(_) => unreachable!("the log's rows are float32"),
        }
        s.keys += ids.len();
        s.last = lsn;
        let since = *s.since.get_or_insert_with(Instant::now);
        if s.keys >= FLUSH_KEYS || since.elapsed() >= FLUSH_AFTER {
            self.write(&mut s)?;
        }
        Ok(())
    }

    /// Writes what is pending as one file (nothing when none is).
    pub(super) fn flush(&self) -> Result<()> {
        self.write(&mut lock(&self.state))
    }

    fn write(&self, s: &mut State) -> Result<()> {
        if s.keys == 0 {
            return Ok(());
        }
        // a key let go of, admitted again and let go of again is in the file twice: its last
        // row is the one that went
        for c in &mut s.pending {
            dedupe(c);
        }
        let header = Header {
            sequence: s.next,
            step: Some(s.last),
            wall_time_ms: Some(crate::membership::now_ms()),
        };
        let path = self.dir.join(delta::file_name(s.next, Encoding::Arrow));
        delta::write(&path, &header, &s.pending, None)?;
        s.written = s.last;
        s.next += 1;
        s.pending.clear();
        s.keys = 0;
        s.since = None;
        self.trim()
    }

    /// Removes the oldest files while the log holds more than its bound (never the newest).
    fn trim(&self) -> Result<()> {
        let files = delta::list(&self.dir)?;
        let mut sizes: Vec<(PathBuf, u64)> = files
            .into_iter()
            .map(|(_, p)| {
                let len = std::fs::metadata(&p).map_or(0, |m| m.len());
                (p, len)
            })
            .collect();
        let mut total: u64 = sizes.iter().map(|(_, n)| n).sum();
        sizes.pop();
        for (path, len) in sizes {
            if total <= self.bound {
                break;
            }
            std::fs::remove_file(&path).map_err(|e| FormatError::Io {
                path: path.clone(),
                source: e,
            })?;
            total -= len;
        }
        Ok(())
    }
}

/// Each key once, with its last row.
fn dedupe(c: &mut Changes) {
    let Some(Values::F32(rows)) = &mut c.deleted else {
        return;
    };
    let n = c.deletes.len();
    let dim = rows.len().checked_div(n).unwrap_or(0);
    let mut last = std::collections::HashMap::with_capacity(n);
    for (i, &k) in c.deletes.iter().enumerate() {
        last.insert(k, i);
    }
    if last.len() == n {
        return;
    }
    let keep: Vec<usize> = (0..n).filter(|&i| last[&c.deletes[i]] == i).collect();
    c.deletes = keep.iter().map(|&i| c.deletes[i]).collect();
    *rows = keep
        .iter()
        .flat_map(|&i| rows[i * dim..(i + 1) * dim].to_vec())
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, sequence: u64, keys: usize) {
        let mut c = Changes::new("k", false);
        c.deletes = (0..keys as i64).collect();
        c.deleted = Some(Values::F32(vec![1.0; keys * 4]));
        let header = Header {
            sequence,
            step: Some(sequence * 10),
            wall_time_ms: None,
        };
        delta::write(
            &dir.join(delta::file_name(sequence, Encoding::Arrow)),
            &header,
            &[c],
            None,
        )
        .unwrap();
    }

    #[test]
    fn the_oldest_files_go_past_the_bound_and_the_newest_says_where_it_got_to() {
        let store = tempfile::tempdir().unwrap();
        let dir = store.path().join(DIR);
        std::fs::create_dir_all(&dir).unwrap();
        for s in 1..=5 {
            file(&dir, s, 200);
        }
        let one = std::fs::metadata(dir.join(delta::file_name(1, Encoding::Arrow)))
            .unwrap()
            .len();
        let log = Log::open(store.path(), 2 * one + one / 2).unwrap();
        let at = |log: &Log| {
            let s = lock(&log.state);
            (s.written, s.next)
        };
        assert_eq!(at(&log), (50, 6));
        log.trim().unwrap();
        let left: Vec<u64> = delta::list(&dir).unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(left, [4, 5]);
        // a bound below one file keeps the newest all the same
        let log = Log::open(store.path(), 1).unwrap();
        log.trim().unwrap();
        assert_eq!(delta::list(&dir).unwrap().len(), 1);
        assert_eq!(at(&log), (50, 6));
    }

    #[test]
    fn a_key_let_go_of_twice_is_kept_with_its_last_row() {
        let mut c = Changes::new("k", false);
        c.deletes = vec![5, 6, 5];
        c.deleted = Some(Values::F32(vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0]));
        dedupe(&mut c);
        assert_eq!(c.deletes, [6, 5]);
        assert_eq!(c.deleted, Some(Values::F32(vec![2.0, 2.0, 3.0, 3.0])));
    }
}
