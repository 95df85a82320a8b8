//! The model kept with a store's tables, for whole-model inference (RM-SSD's offload) from the
//! store alone: its configuration (`model.json`) and dense weights (`dense.npz`, numpy's archive
//! of a PyTorch `state_dict` without the sparse part), both checksummed attachments, written by
//! [`save`] and read into the engine's [`DenseModel`] by [`StoredModel::load`];
//! [`Store::infer`](crate::Inference::infer) runs it next to the embeddings and returns only its
//! outputs. No Python and no model zoo on this path: the weights' names and the family's layer
//! conventions (docs/format.md, "Model attachments") say everything. This module reads a store
//! through its reader, not the [`Store`](crate::Store), which holds the model it loads.

use std::collections::HashMap;
use std::io::Cursor;

use nearrec_engine::dense::{Activation, DenseModel, Graph, Interaction, Linear, Mlp, Op, Slice};
use nearrec_engine::{Batch, EngineError, InferTimes, PoolingMode};
use nearrec_format::{StoreReader, TableMeta};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod build;

use build::{Weights, bad, build};

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
    /// `t0, t1, ...`, as `nearrec.build` names them. A table may feed several inputs (features).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<Vec<String>>,
    /// The inputs' names when they are not the tables' (features of a TorchRec model, several
    /// of which may read one table); a request's lookups are matched to inputs by these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// Each input's pooling (`sum`, `mean`, `max`) where the model fixes it (a TorchRec
    /// model's configs do); a request's lookups are pooled so, whatever they ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling: Option<Vec<String>>,
    /// DIN / DIEN: the behaviour tables read as sequences (recorded for rebuilding the PyTorch
    /// model; no engine twin).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sequence: bool,
    /// The dense part as a program (`model: "graph"`): a user's model captured by Python.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphSpec>,
}

/// A dense part as a program of the operations the engine runs ([`Graph`]), its weights named
/// in `dense.npz`. Values are numbered: 0 the dense features, 1 the inputs' pooled vectors side
/// by side, then one per op; a slice is `[value, start, end)` columns, and an op's input given
/// as several slices is their concatenation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphSpec {
    /// Dense features per sample.
    pub dense: usize,
    pub ops: Vec<OpSpec>,
    pub output: Vec<SliceSpec>,
}

/// `[value, start, end]`.
pub type SliceSpec = (usize, usize, usize);

/// One operation of a [`GraphSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum OpSpec {
    /// `nn.Linear`: weights `weight` (`[out, in]`) and `bias` (`[out]`, none: zeros) by name,
    /// then `activation` (`none`, `relu`, `sigmoid`, `tanh`).
    Linear {
        input: Vec<SliceSpec>,
        weight: String,
        #[serde(default)]
        bias: Option<String>,
        #[serde(default = "none")]
        activation: String,
    },
    Activation {
        input: Vec<SliceSpec>,
        activation: String,
    },
    Add {
        a: Vec<SliceSpec>,
        b: Vec<SliceSpec>,
    },
    Mul {
        a: Vec<SliceSpec>,
        b: Vec<SliceSpec>,
    },
    /// Per sample, the dot products of `vectors[i]` and `vectors[j]` for each pair.
    Dots {
        vectors: Vec<Vec<SliceSpec>>,
        pairs: Vec<(usize, usize)>,
    },
}

/// One named float32 array of a model's dense weights (a `state_dict` entry).
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
    pub values: &'a [f32],
}

/// A [`Tensor`] owned: name, shape, values (a weight read from a file or off the wire).
pub type OwnedWeight = (String, Vec<usize>, Vec<f32>);

/// Owned weights as the tensors the model's calls take.
pub fn tensors(owned: &[OwnedWeight]) -> Vec<Tensor<'_>> {
    owned
        .iter()
        .map(|(name, shape, values)| Tensor {
            name,
            shape,
            values,
        })
        .collect()
}

/// Keeps a model with the store at `path`: its configuration and its dense weights as two
/// checksummed attachments (each written atomically), what
/// [`Store::infer`](crate::Inference::infer) and Python's `nearrec.models.load` read back. The weights go as a numpy `.npz` archive (no pickle).
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

fn none() -> String {
    "none".into()
}

/// The model kept with a store: its dense part, ready for the engine, and its input tables.
#[derive(Debug)]
pub struct StoredModel {
    /// The family (`rmc1`, `wnd`, ...).
    pub name: String,
    pub dense: DenseModel,
    /// The model's input tables, in input order.
    pub tables: Vec<String>,
    /// The inputs' names, which a request's lookups are matched by: the features, or the
    /// tables.
    pub inputs: Vec<String>,
    /// Each input's pooling, where the model fixes it.
    pub pooling: Option<Vec<PoolingMode>>,
}

/// A model's outputs for one batch: row-major `[batch, outputs]`, and where the time went.
#[derive(Debug, Clone)]
pub struct Inferred {
    pub outputs: Vec<f32>,
    pub batch: usize,
    pub width: usize,
    pub times: InferTimes,
}

