//! The Open Inference Protocol's tensors ([`crate::inference`]) to and from the facade's: how the
//! stores a node serves are models to Triton's and KServe's clients (`docs/serving.md`, "Triton
//! and KServe"), with the tensors `nearrec triton export` gives a store on Triton, so that a
//! client moves between the two unchanged:
//!
//! - the model `STORE`: the store's kept model — [`DENSE`] FP32 `[B, dense width]` when it has
//!   dense features; per input (a feature, or a table) `INPUT` INT64 `[B, L]`, each sample's ids
//!   in its row padded past its length, and `INPUT__lengths` INT64 `[B, 1]`; out
//!   [`PREDICTIONS`] FP32 `[B, outputs]`. A store that keeps no model is its pooled lookups
//!   under this name too, as on Triton.
//! - the model `STORE.pooled`: the store's pooled lookups, per table the same two inputs; out
//!   [`POOLED`] FP32 `[B, Σ dim]`, the tables in the order the request gives them (as a lookup
//!   of the node's own protocol).
//!
//! Tensors come in `raw_input_contents` (little-endian, as `tritonclient` sends them) or in
//! `contents`. Ids whose samples all fill their rows are taken as they are — read in place from a
//! raw tensor aligned for them, else copied once as the native protocol's are — and a padded
//! tensor is compacted once. Every fault names its input, and the sample where it has one.

use bytes::Bytes;
use nearrec::{Bags, Batch, Error, Indices, Result, StoreApi, TableLookup};

use crate::arrays::{decode, encode};
use crate::inference as pb;
use pb::model_infer_request::InferInputTensor;
use pb::model_metadata_response::TensorMetadata;

/// The dense features' input.
pub const DENSE: &str = "dense";
/// What an input's lengths tensor adds to its name.
pub const LENGTHS: &str = "__lengths";
/// The kept model's output.
pub const PREDICTIONS: &str = "predictions";
/// The pooled lookups' output.
pub const POOLED: &str = "pooled";
/// What the name of a store's pooled-lookup model adds to the store's.
pub const POOLED_MODEL: &str = ".pooled";
/// Every model's one version: a store's own versions are its (`nearrec info`), not a model's.
pub const VERSION: &str = "1";

/// The store a model's name serves, and whether it names the store's pooled lookups.
pub fn store_of(model: &str) -> (&str, bool) {
    match model.strip_suffix(POOLED_MODEL) {
        Some(store) => (store, true),
        None => (model, false),
    }
}

fn invalid(input: &str, position: Option<usize>, reason: String) -> Error {
    Error::InvalidRequest {
        table: Some(input.to_owned()),
        position,
        reason,
    }
}

/// `version` of a model: empty (the one there is) or [`VERSION`].
pub fn check_version(model: &str, version: &str) -> Result<()> {
    if version.is_empty() || version == VERSION {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "model {model:?} has version {VERSION} only, not {version:?}"
    )))
}

/// A model as the protocol shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// Its inputs in order, each the two tensors of its ids and lengths.
    pub inputs: Vec<String>,
    /// The width of its dense features; 0: no [`DENSE`] input.
    pub dense: usize,
    /// Its output, [`PREDICTIONS`] or [`POOLED`], and the output's width.
    pub output: &'static str,
    pub width: usize,
}

impl Signature {
    /// What `store` is as the model `STORE` (its kept model, or its pooled lookups when it keeps
    /// none) or with `pooled` as `STORE.pooled`.
    pub fn of(store: &dyn StoreApi, pooled: bool) -> Result<Self> {
        let info = store.info()?;
        if info.model && !pooled {
            let saved = store.able(store.inference(), "infer")?.saved_model()?;
            let model = saved.build(|t| Ok(info.table(t)?.dim as usize))?;
            return Ok(Self {
                dense: model.dense.dense_width(),
                width: model.dense.outputs(),
                inputs: model.inputs,
                output: PREDICTIONS,
            });
        }
        Ok(Self {
            inputs: info.tables.iter().map(|t| t.name.clone()).collect(),
            dense: 0,
            output: POOLED,
            width: info.tables.iter().map(|t| t.dim as usize).sum(),
        })
    }

