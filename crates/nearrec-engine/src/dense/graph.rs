//! A model's dense part as a small program of operations the engine runs, for models outside the
//! families of `model.rs` (a TorchRec DLRM, a user's own model captured by `torch.export`):
//! linear layers with their activations, element-wise activations, sums and products,
//! concatenation (an op's input is a list of column slices), and DLRM's pairwise dot products.
//!
//! Values are `[batch, width]` row-major matrices numbered in order: 0 the dense features, 1 the
//! pooled inputs side by side (input `k` at its columns), then one per op. The program is cut as
//! the families are: ops that need no input table run beside the reads (`early_dense`), each
//! table's slice of every linear layer that reads it directly is multiplied as soon as its rows
//! are in (`early_table`), and the rest runs when all are in (`finish`).

use std::borrow::Cow;
use std::ops::Range;

use super::{Activation, Linear, ModelError};

/// Columns `cols` of value `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub value: usize,
    pub cols: Range<usize>,
}

/// One operation; an input given as several slices is their concatenation.
#[derive(Debug, Clone)]
pub enum Op {
    /// `input Wᵀ + b`, then the layer's activation.
    Linear { input: Vec<Slice>, layer: Linear },
    /// An activation on its own.
    Activation {
        input: Vec<Slice>,
        activation: Activation,
    },
    /// Element-wise `a + b`.
    Add { a: Vec<Slice>, b: Vec<Slice> },
    /// Element-wise `a · b`.
    Mul { a: Vec<Slice>, b: Vec<Slice> },
    /// Per sample, the dot products of `vectors[i]` and `vectors[j]` for each `(i, j)` of
    /// `pairs`, in that order (DLRM's interaction, in any pair order).
    Dots {
        vectors: Vec<Vec<Slice>>,
        pairs: Vec<(usize, usize)>,
    },
}

/// Where a linear layer's input columns come from once the graph is cut.
#[derive(Debug, Clone)]
enum Piece {
    /// A value known before any table is in.
    Early(Slice),
    /// Columns `cols` of input table `k`'s block.
    Table(usize, Range<usize>),
    /// Anything else, multiplied in `finish`.
    Late(Slice),
}

/// A dense part as a program ([`super::DenseModel::graph`]).
#[derive(Debug, Clone)]
pub struct Graph {
    dense: usize,
    dims: Vec<usize>,
    ops: Vec<Op>,
    output: Vec<Slice>,
    widths: Vec<usize>,
    /// Per op: whether it needs no input table (it runs in `early_dense`).
    early: Vec<bool>,
    /// Per linear op that needs a table: its input pieces, each at its first input column.
    pieces: Vec<Option<Vec<(usize, Piece)>>>,
    /// Per input table: the ops that read it directly, in op order.
    feeds: Vec<Vec<usize>>,
}

/// What the dense features give on their own: every early op's value, the dense features
/// themselves, and each late linear op's partial product.
#[derive(Debug, Default)]
pub(crate) struct GraphEarly {
    values: Vec<Vec<f32>>,
    partial: Vec<Vec<f32>>,
}