/// A model as its store keeps it, read and checked but not built: what Python's
/// `nearrec.models.load` rebuilds the PyTorch model from.
#[derive(Debug)]
pub struct SavedModel {
    pub config: ModelConfig,
    weights: Weights,
}

impl SavedModel {
    /// Reads the model kept with the store `reader` opened: `NoModel` when it keeps none,
    /// `BadModel` when its attachments do not parse.
    pub fn read(reader: &StoreReader) -> Result<Self> {
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
        let mut config: ModelConfig = serde_json::from_slice(&config)
            .map_err(|e| bad(format!("{CONFIG_ATTACHMENT}: {e}")))?;
        let weights =
            Weights::read(&weights).map_err(|e| bad(format!("{WEIGHTS_ATTACHMENT}: {e}")))?;
        if config.tables.is_none() {
            config.tables = Some(numbered_tables(reader.tables()));
        }
        Ok(Self { config, weights })
    }

    /// A model as it travels (a node's `Model` answer): its configuration as JSON, its
    /// `tables` named ([`Self::config_json`]), and its weights.
    pub fn from_json(config: &str, weights: &[Tensor<'_>]) -> Result<Self> {
        let config: ModelConfig = serde_json::from_str(config)
            .map_err(|e| Error::invalid(format!("a model's configuration: {e}")))?;
        if config.tables.is_none() {
            return Err(Error::invalid(
                "a model's configuration names no input tables",
            ));
        }
        Ok(Self {
            config,
            weights: Weights::of(weights),
        })
    }

    /// The configuration as JSON.
    pub fn config_json(&self) -> String {
        serde_json::to_string(&self.config).expect("a configuration serialises")
    }

    /// The model built for the engine, each input table's width as `dim_of` gives it (the
    /// store's tables, or a sharded store's plan).
    pub fn build(&self, dim_of: impl Fn(&str) -> Result<usize>) -> Result<StoredModel> {
        let dims = (self.config.tables.iter().flatten())
            .map(|t| dim_of(t))
            .collect::<Result<Vec<_>>>()?;
        StoredModel::assemble(self.config.clone(), &self.weights, &dims)
    }

    /// The dense weights: `(name, shape, values)` per array.
    pub fn weights(&self) -> impl Iterator<Item = (&str, &[u64], &[f32])> {
        self.weights
            .0
            .iter()
            .map(|(name, (shape, values))| (name.as_str(), shape.as_slice(), values.as_slice()))
    }
}

/// The kept weight an update's `name` replaces: the one of that name, or else the one kept
/// name that ends it after a dot (a trainer's checkpoint of a wrapper around the model:
/// `model.over_arch.0.weight` for `over_arch.0.weight`).
fn kept_name(weights: &Weights, name: &str) -> Result<String> {
    if weights.0.contains_key(name) {
        return Ok(name.to_owned());
    }
    let ends = |k: &&String| {
        name.strip_suffix(k.as_str())
            .is_some_and(|p| p.ends_with('.'))
    };
    let mut found: Vec<&String> = weights.0.keys().filter(ends).collect();
    if found.len() == 1 {
        return Ok(found[0].clone());
    }
    found.sort_unstable();
    if found.len() > 1 {
        return Err(Error::invalid(format!(
            "weight {name:?} could be any of the kept model's {found:?}: name it as it keeps it"
        )));
    }
    let mut kept: Vec<&str> = weights.0.keys().map(String::as_str).collect();
    kept.sort_unstable();
    let more = if kept.len() > 6 { ", ..." } else { "" };
    Err(Error::invalid(format!(
        "the model kept with the store has no weight {name:?} (it keeps {}{more})",
        kept[..kept.len().min(6)].join(", ")
    )))
}

/// The model kept with the store `reader` opened, its dense weights `updates` in place of the
/// ones of their names (a partial update keeps the rest): each must be a weight the model
/// keeps, of its shape, finite and named once. The model is built from them before anything
/// is written, so an update that would not run is refused whole. Returns the new weights
/// attachment (`dense.npz`) and the model (`None` on a shard that lacks some of its tables:
/// there the names and shapes are what is checked).
pub(crate) fn updated(
    reader: &StoreReader,
    updates: &[Tensor<'_>],
) -> Result<(Vec<u8>, Option<StoredModel>)> {
    let SavedModel {
        config,
        mut weights,
    } = SavedModel::read(reader)?;
    if updates.is_empty() {
        return Err(Error::invalid("a model update names no weights"));
    }
    let mut seen = std::collections::HashSet::new();
    for t in updates {
        let name = kept_name(&weights, t.name)?;
        if !seen.insert(name.clone()) {
            return Err(Error::invalid(format!("weight {name:?} is given twice")));
        }
        let (shape, values) = weights.0.get_mut(&name).expect("a kept name");
        let given: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        if given != *shape || t.values.len() as u64 != shape.iter().product::<u64>() {
            return Err(Error::invalid(format!(
                "weight {:?} has shape {:?}, the kept model's {:?}",
                t.name, t.shape, shape
            )));
        }
        if let Some(i) = t.values.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(format!(
                "weight {:?} holds {} at flat position {i}",
                t.name, t.values[i]
            )));
        }
        values.copy_from_slice(t.values);
    }
    let npz = weights
        .to_npz()
        .map_err(|e| Error::invalid(format!("model weights: {e}")))?;
    let model = match (SavedModel { config, weights }).build(|t| table_dim(reader.tables(), t)) {
        // a shard that keeps the model for its router may hold only some of its tables
        Err(Error::Engine(EngineError::UnknownTable { .. })) => None,
        built => Some(built?),
    };
    Ok((npz, model))
}

