//! The write path of a live store: what a call writes ([`RowWrite`], [`RowValues`],
//! [`WriteOptions`]), the call encoded, logged and applied to the deltas (also replayed records,
//! a transaction's decided writes, a catch-up's adopted rows, expiry), and the writer's budget
//! for the deltas.

use std::borrow::Cow;

use super::*;

/// One table's rows written by a call: ids and their rows' values.
#[derive(Debug, Clone, Copy)]
pub struct RowWrite<'a> {
    pub table: &'a str,
    pub ids: &'a [i64],
    /// `None`: the rows are removed.
    pub values: Option<RowValues<'a>>,
}

/// A write's rows: float32 values (`ids.len() × dim`), encoded with the table's dtype as they
/// are written; or rows already in the table's encoding (`ids.len() × row_bytes`: FBGEMM's
/// fused row-wise layouts for int8 / int4 / int2, `docs/format.md` §4), taken as they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowValues<'a> {
    F32(&'a [f32]),
    Encoded(&'a [u8]),
}

/// [`RowValues`] owned (a write decoded from the wire, or split by a router).
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedValues {
    F32(Vec<f32>),
    Encoded(Vec<u8>),
}

impl<'a> RowValues<'a> {
    /// Rows `range` of these values, which hold `rows` rows of one width.
    pub fn rows(self, range: std::ops::Range<usize>, rows: usize) -> RowValues<'a> {
        fn cut<T>(v: &[T], range: std::ops::Range<usize>, rows: usize) -> &[T] {
            let width = v.len().checked_div(rows).unwrap_or(0);
            &v[range.start * width..range.end * width]
        }
        match self {
            RowValues::F32(v) => RowValues::F32(cut(v, range, rows)),
            RowValues::Encoded(b) => RowValues::Encoded(cut(b, range, rows)),
        }
    }

    /// Their size in bytes.
    pub fn bytes(self) -> usize {
        match self {
            RowValues::F32(v) => 4 * v.len(),
            RowValues::Encoded(b) => b.len(),
        }
    }
}

impl OwnedValues {
    pub fn as_values(&self) -> RowValues<'_> {
        match self {
            OwnedValues::F32(v) => RowValues::F32(v),
            OwnedValues::Encoded(b) => RowValues::Encoded(b),
        }
    }

    /// No rows yet, of the kind of `like`.
    pub fn empty_like(like: RowValues<'_>) -> Self {
        match like {
            RowValues::F32(_) => OwnedValues::F32(Vec::new()),
            RowValues::Encoded(_) => OwnedValues::Encoded(Vec::new()),
        }
    }

    /// Appends `rows`, of this kind (rows of the other kind are a caller's bug: ignored).
    pub fn extend(&mut self, rows: RowValues<'_>) {
        match (self, rows) {
            (OwnedValues::F32(o), RowValues::F32(v)) => o.extend_from_slice(v),
            (OwnedValues::Encoded(o), RowValues::Encoded(b)) => o.extend_from_slice(b),
            _ => debug_assert!(false, "rows of another kind"),
        }
    }
}

/// How a call's rows are checked.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOptions {
    /// Accept NaN and infinite values (refused by default: a NaN row poisons every bag).
    pub allow_nonfinite: bool,
}

