//! The fast pooling path.
//!
//! Why it is fast: (1) for the common widths (`dim` in 8..=256, powers of two) the bag's
//! accumulator is a fixed-size array the compiler keeps in vector registers, so a bag reads each of
//! its rows once and writes its output row once; (2) rows `PREFETCH_AHEAD` lookups ahead are
//! prefetched, so several cache misses are in flight across bags as well as within them; (3) the
//! whole loop is compiled for AVX-512 and AVX2+FMA as well as the baseline and the best one is
//! chosen at run time. Decoding (fp16 / bf16 / fp8, int8 / int4 / int2) happens in registers.
//!
//! A task with a [`RowPatch`] (a live store's rows written since the table's file) runs the same
//! loop with a cursor over the positions that read a patched row: one compare per lookup, and the
//! patch's row instead of the table's where they meet. A task without one compiles without the
//! cursor.

use multiversion::multiversion;
use nearrec_format::DType;

use crate::job::{BagsOut, IndexError, PoolJob, PoolingMode, RowIndex};
use crate::patch::RowPatch;
use crate::source::{AHEAD, Lacked, RUN, RowRef, RowSource, SKIP};
use crate::table::TableView;

mod decode;

use decode::{Bf16, Decode, Fp8, Fp16, Fp32, Int2, Int4, Int8};

/// Lookups between a prefetch and its use: enough to keep ~16 misses in flight per core.
const PREFETCH_AHEAD: usize = 16;

/// Evaluates `$call` with the const `$w` set to `$dim` where the loops specialise that width (a
/// power of two in 8..=256), else to 0 (the width known only at run time).
macro_rules! by_width {
    ($dim:expr, $w:ident => $call:expr) => {
        match $dim {
            8 => {
                const $w: usize = 8;
                $call
            }
            16 => {
                const $w: usize = 16;
                $call
            }
            32 => {
                const $w: usize = 32;
                $call
            }
            64 => {
                const $w: usize = 64;
                $call
            }
            128 => {
                const $w: usize = 128;
                $call
            }
            256 => {
                const $w: usize = 256;
                $call
            }
            _ => {
                const $w: usize = 0;
                $call
            }
        }
    };
}

/// Pools every bag of `job` from `table` into `out`, bag `b` into `out.bag(b)`.
///
/// Matches `torch.nn.EmbeddingBag`: sum (optionally weighted), mean over the rows that are not
/// `padding_idx`, element-wise max; a bag with no counted rows gives zeros. Returns the first
/// out-of-range index met (bags before it are written, the rest are not).
pub fn pool_bags<I: RowIndex>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
) -> Result<(), IndexError> {
    dispatch::<I, false>(table, job, out, Patched::NONE)
}

/// [`pool_bags`] with `patch`'s rows standing in for the table's (a live store's written and
/// removed rows), at the positions the patch recorded ([`RowPatch::read_at`]) or, when it
/// recorded none, wherever an index names a patched row.
pub fn pool_bags_patched<I: RowIndex>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    patch: &RowPatch,
) -> Result<(), IndexError> {
    assert!(patch.is_empty() || patch.row_bytes() == table.row_bytes());
    let found;
    let at = if patch.read_positions().is_empty() {
        let (lo, hi) = (job.bounds[0], job.bounds[job.bags()]);
        found = (lo..hi)
            .filter(|&p| u64::try_from(job.indices[p].to_i64()).is_ok_and(|r| patch.contains(r)))
            .collect::<Vec<_>>();
        &found[..]
    } else {
        patch.read_positions()
    };
    debug_assert!(at.is_sorted(), "positions recorded in ascending order");
    dispatch::<I, true>(
        table,
        job,
        out,
        Patched {
            patch: Some(patch),
            at,
        },
    )
}

