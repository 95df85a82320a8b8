//! What one lookup reads of a table's delta: `DeltaView`, the rows written up to its snapshot's
//! version.

use super::*;

/// What a lookup reads of a live store's deltas: per table of the engine, its delta (`None`:
/// none), and the base and version of the reader's snapshot.
#[derive(Debug, Clone, Copy)]
pub struct DeltaView<'a> {
    tables: &'a [Option<Arc<TableDelta>>],
    /// Per table, a keyed table's key delta: keys given rows (a 4-byte row number, see
    /// [`crate::keyed::decode_row`]) or let go of since the base.
    keys: &'a [Option<Arc<TableDelta>>],
    base: u64,
    version: u64,
}

impl<'a> DeltaView<'a> {
    /// No delta: every row is the base's (a store that is not live).
    pub const NONE: DeltaView<'static> = DeltaView {
        tables: &[],
        keys: &[],
        base: 0,
        version: 0,
    };

    pub fn new(
        tables: &'a [Option<Arc<TableDelta>>],
        keys: &'a [Option<Arc<TableDelta>>],
        base: u64,
        version: u64,
    ) -> Self {
        Self {
            tables,
            keys,
            base,
            version,
        }
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Table `id`'s key delta, if it holds anything.
    pub(crate) fn keys(&self, id: usize) -> Option<&'a TableDelta> {
        self.keys.get(id)?.as_deref().filter(|d| !d.is_empty())
    }

    /// Table `id`'s delta, if it holds anything.
    fn table(&self, id: usize) -> Option<&'a TableDelta> {
        self.tables.get(id)?.as_deref().filter(|d| !d.is_empty())
    }

    /// The rows the delta holds for `indices[positions]` (ids in `0..rows`; others are left for
    /// the caller to refuse), as a patch with the positions that read them; `None` when it holds
    /// none of them.
    ///
    /// Every shard's read lock is taken, in order (a writer holds one shard at a time, so
    /// readers holding several cannot deadlock with it), and the lookups the filter lets through
    /// are found in two passes — index slots prefetched `AHEAD` lookups ahead and each entry's
    /// lines asked for as it is found, then the rows copied — so their cache misses overlap. A
    /// lock per shard touched, taken in order, needed the lookups sorted: that sort cost more
    /// than the 64 locks.
    pub(crate) fn patch(
        &self,
        id: usize,
        indices: Indices<'_>,
        positions: Range<usize>,
        rows: u64,
    ) -> Option<RowPatch> {
        let d = self.table(id)?;
        let rb = d.row_bytes();
        // (row, position, shard) of the lookups the filter lets through
        let maybe: Vec<(u64, usize, usize)> = positions
            .filter_map(|pos| {
                let r = u64::try_from(indices.get(pos)).ok()?;
                (r < rows && d.may_hold(r)).then(|| (r, pos, d.shard(r)))
            })
            .collect();
        if maybe.is_empty() {
            return None;
        }
        let shards: Vec<RwLockReadGuard<'_, Shard>> =
            (0..SHARDS).map(|s| d.read_shard(s)).collect();
        // pass 1: index slots ahead, entries found and their lines asked for
        let found: Vec<u32> = (0..maybe.len())
            .map(|i| {
                if let Some(&(r, _, s)) = maybe.get(i + AHEAD) {
                    shards[s].prefetch_slot(r);
                }
                let (r, _, s) = maybe[i];
                let shard = &shards[s];
                let e = shard.find(r).unwrap_or(NONE);
                if e != NONE {
                    shard.prefetch_entry(e, rb);
                }
                e
            })
            .collect();
        // pass 2: the rows the reader's version sees, each copied once
        let mut patch = RowPatch::with_capacity(rb, maybe.len());
        let mut read_at = Vec::with_capacity(maybe.len());
        for (&(r, pos, s), &e) in maybe.iter().zip(&found) {
            if e == NONE {
                continue;
            }
            if !patch.contains(r) {
                match shards[s].visible(e, self.base, self.version, rb) {
                    Some(bytes) => patch.set(r, bytes),
                    None => continue,
                }
            }
            read_at.push(pos);
        }
        drop(shards);
        if patch.is_empty() {
            return None;
        }
        patch.read_at(read_at);
        d.served.fetch_add(patch.len() as u64, Relaxed);
        d.removed_served.fetch_add(patch.removed(), Relaxed);
        Some(patch)
    }
}
