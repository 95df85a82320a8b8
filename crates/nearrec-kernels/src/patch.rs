//! Rows that stand in for a table's own in one pooling task: a live store's written and removed
//! rows (`docs/live.md`), gathered before the task from the delta at the task's version. A
//! [`TableView`](crate::TableView) given a patch reads a patched row from it and every other row
//! from the table, so the kernels and their reference twin pool both alike.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::job::{BagsOut, IndexError, PoolJob, RowIndex};
use crate::table::TableView;

/// Pools `job` with `patch`'s rows standing in for the table's: the bags that read a patched
/// row on the reference kernel, runs of the others on the fast one (a live store's delta
/// usually touches a few bags of a task; the fast row loop stays free of a patch test). The
/// touched bags come from the positions the patch recorded, or from every index when it
/// recorded none.
pub fn pool_bags_patched<I: RowIndex>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    patch: &RowPatch,
) -> Result<(), IndexError> {
    let bags = job.bags();
    let touched: Vec<bool> = if patch.read_at.is_empty() {
        (0..bags)
            .map(|b| {
                job.indices[job.bounds[b]..job.bounds[b + 1]]
                    .iter()
                    .any(|i| u64::try_from(i.to_i64()).is_ok_and(|r| patch.contains(r)))
            })
            .collect()
    } else {
        let mut touched = vec![false; bags];
        for &p in &patch.read_at {
            // the bag whose positions hold `p` (bounds ascend; empty bags hold none)
            let b = job.bounds.partition_point(|&s| s <= p).saturating_sub(1);
            if b < bags {
                touched[b] = true;
            }
        }
        touched
    };
    let mut b = 0;
    while b < bags {
        let e = b + touched[b..]
            .iter()
            .take_while(|&&t| t == touched[b])
            .count();
        let run = PoolJob {
            bounds: &job.bounds[b..=e],
            ..*job
        };
        let mut o = out.sub(b..e);
        if touched[b] {
            crate::reference::pool_bags_patched(table, &run, &mut o, patch)?;
        } else {
            crate::pool_bags(table, &run, &mut o)?;
        }
        b = e;
    }
    Ok(())
}

/// Rows by id: each is `row_bytes` of the table's encoding; a removed row is all zero bytes,
/// which every encoding decodes as zeros (int8's scale and bias included).
#[derive(Debug, Clone)]
pub struct RowPatch {
    row_bytes: usize,
    at: HashMap<u64, usize, BuildHasherDefault<RowHasher>>,
    data: Vec<u8>,
    removed: u64,
    /// Positions in the task's indices that read a patched row, when its maker recorded them
    /// ([`Self::read_at`]); empty: not recorded (the kernels look at every index).
    read_at: Vec<usize>,
}

impl RowPatch {
    pub fn new(row_bytes: usize) -> Self {
        Self {
            row_bytes,
            at: HashMap::default(),
            data: Vec::new(),
            removed: 0,
            read_at: Vec::new(),
        }
    }

    /// Records that the index at `position` (of the task's indices) reads a patched row: with
    /// every such position recorded, the kernels find the bags to patch without a look-up per
    /// index.
    pub fn read_at(&mut self, position: usize) {
        self.read_at.push(position);
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Rows patched.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Removed rows patched (as zero rows).
    pub fn removed(&self) -> u64 {
        self.removed
    }

    /// Row `row` reads as `bytes` (`None`: removed, a zero row). The first patch of a row stands.
    pub fn set(&mut self, row: u64, bytes: Option<&[u8]>) {
        if self.at.contains_key(&row) {
            return;
        }
        let at = self.data.len();
        match bytes {
            Some(b) => {
                assert_eq!(b.len(), self.row_bytes, "a patch row of the table's size");
                self.data.extend_from_slice(b);
            }
            None => {
                self.data.resize(at + self.row_bytes, 0);
                self.removed += 1;
            }
        }
        self.at.insert(row, at);
    }

    /// Whether `row` is patched (as [`Self::get`] without the bytes).
    pub fn contains(&self, row: u64) -> bool {
        self.at.contains_key(&row)
    }

    #[inline]
    pub fn get(&self, row: u64) -> Option<&[u8]> {
        let &at = self.at.get(&row)?;
        Some(&self.data[at..at + self.row_bytes])
    }
}

/// A row id mixed into a hash (splitmix64's finaliser): ids are often dense and sequential.
#[derive(Default)]
pub struct RowHasher(u64);

impl Hasher for RowHasher {
    fn finish(&self) -> u64 {
        let x = self.0;
        let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}
