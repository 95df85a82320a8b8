//! A delta file read: an Arrow IPC stream or a Parquet file, batch by batch, every row checked
//! against its table's shape before anything is returned.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Field, Schema};
use rustc_hash::FxHashMap;

use super::{
    Changes, DELTA_VERSION, DTYPE_KEY, Delta, Encoding, FORMAT_KEY, Header, Op, SEQUENCE_KEY,
    STEP_KEY, Shape, Values, WALL_TIME_KEY,
};
use crate::dtype::DType;
use crate::error::{FormatError, Result};

/// Reads delta file `path` whole, every row checked against `shape_of(table)` (`None`: no
/// such table): an id out of the table's rows (a keyed table's are any 64 bits), values not of
/// the table's dim, encoded rows not of its dtype or row size, a value not finite, an id named
/// twice for one table, a row missing its table, id or op — each refused naming the row (0
/// first, across the file's batches) and column. The header is checked against the name.
pub fn read(path: &Path, shape_of: impl Fn(&str) -> Option<Shape>) -> Result<Delta> {
    let bad = |row: Option<u64>, column: Option<&str>, reason: String| FormatError::BadDelta {
        path: path.to_owned(),
        row,
        column: column.map(str::to_owned),
        reason,
    };
    let (named, encoding) = super::named(path)?;
    let bytes = crate::files::read_regular(path, 0).map_err(|e| FormatError::io(path, e))?;
    let malformed =
        |e: &dyn std::fmt::Display| bad(None, None, format!("not a readable file: {e}"));
    // the schema as written, its metadata with it (a Parquet reader's own drops it)
    let (schema, batches): (_, Box<dyn Iterator<Item = _>>) = match encoding {
        Encoding::Arrow => {
            let r = caught("Arrow IPC", || {
                arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| malformed(&e))?;
            (r.schema(), Box::new(Caught(r)))
        }
        Encoding::Parquet => {
            let (schema, batches) = parquet_batches(bytes).map_err(|e| malformed(&e))?;
            (schema, Box::new(batches.into_iter().map(Ok)))
        }
    };
    let header = header(&schema, named).map_err(|reason| bad(None, None, reason))?;
    let columns =
        Columns::of(&schema).map_err(|(column, reason)| bad(None, Some(column), reason))?;
    let mut reader = Reader::new(&shape_of, columns);
    for batch in batches {
        let batch = batch.map_err(|e| {
            bad(
                Some(reader.row),
                None,
                format!("a batch that does not read: {e}"),
            )
        })?;
        reader
            .batch(&batch)
            .map_err(|(row, column, reason)| bad(Some(row), Some(column), reason))?;
    }
    Ok(Delta {
        path: path.to_owned(),
        header,
        tables: reader.tables,
    })
}

/// `read` run with a panic inside it taken as an error: the `arrow-ipc` and `parquet` crates
/// panic on some malformed files (found by fuzzing: in `parquet` a definition-level run past
/// its page, `bit_chunk_iterator.rs` "offset + len out of bounds"; in `arrow-ipc` a stream's
/// malformed message), and such a panic is the file's refusal, not the process's end.
fn caught<T>(
    reader: &str,
    read: impl FnOnce() -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|panic| {
        let said = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(format!("the {reader} reader failed on it ({said})"))
    })
}

/// An Arrow IPC stream's batches, each read under [`caught`].
struct Caught<R>(R);

impl<R: Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>>> Iterator
    for Caught<R>
{
    type Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = caught("Arrow IPC", || Ok(self.0.next()));
        next.unwrap_or_else(|e| Some(Err(arrow_schema::ArrowError::IpcError(e))))
    }
}

/// A Parquet file's schema (as written, its metadata with it) and every batch of it, read
/// under [`caught`].
pub(super) fn parquet_batches(
    bytes: Vec<u8>,
) -> std::result::Result<(arrow_schema::SchemaRef, Vec<RecordBatch>), String> {
    caught("Parquet", move || {
        let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            bytes::Bytes::from(bytes),
        )
        .map_err(|e| e.to_string())?;
        let schema = b.schema().clone();
        let batches = b
            .with_batch_size(64 * 1024)
            .build()
            .map_err(|e| e.to_string())?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| format!("a batch that does not read: {e}"))?;
        Ok((schema, batches))
    })
}

