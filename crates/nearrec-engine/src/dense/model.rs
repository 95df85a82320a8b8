//! The dense part of a recommendation model, cut where RM-SSD cuts it: work that needs only the
//! dense features, work that needs only one table's pooled vectors (that table's slice of the
//! first layer it feeds), and the rest once everything is in. The three model families here are
//! DeepRecInfra's DLRM (RMC1–3, concat or dot interaction), Wide & Deep (one or more sigmoid
//! heads: WND, MTWND) and NCF; layer sizes are free.

use std::ops::Range;

use super::graph::GraphEarly;
use super::{Graph, Linear, Mlp, ModelError};

/// How DLRM joins the bottom MLP's output with the pooled vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interaction {
    /// `[bottom, t0, t1, ...]` concatenated (DeepRecInfra's configs).
    Cat,
    /// DLRM's default: `[bottom, dots]`, the dots being the strictly lower triangle of the pairwise
    /// dot products of `[bottom, t0, t1, ...]`, row by row.
    Dot,
}

#[derive(Debug, Clone)]
enum Kind {
    Dlrm {
        bottom: Mlp,
        interaction: Interaction,
        top: Mlp,
        tables: usize,
    },
    /// The first trunk layer takes `[t0, t1, ..., dense]`; with heads, each head maps the trunk's
    /// output to one column of the result.
    WideAndDeep {
        trunk: Mlp,
        heads: Vec<Mlp>,
        dims: Vec<usize>,
    },
    /// Tables 0 and 1 summed (matrix factorisation), tables 2 and 3 through `mlp`, then
    /// `predict` over `[t0 + t1, mlp output]`.
    Ncf { mlp: Mlp, predict: Mlp, dim: usize },
    /// Any model's dense part as a program (`graph.rs`).
    Graph(Graph),
}

/// A model's dense layers, ready to run next to the embeddings ([`crate::Engine::infer`]).
#[derive(Debug, Clone)]
pub struct DenseModel {
    kind: Kind,
}

/// What the dense features give before any table is in: the bottom MLP's output (DLRM) and its
/// share of the first top layer.
#[derive(Debug, Default)]
pub(crate) struct Early {
    hidden: Vec<f32>,
    partial: Vec<f32>,
    graph: GraphEarly,
}

impl DenseModel {
    /// DLRM over `tables` pooled tables whose dim is the bottom MLP's output width.
    pub fn dlrm(
        bottom: Mlp,
        interaction: Interaction,
        top: Mlp,
        tables: usize,
    ) -> Result<Self, ModelError> {
        let (d, n) = (bottom.outputs(), tables + 1);
        let want = match interaction {
            Interaction::Cat => n * d,
            Interaction::Dot => d + n * (n - 1) / 2,
        };
        if top.inputs() != want {
            return Err(ModelError(format!(
                "the top MLP takes {} inputs; {tables} tables of dim {d} with {interaction:?} \
                 interaction give {want}",
                top.inputs()
            )));
        }
        Ok(Self {
            kind: Kind::Dlrm {
                bottom,
                interaction,
                top,
                tables,
            },
        })
    }

    /// Wide & Deep: `trunk` over `[t0, ..., dense]` (tables of dims `dims`); `heads` (empty for
    /// WND) each map the trunk's output to one output column.
    pub fn wide_and_deep(
        trunk: Mlp,
        heads: Vec<Mlp>,
        dims: Vec<usize>,
    ) -> Result<Self, ModelError> {
        let tables: usize = dims.iter().sum();
        if trunk.inputs() <= tables {
            return Err(ModelError(format!(
                "the trunk takes {} inputs, no more than the tables' {tables}: no dense features",
                trunk.inputs()
            )));
        }
        if let Some((i, h)) = heads
            .iter()
            .enumerate()
            .find(|(_, h)| h.inputs() != trunk.outputs() || h.outputs() != 1)
        {
            return Err(ModelError(format!(
                "head {i} maps {} to {}; it must map the trunk's {} outputs to 1",
                h.inputs(),
                h.outputs(),
                trunk.outputs()
            )));
        }
        Ok(Self {
            kind: Kind::WideAndDeep { trunk, heads, dims },
        })
    }

