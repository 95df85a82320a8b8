//! The model kept with a store's tables, for whole-model inference (RM-SSD's offload) from the
//! store alone: its configuration (`model.json`) and dense weights (`dense.npz`, numpy's archive
//! of a PyTorch `state_dict` without the sparse part), both checksummed attachments, written by
//! [`save`] and read into the engine's [`DenseModel`] by [`StoredModel::load`];
//! [`Store::infer`](crate::Store::infer) runs it next to the embeddings and returns only its
//! outputs. No Python and no model zoo on this path: the weights' names and the family's layer
//! conventions (docs/format.md, "Model attachments") say everything. This module reads a store
//! through its reader, not the [`Store`](crate::Store), which holds the model it loads.

use std::collections::HashMap;
use std::io::Cursor;

use nearrec_engine::dense::{Activation, DenseModel, Interaction, Linear, Mlp};
use nearrec_engine::{Batch, EngineError, InferTimes};
use nearrec_format::{StoreReader, TableMeta};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The configuration attachment (`nearrec.models.CONFIG_ATTACHMENT`).
pub const CONFIG_ATTACHMENT: &str = "model.json";
/// The dense weights attachment (`nearrec.models.WEIGHTS_ATTACHMENT`).
pub const WEIGHTS_ATTACHMENT: &str = "dense.npz";

/// A model's configuration, as `model.json` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// `rmc1`–`rmc3`, `wnd`, `mtwnd`, `ncf` (`din`, `dien`: kept, but with no engine twin).
    pub model: String,
    /// `deeprecsys` or `recssd` (the tables' sizes; recorded for rebuilding the PyTorch model).
    #[serde(default = "deeprecsys")]
    pub variant: String,
    /// DLRM's interaction: `cat` or `dot`.
    #[serde(default = "cat")]
    pub interaction: String,
    /// MTWND's heads.
    #[serde(default = "one")]
    pub tasks: usize,
    /// The model's input tables in order; older saves leave it out: the store's tables
    /// `t0, t1, ...`, as `nearrec.build` names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<Vec<String>>,
}

/// One named float32 array of a model's dense weights (a `state_dict` entry).
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
    pub values: &'a [f32],
}