/// Pools each bag of `job` from the rows `source` finds into `out`, as far as it holds them:
/// a bag's cells get the reduction of its found rows (from zeros; max from `-inf`), not
/// finished; each lookup it lacked is pushed onto `lacked`, in order of position. The caller
/// reduces those rows into the same cells and then finishes each bag (mean's division, zeros
/// for an empty bag) by `counts[b]`: the rows bag `b` counts (padding excluded; rows the source
/// lacked included).
///
/// Indices are range-checked against `rows` as [`pool_bags`] checks them: the first bad one is
/// returned, bags before it are written. `dim` and `dtype` are the rows' (every row the source
/// gives is `dtype.row_bytes(dim)` long, fp32 rows 4-byte aligned).
#[allow(clippy::too_many_arguments)]
pub fn pool_found<I: RowIndex, S: RowSource>(
    dtype: DType,
    dim: usize,
    rows: u64,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    counts: &mut [usize],
    source: &S,
    lacked: &mut Vec<Lacked>,
) -> Result<(), IndexError> {
    debug_assert_eq!(out.bags(), job.bags());
    assert_eq!(counts.len(), job.bags());
    macro_rules! go {
        ($dec:ty) => {
            by_width!(dim, W => run_found::<I, S, $dec, W>(dim, rows, job, out, counts, source, lacked))
        };
    }
    match dtype {
        DType::Fp32 => go!(Fp32),
        DType::Fp16 => go!(Fp16),
        DType::Bf16 => go!(Bf16),
        DType::Int8 => go!(Int8),
        DType::Int4 => go!(Int4),
        DType::Int2 => go!(Int2),
        DType::Fp8 => go!(Fp8),
    }
}

/// The run of lookups [`pool_found`] has asked its source for: positions `first..first + len`,
/// their rows ([`SKIP`] for padding) and what the source found.
struct Found<'s> {
    first: usize,
    len: usize,
    rows: [u64; RUN],
    found: [Option<RowRef<'s>>; RUN],
    /// The rows of the run after the next one, as the source's hints.
    ahead: [u64; AHEAD],
}

impl<'s> Found<'s> {
    /// Asks `source` for the run from `pos` (up to [`RUN`] lookups, none past `end`), checking
    /// its indices first: a run stops before a bad index, and a run that would start at one is
    /// the error. The rows of the run after the next go along as hints, unchecked.
    #[inline(never)]
    fn next<I: RowIndex, S: RowSource>(
        &mut self,
        pos: usize,
        end: usize,
        rows: u64,
        job: &PoolJob<'_, I>,
        source: &'s S,
    ) -> Result<(), IndexError> {
        let padding = job.padding_idx.unwrap_or(SKIP);
        let indices = &job.indices[pos..pos + (end - pos).min(RUN)];
        // every index checked and taken, without a branch (the loop runs straight through);
        // a negative index wraps to a huge u64: one compare catches both
        let mut bad = false;
        for (&index, row) in indices.iter().zip(&mut self.rows) {
            let value = index.to_i64() as u64;
            bad |= value >= rows;
            *row = if value == padding { SKIP } else { value };
        }
        let mut len = indices.len();
        if bad {
            let i = indices
                .iter()
                .position(|&index| index.to_i64() as u64 >= rows)
                .expect("a bad index");
            if i == 0 {
                return Err(IndexError {
                    position: pos,
                    value: indices[0].to_i64(),
                });
            }
            len = i;
        }
        let after = (pos + len + RUN).min(end);
        let after = &job.indices[after..end.min(after + AHEAD)];
        for (row, &index) in self.ahead.iter_mut().zip(after) {
            *row = index.to_i64() as u64;
        }
        self.found[..len].fill(None);
        let (now, ahead) = (&self.rows[..len], &self.ahead[..after.len()]);
        source.resolve(pos, now, ahead, &mut self.found[..len]);
        (self.first, self.len) = (pos, len);
        Ok(())
    }
}