    /// NCF over four tables of dim `dim`.
    pub fn ncf(mlp: Mlp, predict: Mlp, dim: usize) -> Result<Self, ModelError> {
        if mlp.inputs() != 2 * dim {
            return Err(ModelError(format!(
                "the MLP path takes {} inputs, not tables 2 and 3's {}",
                mlp.inputs(),
                2 * dim
            )));
        }
        if predict.inputs() != dim + mlp.outputs() {
            return Err(ModelError(format!(
                "the predict layer takes {} inputs, not {dim} + {}",
                predict.inputs(),
                mlp.outputs()
            )));
        }
        Ok(Self {
            kind: Kind::Ncf { mlp, predict, dim },
        })
    }

    /// A dense part given as a program of operations (a user's model).
    pub fn graph(graph: Graph) -> Self {
        Self {
            kind: Kind::Graph(graph),
        }
    }

    /// Dense features per sample.
    pub fn dense_width(&self) -> usize {
        match &self.kind {
            Kind::Dlrm { bottom, .. } => bottom.inputs(),
            Kind::WideAndDeep { trunk, dims, .. } => trunk.inputs() - dims.iter().sum::<usize>(),
            Kind::Ncf { .. } => 0,
            Kind::Graph(g) => g.dense_width(),
        }
    }

    /// The dim of each table the model takes, in order.
    pub fn table_dims(&self) -> Vec<usize> {
        match &self.kind {
            Kind::Dlrm { bottom, tables, .. } => vec![bottom.outputs(); *tables],
            Kind::WideAndDeep { dims, .. } => dims.clone(),
            Kind::Ncf { dim, .. } => vec![*dim; 4],
            Kind::Graph(g) => g.table_dims(),
        }
    }

    /// Outputs per sample.
    pub fn outputs(&self) -> usize {
        match &self.kind {
            Kind::Dlrm { top, .. } => top.outputs(),
            Kind::WideAndDeep { trunk, heads, .. } if heads.is_empty() => trunk.outputs(),
            Kind::WideAndDeep { heads, .. } => heads.len(),
            Kind::Ncf { predict, .. } => predict.outputs(),
            Kind::Graph(g) => g.outputs(),
        }
    }

    /// The model on pooled vectors already in hand — `pooled` is `[batch, Σ table_dims]`, the
    /// tables in the model's order, `dense` `[batch, dense_width]` — as [`crate::Engine::infer`]
    /// computes it beside its reads: for vectors pooled elsewhere (a node's or a sharded
    /// store's lookup). Returns `[batch, outputs]`.
    pub fn forward(
        &self,
        dense: &[f32],
        pooled: &[f32],
        batch: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let dims = self.table_dims();
        let width: usize = dims.iter().sum();
        if dense.len() != batch * self.dense_width() || pooled.len() != batch * width {
            return Err(ModelError(format!(
                "{batch} samples take {} dense features and {} pooled values, not {} and {}",
                batch * self.dense_width(),
                batch * width,
                dense.len(),
                pooled.len()
            )));
        }
        let early = self.early_dense(dense, batch);
        let mut at = 0;
        let parts = (dims.iter().enumerate())
            .map(|(k, &dim)| {
                let block: Vec<f32> = (pooled.chunks_exact(width.max(1)))
                    .flat_map(|row| &row[at..at + dim])
                    .copied()
                    .collect();
                at += dim;
                self.early_table(k, &block, batch)
            })
            .collect();
        Ok(self.finish(early, parts, pooled, batch))
    }

    /// The work the dense features allow on their own (`dense`: `[batch, dense_width]`).
    pub(crate) fn early_dense(&self, dense: &[f32], batch: usize) -> Early {
        match &self.kind {
            Kind::Dlrm { bottom, top, .. } => {
                let hidden = bottom.forward(dense, batch);
                let d = bottom.outputs();
                let mut partial = vec![0f32; batch * top.first().outputs()];
                top.first()
                    .accumulate(&hidden, d, 0..d, batch, &mut partial);
                Early {
                    hidden,
                    partial,
                    ..Early::default()
                }
            }
            Kind::WideAndDeep { trunk, dims, .. } => {
                let (first, at) = (trunk.first(), dims.iter().sum::<usize>());
                let mut partial = vec![0f32; batch * first.outputs()];
                let w = self.dense_width();
                first.accumulate(dense, w, at..at + w, batch, &mut partial);
                Early {
                    partial,
                    ..Early::default()
                }
            }
            Kind::Ncf { .. } => Early::default(),
            Kind::Graph(g) => Early {
                graph: g.early_dense(dense, batch),
                ..Early::default()
            },
        }
    }

