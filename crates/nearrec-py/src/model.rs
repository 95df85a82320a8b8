//! A model's dense layers for whole-model offload (`nearrec_engine::dense`), built from numpy
//! weights; `NativeStore.infer` runs them next to the embeddings.

use nearrec::{SavedModel, StoredModel};
use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::error::raise;

/// A model's dense part and inputs, ready for `NativeStore.infer`: a
/// [`nearrec::StoredModel`] built from memory, by the rules a store's kept model is read by.
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeModel {
    pub(crate) model: StoredModel,
}

#[pymethods]
impl NativeModel {
    /// A model from its configuration (`nearrec::model::ModelConfig` as JSON: a family with its
    /// `tables`, or `model: "graph"` with its program, features and pooling), its dense weights
    /// (`(name, float32 array)`, a `state_dict` without the sparse part) and its input tables'
    /// widths `dims`: what `nearrec.models.save` keeps with a store, built here from memory.
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
        StoredModel::from_parts(config, &tensors, &dims)
            .map(|model| Self { model })
            .map_err(|e| crate::error::err(py, e))
    }

    /// Dense features per sample.
    #[getter]
    fn dense_width(&self) -> usize {
        self.model.dense.dense_width()
    }

    /// Outputs per sample.
    #[getter]
    fn outputs(&self) -> usize {
        self.model.dense.outputs()
    }

    /// Each input table's dim, in order.
    #[getter]
    fn table_dims(&self) -> Vec<usize> {
        self.model.dense.table_dims()
    }

    /// The inputs' names (features, or tables), in input order.
    #[getter]
    fn inputs(&self) -> Vec<String> {
        self.model.inputs.clone()
    }

    /// The table each input reads, in input order.
    #[getter]
    fn tables(&self) -> Vec<String> {
        self.model.tables.clone()
    }
}

/// A kept model as Python takes it (`NativeStore.saved_model`): its configuration as JSON
/// (its `tables` filled in) and its dense weights as `(name, float32 array)`.
pub(crate) fn saved_to_py<'py>(py: Python<'py>, saved: &SavedModel) -> PyResult<SavedPy<'py>> {
    let weights = saved
        .weights()
        .map(|(name, shape, values)| {
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            let array = PyArray1::from_slice(py, values).reshape(shape)?;
            Ok((name.to_owned(), array.into_any()))
        })
        .collect::<PyResult<_>>()?;
    Ok((saved.config_json(), weights))
}

/// A kept model's configuration (JSON) and its weights by name.
pub(crate) type SavedPy<'py> = (String, Vec<(String, Bound<'py, PyAny>)>);

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
    crate::error::run(py, || nearrec::model::save(&path, &config, &tensors))
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

pub(crate) type WeightArray<'a> = (&'a str, Vec<usize>, &'a [f32]);

/// Each named array's shape and values, borrowed from numpy (contiguous ones only).
pub(crate) fn weight_arrays<'a>(
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

pub(crate) fn tensors<'a>(arrays: &'a [WeightArray<'a>]) -> Vec<nearrec::model::Tensor<'a>> {
    arrays
        .iter()
        .map(|(name, shape, values)| nearrec::model::Tensor {
            name,
            shape,
            values,
        })
        .collect()
}