/// Keeps a model with the store at `path`: its configuration and its dense weights as two
/// checksummed attachments (each written atomically), what
/// [`Store::infer`](crate::Store::infer) and Python's `nearrec.models.load` read back. The weights go as a numpy `.npz` archive (no pickle).
pub fn save(path: &std::path::Path, config: &ModelConfig, weights: &[Tensor<'_>]) -> Result<()> {
    let npz = write_npz(weights).map_err(|e| Error::invalid(format!("model weights: {e}")))?;
    nearrec_format::attach(path, WEIGHTS_ATTACHMENT, &npz)?;
    let json = serde_json::to_vec(config).expect("a model config serialises");
    nearrec_format::attach(path, CONFIG_ATTACHMENT, &json)?;
    Ok(())
}

/// An uncompressed `.npz` of float32 arrays, as `numpy.savez` writes it.
fn write_npz(weights: &[Tensor<'_>]) -> std::result::Result<Vec<u8>, String> {
    let shapes: Vec<Vec<u64>> = weights
        .iter()
        .map(|t| t.shape.iter().map(|&d| d as u64).collect())
        .collect();
    let arrays: Vec<(&str, &[u64], &[f32])> = weights
        .iter()
        .zip(&shapes)
        .map(|(t, s)| (t.name, s.as_slice(), t.values))
        .collect();
    let mut out = Cursor::new(Vec::new());
    nearrec_format::npz::write_npz_f32(&mut out, &arrays).map_err(|e| e.to_string())?;
    Ok(out.into_inner())
}

fn deeprecsys() -> String {
    "deeprecsys".into()
}

fn cat() -> String {
    "cat".into()
}

fn one() -> usize {
    1
}

/// The model kept with a store: its dense part, ready for the engine, and its input tables.
#[derive(Debug)]
pub struct StoredModel {
    /// The family (`rmc1`, `wnd`, ...).
    pub name: String,
    pub dense: DenseModel,
    /// The model's input tables, in input order.
    pub tables: Vec<String>,
}

/// A model's outputs for one batch: row-major `[batch, outputs]`, and where the time went.
#[derive(Debug, Clone)]
pub struct Inferred {
    pub outputs: Vec<f32>,
    pub batch: usize,
    pub width: usize,
    pub times: InferTimes,
}

impl StoredModel {
    /// Reads the model kept with the store `reader` opened.
    pub fn load(reader: &StoreReader) -> Result<Self> {
        let path = reader.path().display().to_string();
        let (Some(config), Some(weights)) = (
            reader.read_attachment(CONFIG_ATTACHMENT)?,
            reader.read_attachment(WEIGHTS_ATTACHMENT)?,
        ) else {
            return Err(Error::NoModel {
                path,
                reason: "save one with nearrec.models.save".into(),
            });
        };
        let bad = |reason: String| Error::BadModel {
            path: path.clone(),
            reason,
        };
        let config: ModelConfig = serde_json::from_slice(&config)
            .map_err(|e| bad(format!("{CONFIG_ATTACHMENT}: {e}")))?;
        let weights =
            Weights::read(&weights).map_err(|e| bad(format!("{WEIGHTS_ATTACHMENT}: {e}")))?;
        let tables = match config.tables.clone() {
            Some(t) => t,
            None => numbered_tables(reader.tables()),
        };
        let dims = tables
            .iter()
            .map(|t| table_dim(reader.tables(), t))
            .collect::<Result<Vec<_>>>()?;
        let dense = build(&config, &weights, &dims).map_err(|e| match e {
            Error::InvalidRequest { reason, .. } => Error::NoModel {
                path: path.clone(),
                reason,
            },
            Error::BadModel { reason, .. } => bad(reason),
            other => other,
        })?;
        Ok(Self {
            name: config.model,
            dense,
            tables,
        })
    }

    /// `batch`'s lookups in the model's input order, matched by table name: each input table
    /// exactly once, no other table.
    pub fn arrange<'a>(&self, batch: &Batch<'a>) -> Result<Batch<'a>> {
        let mut by_name = HashMap::new();
        for (i, t) in batch.tables.iter().enumerate() {
            if by_name.insert(t.table, *t).is_some() {
                return Err(Error::InvalidRequest {
                    table: Some(t.table.to_owned()),
                    position: Some(i),
                    reason: format!("is given twice (position {i})"),
                });
            }
        }
        let missing: Vec<&str> = self
            .tables
            .iter()
            .map(String::as_str)
            .filter(|t| !by_name.contains_key(t))
            .collect();
        let extra: Vec<&str> = batch
            .tables
            .iter()
            .map(|t| t.table)
            .filter(|t| !self.tables.iter().any(|m| m == t))
            .collect();
        if !missing.is_empty() || !extra.is_empty() {
            let mut parts = Vec::new();
            if !missing.is_empty() {
                parts.push(format!("missing {missing:?}"));
            }
            if !extra.is_empty() {
                parts.push(format!("not inputs {extra:?}"));
            }
            return Err(Error::InvalidRequest {
                table: missing.first().or(extra.first()).map(|t| (*t).to_owned()),
                position: None,
                reason: format!(
                    "the lookups do not match the model's input tables {:?}: {}",
                    self.tables,
                    parts.join("; ")
                ),
            });
        }
        Ok(Batch::new(
            self.tables.iter().map(|t| by_name[t.as_str()]).collect(),
        ))
    }
}

/// Table `name`'s width, or the engine's [`EngineError::UnknownTable`] naming the others.
fn table_dim(tables: &[TableMeta], name: &str) -> Result<usize> {
    match tables.iter().find(|t| t.name == name) {
        Some(t) => Ok(t.dim as usize),
        None => Err(EngineError::UnknownTable {
            name: name.to_owned(),
            available: tables
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }
        .into()),
    }
}

/// The store's tables named `t0`, `t1`, ... in number order.
fn numbered_tables(tables: &[TableMeta]) -> Vec<String> {
    let mut numbered: Vec<(u64, String)> = tables
        .iter()
        .filter_map(|t| {
            let n = t.name.strip_prefix('t')?.parse().ok()?;
            Some((n, t.name.clone()))
        })
        .collect();
    numbered.sort();
    numbered.into_iter().map(|t| t.1).collect()
}