    /// Multiply-adds above which, per value a batch pools, the tables' share of the first
    /// layer is better done as one product over the pooled matrix than as one per table while
    /// other tables pool: the per-table products can hide behind the pooling at most, and on a
    /// layer this much wider than the pooling a table's narrow slice costs more than that
    /// (measured, `bench e2e --places dram`: Wide & Deep ~1000 and RMC3 ~25 gain from one
    /// product; RMC1 ~3, whose pooling is long, keeps its slices).
    const WHOLE_LAYER_RATIO: usize = 8;

    /// Whether the tables' share of the first layer is left to [`Self::finish`], as one product
    /// over every table's columns of the pooled matrix, when every table is in DRAM (no reads
    /// for the per-table products to hide behind) and `pooled` values are added per sample
    /// (lookups × dim). Only the families whose first layer takes the tables side by side: the
    /// DLRM family with concatenation, Wide & Deep.
    pub(crate) fn whole_first_layer(&self, pooled: usize) -> bool {
        let layer = match &self.kind {
            Kind::Dlrm {
                interaction: Interaction::Cat,
                top,
                ..
            } => top.first(),
            Kind::WideAndDeep { trunk, .. } => trunk.first(),
            Kind::Dlrm { .. } | Kind::Ncf { .. } | Kind::Graph(_) => return false,
        };
        let tables: usize = self.table_dims().iter().sum();
        tables * layer.outputs() >= Self::WHOLE_LAYER_RATIO * pooled.max(1)
    }

    /// Table `k`'s share of the first layer it feeds, from its pooled vectors (`[batch, dim]`);
    /// `None` where the table only joins in at the end (DLRM's dot interaction).
    pub(crate) fn early_table(&self, k: usize, pooled: &[f32], batch: usize) -> Option<Vec<f32>> {
        if let Kind::Graph(g) = &self.kind {
            return g.early_table(k, pooled, batch);
        }
        let (layer, cols) = self.share(k)?;
        let mut partial = vec![0f32; batch * layer.outputs()];
        layer.accumulate(pooled, cols.len(), cols, batch, &mut partial);
        Some(partial)
    }

    /// The first layer table `k` feeds in a family, and its columns among that layer's inputs;
    /// `None` for DLRM's dot interaction (tables join at the end) and for programs.
    fn share(&self, k: usize) -> Option<(&Linear, Range<usize>)> {
        Some(match &self.kind {
            Kind::Dlrm {
                interaction: Interaction::Dot,
                ..
            }
            | Kind::Graph(_) => return None,
            Kind::Dlrm { bottom, top, .. } => {
                let d = bottom.outputs();
                (top.first(), (k + 1) * d..(k + 2) * d)
            }
            Kind::WideAndDeep { trunk, dims, .. } => {
                let at = dims[..k].iter().sum::<usize>();
                (trunk.first(), at..at + dims[k])
            }
            Kind::Ncf { mlp, predict, dim } => match k {
                0 | 1 => (predict.first(), 0..*dim), // (u + i) W = u W + i W
                _ => (mlp.first(), (k - 2) * dim..(k - 1) * dim),
            },
        })
    }

    /// Adds into `acc` the first layer's share of each table whose share was not computed
    /// early (`parts[k]` is `None`), from the pooled `[batch, width]` matrix, where the tables
    /// lie side by side as among the layer's inputs: one product per run of such tables, so
    /// that with none computed early it is one product over them all.
    fn multiply_missing(
        &self,
        parts: &[Option<Vec<f32>>],
        pooled: &[f32],
        width: usize,
        batch: usize,
        acc: &mut [f32],
    ) {
        // the pooled matrix starts at the first table's columns
        let (_, zero) = self
            .share(0)
            .expect("a family that takes tables side by side");
        let mut k = 0;
        while k < parts.len() {
            if parts[k].is_some() {
                k += 1;
                continue;
            }
            let first = k;
            while k < parts.len() && parts[k].is_none() {
                k += 1;
            }
            let (layer, from) = self.share(first).expect("as above");
            let (_, to) = self.share(k - 1).expect("as above");
            let at = from.start - zero.start;
            layer.accumulate(&pooled[at..], width, from.start..to.end, batch, acc);
        }
    }