/// [`pool_found`]'s loop for one (dtype, width), `D == 0` as in [`run`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma+f16c"))]
fn run_found<I: RowIndex, S: RowSource, Dec: Decode, const D: usize>(
    dim: usize,
    rows: u64,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    counts: &mut [usize],
    source: &S,
    lacked: &mut Vec<Lacked>,
) -> Result<(), IndexError> {
    let mut run = Found {
        first: job.bounds[0],
        len: 0,
        rows: [0; RUN],
        found: [None; RUN],
        ahead: [0; AHEAD],
    };
    let end = job.bounds[job.bags()];
    for (b, count) in counts.iter_mut().enumerate() {
        let walk = (job.bounds[b], job.bounds[b + 1]);
        *count = if D == 0 {
            found_bag::<I, S, Dec>(
                rows,
                job,
                walk,
                b,
                end,
                source,
                &mut run,
                lacked,
                out.bag(b),
            )?
        } else {
            let mut fixed = [0f32; D];
            let count = found_bag::<I, S, Dec>(
                rows, job, walk, b, end, source, &mut run, lacked, &mut fixed,
            )?;
            out.bag(b).copy_from_slice(&fixed);
            count
        };
    }
    debug_assert!(D == 0 || D == dim);
    Ok(())
}

/// Reduces the found rows of bag `b` (`walk`: its positions) into `acc`, pushing the lookups
/// the source lacked onto `lacked`; returns the rows it counts. `end`: the job's last position.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn found_bag<'s, I: RowIndex, S: RowSource, Dec: Decode>(
    rows: u64,
    job: &PoolJob<'_, I>,
    (start, stop): (usize, usize),
    b: usize,
    end: usize,
    source: &'s S,
    run: &mut Found<'s>,
    lacked: &mut Vec<Lacked>,
    acc: &mut [f32],
) -> Result<usize, IndexError> {
    // every row a source finds is this long (its safety contract)
    let row_bytes = Dec::DTYPE.row_bytes(acc.len() as u32) as usize;
    macro_rules! walk {
        ($init:expr, |$row:ident, $pos:ident| $step:expr) => {{
            acc.fill($init);
            let mut skipped = 0;
            let mut pos = start;
            while pos < stop {
                if pos >= run.first + run.len {
                    run.next(pos, end, rows, job, source)?;
                }
                // the bag's lookups in this run, in a loop of their own: positions ascend, so
                // `first ≤ pos < first + len`, and `pos < stop`
                let (base, from) = (run.first, pos - run.first);
                let to = (stop - base).min(run.len);
                for (i, (&found, &row)) in run.found[from..to]
                    .iter()
                    .zip(&run.rows[from..to])
                    .enumerate()
                {
                    let $pos = pos + i;
                    match found {
                        Some(found) => {
                            // SAFETY: a found row is `row_bytes` long (`RowSource`'s contract)
                            let $row = unsafe { found.bytes(row_bytes) };
                            $step
                        }
                        None if row == SKIP => skipped += 1,
                        None => lacked.push((row, $pos, b)),
                    }
                }
                pos = base + to;
            }
            Ok(stop - start - skipped)
        }};
    }
    match (job.mode, job.weights) {
        (PoolingMode::Max, _) => walk!(f32::NEG_INFINITY, |row, _pos| Dec::max(row, acc)),
        (_, Some(w)) => walk!(0.0, |row, pos| Dec::axpy(row, w[pos], acc)),
        (_, None) => walk!(0.0, |row, _pos| Dec::add(row, acc)),
    }
}

/// The rows that stand in for the table's, and the ascending positions that read them.
#[derive(Clone, Copy)]
struct Patched<'p> {
    patch: Option<&'p RowPatch>,
    at: &'p [usize],
}

impl<'p> Patched<'p> {
    const NONE: Patched<'static> = Patched {
        patch: None,
        at: &[],
    };

    /// The positions from `start` on (what the walk from bag `start` follows).
    #[inline(always)]
    fn from(self, start: usize) -> &'p [usize] {
        &self.at[self.at.partition_point(|&p| p < start)..]
    }
}