/// Delta file `path`'s header alone (its schema's metadata, checked against its name), its
/// rows not read: where a log of delta files (the evicted keys') says it has got to.
pub fn header_of(path: &Path) -> Result<Header> {
    let bad = |reason: String| FormatError::BadDelta {
        path: path.to_owned(),
        row: None,
        column: None,
        reason,
    };
    let (named, encoding) = super::named(path)?;
    let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    let schema = match encoding {
        Encoding::Arrow => caught("Arrow IPC", || {
            arrow_ipc::reader::StreamReader::try_new(std::io::BufReader::new(file), None)
                .map(|r| r.schema())
                .map_err(|e| e.to_string())
        }),
        Encoding::Parquet => caught("Parquet", || {
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .map(|b| b.schema().clone())
                .map_err(|e| e.to_string())
        }),
    }
    .map_err(|e| bad(format!("not a readable file: {e}")))?;
    header(&schema, named).map_err(bad)
}

/// A row refused: the row, its column, why.
pub(super) type Refusal = (u64, &'static str, String);

/// The file's header from its schema's metadata, its sequence the one its name gives.
fn header(schema: &Schema, named: u64) -> std::result::Result<Header, String> {
    let meta = schema.metadata();
    let number = |key: &str| -> std::result::Result<Option<u64>, String> {
        meta.get(key)
            .map(|v| {
                (v.trim().parse::<u64>())
                    .map_err(|_| format!("schema metadata {key:?} = {v:?} is not a whole number"))
            })
            .transpose()
    };
    match meta.get(FORMAT_KEY) {
        Some(v) if v == DELTA_VERSION => {}
        Some(v) => {
            return Err(format!(
                "schema metadata {FORMAT_KEY:?} = {v:?}: this nearrec reads delta format \
                 {DELTA_VERSION}"
            ));
        }
        None => {
            return Err(format!(
                "no schema metadata {FORMAT_KEY:?}: not a nearrec delta file"
            ));
        }
    }
    let sequence =
        number(SEQUENCE_KEY)?.ok_or_else(|| format!("no schema metadata {SEQUENCE_KEY:?}"))?;
    if sequence != named {
        return Err(format!(
            "its schema says sequence {sequence}, its name {named}"
        ));
    }
    Ok(Header {
        sequence,
        step: number(STEP_KEY)?,
        wall_time_ms: number(WALL_TIME_KEY)?,
    })
}

/// Where the four columns are, and what the values hold.
pub(super) struct Columns {
    pub(super) table: usize,
    pub(super) id: usize,
    pub(super) op: usize,
    pub(super) values: usize,
    /// Encoded rows of this dtype (a binary column); `None`: float32 lists.
    pub(super) encoded: Option<DType>,
}

impl Columns {
    fn of(schema: &Schema) -> std::result::Result<Self, (&'static str, String)> {
        let find = |name: &'static str| {
            schema
                .index_of(name)
                .map_err(|_| (name, "the file has no such column".to_owned()))
        };
        let values = find("values")?;
        let field: &Field = schema.field(values);
        let encoded = match field.data_type() {
            DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f)
                if f.data_type() == &DataType::Float32 =>
            {
                None
            }
            DataType::FixedSizeBinary(_) | DataType::Binary | DataType::LargeBinary => {
                let name = field.metadata().get(DTYPE_KEY).ok_or((
                    "values",
                    format!("encoded rows (a binary column) need the field metadata {DTYPE_KEY:?} naming their dtype"),
                ))?;
                Some(
                    name.parse::<DType>()
                        .map_err(|e| ("values", e.to_string()))?,
                )
            }
            other => {
                return Err((
                    "values",
                    format!("{other} is not a list of float32 nor binary encoded rows"),
                ));
            }
        };
        Ok(Self {
            table: find("table")?,
            id: find("id")?,
            op: find("op")?,
            values,
            encoded,
        })
    }
}

/// A file's rows checked batch by batch and grouped by table.
pub(super) struct Reader<'a, F> {
    shape_of: &'a F,
    columns: Columns,
    tables: Vec<Changes>,
    /// Table name → its index in `tables` and its shape.
    index: HashMap<String, (usize, Shape)>,
    /// Per table of `tables`: each id named so far, with its row.
    seen: Vec<FxHashMap<i64, u64>>,
    /// The file's row the batch starts at.
    row: u64,
}

