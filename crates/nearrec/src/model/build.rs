//! A kept model's dense part built from its configuration and weights: a family's layers by
//! their conventional names, or a captured graph's ops (`docs/format.md`, "Model attachments").

use super::*;

pub(super) fn build(config: &ModelConfig, w: &Weights, dims: &[usize]) -> Result<DenseModel> {
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
        "graph" => {
            let spec = config
                .graph
                .as_ref()
                .ok_or_else(|| bad("model \"graph\" without its graph".into()))?;
            graph(spec, w, dims)
        }
        "din" | "dien" => Err(Error::invalid(format!(
            "{}: whole-model offload covers DLRM (RMC1–3), WND, MTWND and NCF; run DIN and DIEN \
             with PyTorch MLPs",
            config.model
        ))),
        other => Err(bad(format!("unknown model {other:?}"))),
    }
}

/// A [`GraphSpec`] as the engine's [`Graph`], its layers' weights from `w`.
pub(super) fn graph(spec: &GraphSpec, w: &Weights, dims: &[usize]) -> Result<DenseModel> {
    let slices = |s: &[SliceSpec]| -> Vec<Slice> {
        s.iter()
            .map(|&(value, start, end)| Slice {
                value,
                cols: start..end,
            })
            .collect()
    };
    let activation = |i: usize, name: &str| {
        Activation::parse(name).ok_or_else(|| {
            bad(format!(
                "op {i}: unknown activation {name:?} (none, relu, sigmoid, tanh)"
            ))
        })
    };
    let ops = spec
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            Ok(match op {
                OpSpec::Linear {
                    input,
                    weight,
                    bias,
                    activation: act,
                } => Op::Linear {
                    input: slices(input),
                    layer: w.linear(weight, bias.as_deref(), activation(i, act)?)?,
                },
                OpSpec::Activation {
                    input,
                    activation: act,
                } => Op::Activation {
                    input: slices(input),
                    activation: activation(i, act)?,
                },
                OpSpec::Add { a, b } => Op::Add {
                    a: slices(a),
                    b: slices(b),
                },
                OpSpec::Mul { a, b } => Op::Mul {
                    a: slices(a),
                    b: slices(b),
                },
                OpSpec::Dots { vectors, pairs } => Op::Dots {
                    vectors: vectors.iter().map(|v| slices(v)).collect(),
                    pairs: pairs.clone(),
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Graph::new(spec.dense, dims.to_vec(), ops, slices(&spec.output))
        .map(DenseModel::graph)
        .map_err(|e| bad(e.to_string()))
}

pub(super) fn bad(reason: String) -> Error {
    Error::BadModel {
        path: String::new(),
        reason,
    }
}

/// The float arrays of an `.npz` archive, by name (`"bottom.0.weight"`).
#[derive(Debug)]
pub(super) struct Weights(pub(super) HashMap<String, (Vec<u64>, Vec<f32>)>);

impl Weights {
    pub(super) fn of(tensors: &[Tensor<'_>]) -> Self {
        let owned = |t: &Tensor<'_>| {
            let shape = t.shape.iter().map(|&d| d as u64).collect();
            (t.name.to_owned(), (shape, t.values.to_vec()))
        };
        Self(tensors.iter().map(owned).collect())
    }

    /// The weights as numpy's uncompressed `.npz`, arrays in name order.
    pub(super) fn to_npz(&self) -> std::result::Result<Vec<u8>, String> {
        let mut arrays: Vec<(&str, &[u64], &[f32])> = (self.0.iter())
            .map(|(name, (shape, values))| (name.as_str(), &shape[..], &values[..]))
            .collect();
        arrays.sort_unstable_by_key(|a| a.0);
        let mut out = Cursor::new(Vec::new());
        nearrec_format::npz::write_npz_f32(&mut out, &arrays).map_err(|e| e.to_string())?;
        Ok(out.into_inner())
    }

    pub(super) fn read(bytes: &[u8]) -> std::result::Result<Self, String> {
        let arrays = nearrec_format::npz::read_npz_f32(bytes)?;
        Ok(Self(
            arrays
                .into_iter()
                .map(|(name, f)| (name, (f.shape, f.values)))
                .collect(),
        ))
    }

    /// One `nn.Linear` from its weight (`[out, in]`) and bias (`[out]`; none: zeros) by name.
    fn linear(&self, weight: &str, bias: Option<&str>, activation: Activation) -> Result<Linear> {
        let (shape, values) = self
            .0
            .get(weight)
            .ok_or_else(|| bad(format!("no {weight} in the weights")))?;
        let [outputs, inputs] = shape[..] else {
            return Err(bad(format!("{weight} has shape {shape:?}, not [out, in]")));
        };
        let (outputs, inputs) = (outputs as usize, inputs as usize);
        let bias = match bias.map(|b| (b, self.0.get(b))) {
            Some((_, Some((s, b)))) if s[..] == [outputs as u64] => b.clone(),
            Some((name, Some((s, _)))) => {
                return Err(bad(format!("{name} has shape {s:?}, not [{outputs}]")));
            }
            Some((name, None)) => return Err(bad(format!("no {name} in the weights"))),
            None => vec![0.0; outputs],
        };
        Linear::new(values.clone(), bias, outputs, inputs, activation)
            .map_err(|e| bad(format!("{weight}: {e}")))
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
                let bias = format!("{prefix}.{i}.bias");
                let activation = if j + 1 == n { last } else { Activation::Relu };
                self.linear(
                    &format!("{prefix}.{i}.weight"),
                    self.0.contains_key(&bias).then_some(bias.as_str()),
                    activation,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Mlp::new(layers).map_err(|e| bad(format!("{prefix}: {e}")))
    }
}