impl Graph {
    /// Checks the program: every slice within a value defined before it, widths that agree, a
    /// non-empty output.
    pub fn new(
        dense: usize,
        dims: Vec<usize>,
        ops: Vec<Op>,
        output: Vec<Slice>,
    ) -> Result<Self, ModelError> {
        if let Some(k) = dims.iter().position(|&d| d == 0) {
            return Err(ModelError(format!("input {k} has dim 0")));
        }
        let mut widths = vec![dense, dims.iter().sum()];
        let mut early = Vec::with_capacity(ops.len());
        let needs_tables = |slices: &[Slice], early: &[bool]| {
            slices
                .iter()
                .any(|s| s.value == 1 || (s.value >= 2 && !early[s.value - 2]))
        };
        for (i, op) in ops.iter().enumerate() {
            let at = |what: &str, slices: &[Slice]| width(&widths, slices, i, what);
            let w = match op {
                Op::Linear { input, layer } => {
                    let w = at("input", input)?;
                    if w != layer.inputs() {
                        return Err(ModelError(format!(
                            "op {i}: the layer takes {} inputs, its input has {w} columns",
                            layer.inputs()
                        )));
                    }
                    layer.outputs()
                }
                Op::Activation { input, .. } => at("input", input)?,
                Op::Add { a, b } | Op::Mul { a, b } => {
                    let (wa, wb) = (at("a", a)?, at("b", b)?);
                    if wa != wb {
                        return Err(ModelError(format!(
                            "op {i}: element-wise operands of {wa} and {wb} columns"
                        )));
                    }
                    wa
                }
                Op::Dots { vectors, pairs } => {
                    let ws = vectors
                        .iter()
                        .map(|v| at("vector", v))
                        .collect::<Result<Vec<_>, _>>()?;
                    if ws.windows(2).any(|p| p[0] != p[1]) {
                        return Err(ModelError(format!(
                            "op {i}: dot products of vectors of widths {ws:?}"
                        )));
                    }
                    if let Some(&(a, b)) = pairs.iter().find(|&&(a, b)| a.max(b) >= ws.len()) {
                        return Err(ModelError(format!(
                            "op {i}: pair ({a}, {b}) of {} vectors",
                            ws.len()
                        )));
                    }
                    if pairs.is_empty() {
                        return Err(ModelError(format!("op {i}: no pairs")));
                    }
                    pairs.len()
                }
            };
            let e = !op_inputs(op).any(|s| needs_tables(s, &early));
            early.push(e);
            widths.push(w);
        }
        width(&widths, &output, ops.len(), "output")?;
        if output.is_empty() {
            return Err(ModelError("the model has no outputs".into()));
        }
        let mut starts = vec![0];
        starts.extend(dims.iter().scan(0, |at, d| {
            *at += d;
            Some(*at)
        }));
        let mut feeds = vec![Vec::new(); dims.len()];
        let pieces = ops
            .iter()
            .enumerate()
            .map(|(i, op)| match op {
                Op::Linear { input, .. } if !early[i] => {
                    let mut out = Vec::new();
                    let mut col = 0;
                    for s in input {
                        if s.value == 1 {
                            // cut at table boundaries: each piece is one table's
                            for (k, w) in starts.windows(2).enumerate() {
                                let (lo, hi) = (s.cols.start.max(w[0]), s.cols.end.min(w[1]));
                                if lo < hi {
                                    out.push((
                                        col + lo - s.cols.start,
                                        Piece::Table(k, lo - w[0]..hi - w[0]),
                                    ));
                                    if feeds[k].last() != Some(&i) {
                                        feeds[k].push(i);
                                    }
                                }
                            }
                        } else if s.value == 0 || early[s.value - 2] {
                            out.push((col, Piece::Early(s.clone())));
                        } else {
                            out.push((col, Piece::Late(s.clone())));
                        }
                        col += s.cols.len();
                    }
                    Some(out)
                }
                _ => None,
            })
            .collect();
        Ok(Self {
            dense,
            dims,
            ops,
            output,
            widths,
            early,
            pieces,
            feeds,
        })
    }

    pub fn dense_width(&self) -> usize {
        self.dense
    }

    pub fn table_dims(&self) -> Vec<usize> {
        self.dims.clone()
    }

    pub fn outputs(&self) -> usize {
        self.output.iter().map(|s| s.cols.len()).sum()
    }

    /// The ops that need no table, and the dense-fed share of each linear op that does.
    pub(crate) fn early_dense(&self, dense: &[f32], batch: usize) -> GraphEarly {
        let mut values = vec![dense.to_vec(), Vec::new()];
        let mut partial = Vec::with_capacity(self.ops.len());
        for (i, op) in self.ops.iter().enumerate() {
            let (value, part) = if self.early[i] {
                (self.run(op, &values, batch), Vec::new())
            } else if let (Op::Linear { layer, .. }, Some(pieces)) = (op, &self.pieces[i]) {
                let mut y = vec![0f32; batch * layer.outputs()];
                for (col, piece) in pieces {
                    if let Piece::Early(s) = piece {
                        self.accumulate(layer, &values, s, *col, batch, &mut y);
                    }
                }
                (Vec::new(), y)
            } else {
                (Vec::new(), Vec::new())
            };
            values.push(value);
            partial.push(part);
        }
        GraphEarly { values, partial }
    }