impl<'a, F: Fn(&str) -> Option<Shape>> Reader<'a, F> {
    pub(super) fn new(shape_of: &'a F, columns: Columns) -> Self {
        Self {
            shape_of,
            columns,
            tables: Vec::new(),
            index: HashMap::new(),
            seen: Vec::new(),
            row: 0,
        }
    }

    /// The rows read, by table in the order the file first names them.
    pub(super) fn into_tables(self) -> Vec<Changes> {
        self.tables
    }

    pub(super) fn batch(&mut self, batch: &RecordBatch) -> std::result::Result<(), Refusal> {
        let first = self.row;
        let c = &self.columns;
        let tables =
            Strings::of(batch.column(c.table).as_ref()).map_err(|r| (first, "table", r))?;
        let ids = Ints::of(batch.column(c.id).as_ref()).map_err(|r| (first, "id", r))?;
        let ops = OpColumn::of(batch.column(c.op).as_ref()).map_err(|r| (first, "op", r))?;
        let values = Rows::of(batch.column(c.values)).map_err(|r| (first, "values", r))?;
        let encoded = c.encoded;
        for i in 0..batch.num_rows() {
            let row = first + i as u64;
            let name = tables.get(i).ok_or((row, "table", "null".to_owned()))?;
            let (at, shape) = match self.index.get(name) {
                Some(&found) => found,
                None => {
                    let shape = (self.shape_of)(name).ok_or_else(|| {
                        (
                            row,
                            "table",
                            format!("{name:?} is not a table of the store"),
                        )
                    })?;
                    if let Some(dtype) = encoded
                        && dtype != shape.dtype
                    {
                        return Err((
                            row,
                            "values",
                            format!(
                                "the file's rows are encoded as {dtype}, table {name:?} holds {}",
                                shape.dtype
                            ),
                        ));
                    }
                    let at = self.tables.len();
                    self.tables.push(Changes::new(name, encoded.is_some()));
                    self.seen.push(FxHashMap::default());
                    self.index.insert(name.to_owned(), (at, shape));
                    (at, shape)
                }
            };
            let id = ids.get(i).ok_or((row, "id", "null".to_owned()))?;
            let id = if shape.keyed {
                i64::try_from(id)
                    .or_else(|_| u64::try_from(id).map(|k| k as i64))
                    .map_err(|_| (row, "id", format!("{id} is not a 64-bit key")))?
            } else {
                u64::try_from(id)
                    .ok()
                    .filter(|&r| r < shape.rows)
                    .map(|r| r as i64)
                    .ok_or_else(|| {
                        (
                            row,
                            "id",
                            format!("{id} is not a row of table {name:?}'s {} rows", shape.rows),
                        )
                    })?
            };
            let op = ops.get(i).map_err(|r| (row, "op", r))?;
            match self.seen[at].entry(id) {
                Entry::Occupied(before) => {
                    return Err((
                        row,
                        "id",
                        format!(
                            "{} of table {name:?} again (row {} named it): a file holds each \
                             row once",
                            if shape.keyed { "key" } else { "row" },
                            before.get()
                        ),
                    ));
                }
                Entry::Vacant(v) => {
                    v.insert(row);
                }
            }
            let value = values.get(i);
            let changes = &mut self.tables[at];
            let check = |v: &RowValues<'_>| -> std::result::Result<(), Refusal> {
                match v {
                    RowValues::F32(v) if v.len() != shape.dim as usize => Err((
                        row,
                        "values",
                        format!("{} values, table {name:?} has dim {}", v.len(), shape.dim),
                    )),
                    RowValues::F32(v) => match v.iter().position(|x| !x.is_finite()) {
                        Some(j) => Err((row, "values", format!("values[{j}] is {}", v[j]))),
                        None => Ok(()),
                    },
                    RowValues::Encoded(b) if b.len() != shape.row_bytes() => Err((
                        row,
                        "values",
                        format!(
                            "{} bytes, a row of table {name:?} ({} × dim {}) is {}",
                            b.len(),
                            shape.dtype,
                            shape.dim,
                            shape.row_bytes()
                        ),
                    )),
                    RowValues::Encoded(_) => Ok(()),
                    RowValues::Null => {
                        Err((row, "values", "a null inside the row's values".into()))
                    }
                }
            };
            match op {
                Op::Upsert => {
                    let v = value.ok_or((row, "values", "null on an upsert".to_owned()))?;
                    check(&v)?;
                    changes.upserts.push(id);
                    v.push_to(&mut changes.values);
                }
                Op::Delete => {
                    // the row as it was: every delete of a table carries one, or none does
                    let had = changes.deleted.is_some() || changes.deletes.is_empty();
                    match (value, had) {
                        (Some(v), true) => {
                            check(&v)?;
                            let to = (changes.deleted)
                                .get_or_insert_with(|| Values::empty(encoded.is_some()));
                            v.push_to(to);
                        }
                        (None, _) => changes.deleted = None,
                        (Some(_), false) => {}
                    }
                    changes.deletes.push(id);
                }
            }
        }
        self.row += batch.num_rows() as u64;
        Ok(())
    }
}