    /// The model `name`'s metadata: each dimension of any size `-1`, the batch's first.
    pub fn metadata(&self, name: &str) -> pb::ModelMetadataResponse {
        let tensor = |name: &str, datatype: &str, width: i64| TensorMetadata {
            name: name.to_owned(),
            datatype: datatype.to_owned(),
            shape: vec![-1, width],
        };
        let dense = (self.dense > 0).then(|| tensor(DENSE, "FP32", self.dense as i64));
        let ids = self.inputs.iter().flat_map(|input| {
            [
                tensor(input, "INT64", -1),
                tensor(&format!("{input}{LENGTHS}"), "INT64", 1),
            ]
        });
        pb::ModelMetadataResponse {
            name: name.to_owned(),
            versions: vec![VERSION.to_owned()],
            platform: "nearrec".to_owned(),
            inputs: dense.into_iter().chain(ids).collect(),
            outputs: vec![tensor(self.output, "FP32", self.width as i64)],
        }
    }
}

/// One input's ids: the request's own bytes, or copied out of them.
#[derive(Debug)]
enum Ids {
    /// A raw tensor aligned for `i64`, a whole number of them.
    Raw(Bytes),
    Owned(Vec<i64>),
}

impl Ids {
    fn view(&self) -> &[i64] {
        match self {
            Self::Raw(b) => bytemuck::cast_slice(b),
            Self::Owned(v) => v,
        }
    }
}

/// One input's lookup: its ids, and each sample's count of them (`None`: every sample fills its
/// row of `row`).
#[derive(Debug)]
struct Feature {
    name: String,
    ids: Ids,
    row: usize,
    lengths: Option<Vec<i64>>,
}

/// A `ModelInferRequest`'s inputs, checked: its samples, dense features and lookups.
#[derive(Debug)]
pub struct Inputs {
    pub batch: usize,
    /// `[batch, dense width]`; empty without a [`DENSE`] input.
    pub dense: Vec<f32>,
    features: Vec<Feature>,
}

/// One tensor of a request: its message and its raw contents, if the request sends them so.
struct Tensor<'r> {
    t: &'r InferInputTensor,
    raw: Option<&'r Bytes>,
}

impl Tensor<'_> {
    /// Its shape as `[rows, columns]` (`[rows]` is one column), its rows to agree with `batch`.
    fn matrix(&self, batch: &mut Option<usize>) -> Result<(usize, usize)> {
        let t = self.t;
        let dims: Vec<usize> = (t.shape.iter())
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| invalid(&t.name, None, format!("has shape {:?}", t.shape)))?;
        let (rows, columns) = match dims[..] {
            [rows] => (rows, 1),
            [rows, columns] => (rows, columns),
            _ => {
                return Err(invalid(
                    &t.name,
                    None,
                    format!("has shape {:?}, not [batch, width]", t.shape),
                ));
            }
        };
        match *batch {
            Some(b) if b != rows => Err(invalid(
                &t.name,
                None,
                format!("has {rows} samples, the request's other inputs {b}"),
            )),
            _ => {
                *batch = Some(rows);
                Ok((rows, columns))
            }
        }
    }

    /// Its type held to `want`.
    fn typed(&self, want: &str) -> Result<()> {
        match self.t.datatype == want {
            true => Ok(()),
            false => Err(invalid(
                &self.t.name,
                None,
                format!("is {}, not {want}", self.t.datatype),
            )),
        }
    }

    /// Its values counted against its shape.
    fn counted(&self, have: usize, rows: usize, columns: usize) -> Result<()> {
        match rows.checked_mul(columns) == Some(have) {
            true => Ok(()),
            false => Err(invalid(
                &self.t.name,
                None,
                format!("holds {have} values for its shape {:?}", self.t.shape),
            )),
        }
    }

    fn int64s(&self, rows: usize, columns: usize) -> Result<Ids> {
        self.typed("INT64")?;
        let ids = match self.raw {
            Some(b) if bytemuck::try_cast_slice::<u8, i64>(b).is_ok() => Ids::Raw(b.clone()),
            Some(b) => Ids::Owned(decode(b, &self.t.name, "raw_input_contents")?),
            None => Ids::Owned(
                self.contents()
                    .map_or_else(Vec::new, |c| c.int64_contents.clone()),
            ),
        };
        self.counted(ids.view().len(), rows, columns)?;
        Ok(ids)
    }

    fn fp32s(&self, rows: usize, columns: usize) -> Result<Vec<f32>> {
        self.typed("FP32")?;
        let values = match self.raw {
            Some(b) => decode(b, &self.t.name, "raw_input_contents")?,
            None => self
                .contents()
                .map_or_else(Vec::new, |c| c.fp32_contents.clone()),
        };
        self.counted(values.len(), rows, columns)?;
        Ok(values)
    }

    fn contents(&self) -> Option<&pb::InferTensorContents> {
        self.t.contents.as_ref()
    }
}