    /// Input table `k`'s share of each linear op that reads it directly, side by side in op
    /// order, from its pooled block (`[batch, dims[k]]`).
    pub(crate) fn early_table(&self, k: usize, block: &[f32], batch: usize) -> Option<Vec<f32>> {
        if self.feeds[k].is_empty() {
            return None;
        }
        let mut out = Vec::new();
        for &i in &self.feeds[k] {
            let (Op::Linear { layer, .. }, Some(pieces)) = (&self.ops[i], &self.pieces[i]) else {
                unreachable!("only linear ops are fed")
            };
            let mut y = vec![0f32; batch * layer.outputs()];
            for (col, piece) in pieces {
                if let Piece::Table(t, cols) = piece
                    && *t == k
                {
                    layer.accumulate(
                        &block[cols.start..],
                        self.dims[k],
                        *col..*col + cols.len(),
                        batch,
                        &mut y,
                    );
                }
            }
            out.extend(y);
        }
        Some(out)
    }

    /// The rest, tables' shares summed in table order (so the result does not depend on which
    /// read landed first); `pooled` is `[batch, Σ dims]`.
    pub(crate) fn finish(
        &self,
        early: GraphEarly,
        parts: Vec<Option<Vec<f32>>>,
        pooled: &[f32],
        batch: usize,
    ) -> Vec<f32> {
        let GraphEarly {
            values,
            mut partial,
        } = early;
        // the pooled inputs read where they lie, not copied
        let mut values: Vec<Cow<'_, [f32]>> = values.into_iter().map(Cow::Owned).collect();
        values[1] = Cow::Borrowed(pooled);
        // where each table's share of each op starts in its part
        let mut at = vec![0usize; self.dims.len()];
        for (i, op) in self.ops.iter().enumerate() {
            if self.early[i] {
                continue;
            }
            let value = match (op, &self.pieces[i]) {
                (Op::Linear { layer, .. }, Some(pieces)) => {
                    let mut y = std::mem::take(&mut partial[i]);
                    let n = batch * layer.outputs();
                    for (k, part) in parts.iter().enumerate() {
                        if let Some(part) = part
                            && self.feeds[k].contains(&i)
                        {
                            y.iter_mut()
                                .zip(&part[at[k]..at[k] + n])
                                .for_each(|(a, b)| *a += b);
                            at[k] += n;
                        }
                    }
                    for (col, piece) in pieces {
                        if let Piece::Late(s) = piece {
                            self.accumulate(layer, &values, s, *col, batch, &mut y);
                        }
                    }
                    layer.finish(&mut y);
                    y
                }
                _ => self.run(op, &values, batch),
            };
            values[i + 2] = Cow::Owned(value);
        }
        self.gather(&values, &self.output, batch)
    }

    /// One op whole, from computed values.
    fn run<V: AsRef<[f32]>>(&self, op: &Op, values: &[V], batch: usize) -> Vec<f32> {
        match op {
            Op::Linear { input, layer } => {
                let mut y = vec![0f32; batch * layer.outputs()];
                let mut col = 0;
                for s in input {
                    self.accumulate(layer, values, s, col, batch, &mut y);
                    col += s.cols.len();
                }
                layer.finish(&mut y);
                y
            }
            Op::Activation { input, activation } => {
                let mut y = self.gather(values, input, batch);
                activation.apply(&mut y);
                y
            }
            Op::Add { a, b } | Op::Mul { a, b } => {
                let mut y = self.gather(values, a, batch);
                let b = self.gather(values, b, batch);
                if matches!(op, Op::Add { .. }) {
                    y.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                } else {
                    y.iter_mut().zip(&b).for_each(|(x, y)| *x *= y);
                }
                y
            }
            Op::Dots { vectors, pairs } => {
                let vs: Vec<Vec<f32>> = vectors
                    .iter()
                    .map(|v| self.gather(values, v, batch))
                    .collect();
                let d = vs[0].len() / batch.max(1);
                let mut y = Vec::with_capacity(batch * pairs.len());
                for b in 0..batch {
                    for &(i, j) in pairs {
                        let (x, z) = (&vs[i][b * d..][..d], &vs[j][b * d..][..d]);
                        y.push(x.iter().zip(z).map(|(p, q)| p * q).sum());
                    }
                }
                y
            }
        }
    }

    /// Slice `s` of a computed value times the layer's input columns from `col`, into `y`.
    fn accumulate<V: AsRef<[f32]>>(
        &self,
        layer: &Linear,
        values: &[V],
        s: &Slice,
        col: usize,
        batch: usize,
        y: &mut [f32],
    ) {
        let v = values[s.value].as_ref();
        layer.accumulate(
            &v[s.cols.start..],
            self.widths[s.value],
            col..col + s.cols.len(),
            batch,
            y,
        );
    }