fn build(config: &ModelConfig, w: &Weights, dims: &[usize]) -> Result<DenseModel> {
    let model_err = |e: nearrec_engine::dense::ModelError| Error::BadModel {
        path: String::new(),
        reason: e.to_string(),
    };
    match config.model.as_str() {
        "rmc1" | "rmc2" | "rmc3" => {
            let interaction = match config.interaction.as_str() {
                "cat" => Interaction::Cat,
                "dot" => Interaction::Dot,
                other => {
                    return Err(bad(format!(
                        "interaction must be \"cat\" or \"dot\", not {other:?}"
                    )));
                }
            };
            let bottom = w.mlp("bottom", Activation::Relu)?;
            let top = w.mlp("top", Activation::Sigmoid)?;
            DenseModel::dlrm(bottom, interaction, top, dims.len()).map_err(model_err)
        }
        "wnd" => DenseModel::wide_and_deep(
            w.mlp("top", Activation::Sigmoid)?,
            Vec::new(),
            dims.to_vec(),
        )
        .map_err(model_err),
        "mtwnd" => {
            let heads = (0..config.tasks)
                .map(|h| w.mlp(&format!("heads.{h}"), Activation::Sigmoid))
                .collect::<Result<Vec<_>>>()?;
            DenseModel::wide_and_deep(w.mlp("trunk", Activation::Relu)?, heads, dims.to_vec())
                .map_err(model_err)
        }
        "ncf" => {
            let dim = *dims
                .first()
                .ok_or_else(|| bad("NCF has no input tables".into()))?;
            DenseModel::ncf(
                w.mlp("mlp", Activation::Relu)?,
                w.mlp("predict", Activation::Relu)?,
                dim,
            )
            .map_err(model_err)
        }
        "din" | "dien" => Err(Error::invalid(format!(
            "{}: whole-model offload covers DLRM (RMC1–3), WND, MTWND and NCF; run DIN and DIEN \
             with PyTorch MLPs",
            config.model
        ))),
        other => Err(bad(format!("unknown model {other:?}"))),
    }
}

fn bad(reason: String) -> Error {
    Error::BadModel {
        path: String::new(),
        reason,
    }
}

/// The float arrays of an `.npz` archive, by name (`"bottom.0.weight"`).
struct Weights(HashMap<String, (Vec<u64>, Vec<f32>)>);

impl Weights {
    fn read(bytes: &[u8]) -> std::result::Result<Self, String> {
        let arrays = nearrec_format::npz::read_npz_f32(bytes)?;
        Ok(Self(
            arrays
                .into_iter()
                .map(|(name, f)| (name, (f.shape, f.values)))
                .collect(),
        ))
    }

    /// The `Sequential` at `prefix`: its `nn.Linear` layers `prefix.{i}.weight` / `.bias` in
    /// order of `i`, ReLU after each but the last, `last` after the last (`nearrec.models.mlp`).
    fn mlp(&self, prefix: &str, last: Activation) -> Result<Mlp> {
        let mut at: Vec<u64> = self
            .0
            .keys()
            .filter_map(|k| {
                let rest = k.strip_prefix(prefix)?.strip_prefix('.')?;
                rest.strip_suffix(".weight")?.parse().ok()
            })
            .collect();
        at.sort_unstable();
        if at.is_empty() {
            return Err(bad(format!("no layers {prefix}.N.weight in the weights")));
        }
        let n = at.len();
        let layers = at
            .iter()
            .enumerate()
            .map(|(j, i)| {
                let name = format!("{prefix}.{i}.weight");
                let (shape, weight) = &self.0[&name];
                let [outputs, inputs] = shape[..] else {
                    return Err(bad(format!("{name} has shape {shape:?}, not [out, in]")));
                };
                let (outputs, inputs) = (outputs as usize, inputs as usize);
                let bias = match self.0.get(&format!("{prefix}.{i}.bias")) {
                    Some((s, b)) if s[..] == [outputs as u64] => b.clone(),
                    Some((s, _)) => {
                        return Err(bad(format!(
                            "{prefix}.{i}.bias has shape {s:?}, not [{outputs}]"
                        )));
                    }
                    None => vec![0.0; outputs],
                };
                let activation = if j + 1 == n { last } else { Activation::Relu };
                Linear::new(weight.clone(), bias, outputs, inputs, activation)
                    .map_err(|e| bad(format!("{name}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Mlp::new(layers).map_err(|e| bad(format!("{prefix}: {e}")))
    }
}