impl Live {
    /// Applies record `lsn` (the next one), `ops`, to the deltas and publishes it.
    pub(super) fn apply(&self, lsn: u64, ops: &[Op]) -> Result<()> {
        let oldest = self.oldest();
        let current = self.snapshot();
        let engine = &current.engine;
        let mut deltas = current.deltas.clone();
        let mut keys = current.keys.clone();
        let mut feeds = None;
        if let Some(log) = self.writer.as_ref().and_then(|w| w.evicted.as_ref()) {
            for op in ops {
                if let Op::ReleaseKeys {
                    table,
                    keys,
                    cause:
                        nearrec_format::wal::Release::Evicted | nearrec_format::wal::Release::Expired,
                } = op
                    && let Err(e) = log.add(lsn, table, keys, &current)
                {
                    // the keys are let go of all the same; their rows are not kept
                    tracing::warn!(target: "nearrec::store", store = %self.dir.display(),
                        table = %table, error = %e,
                        "{} keys let go of at version {lsn} are not in the evicted keys' log", keys.len());
                }
            }
        }
        for op in ops {
            let table = match op {
                Op::Cursor { feed, cursor } => {
                    feeds
                        .get_or_insert_with(|| (*current.feeds).clone())
                        .insert(feed.clone(), *cursor);
                    continue;
                }
                // a transaction's step changes no table: its bookkeeping is the writer's
                // (`txn.rs`), and a commit's rows are the record's other operations
                op if op.is_txn() => continue,
                _ => op.table().unwrap_or_default(),
            };
            let id = engine.table_id(table)?;
            let meta = &engine.tables()[id];
            if matches!(op, Op::AssignKeys { .. } | Op::ReleaseKeys { .. }) && !meta.is_keyed() {
                return Err(FormatError::Corrupted {
                    path: self.dir.clone(),
                    reason: format!(
                        "write-ahead log: record {lsn} gives keys rows in table {:?}, which is \
                         not keyed",
                        meta.name
                    ),
                }
                .into());
            }
            match op {
                Op::AssignKeys { keys: k, rows, .. } => {
                    let d = keys[id].get_or_insert_with(|| self.key_delta());
                    for (key, row) in k.iter().zip(rows) {
                        let row = u32::try_from(*row)
                            .ok()
                            .filter(|&r| r != 0 && u64::from(r) < meta.rows)
                            .ok_or_else(|| {
                                Error::Internal(format!(
                                    "record {lsn} gives key {key} of table {:?} row {row}, not \
                                     one of its rows",
                                    meta.name
                                ))
                            })?;
                        d.insert(lsn, *key, Some(&row.to_le_bytes()), oldest);
                    }
                    continue;
                }
                Op::ReleaseKeys { keys: k, .. } => {
                    let d = keys[id].get_or_insert_with(|| self.key_delta());
                    for key in k {
                        d.insert(lsn, *key, None, oldest);
                    }
                    continue;
                }
                _ => {}
            }
            let delta = deltas[id].get_or_insert_with(|| {
                Arc::new(TableDelta::new(
                    meta.row_bytes as usize,
                    meta.rows,
                    self.delta_rows,
                ))
            });
            match op {
                Op::Write { ids, rows, .. } => {
                    let rb = meta.row_bytes as usize;
                    for (id, row) in ids.iter().zip(rows.chunks_exact(rb)) {
                        delta.insert(lsn, *id, Some(row), oldest);
                    }
                }
                Op::Remove { ids, .. } => {
                    for id in ids {
                        delta.insert(lsn, *id, None, oldest);
                    }
                }
                Op::CreateTable { table, .. } | Op::DropTable { table } => {
                    return Err(Error::Internal(format!(
                        "record {lsn} creates or drops table {table:?}: a change of the tables is \
                         published, not applied"
                    )));
                }
                Op::AssignKeys { .. }
                | Op::ReleaseKeys { .. }
                | Op::Cursor { .. }
                | Op::Prepare { .. }
                | Op::Decide { .. } => {
                    unreachable!("applied above")
                }
            }
        }
        self.publish(Snapshot {
            version: lsn,
            base: current.base,
            engine: current.engine.clone(),
            deltas,
            keys,
            feeds: feeds.map_or_else(|| current.feeds.clone(), Arc::new),
            folded: current.folded.clone(),
        });
        Ok(())
    }

    /// A keyed table's key delta: keys to 4-byte row numbers.
    pub(super) fn key_delta(&self) -> Arc<TableDelta> {
        Arc::new(TableDelta::new(KEY_ROW_BYTES, u64::MAX, self.delta_rows))
    }