impl Inputs {
    /// The request's inputs, each held to its type and shape, its lengths to its rows.
    pub fn of(req: &pb::ModelInferRequest) -> Result<Self> {
        let raw = &req.raw_input_contents;
        if !raw.is_empty() && raw.len() != req.inputs.len() {
            return Err(Error::invalid(format!(
                "raw_input_contents holds {} tensors for the request's {} inputs",
                raw.len(),
                req.inputs.len()
            )));
        }
        let tensors: Vec<Tensor<'_>> = (req.inputs.iter().enumerate())
            .map(|(k, t)| Tensor { t, raw: raw.get(k) })
            .collect();
        let find = |name: &str| tensors.iter().find(|t| t.t.name == name);
        let mut names = std::collections::HashSet::new();
        if let Some(t) = tensors.iter().find(|t| !names.insert(t.t.name.as_str())) {
            return Err(invalid(&t.t.name, None, "is given twice".into()));
        }
        let (mut batch, mut dense, mut features) = (None, Vec::new(), Vec::new());
        for tensor in &tensors {
            let name = tensor.t.name.as_str();
            if name == DENSE {
                let (rows, columns) = tensor.matrix(&mut batch)?;
                dense = tensor.fp32s(rows, columns)?;
            } else if let Some(input) = name.strip_suffix(LENGTHS) {
                if find(input).is_none() {
                    return Err(invalid(
                        name,
                        None,
                        format!("comes without input {input:?}"),
                    ));
                }
            } else {
                let lengths = find(&format!("{name}{LENGTHS}")).ok_or_else(|| {
                    invalid(
                        name,
                        None,
                        format!("comes without its lengths, {name}{LENGTHS}"),
                    )
                })?;
                features.push(Self::feature(tensor, lengths, &mut batch)?);
            }
        }
        if features.is_empty() {
            return Err(Error::invalid(
                "the request gives no input's ids (each input `INPUT` with `INPUT__lengths`)",
            ));
        }
        Ok(Self {
            batch: batch.unwrap_or(0),
            dense,
            features,
        })
    }

