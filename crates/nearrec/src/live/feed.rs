//! Delta feeds on a live store (`docs/live.md`, "Delta feeds"): a delta file's rows and its
//! feed's cursor logged in one record, so that a feeder killed at any moment and started again
//! applies each file once. The cursors are decided in log order as the record is appended
//! (one feeder's retry of a file it already applied logs nothing), replayed with the log, and
//! written to the manifest by each compaction.

use super::*;
use crate::membership::now_ms;

/// What one delta applied to a store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// The store's version after it (the one that holds the file's rows).
    pub version: u64,
    /// `false`: the feed had applied this file (or a later one) before, and nothing was
    /// written now.
    pub applied: bool,
    /// The feed's cursor after the call.
    pub cursor: FeedCursor,
}

impl Live {
    /// Applies `writes` — delta file `cursor.sequence` of feed `feed` — with the feed's cursor,
    /// in one record: all of it or none, durable when it returns. A file at or before the
    /// feed's cursor is not applied again (`applied: false`); one past the next is a gap,
    /// refused. A feed the store has not seen starts at any sequence.
    pub(crate) fn feed(
        &self,
        feed: &str,
        cursor: FeedCursor,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> Result<Fed> {
        check_name(feed)?;
        let w = self.writer()?;
        let _gate = w.gate.read().unwrap_or_else(|p| p.into_inner());
        let w = self.writer()?;
        self.mark_format(w, nearrec_format::FEEDS_VERSION)?;
        let engine = self.snapshot().engine.clone();
        let ops = Self::encode(&engine, writes, options)?;
        let keyed = Self::keyed(&engine, &ops);
        if keyed {
            self.mark_releases(w, &engine)?;
        }
        let need = Self::room(&engine, &ops);
        w.reserve(need)?;
        // the feed's cursor after the call: the one logged now, or the one that took it before
        let mut after = None;
        let decided = self.log_decided(w, need, |lsn| {
            let mut cursors = lock(&w.cursors);
            match cursors.get(feed) {
                Some(h) if h.sequence >= cursor.sequence => {
                    after = Some(*h);
                    return Ok(Vec::new());
                }
                Some(h) if h.sequence + 1 < cursor.sequence => {
                    return Err(gap(feed, h.sequence, cursor.sequence));
                }
                _ => {}
            }
            let mut ops = if keyed {
                keys::decide(&engine, &mut lock(&w.books), lsn, ops, false)?
            } else {
                ops
            };
            let applied = FeedCursor {
                applied_ms: now_ms(),
                ..cursor
            };
            ops.push(Op::Cursor {
                feed: feed.to_owned(),
                cursor: applied,
            });
            cursors.insert(feed.to_owned(), applied);
            after = Some(applied);
            Ok(ops)
        })?;
        Ok(Fed {
            version: decided.unwrap_or_else(|| self.snapshot().version),
            applied: decided.is_some(),
            cursor: after.unwrap_or(cursor),
        })
    }

    /// Lifts the store's format to `version` at least (once, before the first record only its
    /// readers know is logged: a feed's cursor, [`nearrec_format::FEEDS_VERSION`]; a key
    /// evicted or expired, [`nearrec_format::RELEASES_VERSION`]; a transaction's step,
    /// [`nearrec_format::TXN_VERSION`]): an older nearrec refuses the
    /// store rather than take such a record for a damaged one.
    pub(super) fn mark_format(&self, w: &Writer, version: u32) -> Result<()> {
        if w.format_marked.load(Relaxed) >= version {
            return Ok(());
        }
        let dir = lock_store_dir(&self.dir)?;
        let mut manifest = nearrec_format::StoreReader::open(&self.dir)?
            .manifest()
            .clone();
        if manifest.format_version < version {
            manifest.format_version = version;
            manifest.publish(&self.dir)?;
        }
        drop(dir);
        w.format_marked.fetch_max(manifest.format_version, Relaxed);
        Ok(())
    }
}

/// The refusal of delta file `sequence` of feed `feed` by a store whose cursor is at `held`,
/// more than one file before it: it would skip the files between (every store says it so).
pub fn gap(feed: &str, held: u64, sequence: u64) -> Error {
    let skipped = if held + 2 == sequence {
        format!("file {}", held + 1)
    } else {
        format!("files {} to {}", held + 1, sequence - 1)
    };
    Error::invalid(format!(
        "feed {feed:?} has applied file {held} last: file {sequence} would skip {skipped}"
    ))
}

/// A feed's name: 1 to 65,535 bytes (a log record's string).
pub(super) fn check_name(feed: &str) -> Result<()> {
    if feed.is_empty() || feed.len() > u16::MAX as usize {
        return Err(Error::invalid(format!(
            "a feed's name is 1 to {} bytes, not {}",
            u16::MAX,
            feed.len()
        )));
    }
    Ok(())
}