fn dispatch<I: RowIndex, const PATCHED: bool>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    patched: Patched<'_>,
) -> Result<(), IndexError> {
    debug_assert_eq!(out.bags(), job.bags());
    let dim = table.dim();
    macro_rules! go {
        ($dec:ty, $dense:literal) => {
            by_width!(dim, W => run::<I, $dec, W, PATCHED, $dense>(table, job, out, patched))
        };
    }
    match (table.dtype(), table.is_dense()) {
        (DType::Fp32, true) => go!(Fp32, true),
        (DType::Fp16, true) => go!(Fp16, true),
        (DType::Bf16, true) => go!(Bf16, true),
        (DType::Int8, true) => go!(Int8, true),
        (DType::Int4, true) => go!(Int4, true),
        (DType::Int2, true) => go!(Int2, true),
        (DType::Fp8, true) => go!(Fp8, true),
        // row-wise quantised rows carry their scale and bias, so most widths leave a gap at
        // each block's end
        (DType::Int8, false) => go!(Int8, false),
        (DType::Int4, false) => go!(Int4, false),
        (DType::Int2, false) => go!(Int2, false),
        // float rows of a specialised width always fill their blocks: only an odd width leaves
        // a gap, and that width runs the run-time-width loop
        (DType::Fp32, false) => run::<I, Fp32, 0, PATCHED, false>(table, job, out, patched),
        (DType::Fp16, false) => run::<I, Fp16, 0, PATCHED, false>(table, job, out, patched),
        (DType::Bf16, false) => run::<I, Bf16, 0, PATCHED, false>(table, job, out, patched),
        (DType::Fp8, false) => run::<I, Fp8, 0, PATCHED, false>(table, job, out, patched),
    }
}

/// Byte offset of `row` in `table` (`row_bytes`: its rows' bytes, a constant where the width
/// is), `DENSE` as in [`run`].
#[inline(always)]
fn row_offset<const DENSE: bool>(table: &TableView<'_>, row_bytes: usize, row: u64) -> usize {
    if DENSE {
        (row as usize).wrapping_mul(row_bytes)
    } else {
        table.offset(row)
    }
}

/// Asks for the cache line holding `p`. Never faults, whatever `p`.
#[inline(always)]
pub fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Prefetches every cache line of the `row_bytes`-byte row at `p` (any address: never faults).
/// A row's first and last lines are asked for at once and a loop covers the lines between, so
/// a row of two lines (an fp32 row of width 32, a cache slot's head) costs two prefetches and
/// a compare even when its width is known only at run time (a cache's rows); with a
/// compile-time width the loop unrolls to straight-line code.
#[inline(always)]
pub fn prefetch_row(p: *const u8, row_bytes: usize) {
    if row_bytes.is_multiple_of(64) {
        // Rows of whole lines start on a line (the data region is block-aligned, a cache's or a
        // hot partition's rows sit at multiples of their size in aligned buffers), so the row
        // is exactly these lines.
        if row_bytes == 0 {
            return;
        }
        prefetch_line(p);
        prefetch_line(p.wrapping_add(row_bytes - 64));
        let mut line = 64;
        while line + 64 < row_bytes {
            prefetch_line(p.wrapping_add(line));
            line += 64;
        }
    } else if row_bytes <= 64 {
        // At most two lines: the first byte's and the last byte's.
        prefetch_line(p);
        prefetch_line(p.wrapping_add(row_bytes - 1));
    } else {
        let last = p.wrapping_add(row_bytes - 1) as usize & !63;
        let mut line = p as usize & !63;
        while line <= last {
            prefetch_line(p.wrapping_add(line.wrapping_sub(p as usize)));
            line += 64;
        }
    }
}

