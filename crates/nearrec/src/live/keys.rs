//! Keyed tables written by key (`docs/live.md`, "Keyed tables"; `docs/format.md` §16).
//!
//! A call's ids on a keyed table are keys. Which row each key takes is decided by the writer as
//! the call's record is appended — under the log's lock, so decisions are made in log order —
//! and logged with it ([`Op::AssignKeys`], [`Op::ReleaseKeys`], then the rows' [`Op::Write`]):
//! replay and readers in other processes apply what was decided, never decide again.
//!
//! The writer keeps a [`KeyBook`] per keyed table: the keys given rows or let go of since the
//! tables' base (each with the record that decided it), and which rows are held. A key's row is
//! the book's, else the engine's index (the base's). A new key is given a row once admitted
//! (its table's admission sketch), at the first free row from a cursor; at the table's cap a
//! key is evicted first (the least touched or least recently touched of a sample, as its
//! [`Evict`] says) or, with eviction off, the call is refused whole ([`Error::KeysFull`]) and
//! the book is rolled back. A cap lowered below the keys a table holds is evicted down to at
//! the next call that gives a key a row; with eviction off, the writable open is refused
//! ([`over_caps`]). A compaction lets go of keys past their TTL ([`Live::expire`]), in
//! a record of its own, before it folds.

use std::collections::{HashMap, HashSet};

use nearrec_engine::delta::TableDelta;
use nearrec_engine::{Engine, Evict, KeyLife, decode_row};
use nearrec_format::wal::{MAX_PAYLOAD, Op, Release, payload_len};

use super::{Live, lock};
use crate::error::{Error, Result};

/// A writer's refusal of a keyed table that holds more keys than its cap while its eviction is
/// off: nothing would ever bring it down to the cap, and every new key would be refused.
pub(crate) fn over_caps(engine: &Engine, books: &HashMap<String, KeyBook>) -> Result<()> {
    for (id, t) in engine.tables().iter().enumerate() {
        let Some(book) = books.get(&t.name) else {
            continue;
        };
        let cap = engine.key_cap(id);
        let evicts = engine
            .key_life(id)
            .is_some_and(|l| l.limits.evict != Evict::Off);
        if book.held() > cap && !evicts {
            return Err(Error::Config {
                key: format!("key_limits.{}.cap", t.name),
                reason: format!(
                    "{cap} is below the {} keys table {:?} holds, and its eviction is off: \
                     raise the cap to at least {}, or set evict = \"lfu\" or \"lru\" to evict \
                     down to it at the next new key",
                    book.held(),
                    t.name,
                    book.held()
                ),
            });
        }
    }
    Ok(())
}

impl Live {
    /// Keyed table `table`'s keys past `after` (from the first: `None`), in order, at most
    /// `count`, as the writer has decided them: what a replica's catch-up compares by key.
    /// Refused for a table addressed by row, and by a store that takes no writes.
    pub(crate) fn keys_after(
        &self,
        table: &str,
        after: Option<u64>,
        count: u64,
    ) -> Result<Vec<u64>> {
        let w = self.writer()?;
        let engine = self.snapshot().engine.clone();
        let id = engine.table_id(table)?;
        let books = lock(&w.books);
        let Some(book) = books.get(table) else {
            return Err(Error::InvalidRequest {
                table: Some(table.to_owned()),
                position: None,
                reason: "is addressed by row, not by key: its rows are compared by number".into(),
            });
        };
        let keys = book.keys(&engine, id);
        let from = after.map_or(0, |a| keys.partition_point(|&k| k <= a));
        Ok(keys[from..].iter().take(count as usize).copied().collect())
    }
}

/// Rows a victim is drawn from when a table at its cap evicts.
const SAMPLE: usize = 16;

/// What one change to a book undoes to (see [`KeyBook::rollback`]).
#[derive(Debug)]
enum Undo {
    Key(u64, Option<(u64, Option<u32>)>),
    Row(u32, bool, u64),
}

/// The writer's view of one keyed table's keys (see the module docs).
#[derive(Debug)]
pub(crate) struct KeyBook {
    /// Keys given a row (`Some`) or let go of (`None`) since the base, with the record that
    /// decided it.
    changed: HashMap<u64, (u64, Option<u32>)>,
    /// A bit per row: held by a key (row 0, the zero row, always).
    taken: Vec<u64>,
    rows: u64,
    /// Keys held.
    held: u64,
    /// Where the search for a free row goes on.
    cursor: u64,
    /// Each row's key (only when the table's keys expire or are evicted).
    key_of: Vec<u64>,
    rng: u64,
    /// The changes since [`KeyBook::begin`], while a call decides.
    journal: Option<Vec<Undo>>,
    /// Rows the call deciding now gave new keys: never its victims (its keys are the newest).
    given: std::collections::HashSet<u32>,
    saved: (u64, u64),
}