/// A string column: plain, large, a view, or dictionary-encoded.
enum Strings<'a> {
    Plain(&'a arrow_array::StringArray),
    Large(&'a arrow_array::LargeStringArray),
    View(&'a arrow_array::StringViewArray),
    /// Each row's key into `values` (null where the dictionary's keys are), every one checked
    /// to be one of its values.
    Dict {
        keys: Ints<'a>,
        values: Box<Strings<'a>>,
    },
}

impl<'a> Strings<'a> {
    fn of(a: &'a dyn Array) -> std::result::Result<Self, String> {
        if let Some(s) = a.as_string_opt::<i32>() {
            Ok(Self::Plain(s))
        } else if let Some(s) = a.as_string_opt::<i64>() {
            Ok(Self::Large(s))
        } else if let Some(s) = a.as_string_view_opt() {
            Ok(Self::View(s))
        } else if let Some(d) = a.as_any_dictionary_opt() {
            let values = d.values().as_ref();
            let keys = Ints::of(d.keys())?;
            let n = values.len() as i128;
            if let Some(k) =
                (0..d.keys().len()).find_map(|i| keys.get(i).filter(|k| !(0..n).contains(k)))
            {
                return Err(format!("a dictionary key {k} past its {n} values"));
            }
            Ok(Self::Dict {
                keys,
                values: Box::new(Self::of(values)?),
            })
        } else {
            Err(format!("{} is not a string column", a.data_type()))
        }
    }

    fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            Self::Plain(s) => s.is_valid(i).then(|| s.value(i)),
            Self::Large(s) => s.is_valid(i).then(|| s.value(i)),
            Self::View(s) => s.is_valid(i).then(|| s.value(i)),
            Self::Dict { keys, values } => values.get(keys.get(i)? as usize),
        }
    }
}

/// An integer column of any width and sign, read as `i128` (every `i64` and `u64` exactly).
struct Ints<'a>(Box<dyn Fn(usize) -> Option<i128> + 'a>);

impl<'a> Ints<'a> {
    fn of(a: &'a dyn Array) -> std::result::Result<Self, String> {
        macro_rules! ints {
            ($($t:ty),*) => {
                $(if let Some(p) = a.as_primitive_opt::<$t>() {
                    return Ok(Self(Box::new(move |i| p.is_valid(i).then(|| i128::from(p.value(i))))));
                })*
            };
        }
        ints!(
            Int64Type, UInt64Type, Int32Type, UInt32Type, Int16Type, UInt16Type, Int8Type,
            UInt8Type
        );
        Err(format!("{} is not an integer column", a.data_type()))
    }

    fn get(&self, i: usize) -> Option<i128> {
        (self.0)(i)
    }
}