/// The bag loop for one (dtype, width). `D == 0` means "width known only at run time": the
/// accumulator is then the output row itself. `PATCHED`: `patched` stands in for some rows.
/// `DENSE`: the table's rows are back to back ([`TableView::is_dense`]), so a row's offset is
/// one multiply (a shift at a specialised width) instead of a division.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma+f16c"))]
fn run<I: RowIndex, Dec: Decode, const D: usize, const PATCHED: bool, const DENSE: bool>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    patched: Patched<'_>,
) -> Result<(), IndexError> {
    let mut at = if PATCHED {
        patched.from(job.bounds[0])
    } else {
        &[]
    };
    // The first lookups' rows, asked for before the loop (which asks `PREFETCH_AHEAD` ahead of
    // itself), and their offsets kept as the loop keeps the ones it prefetches (see `reduce`).
    let mut ring = [0usize; PREFETCH_AHEAD];
    let (first, last) = (job.bounds[0], job.bounds[job.bags()].min(job.indices.len()));
    for pos in first..last.min(first + PREFETCH_AHEAD) {
        let offset =
            row_offset::<DENSE>(table, table.row_bytes(), job.indices[pos].to_i64() as u64);
        ring[pos % PREFETCH_AHEAD] = offset;
        prefetch_row(table.addr_at(offset), table.row_bytes());
    }
    for b in 0..job.bags() {
        let (start, end) = (job.bounds[b], job.bounds[b + 1]);
        let walk = Walk {
            start,
            end,
            patch: patched.patch,
        };
        if D == 0 {
            let dst = out.bag(b);
            let count =
                accumulate::<I, Dec, D, PATCHED, DENSE>(table, job, walk, &mut at, &mut ring, dst)?;
            finish(job.mode, count, dst);
        } else {
            // A fresh accumulator per bag: dead on the error path, so the compiler keeps it in
            // registers through the row loop instead of storing it back after every row.
            let mut fixed = [0f32; D];
            let count = accumulate::<I, Dec, D, PATCHED, DENSE>(
                table, job, walk, &mut at, &mut ring, &mut fixed,
            )?;
            finish(job.mode, count, &mut fixed);
            out.bag(b).copy_from_slice(&fixed);
        }
    }
    Ok(())
}

/// One bag's walk: `indices[start..end]`, and the patch its patched positions read.
#[derive(Clone, Copy)]
struct Walk<'p> {
    start: usize,
    end: usize,
    patch: Option<&'p RowPatch>,
}

/// Reduces the rows of the walk's bag into `acc`; returns how many were counted. `at`: the
/// patched positions not yet walked (empty unless `PATCHED`).
#[inline(always)]
fn accumulate<I: RowIndex, Dec: Decode, const D: usize, const PATCHED: bool, const DENSE: bool>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    walk: Walk<'_>,
    at: &mut &[usize],
    ring: &mut [usize; PREFETCH_AHEAD],
    acc: &mut [f32],
) -> Result<usize, IndexError> {
    // One specialised loop per reduction and per padding / no padding, so the per-lookup body has
    // no mode branch and, in the common case, no padding compare.
    // Bytes of one row: a constant when the width is known at compile time, so the prefetch
    // unrolls.
    let row_bytes = if D == 0 {
        table.row_bytes()
    } else {
        Dec::DTYPE.row_bytes(D as u32) as usize
    };
    macro_rules! walk {
        ($step:expr) => {
            if job.padding_idx.is_some() {
                reduce::<I, true, PATCHED, DENSE>(table, job, row_bytes, walk, at, ring, $step)
            } else {
                reduce::<I, false, PATCHED, DENSE>(table, job, row_bytes, walk, at, ring, $step)
            }
        };
    }
    // A dtype whose decoding is large has its step inlined by force: left out of line, the
    // step would be compiled without the loop's target features (its `mul_add` a call to
    // `fmaf`). Forcing it for the float dtypes instead stops the vectoriser keeping their
    // accumulator in vector registers, so they keep the compiler's choice.
    macro_rules! step {
        (|$row:ident, $pos:tt| $body:expr) => {
            if Dec::INLINE_STEP {
                walk!(
                    #[inline(always)]
                    |$row: &[u8], $pos: usize| $body
                )
            } else {
                walk!(|$row: &[u8], $pos: usize| $body)
            }
        };
    }
    match (job.mode, job.weights) {
        (PoolingMode::Max, _) => {
            acc.fill(f32::NEG_INFINITY);
            step!(|row, _| Dec::max(row, acc))
        }
        (_, Some(w)) => {
            acc.fill(0.0);
            step!(|row, pos| Dec::axpy(row, w[pos], acc))
        }
        (_, None) => {
            acc.fill(0.0);
            step!(|row, _| Dec::add(row, acc))
        }
    }
}

