//! Pooling with a patch (`docs/live.md`): the bags of a task that read a patched row on the
//! reference twin, the runs of bags between them on the fast kernels.

use crate::job::{BagsOut, IndexError, PoolJob, RowIndex};
use crate::patch::RowPatch;
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
    let touched: Vec<bool> = if patch.read_positions().is_empty() {
        (0..bags)
            .map(|b| {
                job.indices[job.bounds[b]..job.bounds[b + 1]]
                    .iter()
                    .any(|i| u64::try_from(i.to_i64()).is_ok_and(|r| patch.contains(r)))
            })
            .collect()
    } else {
        let mut touched = vec![false; bags];
        for &p in patch.read_positions() {
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
