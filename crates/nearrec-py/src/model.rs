//! A model's dense layers for whole-model offload (`nearrec_engine::dense`), built from numpy
//! weights; `NativeStore.infer` runs them next to the embeddings.

use nearrec_engine::dense::{Activation, DenseModel, Interaction, Linear, Mlp, ModelError};
use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::error::raise;

/// One layer as Python passes it: `(weight [out, in] float32, bias [out] float32, activation)`.
type LayerArgs<'py> = (
    PyReadonlyArray2<'py, f32>,
    PyReadonlyArray1<'py, f32>,
    String,
);

fn model_err(py: Python<'_>, what: &str, e: ModelError) -> PyErr {
    raise(py, "InvalidRequest", format!("{what}: {e}"), None, None)
}

fn mlp(py: Python<'_>, what: &str, layers: Vec<LayerArgs<'_>>) -> PyResult<Mlp> {
    let layers = layers
        .into_iter()
        .enumerate()
        .map(|(i, (w, b, act))| {
            let [out, inp] = [w.shape()[0], w.shape()[1]];
            let activation = Activation::parse(&act).ok_or_else(|| {
                raise(
                    py,
                    "InvalidRequest",
                    format!(
                        "{what} layer {i}: unknown activation {act:?} (none, relu, sigmoid, tanh)"
                    ),
                    None,
                    None,
                )
            })?;
            Linear::new(
                w.as_array().iter().copied().collect(),
                b.as_array().iter().copied().collect(),
                out,
                inp,
                activation,
            )
            .map_err(|e| model_err(py, &format!("{what} layer {i}"), e))
        })
        .collect::<PyResult<Vec<_>>>()?;
    Mlp::new(layers).map_err(|e| model_err(py, what, e))
}

/// A model's dense part, ready for `NativeStore.infer`.
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeModel {
    pub(crate) model: DenseModel,
}

#[pymethods]
impl NativeModel {
    /// DLRM: `bottom` and `top` layers, `interaction` `"cat"` or `"dot"`, over `tables` tables.
    #[staticmethod]
    fn dlrm(
        py: Python<'_>,
        bottom: Vec<LayerArgs<'_>>,
        top: Vec<LayerArgs<'_>>,
        interaction: &str,
        tables: usize,
    ) -> PyResult<Self> {
        let interaction = match interaction {
            "cat" => Interaction::Cat,
            "dot" => Interaction::Dot,
            other => {
                return Err(raise(
                    py,
                    "InvalidRequest",
                    format!("interaction must be 'cat' or 'dot', not {other:?}"),
                    None,
                    None,
                ));
            }
        };
        let (bottom, top) = (mlp(py, "bottom MLP", bottom)?, mlp(py, "top MLP", top)?);
        DenseModel::dlrm(bottom, interaction, top, tables)
            .map(|model| Self { model })
            .map_err(|e| model_err(py, "DLRM", e))
    }

    /// Wide & Deep: `trunk` over `[tables..., dense]` (tables of `dims`), then `heads` (empty:
    /// the trunk's output is the model's).
    #[staticmethod]
    fn wide_and_deep(
        py: Python<'_>,
        trunk: Vec<LayerArgs<'_>>,
        heads: Vec<Vec<LayerArgs<'_>>>,
        dims: Vec<usize>,
    ) -> PyResult<Self> {
        let trunk = mlp(py, "trunk", trunk)?;
        let heads = heads
            .into_iter()
            .enumerate()
            .map(|(i, h)| mlp(py, &format!("head {i}"), h))
            .collect::<PyResult<Vec<_>>>()?;
        DenseModel::wide_and_deep(trunk, heads, dims)
            .map(|model| Self { model })
            .map_err(|e| model_err(py, "Wide & Deep", e))
    }

    /// NCF over four tables of dim `dim`: `path` over tables 2 and 3, `predict` over
    /// `[t0 + t1, path output]`.
    #[staticmethod]
    fn ncf(
        py: Python<'_>,
        path: Vec<LayerArgs<'_>>,
        predict: Vec<LayerArgs<'_>>,
        dim: usize,
    ) -> PyResult<Self> {
        let (path, predict) = (mlp(py, "MLP path", path)?, mlp(py, "predict", predict)?);
        DenseModel::ncf(path, predict, dim)
            .map(|model| Self { model })
            .map_err(|e| model_err(py, "NCF", e))
    }

    /// Any model's dense part from its configuration (`nearrec::model::ModelConfig` as JSON,
    /// e.g. `model: "graph"` with its program) and weights (`(name, float32 array)`), over inputs
    /// of dims `dims`: what `nearrec::model` reads from a store, built here from memory.
    #[staticmethod]
    fn from_config(
        py: Python<'_>,
        config_json: &str,
        weights: Vec<(String, numpy::PyReadonlyArrayDyn<'_, f32>)>,
        dims: Vec<usize>,
    ) -> PyResult<Self> {
        let config = model_config(py, config_json)?;
        let arrays = weight_arrays(py, &weights)?;
        let tensors = tensors(&arrays);
        nearrec::model::dense_model(&config, &tensors, &dims)
            .map(|model| Self { model })
            .map_err(|e| crate::error::err(py, e))
    }

    /// Dense features per sample.
    #[getter]
    fn dense_width(&self) -> usize {
        self.model.dense_width()
    }

    /// Outputs per sample.
    #[getter]
    fn outputs(&self) -> usize {
        self.model.outputs()
    }

    /// Each input table's dim, in order.
    #[getter]
    fn table_dims(&self) -> Vec<usize> {
        self.model.table_dims()
    }
}

/// Keeps a model with the store at `path` (`nearrec::model::save`): its configuration
/// (`nearrec::model::ModelConfig` as JSON) and its dense weights, `(name, float32 array)` each.
#[pyfunction]
pub(crate) fn model_save(
    py: Python<'_>,
    path: std::path::PathBuf,
    config_json: &str,
    weights: Vec<(String, numpy::PyReadonlyArrayDyn<'_, f32>)>,
) -> PyResult<()> {
    let config = model_config(py, config_json)?;
    let arrays = weight_arrays(py, &weights)?;
    let tensors = tensors(&arrays);
    crate::error::detach(py, || nearrec::model::save(&path, &config, &tensors))?
        .map_err(|e| crate::error::err(py, e))
}

fn model_config(py: Python<'_>, json: &str) -> PyResult<nearrec::model::ModelConfig> {
    serde_json::from_str(json).map_err(|e| {
        raise(
            py,
            "InvalidRequest",
            format!("model configuration: {e}"),
            None,
            None,
        )
    })
}

type WeightArray<'a> = (&'a str, Vec<usize>, &'a [f32]);

/// Each named array's shape and values, borrowed from numpy (contiguous ones only).
fn weight_arrays<'a>(
    py: Python<'_>,
    weights: &'a [(String, numpy::PyReadonlyArrayDyn<'_, f32>)],
) -> PyResult<Vec<WeightArray<'a>>> {
    weights
        .iter()
        .map(|(name, a)| {
            let values = a.as_slice().map_err(|_| {
                raise(
                    py,
                    "InvalidRequest",
                    format!("{name}: not contiguous"),
                    None,
                    None,
                )
            })?;
            Ok((name.as_str(), a.shape().to_vec(), values))
        })
        .collect()
}

fn tensors<'a>(arrays: &'a [WeightArray<'a>]) -> Vec<nearrec::model::Tensor<'a>> {
    arrays
        .iter()
        .map(|(name, shape, values)| nearrec::model::Tensor {
            name,
            shape,
            values,
        })
        .collect()
}