impl KeyBook {
    /// The book of keyed table `id` of `engine`, whose key delta `delta` holds its keys' changes
    /// in `(base, version]`.
    pub(crate) fn build(
        engine: &Engine,
        id: usize,
        delta: Option<&TableDelta>,
        base: u64,
        version: u64,
    ) -> Self {
        let rows = engine.tables()[id].rows;
        let tracks = engine.key_life(id).is_some_and(KeyLife::tracks);
        let mut book = Self {
            changed: HashMap::new(),
            taken: vec![0; rows.div_ceil(64) as usize],
            rows,
            held: 0,
            cursor: 1,
            key_of: if tracks {
                vec![0; rows as usize]
            } else {
                Vec::new()
            },
            rng: 0x9e37_79b9_7f4a_7c15 ^ version,
            journal: None,
            given: std::collections::HashSet::new(),
            saved: (0, 0),
        };
        book.set(0, true);
        engine.for_each_key(id, |key, row| book.hold(key, row));
        let newest = delta.map(|d| d.newest(base, version)).unwrap_or_default();
        // rows the changed keys held at the base go first, then the rows they hold now
        for (key, _) in &newest {
            if let Some(r) = engine.base_row_of(id, *key) {
                book.set(r, false);
                book.held -= 1;
            }
        }
        for (key, value) in newest {
            let row = value.map(|b| decode_row(&b));
            if let Some(r) = row {
                book.hold(key, r);
            }
            book.changed.insert(key, (version, row));
        }
        book
    }

    fn hold(&mut self, key: u64, row: u32) {
        self.set(row, true);
        self.held += 1;
        if let Some(k) = self.key_of.get_mut(row as usize) {
            *k = key;
        }
    }

    fn is_taken(&self, row: u32) -> bool {
        self.taken[row as usize / 64] & (1 << (row % 64)) != 0
    }

    fn set(&mut self, row: u32, taken: bool) {
        let was = self.is_taken(row);
        if let Some(j) = &mut self.journal {
            let key = self.key_of.get(row as usize).copied().unwrap_or(0);
            j.push(Undo::Row(row, was, key));
        }
        let (w, bit) = (row as usize / 64, 1u64 << (row % 64));
        if taken {
            self.taken[w] |= bit;
        } else {
            self.taken[w] &= !bit;
        }
    }

    fn note(&mut self, lsn: u64, key: u64, row: Option<u32>) {
        let before = self.changed.insert(key, (lsn, row));
        if let Some(j) = &mut self.journal {
            j.push(Undo::Key(key, before));
        }
    }

    /// Key `key`'s row now (every record logged so far decided).
    pub(crate) fn row_of(&self, engine: &Engine, id: usize, key: u64) -> Option<u32> {
        match self.changed.get(&key) {
            Some(&(_, row)) => row,
            None => engine.base_row_of(id, key),
        }
    }

    /// Every key held now, in order.
    pub(crate) fn keys(&self, engine: &Engine, id: usize) -> Vec<u64> {
        let mut keys = Vec::with_capacity(self.held as usize);
        engine.for_each_key(id, |key, _| {
            if !self.changed.contains_key(&key) {
                keys.push(key);
            }
        });
        (self.changed.iter()).for_each(|(&key, &(_, row))| keys.extend(row.map(|_| key)));
        keys.sort_unstable();
        keys
    }

    /// Keys held now.
    pub(crate) fn held(&self) -> u64 {
        self.held
    }

    /// Starts a call's decisions (undone by [`Self::rollback`]).
    fn begin(&mut self) {
        self.journal = Some(Vec::new());
        self.given.clear();
        self.saved = (self.held, self.cursor);
    }

    fn commit(&mut self) {
        self.journal = None;
        self.given.clear();
    }

