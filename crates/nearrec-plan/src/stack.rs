//! The LRU stack over row ids that both the stack-distance generator and the profiler walk.
//!
//! Each id sits at a position on a time line: ids never used yet at the front (in first-use
//! order), then used ids by the time of their last access. A Fenwick tree marks the occupied
//! positions, so "the d-th most recently used id" and "how many distinct ids were used since this
//! one" are both O(log n).

use crate::fenwick::Fenwick;

/// The generator's stack: a fixed set of ids, every access moves one to the back.
#[derive(Debug)]
pub(crate) struct LruStack {
    marks: Fenwick,
    /// The id at each position (`u32::MAX` when the position is empty).
    id_at: Vec<u32>,
    pos_of: Vec<usize>,
    /// The next free position at the back.
    next: usize,
}

impl LruStack {
    /// A stack of `ids` ids (`0..ids`, front to back) that will see at most `accesses` moves.
    pub(crate) fn new(ids: usize, accesses: usize) -> Self {
        let len = ids + accesses;
        let mut id_at = vec![u32::MAX; len];
        for (i, slot) in id_at[..ids].iter_mut().enumerate() {
            *slot = i as u32;
        }
        Self {
            marks: Fenwick::with_ones(len, ids),
            id_at,
            pos_of: (0..ids).collect(),
            next: ids,
        }
    }

    fn ids(&self) -> usize {
        self.pos_of.len()
    }

    /// Takes the id at stack distance `distance` (0: the front; d ≥ 1: the d-th most recently
    /// used, clamped to the stack's size) and moves it to the back. Returns the id.
    pub(crate) fn take(&mut self, distance: u64) -> u32 {
        let n = self.ids() as u64;
        let k = if distance == 0 {
            1
        } else {
            n + 1 - distance.min(n)
        };
        let pos = self.marks.find(k).expect("the stack holds every id");
        let id = self.id_at[pos];
        self.marks.add(pos, -1);
        self.marks.add(self.next, 1);
        self.id_at[self.next] = id;
        self.pos_of[id as usize] = self.next;
        self.next += 1;
        id
    }
}

/// The profiler's stack: ids appear as they are first seen; reports each access's distance.
#[derive(Debug)]
pub(crate) struct DistanceCounter {
    marks: Fenwick,
    /// Accesses so far (the next position).
    time: usize,
}

impl DistanceCounter {
    pub(crate) fn new(accesses: usize) -> Self {
        Self {
            marks: Fenwick::new(accesses),
            time: 0,
        }
    }

    /// Records an access whose id was last accessed at `last` (`None`: first reference) and
    /// returns its stack distance (0 for a first reference, 1 for a repeat of the previous id).
    pub(crate) fn access(&mut self, last: Option<usize>) -> u64 {
        let now = self.time;
        let distance = match last {
            None => 0,
            Some(p) => {
                let since = self.marks.prefix(now) - self.marks.prefix(p + 1);
                self.marks.add(p, -1);
                since + 1
            }
        };
        self.marks.add(now, 1);
        self.time += 1;
        distance
    }

    pub(crate) fn time(&self) -> usize {
        self.time
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_follows_a_plain_list() {
        let mut stack = LruStack::new(6, 40);
        let mut plain: Vec<u32> = (0..6).collect(); // front .. back
        for d in [0, 0, 1, 2, 0, 3, 1, 5, 0, 6, 9, 2, 4, 1, 0, 0, 0, 3] {
            let at = if d == 0 {
                0
            } else {
                plain.len() - (d as usize).min(plain.len())
            };
            let want = plain.remove(at);
            plain.push(want);
            assert_eq!(stack.take(d), want, "distance {d}");
        }
    }

    #[test]
    fn distances_match_a_plain_scan() {
        let trace = [3u32, 1, 3, 3, 2, 1, 7, 3, 2, 2, 1, 9, 7];
        let mut counter = DistanceCounter::new(trace.len());
        let mut last = std::collections::HashMap::new();
        for (t, &x) in trace.iter().enumerate() {
            let want = match last.get(&x) {
                None => 0,
                Some(&p) => {
                    let mut seen: Vec<u32> = trace[p + 1..t].to_vec();
                    seen.sort_unstable();
                    seen.dedup();
                    seen.len() as u64 + 1
                }
            };
            assert_eq!(counter.access(last.get(&x).copied()), want, "access {t}");
            last.insert(x, t);
        }
        assert_eq!(counter.time(), trace.len());
    }
}
