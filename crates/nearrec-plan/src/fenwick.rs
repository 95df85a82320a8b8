//! A Fenwick (binary indexed) tree of counts: point updates, prefix sums and "the position of the
//! k-th mark", each O(log n). It is what keeps the LRU stack of the generator and the profiler
//! logarithmic per access (a list scan is O(n)).

#[derive(Debug, Clone)]
pub(crate) struct Fenwick {
    tree: Vec<u32>,
    /// The largest power of two ≤ the length (the first step of the descent in `find`).
    top: usize,
}

impl Fenwick {
    pub(crate) fn new(len: usize) -> Self {
        let top = if len == 0 { 0 } else { 1 << len.ilog2() };
        Self {
            tree: vec![0; len + 1],
            top,
        }
    }

    /// A tree whose first `ones` positions hold 1 (built in O(n)).
    pub(crate) fn with_ones(len: usize, ones: usize) -> Self {
        let mut f = Self::new(len);
        f.tree[1..=ones.min(len)].fill(1);
        for i in 1..=len {
            let parent = i + (i & i.wrapping_neg());
            if parent <= len {
                f.tree[parent] += f.tree[i];
            }
        }
        f
    }

    pub(crate) fn len(&self) -> usize {
        self.tree.len() - 1
    }

    /// Adds `delta` (±1) at `pos` (0-based).
    pub(crate) fn add(&mut self, pos: usize, delta: i32) {
        let mut i = pos + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// The sum of positions `0..end`.
    pub(crate) fn prefix(&self, end: usize) -> u64 {
        let mut i = end;
        let mut sum = 0u64;
        while i > 0 {
            sum += u64::from(self.tree[i]);
            i &= i - 1;
        }
        sum
    }

    /// The position of the `k`-th mark (1-based `k`), counting from position 0; `None` when fewer
    /// than `k` positions are marked.
    pub(crate) fn find(&self, k: u64) -> Option<usize> {
        if k == 0 {
            return None;
        }
        let (mut at, mut left) = (0usize, k);
        let mut step = self.top;
        while step > 0 {
            let next = at + step;
            if next < self.tree.len() && u64::from(self.tree[next]) < left {
                at = next;
                left -= u64::from(self.tree[next]);
            }
            step >>= 1;
        }
        (at < self.len()).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_find_agree_with_a_plain_vector() {
        let mut f = Fenwick::with_ones(37, 5);
        let mut plain = [0u32; 37];
        plain[..5].fill(1);
        for (pos, delta) in [
            (3, -1),
            (20, 1),
            (36, 1),
            (0, -1),
            (7, 1),
            (20, -1),
            (30, 1),
        ] {
            f.add(pos, delta);
            plain[pos] = plain[pos].wrapping_add_signed(delta);
        }
        for end in 0..=37 {
            assert_eq!(
                f.prefix(end),
                plain[..end].iter().map(|&v| u64::from(v)).sum::<u64>()
            );
        }
        let marks: Vec<usize> = (0..37).filter(|&i| plain[i] == 1).collect();
        for (k, &pos) in marks.iter().enumerate() {
            assert_eq!(f.find(k as u64 + 1), Some(pos));
        }
        assert_eq!(f.find(marks.len() as u64 + 1), None);
        assert_eq!(f.find(0), None);
    }
}