    /// The rest: the partial products summed in table order (so the result does not depend on
    /// which read landed first), the interaction where it needs every table, the remaining layers.
    /// `pooled` is the whole `[batch, width]` matrix, tables in the model's order.
    pub(crate) fn finish(
        &self,
        early: Early,
        parts: Vec<Option<Vec<f32>>>,
        pooled: &[f32],
        batch: usize,
    ) -> Vec<f32> {
        let sum = |mut acc: Vec<f32>, parts: &[Option<Vec<f32>>]| {
            for p in parts.iter().flatten() {
                acc.iter_mut().zip(p).for_each(|(a, b)| *a += b);
            }
            acc
        };
        match &self.kind {
            Kind::Graph(g) => g.finish(early.graph, parts, pooled, batch),
            Kind::Dlrm {
                bottom,
                interaction,
                top,
                tables,
            } => {
                let mut z = sum(early.partial, &parts);
                if *interaction == Interaction::Cat {
                    let width = tables * bottom.outputs();
                    self.multiply_missing(&parts, pooled, width, batch, &mut z);
                }
                if *interaction == Interaction::Dot {
                    let dots = lower_dots(&early.hidden, pooled, bottom.outputs(), *tables, batch);
                    let d = bottom.outputs();
                    let cols = d..top.inputs();
                    top.first()
                        .accumulate(&dots, cols.len(), cols, batch, &mut z);
                }
                top.first().finish(&mut z);
                top.forward_from(1, z, batch)
            }
            Kind::WideAndDeep { trunk, heads, dims } => {
                let mut h = sum(early.partial, &parts);
                self.multiply_missing(&parts, pooled, dims.iter().sum(), batch, &mut h);
                trunk.first().finish(&mut h);
                let h = trunk.forward_from(1, h, batch);
                if heads.is_empty() {
                    return h;
                }
                let mut out = vec![0f32; batch * heads.len()];
                for (t, head) in heads.iter().enumerate() {
                    for (b, v) in head.forward(&h, batch).into_iter().enumerate() {
                        out[b * heads.len() + t] = v;
                    }
                }
                out
            }
            Kind::Ncf { mlp, predict, dim } => {
                let [u, i, a, b]: [Vec<f32>; 4] = parts
                    .into_iter()
                    .map(|p| p.expect("every NCF table has a share"))
                    .collect::<Vec<_>>()
                    .try_into()
                    .expect("NCF takes four tables");
                let mut m = sum(a, &[Some(b)]);
                mlp.first().finish(&mut m);
                let m = mlp.forward_from(1, m, batch);
                let mut p = sum(u, &[Some(i)]);
                let cols = *dim..predict.inputs();
                predict
                    .first()
                    .accumulate(&m, mlp.outputs(), cols, batch, &mut p);
                predict.first().finish(&mut p);
                predict.forward_from(1, p, batch)
            }
        }
    }
}

/// DLRM's dot interaction without the bottom output: for each sample, the dot products of the
/// vectors `[hidden, t0, t1, ...]` at (i, j) for i > j, row by row (`torch.tril_indices(n, n,
/// -1)`'s order).
fn lower_dots(hidden: &[f32], pooled: &[f32], d: usize, tables: usize, batch: usize) -> Vec<f32> {
    let n = tables + 1;
    let pairs = n * (n - 1) / 2;
    let mut out = Vec::with_capacity(batch * pairs);
    for b in 0..batch {
        let vector = |i: usize| -> &[f32] {
            if i == 0 {
                &hidden[b * d..][..d]
            } else {
                &pooled[b * tables * d + (i - 1) * d..][..d]
            }
        };
        for i in 1..n {
            for j in 0..i {
                out.push(vector(i).iter().zip(vector(j)).map(|(x, y)| x * y).sum());
            }
        }
    }
    out
}