/// Walks one bag: range-checks each index, skips padding (when `PAD`), prefetches the row
/// `PREFETCH_AHEAD` lookups ahead and hands each row (with its position) to `step` — the
/// patch's row at the next position of `at` (when `PATCHED`), else the table's. Returns the
/// rows counted.
///
/// The body is kept short on purpose: the loop is bound by memory latency, and the fewer
/// instructions a lookup takes, the more lookups the out-of-order window holds in flight. So a
/// row's offset in a table with gaps (a division, as a multiply by the inverse, and a
/// remainder) is worked out once, when its row is prefetched, and kept in `ring` (at its
/// position modulo `PREFETCH_AHEAD`) until the loop reaches it; back-to-back rows' offsets are
/// one multiply and not kept.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn reduce<I: RowIndex, const PAD: bool, const PATCHED: bool, const DENSE: bool>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    row_bytes: usize,
    walk: Walk<'_>,
    at: &mut &[usize],
    ring: &mut [usize; PREFETCH_AHEAD],
    mut step: impl FnMut(&[u8], usize),
) -> Result<usize, IndexError> {
    let (start, end) = (walk.start, walk.end);
    let rows = table.rows();
    debug_assert!(row_bytes == table.row_bytes() && DENSE == table.is_dense());
    let offset = |row: u64| row_offset::<DENSE>(table, row_bytes, row);
    // Prefetch only within this job's indices.
    let prefetch_end = job.bounds[job.bags()]
        .min(job.indices.len())
        .saturating_sub(PREFETCH_AHEAD);
    let padding = job.padding_idx.unwrap_or(u64::MAX);
    let mut skipped = 0usize;
    for (pos, ix) in job.indices[start..end]
        .iter()
        .enumerate()
        .map(|(k, ix)| (start + k, ix))
    {
        // this lookup's offset, kept when its row was prefetched (a table with gaps)
        let kept = ring[pos % PREFETCH_AHEAD];
        if pos < prefetch_end {
            // SAFETY: pos + PREFETCH_AHEAD < indices.len() by `prefetch_end`.
            let ahead = unsafe { job.indices.get_unchecked(pos + PREFETCH_AHEAD) }.to_i64();
            // An out-of-range index prefetches a meaningless address, which is harmless; it is
            // reported when the loop reaches it.
            let ahead = offset(ahead as u64);
            if !DENSE {
                ring[pos % PREFETCH_AHEAD] = ahead;
            }
            prefetch_row(table.addr_at(ahead), row_bytes);
        }
        let patched = PATCHED && at.first() == Some(&pos);
        if patched {
            *at = &at[1..];
        }
        let value = ix.to_i64();
        // A negative index wraps to a huge u64, so one compare catches both cases.
        if value as u64 >= rows {
            return Err(IndexError {
                position: pos,
                value,
            });
        }
        if PAD && value as u64 == padding {
            skipped += 1;
            continue;
        }
        let at_row = if DENSE { offset(value as u64) } else { kept };
        debug_assert_eq!(at_row, offset(value as u64));
        // SAFETY: `value < rows`, checked above, so `at_row` (its offset) is inside the
        // table, and `row_bytes` is the table's.
        let own = || unsafe { table.row_at(at_row, row_bytes) };
        let row = if patched {
            // a position recorded for a row the patch lacks reads the table (never stale: the
            // patch holds every row that differs)
            walk.patch
                .and_then(|p| p.get(value as u64))
                .unwrap_or_else(own)
        } else {
            own()
        };
        step(row, pos);
    }
    Ok(end - start - skipped)
}

/// Turns an accumulator into the bag's result: zeros for an empty bag, divided by the count for
/// mean (as EmbeddingBag divides, not multiplies by a reciprocal).
#[inline(always)]
fn finish(mode: PoolingMode, count: usize, acc: &mut [f32]) {
    if count == 0 {
        acc.fill(0.0);
    } else if mode == PoolingMode::Mean {
        let n = count as f32;
        acc.iter_mut().for_each(|a| *a /= n);
    }
}