/// The `op` column: integer codes (0 upsert, 1 delete) or their names.
enum OpColumn<'a> {
    Codes(Ints<'a>),
    Names(Strings<'a>),
}

impl<'a> OpColumn<'a> {
    fn of(a: &'a dyn Array) -> std::result::Result<Self, String> {
        Ints::of(a)
            .map(Self::Codes)
            .or_else(|_| Strings::of(a).map(Self::Names))
            .map_err(|_| {
                format!(
                    "{} is neither integer codes (0 upsert, 1 delete) nor their names",
                    a.data_type()
                )
            })
    }

    fn get(&self, i: usize) -> std::result::Result<Op, String> {
        match self {
            Self::Codes(c) => match c.get(i) {
                Some(0) => Ok(Op::Upsert),
                Some(1) => Ok(Op::Delete),
                Some(v) => Err(format!("{v} is neither 0 (upsert) nor 1 (delete)")),
                None => Err("null".into()),
            },
            Self::Names(s) => match s.get(i) {
                Some("upsert") => Ok(Op::Upsert),
                Some("delete") => Ok(Op::Delete),
                Some(v) => Err(format!("{v:?} is neither \"upsert\" nor \"delete\"")),
                None => Err("null".into()),
            },
        }
    }
}

/// One row's values as the file holds them.
enum RowValues<'a> {
    F32(&'a [f32]),
    /// A row whose values hold a null.
    Null,
    Encoded(&'a [u8]),
}

impl RowValues<'_> {
    fn push_to(&self, to: &mut Values) {
        match (self, to) {
            (RowValues::F32(v), Values::F32(out)) => out.extend_from_slice(v),
            (RowValues::Encoded(b), Values::Encoded(out)) => out.extend_from_slice(b),
            (RowValues::Null, _) => unreachable!("refused before"),
            _ => unreachable!("a file's values are all float32 or all encoded"),
        }
    }
}

/// The `values` column: each row a slice of the flat values.
enum Rows<'a> {
    /// Lists of float32: the flat values and each row's `[start, end)`.
    F32 {
        list: &'a dyn Array,
        flat: &'a [f32],
        /// Nulls inside the flat values (a null row's slots may hold them; another's may not).
        inner: Option<&'a NullBuffer>,
        bounds: Box<dyn Fn(usize) -> (usize, usize) + 'a>,
    },
    Binary(Box<dyn Fn(usize) -> Option<&'a [u8]> + 'a>),
}

impl<'a> Rows<'a> {
    fn of(a: &'a ArrayRef) -> std::result::Result<Self, String> {
        let floats = |values: &'a ArrayRef| -> std::result::Result<(&'a [f32], Option<&'a NullBuffer>), String> {
            let p = values
                .as_primitive_opt::<Float32Type>()
                .ok_or_else(|| format!("{} is not float32", values.data_type()))?;
            Ok((p.values().as_ref(), p.nulls().filter(|n| n.null_count() > 0)))
        };
        if let Some(l) = a.as_fixed_size_list_opt() {
            let n = l.value_length() as usize;
            return Ok(Self::F32 {
                list: l,
                flat: floats(l.values())?.0,
                inner: floats(l.values())?.1,
                bounds: Box::new(move |i| {
                    let s = l.value_offset_at(i);
                    (s, s + n)
                }),
            });
        }
        if let Some(l) = a.as_list_opt::<i32>() {
            let off = l.value_offsets();
            return Ok(Self::F32 {
                list: l,
                flat: floats(l.values())?.0,
                inner: floats(l.values())?.1,
                bounds: Box::new(move |i| (off[i] as usize, off[i + 1] as usize)),
            });
        }
        if let Some(l) = a.as_list_opt::<i64>() {
            let off = l.value_offsets();
            return Ok(Self::F32 {
                list: l,
                flat: floats(l.values())?.0,
                inner: floats(l.values())?.1,
                bounds: Box::new(move |i| (off[i] as usize, off[i + 1] as usize)),
            });
        }
        if let Some(b) = a.as_fixed_size_binary_opt() {
            return Ok(Self::Binary(Box::new(move |i| {
                b.is_valid(i).then(|| b.value(i))
            })));
        }
        if let Some(b) = a.as_binary_opt::<i32>() {
            return Ok(Self::Binary(Box::new(move |i| {
                b.is_valid(i).then(|| b.value(i))
            })));
        }
        if let Some(b) = a.as_binary_opt::<i64>() {
            return Ok(Self::Binary(Box::new(move |i| {
                b.is_valid(i).then(|| b.value(i))
            })));
        }
        Err(format!(
            "{} is not a list of float32 nor binary",
            a.data_type()
        ))
    }

    fn get(&self, i: usize) -> Option<RowValues<'a>> {
        match self {
            Self::F32 {
                list,
                flat,
                inner,
                bounds,
            } => list.is_valid(i).then(|| {
                let (s, e) = bounds(i);
                match inner {
                    Some(n) if (s..e).any(|j| n.is_null(j)) => RowValues::Null,
                    _ => RowValues::F32(&flat[s..e]),
                }
            }),
            Self::Binary(get) => get(i).map(RowValues::Encoded),
        }
    }
}
