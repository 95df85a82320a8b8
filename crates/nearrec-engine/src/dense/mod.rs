//! Dense layers for whole-model offload (RM-SSD): the bottom MLP, the interaction and the top MLP
//! run in the engine, next to the embeddings, and only the model's outputs leave.
//!
//! `linear.rs` holds the FC layers (given in PyTorch's weight layout, SGEMM from the `gemm` crate);
//! `graph.rs` a dense part as a program of the operations the engine runs (a user's model);
//! `model.rs` the model families (and the program, as one more), each cut into the work the dense features allow alone, the
//! work each table's pooled vectors allow alone (its slice of the first layer it feeds, RM-SSD's
//! decomposed first top layer), and the rest. [`crate::Engine::infer`] schedules the parts.

mod graph;
mod linear;
mod model;

pub use graph::{Graph, Op, Slice};
pub use linear::{Activation, Linear, Mlp};
pub(crate) use model::Early;
pub use model::{DenseModel, Interaction};

/// A model whose layers do not fit together, or a request that does not fit the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);