    /// An input's ids and lengths: each length within its row, the ids compacted when some
    /// sample does not fill its row.
    fn feature(
        ids: &Tensor<'_>,
        lengths: &Tensor<'_>,
        batch: &mut Option<usize>,
    ) -> Result<Feature> {
        let (rows, row) = ids.matrix(batch)?;
        let (samples, one) = lengths.matrix(batch)?;
        if one != 1 {
            let shape = &lengths.t.shape;
            return Err(invalid(
                &lengths.t.name,
                None,
                format!("has shape {shape:?}, not [batch, 1]"),
            ));
        }
        let counts = lengths.int64s(samples, 1)?;
        let counts = counts.view();
        if let Some(s) = counts.iter().position(|&n| n < 0 || n as usize > row) {
            return Err(invalid(
                &lengths.t.name,
                Some(s),
                format!(
                    "sample {s} has length {}, not 0 to the {row} ids of its row",
                    counts[s]
                ),
            ));
        }
        let name = ids.t.name.clone();
        let padded = ids.int64s(rows, row)?;
        if counts.iter().all(|&n| n as usize == row) {
            return Ok(Feature {
                name,
                ids: padded,
                row,
                lengths: None,
            });
        }
        let padded = padded.view();
        let total = counts.iter().sum::<i64>() as usize;
        let mut compact = Vec::with_capacity(total);
        for (sample, &n) in counts.iter().enumerate() {
            compact.extend_from_slice(&padded[sample * row..sample * row + n as usize]);
        }
        Ok(Feature {
            name,
            ids: Ids::Owned(compact),
            row,
            lengths: Some(counts.to_vec()),
        })
    }

    /// The lookups, one per input in the request's order, named by their inputs.
    pub fn lookups<'a>(&'a self) -> Batch<'a> {
        let lookup = |f: &'a Feature| {
            let bags = match &f.lengths {
                Some(n) => Bags::Lengths(Indices::I64(n)),
                None => Bags::Fixed {
                    batch: self.batch,
                    bag_size: f.row,
                },
            };
            TableLookup::new(&f.name, Indices::I64(f.ids.view()), bags)
        };
        Batch::new(self.features.iter().map(lookup).collect())
    }

    /// Whether the ids of input `k` are read in place from the request.
    pub fn in_place(&self, k: usize) -> bool {
        matches!(
            self.features.get(k),
            Some(Feature {
                ids: Ids::Raw(_),
                ..
            })
        )
    }
}

/// The outputs `req` asks for held to the model's one, `output`.
pub fn check_outputs(req: &pb::ModelInferRequest, output: &str) -> Result<()> {
    match req.outputs.iter().find(|o| o.name != output) {
        None => Ok(()),
        Some(o) => Err(invalid(
            &o.name,
            None,
            format!(
                "is no output of model {:?}: its output is {output:?}",
                req.model_name
            ),
        )),
    }
}