    /// Checks and encodes one call's rows into log operations (nothing is applied); a keyed
    /// table's operations name keys, decided as they are logged ([`keys::decide`]).
    pub(super) fn encode(
        engine: &Engine,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> Result<Vec<Op>> {
        writes
            .iter()
            .map(|w| {
                let id = engine.table_id(w.table)?;
                let meta = &engine.tables()[id];
                let keyed = meta.is_keyed();
                let bad = |position: usize, reason: String| Error::InvalidRequest {
                    table: Some(meta.name.clone()),
                    position: Some(position),
                    reason,
                };
                let ids = w
                    .ids
                    .iter()
                    .enumerate()
                    .map(|(k, &v)| {
                        // a key is any 64 bits
                        let id = if keyed {
                            Some(v as u64)
                        } else {
                            u64::try_from(v).ok()
                        };
                        id.filter(|&r| keyed || r < meta.rows).ok_or_else(|| {
                            bad(
                                k,
                                format!("ids[{k}] = {v} is not a row of its {} rows", meta.rows),
                            )
                        })
                    })
                    .collect::<Result<Vec<u64>>>()?;
                let rb = meta.row_bytes as usize;
                let rows = match w.values {
                    None => {
                        return Ok(Op::Remove {
                            table: meta.name.clone(),
                            ids,
                        });
                    }
                    Some(RowValues::F32(values)) => {
                        let dim = meta.dim as usize;
                        check_values(&meta.name, ids.len(), dim, values, options)?;
                        let mut rows = vec![0u8; ids.len() * rb];
                        for (out, v) in rows.chunks_exact_mut(rb).zip(values.chunks_exact(dim)) {
                            meta.dtype.encode_row(v, out);
                        }
                        rows
                    }
                    Some(RowValues::Encoded(bytes)) => {
                        check_encoded(&meta.name, ids.len(), meta.dtype, meta.dim, bytes, options)?;
                        bytes.to_vec()
                    }
                };
                Ok(Op::Write {
                    table: meta.name.clone(),
                    ids,
                    row_bytes: rb as u32,
                    rows,
                })
            })
            .collect()
    }

    /// One call: checked, logged (durable as the store's durability says), applied and
    /// published; returns its version.
    pub(crate) fn write(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> Result<u64> {
        let w = self.writer()?;
        let _gate = w.gate.read().unwrap_or_else(|p| p.into_inner());
        // closed while this call waited for the gate: its lock and log are let go of
        let w = self.writer()?;
        let engine = self.snapshot().engine.clone();
        let ops = Self::encode(&engine, writes, options)?;
        let need = Self::room(&engine, &ops);
        w.reserve(need)?;
        self.log_call(w, &engine, Cow::Owned(ops), need)
    }

    /// Logs and applies call `ops` ([`Self::encode`]'s, `need` bytes of room reserved for
    /// them), a keyed table's keys resolved to rows as the record is appended, in log order;
    /// its version. With every key new and not admitted, nothing is logged. Borrowed `ops` are
    /// copied only to be decided (a keyed table's).
    pub(super) fn log_call(
        &self,
        w: &Writer,
        engine: &Engine,
        ops: Cow<'_, [Op]>,
        need: u64,
    ) -> Result<u64> {
        if !Self::keyed(engine, &ops) {
            return self.log_and_apply(w, &ops, need);
        }
        let ops = ops.into_owned();
        if let Err(e) = self.mark_releases(w, engine) {
            w.used.fetch_sub(need, Relaxed);
            return Err(e);
        }
        let decided = self.log_decided(w, need, |lsn| {
            keys::decide(engine, &mut lock(&w.books), lsn, ops, false)
        })?;
        Ok(decided.unwrap_or_else(|| self.snapshot().version))
    }

    /// Logs the record `decide` makes as it is appended (see [`Wal::append_with`]), whose
    /// `need` bytes of room are reserved, then applies and publishes it in log order; its
    /// version, or `None` when `decide` made no operations (nothing logged, the room given
    /// back).
    pub(super) fn log_decided(
        &self,
        w: &Writer,
        need: u64,
        decide: impl FnOnce(u64) -> Result<Vec<Op>>,
    ) -> Result<Option<u64>> {
        match w.wal.append_with(decide) {
            Ok((0, _)) => {
                w.used.fetch_sub(need, Relaxed);
                Ok(None)
            }
            Ok((lsn, ops)) => self.apply_logged(w, lsn, &ops, need).map(Some),
            Err(e) => {
                w.used.fetch_sub(need, Relaxed);
                Err(e)
            }
        }
    }

    /// Lets go of keyed tables' keys past their TTL, in a record of its own (a compaction's
    /// first step, and the background compactor's every tenth of a TTL): at most
    /// [`EXPIRED_PER_RECORD`] keys, and no more than the delta has room for; its version, or
    /// `None` when none had expired. It waits for nothing: with the writers' gate wanted by a
    /// change of the tables, or no room in the delta, it does nothing now.
    pub(crate) fn expire(&self) -> Result<Option<u64>> {
        let w = self.writer()?;
        let Ok(_gate) = w.gate.try_read() else {
            return Ok(None);
        };
        if w.closed.load(Relaxed) {
            return Ok(None);
        }
        let entry = KEY_ROW_BYTES as u64 + ENTRY_OVERHEAD;
        let free = w.budget.saturating_sub(w.used.load(Relaxed));
        let most = EXPIRED_PER_RECORD.min((free / entry) as usize);
        let need = most as u64 * entry;
        if most == 0 || w.try_reserve(need).is_err() {
            return Ok(None);
        }
        let engine = self.snapshot().engine.clone();
        self.mark_releases(w, &engine)?;
        self.log_decided(w, need, |lsn| {
            Ok(keys::expire(&engine, &mut lock(&w.books), lsn, most))
        })
    }

    /// Lifts the store's format to the version that tells evicted and expired keys from
    /// removed ones (kinds 8 and 9) before a keyed table that may let keys go of itself logs.
    pub(super) fn mark_releases(&self, w: &Writer, engine: &Engine) -> Result<()> {
        let releases = (0..engine.tables().len()).any(|id| {
            engine.key_life(id).is_some_and(|l| {
                l.limits.evict != nearrec_engine::Evict::Off || l.limits.ttl_s.is_some()
            })
        });
        if releases {
            self.mark_format(w, nearrec_format::RELEASES_VERSION)?;
        }
        Ok(())
    }

    /// A replica catching up: `writes` logged as record `count` (the numbers between taken by
    /// empty records, so that the replica's count of writes is its shard's), applied and
    /// published; what it held prepared aborted first. `count` past the version, or at it with
    /// no rows (nothing to do); at most [`MAX_ADOPTED_GAP`] records ahead.
    pub(crate) fn adopt(
        &self,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        count: u64,
    ) -> Result<u64> {
        let w = self.writer()?;
        for tx in txn::prepared(w) {
            self.decide(tx, Decision::Abort, false)?;
        }
        let engine = self.snapshot().engine.clone();
        let ops = Self::encode(&engine, writes, options)?;
        let keyed = Self::keyed(&engine, &ops);
        if keyed {
            self.mark_releases(w, &engine)?;
        }
        // the log to itself: no other record between the gap and this one's publication
        let _gate = w.gate.write().unwrap_or_else(|p| p.into_inner());
        let w = self.writer()?;
        let version = w.wal.next_lsn() - 1;
        let refuse = |reason: String| Error::InvalidRequest {
            table: writes.first().map(|w| w.table.to_owned()),
            position: None,
            reason,
        };
        if count < version || (count == version && !ops.is_empty()) {
            return Err(refuse(format!(
                "a catch-up's rows at count {count}, but the replica has made {version} writes: \
                 it is not behind the replica it copies from"
            )));
        }
        if count - version > MAX_ADOPTED_GAP {
            return Err(refuse(format!(
                "the replica is {} writes behind, more than a catch-up adopts ({MAX_ADOPTED_GAP}): \
                 copy it whole",
                count - version
            )));
        }
        if count == version {
            return Ok(version);
        }
        let need = Self::room(&engine, &ops);
        w.reserve(need)?;
        // a member's keys: decided here as record `count` (the log is this call's alone), every
        // one taken
        let ops = if keyed {
            match keys::decide(&engine, &mut lock(&w.books), count, ops, true) {
                Ok(ops) => ops,
                Err(e) => {
                    w.used.fetch_sub(need, Relaxed);
                    return Err(e);
                }
            }
        } else {
            ops
        };
        let lsn = match w.wal.append_at(count, &ops) {
            Ok(lsn) => lsn,
            Err(e) => {
                w.used.fetch_sub(need, Relaxed);
                if keyed {
                    // decided and never logged: the books as the log has them
                    self.build_books(w);
                }
                return Err(e.into());
            }
        };
        let mut applied = lock(&w.applied);
        let before = self.delta_bytes();
        let result = self.apply(lsn, &ops);
        let freed = (before + need).saturating_sub(self.delta_bytes());
        w.used.fetch_sub(freed, Relaxed);
        *applied = lsn;
        drop(applied);
        w.turn.notify_all();
        result.map(|()| lsn)
    }

    /// Whether `ops` write or remove rows of a keyed table (their keys decided as they are
    /// logged: [`keys::decide`]).
    pub(super) fn keyed(engine: &Engine, ops: &[Op]) -> bool {
        ops.iter().any(|op| {
            op.table()
                .and_then(|t| engine.table_id(t).ok())
                .is_some_and(|id| engine.is_keyed(id))
        })
    }

    /// What `ops`' entries will cost the deltas (a removed row's entry is counted like a row;
    /// a keyed table's written key like its row and two keys' entries, an eviction's and its
    /// own).
    pub(super) fn room(engine: &Engine, ops: &[Op]) -> u64 {
        let key = KEY_ROW_BYTES as u64 + ENTRY_OVERHEAD;
        ops.iter()
            .map(|op| {
                let id = op.table().and_then(|t| engine.table_id(t).ok());
                let keyed = id.is_some_and(|id| engine.is_keyed(id));
                let rb = id.map_or(0, |id| engine.tables()[id].row_bytes);
                match op {
                    Op::Write { ids, .. } => {
                        ids.len() as u64 * (rb + ENTRY_OVERHEAD + if keyed { 2 * key } else { 0 })
                    }
                    Op::Remove { ids, .. } if keyed => ids.len() as u64 * key,
                    Op::Remove { ids, .. } => ids.len() as u64 * (rb + ENTRY_OVERHEAD),
                    _ => 0,
                }
            })
            .sum()
    }

    /// Logs `ops`, whose `need` bytes of room are reserved, then applies and publishes them in
    /// log order; their version. The caller holds the writer's gate.
    pub(super) fn log_and_apply(&self, w: &Writer, ops: &[Op], need: u64) -> Result<u64> {
        let lsn = match w.wal.append(ops) {
            Ok(lsn) => lsn,
            Err(e) => {
                w.used.fetch_sub(need, Relaxed);
                return Err(e.into());
            }
        };
        self.apply_logged(w, lsn, ops, need)
    }

    /// Applies and publishes record `lsn`, `ops`, logged with `need` bytes of room reserved,
    /// in log order; its version.
    pub(super) fn apply_logged(&self, w: &Writer, lsn: u64, ops: &[Op], need: u64) -> Result<u64> {
        fail::fail_point!("live::logged", |_| std::process::abort());
        // apply in log order: wait for the record before this one
        let mut applied = lock(&w.applied);
        while *applied + 1 < lsn {
            applied = w.turn.wait(applied).unwrap_or_else(|p| p.into_inner());
        }
        let before = self.delta_bytes();
        let result = self.apply(lsn, ops);
        // what pruning freed (the reservation assumed every entry stays), or what the record
        // took past its reservation (a TTL's keys, counted once decided)
        let after = self.delta_bytes();
        if after > before + need {
            w.used.fetch_add(after - before - need, Relaxed);
        } else {
            w.used.fetch_sub(before + need - after, Relaxed);
        }
        *applied = lsn;
        drop(applied);
        w.turn.notify_all();
        if w.auto_compact && w.used.load(Relaxed) >= w.budget / 2 {
            w.signal.want();
        }
        result.map(|()| lsn)
    }
}

impl Writer {
    /// A compaction's files let go of: those retired before go (paced), these stay until the
    /// next compaction (a reader in another process one compaction behind may still open
    /// them).
    pub(super) fn retire(&self, dir: &Path, files: Vec<String>) {
        let before = std::mem::replace(&mut *lock(&self.retired), files);
        compact::remove_paced(dir, &before, self.compaction_rate);
    }

    /// A change of the tables' files let go of: kept with the last compaction's.
    pub(super) fn retire_more(&self, files: Vec<String>) {
        lock(&self.retired).extend(files);
    }

    /// Reserves `need` bytes of the delta's budget if they are free now; else the bytes in
    /// use.
    pub(super) fn try_reserve(&self, need: u64) -> std::result::Result<(), u64> {
        self.used
            .fetch_update(Relaxed, Relaxed, |used| {
                (used + need <= self.budget).then_some(used + need)
            })
            .map(drop)
    }

    /// Reserves `need` bytes of the delta's budget for a call, waiting up to the store's
    /// `write_wait_ms` for a compaction to free them; else the call is refused whole.
    pub(super) fn reserve(&self, need: u64) -> Result<()> {
        let deadline = Instant::now() + self.wait;
        loop {
            let used = match self.try_reserve(need) {
                Ok(()) => return Ok(()),
                Err(used) => used,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.auto_compact || need > self.budget || left.is_zero() {
                return Err(Error::DeltaFull {
                    used,
                    asked: need,
                    budget: self.budget,
                });
            }
            self.signal.want();
            self.signal.wait_room(left.min(Duration::from_millis(50)));
        }
    }
}

/// The values of a write of `rows` rows of `table` (dim `dim`): `rows × dim` of them, finite
/// unless `options` allow otherwise. Every implementation checks a write's values with this
/// (a router before it splits the call, so that a position is the caller's).
pub fn check_values(
    table: &str,
    rows: usize,
    dim: usize,
    values: &[f32],
    options: WriteOptions,
) -> Result<()> {
    if values.len() != rows * dim {
        return Err(Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!(
                "{rows} ids need {} values ({rows} × dim {dim}), not {}",
                rows * dim,
                values.len()
            ),
        });
    }
    if !options.allow_nonfinite
        && let Some(at) = values.iter().position(|v| !v.is_finite())
    {
        let (row, col) = (at / dim, at % dim);
        return Err(Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: Some(row),
            reason: format!(
                "rows[{row}][{col}] is {} (pass allow_nonfinite to write it)",
                values[at]
            ),
        });
    }
    Ok(())
}

/// Rows of `table` already in its encoding (`dtype`, `dim`): `rows` of them, each of
/// `row_bytes`, every value they decode to finite unless `options` allow otherwise. Every implementation checks encoded rows with this.
pub fn check_encoded(
    table: &str,
    rows: usize,
    dtype: nearrec_format::DType,
    dim: u32,
    bytes: &[u8],
    options: WriteOptions,
) -> Result<()> {
    let rb = dtype.row_bytes(dim) as usize;
    if bytes.len() != rows * rb {
        return Err(Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!(
                "{rows} ids need {} bytes of {dtype} rows ({rows} × {rb}), not {}",
                rows * rb,
                bytes.len()
            ),
        });
    }
    if options.allow_nonfinite {
        return Ok(());
    }
    let mut decoded = vec![0f32; dim as usize];
    for (row, b) in bytes.chunks_exact(rb).enumerate() {
        // a scale or bias not finite decodes to values that are not (0 × ∞ is NaN)
        dtype.decode_row(b, &mut decoded);
        if let Some(col) = decoded.iter().position(|v| !v.is_finite()) {
            return Err(Error::InvalidRequest {
                table: Some(table.to_owned()),
                position: Some(row),
                reason: format!(
                    "rows[{row}][{col}] decodes to {} (pass allow_nonfinite to write it)",
                    decoded[col]
                ),
            });
        }
    }
    Ok(())
}

/// The most keys one record lets go of past their TTL (8 MiB of keys): more wait for the next.
const EXPIRED_PER_RECORD: usize = 1 << 20;

/// The most records a catch-up's rows may be numbered past the replica's version
/// ([`Live::adopt`]): 16 MiB of empty records.
const MAX_ADOPTED_GAP: u64 = 1 << 20;