    /// Undoes every change since [`Self::begin`].
    fn rollback(&mut self) {
        self.given.clear();
        let Some(journal) = self.journal.take() else {
            return;
        };
        for undo in journal.into_iter().rev() {
            match undo {
                Undo::Key(key, Some(before)) => {
                    self.changed.insert(key, before);
                }
                Undo::Key(key, None) => {
                    self.changed.remove(&key);
                }
                Undo::Row(row, was, key) => {
                    let (w, bit) = (row as usize / 64, 1u64 << (row % 64));
                    if was {
                        self.taken[w] |= bit;
                    } else {
                        self.taken[w] &= !bit;
                    }
                    if let Some(k) = self.key_of.get_mut(row as usize) {
                        *k = key;
                    }
                }
            }
        }
        (self.held, self.cursor) = self.saved;
    }

    /// `key` given `row`, decided by record `lsn`.
    fn assign(&mut self, lsn: u64, key: u64, row: u32) {
        self.given.insert(row);
        self.set(row, true);
        self.held += 1;
        if let Some(k) = self.key_of.get_mut(row as usize) {
            *k = key;
        }
        self.note(lsn, key, Some(row));
    }

    /// `key`, at `row`, let go of by record `lsn`.
    fn release(&mut self, lsn: u64, key: u64, row: u32) {
        self.set(row, false);
        self.held -= 1;
        self.note(lsn, key, None);
    }