/// The answer to `req`: output `output`, `[batch, width]` row-major, sent raw.
pub fn answer(
    req: &pb::ModelInferRequest,
    output: &str,
    batch: usize,
    width: usize,
    values: Vec<f32>,
) -> pb::ModelInferResponse {
    pb::ModelInferResponse {
        model_name: req.model_name.clone(),
        model_version: VERSION.to_owned(),
        id: req.id.clone(),
        parameters: Default::default(),
        outputs: vec![pb::model_infer_response::InferOutputTensor {
            name: output.to_owned(),
            datatype: "FP32".to_owned(),
            shape: vec![batch as i64, width as i64],
            ..Default::default()
        }],
        raw_output_contents: vec![encode(values)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrays::encode_slice;

    fn tensor(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            ..Default::default()
        }
    }

    /// An input: its name, type, shape and values (as i64 or f32 bytes).
    type Input<'a> = (&'a str, &'a str, &'a [i64], Bytes);

    /// A request of `inputs`, sent raw.
    fn request(inputs: &[Input<'_>]) -> pb::ModelInferRequest {
        pb::ModelInferRequest {
            model_name: "s".into(),
            inputs: inputs.iter().map(|(n, d, s, _)| tensor(n, d, s)).collect(),
            raw_input_contents: inputs.iter().map(|(.., b)| b.clone()).collect(),
            ..Default::default()
        }
    }

    fn ints(v: &[i64]) -> Bytes {
        encode_slice(v)
    }

    /// Each lookup's table, ids and bags as plain vectors.
    fn plain(batch: &Batch<'_>) -> Vec<(String, Vec<i64>, String)> {
        let ids = |i: &Indices<'_>| match i {
            Indices::I64(v) => v.to_vec(),
            Indices::I32(v) => v.iter().map(|&x| x as i64).collect(),
        };
        (batch.tables.iter())
            .map(|t| {
                let bags = match &t.bags {
                    Bags::Lengths(n) => format!("lengths {:?}", ids(n)),
                    Bags::Fixed { batch, bag_size } => format!("fixed {batch}x{bag_size}"),
                    Bags::Offsets { .. } => "offsets".into(),
                };
                (t.table.to_owned(), ids(&t.indices), bags)
            })
            .collect()
    }

    #[test]
    fn padded_ids_are_compacted_and_full_rows_taken_whole() {
        let dense: Vec<f32> = vec![0.5, 1.0, -1.0, 2.0];
        let req = request(&[
            ("dense", "FP32", &[2, 2], encode_slice(&dense)),
            ("a", "INT64", &[2, 3], ints(&[1, 2, 9, 4, 9, 9])),
            ("a__lengths", "INT64", &[2, 1], ints(&[2, 1])),
            ("b", "INT64", &[2, 2], ints(&[5, 6, 7, 8])),
            ("b__lengths", "INT64", &[2, 1], ints(&[2, 2])),
        ]);
        let inputs = Inputs::of(&req).unwrap();
        assert_eq!((inputs.batch, &inputs.dense), (2, &dense));
        assert_eq!(
            plain(&inputs.lookups()),
            [
                ("a".into(), vec![1, 2, 4], "lengths [2, 1]".into()),
                ("b".into(), vec![5, 6, 7, 8], "fixed 2x2".into()),
            ]
        );
        // the same request in `contents` reads the same
        let mut typed = req.clone();
        for (t, raw) in typed.inputs.iter_mut().zip(&req.raw_input_contents) {
            let mut c = pb::InferTensorContents::default();
            match t.datatype.as_str() {
                "FP32" => c.fp32_contents = decode(raw, "", "").unwrap(),
                _ => c.int64_contents = decode(raw, "", "").unwrap(),
            }
            t.contents = Some(c);
        }
        typed.raw_input_contents.clear();
        let again = Inputs::of(&typed).unwrap();
        assert_eq!(plain(&again.lookups()), plain(&inputs.lookups()));
        assert_eq!(again.dense, dense);
    }

    #[test]
    fn aligned_raw_ids_are_read_in_place() {
        // a Bytes over a Vec<i64> is aligned for it
        let ids = encode(vec![3i64, 4, 5, 6]);
        let req = request(&[
            ("a", "INT64", &[2, 2], ids.clone()),
            ("a__lengths", "INT64", &[2, 1], ints(&[2, 2])),
        ]);
        let inputs = Inputs::of(&req).unwrap();
        assert!(inputs.in_place(0));
        let batch = inputs.lookups();
        let Indices::I64(read) = batch.tables[0].indices else {
            panic!("int64 ids")
        };
        assert_eq!(read.as_ptr() as *const u8, ids.as_ptr());
        // one byte off, they are copied
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&ids);
        let req = request(&[
            ("a", "INT64", &[2, 2], Bytes::from(shifted).slice(1..)),
            ("a__lengths", "INT64", &[2, 1], ints(&[2, 2])),
        ]);
        let inputs = Inputs::of(&req).unwrap();
        assert!(!inputs.in_place(0));
        assert_eq!(plain(&inputs.lookups())[0].1, [3, 4, 5, 6]);
    }

    #[test]
    fn faults_name_their_input_and_sample() {
        let cases: Vec<(Vec<Input<'_>>, &str, Option<usize>, &str)> = vec![
            (
                vec![
                    ("a", "INT64", &[2, 2], ints(&[1, 2, 3, 4])),
                    ("a__lengths", "INT64", &[2, 1], ints(&[2, 3])),
                ],
                "a__lengths",
                Some(1),
                "sample 1 has length 3",
            ),
            (
                vec![
                    ("a", "INT64", &[2, 2], ints(&[1, 2, 3])),
                    ("a__lengths", "INT64", &[2, 1], ints(&[1, 1])),
                ],
                "a",
                None,
                "holds 3 values",
            ),
            (
                vec![("a", "INT64", &[2, 2], ints(&[1, 2, 3, 4]))],
                "a",
                None,
                "without its lengths",
            ),
            (
                vec![
                    ("a", "INT32", &[1, 1], ints(&[1])),
                    ("a__lengths", "INT64", &[1, 1], ints(&[1])),
                ],
                "a",
                None,
                "is INT32, not INT64",
            ),
            (
                vec![
                    ("a", "INT64", &[1, 1], ints(&[1])),
                    ("a__lengths", "INT64", &[1, 1], ints(&[1])),
                    ("dense", "FP32", &[2, 1], encode_slice(&[1f32, 2.0])),
                ],
                "dense",
                None,
                "has 2 samples, the request's other inputs 1",
            ),
            (
                vec![("b__lengths", "INT64", &[1, 1], ints(&[1]))],
                "b__lengths",
                None,
                "without input",
            ),
            (
                vec![
                    ("a", "INT64", &[1, 1], ints(&[1])),
                    ("a", "INT64", &[1, 1], ints(&[1])),
                ],
                "a",
                None,
                "given twice",
            ),
        ];
        for (inputs, input, position, says) in cases {
            let e = Inputs::of(&request(&inputs)).unwrap_err();
            assert_eq!(e.kind(), nearrec::ErrorKind::InvalidRequest, "{e}");
            assert_eq!((e.table(), e.position()), (Some(input), position), "{e}");
            assert!(e.to_string().contains(says), "{e} (wanted {says:?})");
        }
        let e = Inputs::of(&request(&[(
            "dense",
            "FP32",
            &[1, 1],
            encode_slice(&[1f32]),
        )]));
        assert!(e.unwrap_err().to_string().contains("no input's ids"));
        let mut short = request(&[("a", "INT64", &[1, 1], ints(&[1]))]);
        short.raw_input_contents.push(ints(&[1]));
        let e = Inputs::of(&short).unwrap_err();
        assert!(
            e.to_string()
                .contains("2 tensors for the request's 1 inputs"),
            "{e}"
        );
    }

    #[test]
    fn names_versions_and_outputs() {
        assert_eq!(store_of("s.pooled"), ("s", true));
        assert_eq!(store_of("s"), ("s", false));
        assert!(check_version("s", "").is_ok() && check_version("s", "1").is_ok());
        assert!(
            check_version("s", "2")
                .unwrap_err()
                .to_string()
                .contains("version 1 only")
        );
        let mut req = request(&[]);
        req.outputs
            .push(pb::model_infer_request::InferRequestedOutputTensor {
                name: "pooled".into(),
                ..Default::default()
            });
        assert!(check_outputs(&req, POOLED).is_ok());
        let e = check_outputs(&req, PREDICTIONS).unwrap_err();
        assert_eq!(e.table(), Some("pooled"));
        let answer = answer(&req, POOLED, 2, 3, vec![0.0; 6]);
        assert_eq!(answer.outputs[0].shape, [2, 3]);
        assert_eq!(answer.raw_output_contents[0].len(), 24);
        let sig = Signature {
            inputs: vec!["a".into()],
            dense: 4,
            output: PREDICTIONS,
            width: 1,
        };
        let meta = sig.metadata("s");
        let names: Vec<_> = meta
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), t.shape.clone()))
            .collect();
        assert_eq!(
            names,
            [
                ("dense", vec![-1, 4]),
                ("a", vec![-1, -1]),
                ("a__lengths", vec![-1, 1])
            ]
        );
    }
}