impl StoredModel {
    /// Reads the model kept with the store `reader` opened.
    pub fn load(reader: &StoreReader) -> Result<Self> {
        let path = reader.path().display().to_string();
        let saved = SavedModel::read(reader)?;
        let built = saved.build(|t| table_dim(reader.tables(), t));
        built.map_err(|e| match e {
            Error::InvalidRequest { reason, .. } => Error::NoModel {
                path: path.clone(),
                reason,
            },
            Error::BadModel { reason, .. } => Error::BadModel {
                path: path.clone(),
                reason,
            },
            other => other,
        })
    }

    /// A model from its configuration (as `model.json` holds it, its `tables` given) and its
    /// dense weights, over input tables of widths `dims`: what Python's `offload` builds from a
    /// PyTorch model in memory, by the rules [`StoredModel::load`] reads a store's by. Weights
    /// that do not fit the family are an `InvalidRequest`.
    pub fn from_parts(config: ModelConfig, weights: &[Tensor<'_>], dims: &[usize]) -> Result<Self> {
        let w = Weights::of(weights);
        let name = config.model.clone();
        Self::assemble(config, &w, dims).map_err(|e| match e {
            Error::BadModel { reason, .. } => Error::invalid(format!("{name}: {reason}")),
            other => other,
        })
    }

    /// The model of `config` and `w` over inputs of widths `dims` (errors without a path).
    fn assemble(config: ModelConfig, w: &Weights, dims: &[usize]) -> Result<Self> {
        let tables = config
            .tables
            .clone()
            .ok_or_else(|| bad("the configuration names no input tables".into()))?;
        if dims.len() != tables.len() {
            return Err(bad(format!(
                "{} widths for {} input tables",
                dims.len(),
                tables.len()
            )));
        }
        let inputs = config.features.clone().unwrap_or_else(|| tables.clone());
        if inputs.len() != tables.len() {
            return Err(bad(format!(
                "{} features for {} input tables",
                inputs.len(),
                tables.len()
            )));
        }
        let pooling = match &config.pooling {
            None => None,
            Some(names) if names.len() != inputs.len() => {
                return Err(bad(format!(
                    "{} poolings for {} inputs",
                    names.len(),
                    inputs.len()
                )));
            }
            Some(names) => Some(
                names
                    .iter()
                    .map(|n| {
                        PoolingMode::from_name(n)
                            .ok_or_else(|| bad(format!("pooling {n:?} is not sum, mean or max")))
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        let dense = build(&config, w, dims)?;
        Ok(Self {
            name: config.model,
            dense,
            tables,
            inputs,
            pooling,
        })
    }

    /// `batch` as the model's inputs: as it is when `in_order` (already its tables in input
    /// order), else [`Self::arrange`]d.
    pub fn inputs_of<'a>(&'a self, batch: &Batch<'a>, in_order: bool) -> Result<Batch<'a>> {
        if in_order {
            return Ok(batch.clone());
        }
        self.arrange(batch)
    }

    /// `batch`'s lookups in the model's input order, matched by input name (the table, or the
    /// feature where the model names its inputs by feature; each then reads its table, pooled
    /// as the model fixes it): each input exactly once, nothing else.
    pub fn arrange<'a>(&'a self, batch: &Batch<'a>) -> Result<Batch<'a>> {
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
            .inputs
            .iter()
            .map(String::as_str)
            .filter(|t| !by_name.contains_key(t))
            .collect();
        let extra: Vec<&str> = batch
            .tables
            .iter()
            .map(|t| t.table)
            .filter(|t| !self.inputs.iter().any(|m| m == t))
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
                // a missing input named by the table it reads
                table: missing
                    .first()
                    .map(|m| &self.tables[self.inputs.iter().position(|i| i == m).unwrap_or(0)])
                    .map(String::as_str)
                    .or(extra.first().copied())
                    .map(str::to_owned),
                position: None,
                reason: format!(
                    "the lookups do not match the model's inputs {:?}: {}",
                    self.inputs,
                    parts.join("; ")
                ),
            });
        }
        Ok(Batch::new(
            self.inputs
                .iter()
                .zip(&self.tables)
                .enumerate()
                .map(|(k, (input, table))| {
                    let mut lookup = by_name[input.as_str()];
                    lookup.table = table;
                    if let Some(modes) = &self.pooling {
                        lookup.mode = modes[k];
                    }
                    lookup
                })
                .collect(),
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