    /// A row no key holds, from the cursor on.
    fn free_row(&mut self) -> Option<u32> {
        if self.held + 1 >= self.rows {
            return None;
        }
        let words = self.taken.len() as u64;
        let start = self.cursor / 64;
        for i in 0..=words {
            let w = (start + i) % words;
            let mut free = !self.taken[w as usize];
            while free != 0 {
                let row = w * 64 + u64::from(free.trailing_zeros());
                if row != 0 && row < self.rows {
                    self.cursor = row + 1;
                    return Some(row as u32);
                }
                free &= free - 1;
            }
        }
        None
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The key a table at its cap evicts: the least worth keeping of a sample of held rows
    /// (`life.score`) — not one the call deciding now gave a new key, while others are held —
    /// with its row. `None` when no row is held.
    fn victim(&mut self, life: &KeyLife) -> Option<(u64, u32)> {
        if self.held == 0 || self.key_of.is_empty() {
            return None;
        }
        let mut best: Option<(u64, u32)> = None;
        let mut found = 0;
        for _ in 0..SAMPLE * 64 {
            let row = (1 + self.next_random() % (self.rows - 1)) as u32;
            if !self.is_taken(row) || self.given.contains(&row) {
                continue;
            }
            let score = life.score(row);
            if best.is_none_or(|(s, _)| score < s) {
                best = Some((score, row));
            }
            found += 1;
            if found == SAMPLE {
                break;
            }
        }
        let row = match best {
            Some((_, row)) => row,
            // a sparse sample: the first held row the call did not give, else any held one
            None => (1..self.rows as u32)
                .find(|&r| self.is_taken(r) && !self.given.contains(&r))
                .or_else(|| (1..self.rows as u32).find(|&r| self.is_taken(r)))?,
        };
        Some((self.key_of[row as usize], row))
    }

    /// The keys whose rows were not touched for their TTL at `now`, with their rows.
    fn expired(&self, life: &KeyLife, now: u64) -> Vec<(u64, u32)> {
        if self.key_of.is_empty() {
            return Vec::new();
        }
        (1..self.rows as u32)
            .filter(|&r| self.is_taken(r) && life.expired(r, now))
            .map(|r| (self.key_of[r as usize], r))
            .collect()
    }

    /// After a compaction to `c` folded the keys' changes up to it into the index: those
    /// changes leave the book.
    pub(crate) fn prune(&mut self, c: u64) {
        self.changed.retain(|_, (lsn, _)| *lsn > c);
    }
}

/// Appends `key` to `ops`' last operation when it is of the same kind (assigned row `row`, or
/// let go of for `cause`) and table, else starts one.
fn push_key(ops: &mut Vec<Op>, table: &str, key: u64, row: Result<u32, Release>) {
    match (ops.last_mut(), row) {
        (
            Some(Op::AssignKeys {
                keys,
                rows,
                table: t,
            }),
            Ok(r),
        ) if t == table => {
            keys.push(key);
            rows.push(u64::from(r));
        }
        (
            Some(Op::ReleaseKeys {
                keys,
                cause,
                table: t,
            }),
            Err(c),
        ) if *cause == c && t == table => keys.push(key),
        (_, Ok(r)) => ops.push(Op::AssignKeys {
            table: table.to_owned(),
            keys: vec![key],
            rows: vec![u64::from(r)],
        }),
        (_, Err(cause)) => ops.push(Op::ReleaseKeys {
            table: table.to_owned(),
            keys: vec![key],
            cause,
        }),
    }
}

/// What one call's decisions counted, per table (added to its [`KeyLife`] once it is logged).
#[derive(Debug, Default)]
struct Counts {
    not_admitted: u64,
    evicted: u64,
}

/// Decides call `ops` — whose keyed tables' `Write`s and `Remove`s name keys — as record `lsn`:
/// the record's operations, every key resolved to its row (see the module docs). On an error
/// nothing is decided. `copied`: the keys are a member's, copied to a replica catching up
/// (`Live::adopt`): every one is admitted, and none evicted for it (the member's keys fit the
/// cap, and those the replica holds beyond them are removed first).
pub(crate) fn decide(
    engine: &Engine,
    books: &mut HashMap<String, KeyBook>,
    lsn: u64,
    ops: Vec<Op>,
    copied: bool,
) -> Result<Vec<Op>> {
    let mut out = Vec::with_capacity(ops.len() + 2);
    let mut touched: Vec<String> = Vec::new();
    let mut counts: HashMap<String, Counts> = HashMap::new();
    let result = (|| {
        for op in ops {
            let Some(table) = op.table().map(str::to_owned) else {
                out.push(op);
                continue;
            };
            let id = engine.table_id(&table)?;
            if !engine.is_keyed(id) {
                out.push(op);
                continue;
            }
            let book = books
                .get_mut(&table)
                .ok_or_else(|| Error::Internal(format!("keyed table {table:?} has no key book")))?;
            if !touched.contains(&table) {
                book.begin();
                touched.push(table.clone());
            }
            let life = engine.key_life(id);
            let now = engine.now();
            let cap = engine.key_cap(id);
            let count = counts.entry(table.clone()).or_default();
            match op {
                Op::Write {
                    ids: keys,
                    row_bytes,
                    rows: values,
                    ..
                } => {
                    let rb = row_bytes as usize;
                    let mut ids = Vec::with_capacity(keys.len());
                    let mut bytes = Vec::with_capacity(values.len());
                    for (position, (&key, value)) in
                        keys.iter().zip(values.chunks_exact(rb)).enumerate()
                    {
                        let row = match book.row_of(engine, id, key) {
                            Some(r) => {
                                if let Some(l) = life {
                                    l.touch(r, now);
                                }
                                r
                            }
                            None => {
                                if !copied && life.is_some_and(|l| !l.admit(key, now)) {
                                    count.not_admitted += 1;
                                    continue;
                                }
                                // a cap lowered below the keys held is evicted down to here
                                while !copied && book.held() >= cap {
                                    let victim = match life {
                                        Some(l) if l.limits.evict != Evict::Off => book.victim(l),
                                        _ => None,
                                    };
                                    let Some((vkey, vrow)) = victim else {
                                        if let Some(l) = life {
                                            l.count(0, 0, 0, 1);
                                        }
                                        return Err(Error::KeysFull {
                                            table: table.clone(),
                                            position,
                                            key,
                                            cap,
                                        });
                                    };
                                    book.release(lsn, vkey, vrow);
                                    push_key(&mut out, &table, vkey, Err(Release::Evicted));
                                    count.evicted += 1;
                                }
                                let r = book.free_row().ok_or_else(|| {
                                    Error::Internal(format!(
                                        "table {table:?}: {} keys held under a cap of {cap}, yet no \
                                         row is free",
                                        book.held()
                                    ))
                                })?;
                                book.assign(lsn, key, r);
                                push_key(&mut out, &table, key, Ok(r));
                                if let Some(l) = life {
                                    l.reset(r, now);
                                }
                                r
                            }
                        };
                        ids.push(u64::from(row));
                        bytes.extend_from_slice(value);
                    }
                    if !ids.is_empty() {
                        out.push(Op::Write {
                            table,
                            ids,
                            row_bytes,
                            rows: bytes,
                        });
                    }
                }
                Op::Remove { ids: keys, .. } => {
                    for key in keys {
                        if let Some(r) = book.row_of(engine, id, key) {
                            book.release(lsn, key, r);
                            push_key(&mut out, &table, key, Err(Release::Removed));
                        }
                    }
                }
                other => out.push(other),
            }
        }
        // a record too large to log is refused before anything is decided
        let bytes = payload_len(&out);
        if bytes > MAX_PAYLOAD {
            return Err(Error::InvalidRequest {
                table: touched.first().cloned(),
                position: None,
                reason: format!(
                    "the call's record would hold {bytes} bytes, more than one record's \
                     {MAX_PAYLOAD}: split it"
                ),
            });
        }
        Ok(())
    })();
    for table in &touched {
        let book = books.get_mut(table).expect("touched");
        if result.is_ok() {
            book.commit();
        } else {
            book.rollback();
        }
    }
    result?;
    for (table, c) in counts {
        if let Some(life) = engine
            .table_id(&table)
            .ok()
            .and_then(|id| engine.key_life(id))
        {
            life.count(c.not_admitted, 0, c.evicted, 0);
        }
    }
    Ok(out)
}

/// The record that lets go of keys past their TTL at the engine's clock, at most `most` of
/// them (the rest wait for the next), decided as record `lsn` (empty when none has expired).
pub(crate) fn expire(
    engine: &Engine,
    books: &mut HashMap<String, KeyBook>,
    lsn: u64,
    most: usize,
) -> Vec<Op> {
    let mut out = Vec::new();
    let mut left = most;
    let now = engine.now();
    for (table, book) in books.iter_mut() {
        let Some(life) = engine
            .table_id(table)
            .ok()
            .and_then(|id| engine.key_life(id))
        else {
            continue;
        };
        let mut gone = book.expired(life, now);
        gone.truncate(left);
        left -= gone.len();
        life.count(0, gone.len() as u64, 0, 0);
        for (key, row) in gone {
            book.release(lsn, key, row);
            push_key(&mut out, table, key, Err(Release::Expired));
        }
    }
    out
}

/// Refuses a prepare ([`Error::KeysFull`]) whose new keys of a keyed table that does not evict
/// would take it past its cap, counting the new keys of every transaction held before it (`held`, their operations):
/// each commits without asking again (a commit cannot fail on it), so the prepare makes room.
pub(super) fn keys_fit<'a>(
    engine: &Engine,
    books: &HashMap<String, KeyBook>,
    ops: &[Op],
    held: impl Iterator<Item = &'a [Op]> + Clone,
) -> Result<()> {
    for op in ops {
        let Op::Write { table, ids, .. } = op else {
            continue;
        };
        let (Some(book), Ok(id)) = (books.get(table), engine.table_id(table)) else {
            continue;
        };
        if engine
            .key_life(id)
            .is_some_and(|l| l.limits.evict != Evict::Off)
        {
            continue;
        }
        let new = |ids: &[u64]| -> HashSet<u64> {
            (ids.iter().copied())
                .filter(|&key| book.row_of(engine, id, key).is_none())
                .collect()
        };
        let mut taken: HashSet<u64> = HashSet::new();
        for other in held.clone().flatten() {
            if let Op::Write { table: t, ids, .. } = other
                && t == table
            {
                taken.extend(new(ids));
            }
        }
        let cap = engine.key_cap(id);
        let mut count = book.held() + taken.len() as u64;
        for (position, &key) in ids.iter().enumerate() {
            if book.row_of(engine, id, key).is_none() && taken.insert(key) {
                count += 1;
                if count > cap {
                    return Err(Error::KeysFull {
                        table: table.clone(),
                        position,
                        key,
                        cap,
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys let go of merge into the last operation only when it is of the same table and
    /// cause: an expiry record of two tables once released the second's keys in the first.
    #[test]
    fn keys_let_go_of_merge_only_within_one_table_and_cause() {
        let mut ops = Vec::new();
        push_key(&mut ops, "a", 1, Err(Release::Expired));
        push_key(&mut ops, "a", 2, Err(Release::Expired));
        push_key(&mut ops, "b", 3, Err(Release::Expired));
        push_key(&mut ops, "b", 4, Err(Release::Evicted));
        push_key(&mut ops, "b", 5, Ok(7));
        push_key(&mut ops, "c", 6, Ok(8));
        let got: Vec<(String, Vec<u64>, Option<Release>)> = ops
            .iter()
            .map(|op| match op {
                Op::ReleaseKeys { table, keys, cause } => {
                    (table.clone(), keys.clone(), Some(*cause))
                }
                Op::AssignKeys { table, keys, .. } => (table.clone(), keys.clone(), None),
                other => panic!("{other:?}"),
            })
            .collect();
        let want = vec![
            ("a".to_owned(), vec![1, 2], Some(Release::Expired)),
            ("b".to_owned(), vec![3], Some(Release::Expired)),
            ("b".to_owned(), vec![4], Some(Release::Evicted)),
            ("b".to_owned(), vec![5], None),
            ("c".to_owned(), vec![6], None),
        ];
        assert_eq!(got, want);
    }
}
