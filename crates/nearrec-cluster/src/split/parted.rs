//! A table's ids routed to the parts that hold them (`Parted`): each id range-checked, made a
//! part's local row, its bag's length and weight kept per part.

use super::*;

pub(super) fn out_of_range(
    lookup: &TableLookup<'_>,
    position: usize,
    bag: usize,
    rows: u64,
) -> EngineError {
    EngineError::IndexOutOfRange {
        table: lookup.table.to_owned(),
        position,
        bag,
        value: lookup.indices.get(position),
        rows,
    }
}

/// Bag `b`'s `dim` columns from `c` on in the pooled answer `p`.
pub(super) fn row((p, c): (&Pooled, usize), b: usize, dim: usize) -> &[f32] {
    &p.values[b * p.width() + c..][..dim]
}

/// Positions `from .. to` of a table's ids: bag `index`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bag {
    pub(super) from: usize,
    pub(super) to: usize,
    pub(super) index: usize,
}

/// The part holding row `id` of a table whose parts after the first start at `firsts`.
#[inline]
pub(super) fn part_at(firsts: &[u64], id: u64) -> usize {
    if firsts.len() <= 16 {
        // branch-free over a few parts
        firsts.iter().map(|&f| usize::from(f <= id)).sum()
    } else {
        firsts.partition_point(|&f| f <= id)
    }
}

/// Routes bag `bag` of a table without hot rows: each id range-checked and sent to the part
/// that holds it as a local row (generic over the ids' width, so that the loop is tight).
pub(super) fn plain<T: Copy + Into<i64>>(
    all: &[T],
    bag: Bag,
    lookup: &TableLookup<'_>,
    table: &ShardedTable,
    firsts: &[u64],
    padding: Option<u64>,
    out: &mut Parted,
) -> Result<(), EngineError> {
    let rows = table.rows;
    for (j, &id) in (bag.from..bag.to).zip(&all[bag.from..bag.to]) {
        let id: i64 = id.into();
        if id < 0 || id as u64 >= rows {
            return Err(out_of_range(lookup, j, bag.index, rows));
        }
        let id = id as u64;
        if Some(id) == padding {
            continue;
        }
        let p = part_at(firsts, id);
        let first = if p == 0 { 0 } else { firsts[p - 1] };
        let weight = lookup.per_sample_weights.map_or(0.0, |w| w[j]);
        out.put(p, bag.index, (id - first) as i64, weight);
    }
    Ok(())
}

/// A split table's rows routed so far, part by part: local rows, each part's bag lengths and
/// weights, each bag's count, and the parts the bag under way reached.
pub(super) struct Parted {
    pub(super) ids: Vec<Vec<i64>>,
    pub(super) lengths: Vec<Vec<i64>>,
    pub(super) weights: Vec<Vec<f32>>,
    weighted: bool,
    pub(super) counts: Vec<u32>,
    /// Per part, the bag (+ 1) it last took an id of.
    stamp: Vec<usize>,
    reached: u64,
    /// A keyed table's: per part, the caller's position of each id.
    pub(super) positions: Option<Vec<Vec<usize>>>,
}

impl Parted {
    /// Room for `n` ids over `parts` parts (an even share each, and some).
    pub(super) fn new(parts: usize, bags: usize, n: usize, weighted: bool) -> Self {
        let room = n / parts + n / (4 * parts) + 16;
        Parted {
            ids: (0..parts).map(|_| Vec::with_capacity(room)).collect(),
            lengths: vec![vec![0; bags]; parts],
            weights: (0..parts)
                .map(|_| Vec::with_capacity(if weighted { room } else { 0 }))
                .collect(),
            weighted,
            counts: vec![0; bags],
            stamp: vec![0; parts],
            reached: 0,
            positions: None,
        }
    }

    #[inline]
    pub(super) fn put(&mut self, part: usize, bag: usize, local: i64, weight: f32) {
        self.ids[part].push(local);
        self.lengths[part][bag] += 1;
        if self.weighted {
            self.weights[part].push(weight);
        }
        self.counts[bag] += 1;
        if self.stamp[part] != bag + 1 {
            self.stamp[part] = bag + 1;
            self.reached += 1;
        }
    }

    /// The parts the bag just routed reached.
    pub(super) fn end_bag(&mut self) -> u64 {
        std::mem::take(&mut self.reached)
    }
}