    /// The slices side by side, `[batch, Σ widths]`.
    fn gather<V: AsRef<[f32]>>(&self, values: &[V], slices: &[Slice], batch: usize) -> Vec<f32> {
        let w: usize = slices.iter().map(|s| s.cols.len()).sum();
        let mut y = Vec::with_capacity(batch * w);
        for b in 0..batch {
            for s in slices {
                let row = b * self.widths[s.value];
                y.extend_from_slice(
                    &values[s.value].as_ref()[row + s.cols.start..row + s.cols.end],
                );
            }
        }
        y
    }
}

/// The slices an op reads.
fn op_inputs(op: &Op) -> Box<dyn Iterator<Item = &[Slice]> + '_> {
    match op {
        Op::Linear { input, .. } | Op::Activation { input, .. } => {
            Box::new(std::iter::once(input.as_slice()))
        }
        Op::Add { a, b } | Op::Mul { a, b } => Box::new([a.as_slice(), b.as_slice()].into_iter()),
        Op::Dots { vectors, .. } => Box::new(vectors.iter().map(Vec::as_slice)),
    }
}

/// The width of slices side by side, each within a value defined before op `i`.
fn width(widths: &[usize], slices: &[Slice], i: usize, what: &str) -> Result<usize, ModelError> {
    let mut w = 0;
    for s in slices {
        let Some(&have) = widths.get(s.value) else {
            return Err(ModelError(format!(
                "op {i}: its {what} reads value {}, which is not defined before it",
                s.value
            )));
        };
        if s.cols.start >= s.cols.end || s.cols.end > have {
            return Err(ModelError(format!(
                "op {i}: its {what} reads columns {:?} of value {} ({have} wide)",
                s.cols, s.value
            )));
        }
        w += s.cols.len();
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::super::{DenseModel, Interaction, Mlp};
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32)
            .map(|v| v / (1u32 << 24) as f32 - 0.5)
            .collect()
    }

    fn layer(inputs: usize, outputs: usize, act: Activation, seed: u32) -> Linear {
        Linear::new(
            values(inputs * outputs, seed),
            values(outputs, seed + 1),
            outputs,
            inputs,
            act,
        )
        .unwrap()
    }

    fn s(value: usize, cols: Range<usize>) -> Slice {
        Slice { value, cols }
    }

    /// The program run op after op on whole values: what the cut must equal.
    fn whole(g: &Graph, dense: &[f32], pooled: &[f32], batch: usize) -> Vec<f32> {
        let mut vals = vec![dense.to_vec(), pooled.to_vec()];
        for op in &g.ops {
            let v = g.run(op, &vals, batch);
            vals.push(v);
        }
        g.gather(&vals, &g.output, batch)
    }

    /// The cut as the engine schedules it: dense first, tables in reverse, then the rest.
    fn cut(g: &Graph, dense: &[f32], pooled: &[f32], batch: usize) -> Vec<f32> {
        let early = g.early_dense(dense, batch);
        let total: usize = g.dims.iter().sum();
        let mut parts = vec![None; g.dims.len()];
        let mut at = 0;
        let starts: Vec<usize> = g
            .dims
            .iter()
            .map(|d| {
                at += d;
                at - d
            })
            .collect();
        for k in (0..g.dims.len()).rev() {
            let block: Vec<f32> = (0..batch)
                .flat_map(|b| pooled[b * total + starts[k]..][..g.dims[k]].to_vec())
                .collect();
            parts[k] = g.early_table(k, &block, batch);
        }
        g.finish(early, parts, pooled, batch)
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    #[test]
    fn the_cut_equals_the_program_run_whole() {
        // dense 5, tables of dims 4, 3, 4; a bottom layer, a layer over [bottom, t0, t2 twice,
        // t1's last two], a sum of t0 and t2, their product, dots of three vectors, a late layer
        // over everything, an activation on its own
        let (batch, dims) = (7, vec![4, 3, 4]);
        let ops = vec![
            Op::Linear {
                input: vec![s(0, 0..5)],
                layer: layer(5, 4, Activation::Relu, 1),
            },
            Op::Linear {
                input: vec![s(2, 0..4), s(1, 0..4), s(1, 7..11), s(1, 7..11), s(1, 5..7)],
                layer: layer(18, 6, Activation::Tanh, 3),
            },
            Op::Add {
                a: vec![s(1, 0..4)],
                b: vec![s(1, 7..11)],
            },
            Op::Mul {
                a: vec![s(4, 0..4)],
                b: vec![s(2, 0..4)],
            },
            Op::Dots {
                vectors: vec![vec![s(2, 0..4)], vec![s(1, 0..4)], vec![s(5, 0..4)]],
                pairs: vec![(0, 1), (2, 0), (2, 1)],
            },
            Op::Linear {
                input: vec![s(6, 0..3), s(3, 0..6), s(1, 4..7), s(0, 1..3)],
                layer: layer(14, 2, Activation::None, 5),
            },
            Op::Activation {
                input: vec![s(7, 0..2)],
                activation: Activation::Sigmoid,
            },
        ];
        let g = Graph::new(5, dims, ops, vec![s(8, 0..2), s(6, 1..3)]).unwrap();
        assert_eq!(g.outputs(), 4);
        assert_eq!(g.feeds, vec![vec![1], vec![1, 5], vec![1]]);
        let dense = values(batch * 5, 11);
        let pooled = values(batch * 11, 12);
        close(
            &cut(&g, &dense, &pooled, batch),
            &whole(&g, &dense, &pooled, batch),
        );
    }

    #[test]
    fn dlrm_as_a_program_equals_the_family() {
        let (batch, d, tables) = (9, 4, 3);
        let bottom = layer(6, d, Activation::Relu, 1);
        let n = tables + 1;
        let top_in = d + n * (n - 1) / 2;
        let top0 = layer(top_in, 5, Activation::Relu, 2);
        let top1 = layer(5, 1, Activation::Sigmoid, 3);
        let family = DenseModel::dlrm(
            Mlp::new(vec![bottom.clone()]).unwrap(),
            Interaction::Dot,
            Mlp::new(vec![top0.clone(), top1.clone()]).unwrap(),
            tables,
        )
        .unwrap();
        let mut vectors = vec![vec![s(2, 0..d)]];
        vectors.extend((0..tables).map(|k| vec![s(1, k * d..(k + 1) * d)]));
        let pairs = (1..n).flat_map(|i| (0..i).map(move |j| (i, j))).collect();
        let ops = vec![
            Op::Linear {
                input: vec![s(0, 0..6)],
                layer: bottom,
            },
            Op::Dots { vectors, pairs },
            Op::Linear {
                input: vec![s(2, 0..d), s(3, 0..n * (n - 1) / 2)],
                layer: top0,
            },
            Op::Linear {
                input: vec![s(4, 0..5)],
                layer: top1,
            },
        ];
        let g = Graph::new(6, vec![d; tables], ops, vec![s(5, 0..1)]).unwrap();
        let dense = values(batch * 6, 21);
        let pooled = values(batch * tables * d, 22);
        let early = family.early_dense(&dense, batch);
        let fam = family.finish(early, vec![None; tables], &pooled, batch);
        close(&cut(&g, &dense, &pooled, batch), &fam);
    }

    #[test]
    fn malformed_programs_are_refused() {
        let l = || layer(3, 2, Activation::None, 1);
        let cases: Vec<(Vec<Op>, Vec<Slice>, &str)> = vec![
            (
                vec![Op::Linear {
                    input: vec![s(3, 0..3)],
                    layer: l(),
                }],
                vec![s(2, 0..2)],
                "not defined before it",
            ),
            (
                vec![Op::Linear {
                    input: vec![s(1, 2..5)],
                    layer: l(),
                }],
                vec![s(2, 0..2)],
                "columns 2..5 of value 1",
            ),
            (
                vec![Op::Linear {
                    input: vec![s(1, 0..2)],
                    layer: l(),
                }],
                vec![s(2, 0..2)],
                "takes 3 inputs",
            ),
            (
                vec![Op::Add {
                    a: vec![s(1, 0..2)],
                    b: vec![s(0, 0..1)],
                }],
                vec![s(2, 0..2)],
                "operands of 2 and 1",
            ),
            (
                vec![Op::Dots {
                    vectors: vec![vec![s(1, 0..2)], vec![s(1, 2..4)]],
                    pairs: vec![(0, 2)],
                }],
                vec![s(2, 0..1)],
                "pair (0, 2) of 2 vectors",
            ),
            (Vec::new(), Vec::new(), "no outputs"),
        ];
        for (ops, output, want) in cases {
            let err = Graph::new(2, vec![4], ops, output).unwrap_err();
            assert!(err.0.contains(want), "{err} lacks {want:?}");
        }
    }
}
