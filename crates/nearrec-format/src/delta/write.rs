//! A delta file written: one batch of every table's rows, the header in the schema's metadata,
//! the file made whole under its name at once (a watcher never sees half of it).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, FixedSizeBinaryBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, FixedSizeListArray, Int8Array, Int64Array, ListArray, RecordBatch};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema};

use super::{
    Changes, DELTA_VERSION, DTYPE_KEY, Encoding, FORMAT_KEY, Header, Op, SEQUENCE_KEY, STEP_KEY,
    Values, WALL_TIME_KEY,
};
use crate::dtype::DType;
use crate::error::{FormatError, Result};

/// Writes `tables` as delta file `path` (its name `<header.sequence>.arrow` or `.parquet`),
/// atomically and durably. `encoded`: the dtype of [`Values::Encoded`] rows (every table's
/// must be of it); float32 rows need none. Each table's upserts first, then its deletes — with
/// the rows as they were where [`Changes::deleted`] holds them, else null.
pub fn write(
    path: &Path,
    header: &Header,
    tables: &[Changes],
    encoded: Option<DType>,
) -> Result<()> {
    let bad = |reason: String| FormatError::BadDelta {
        path: path.to_owned(),
        row: None,
        column: None,
        reason,
    };
    let (named, encoding) = super::named(path)?;
    if named != header.sequence {
        return Err(bad(format!(
            "its name says sequence {named}, its header {}",
            header.sequence
        )));
    }
    let rows: usize = tables.iter().map(Changes::len).sum();
    let mut table = StringDictionaryBuilder::<Int32Type>::new();
    let mut ids = Vec::with_capacity(rows);
    let mut ops = Vec::with_capacity(rows);
    // each row's values: a slice of a table's, or none
    let mut values: Vec<Option<RowRef<'_>>> = Vec::with_capacity(rows);
    for t in tables {
        let parts = [
            (&t.upserts, Some(&t.values), Op::Upsert),
            (&t.deletes, t.deleted.as_ref(), Op::Delete),
        ];
        for (id_list, vals, op) in parts {
            let (len, is_encoded) = match vals {
                Some(Values::F32(f)) => (f.len(), false),
                Some(Values::Encoded(b)) => (b.len(), true),
                None => (0, encoded.is_some()),
            };
            let w = len.checked_div(id_list.len()).unwrap_or(0);
            if len != w * id_list.len() || is_encoded != encoded.is_some() {
                return Err(bad(format!(
                    "table {:?}: {len} values for {} rows, or not of the file's encoding",
                    t.table,
                    id_list.len()
                )));
            }
            for (k, &id) in id_list.iter().enumerate() {
                table.append_value(&t.table);
                ids.push(id);
                ops.push(op.code());
                values.push(vals.map(|v| RowRef {
                    values: v,
                    start: k * w,
                    len: w,
                }));
            }
        }
    }
    let (values_field, values_array) = values_column(&values, encoded);
    let schema = Schema::new(vec![
        Field::new(
            "table",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        ),
        Field::new("id", DataType::Int64, false),
        Field::new("op", DataType::Int8, false),
        values_field,
    ])
    .with_metadata(HashMap::from_iter(
        [
            Some((FORMAT_KEY, DELTA_VERSION.to_owned())),
            Some((SEQUENCE_KEY, header.sequence.to_string())),
            header.step.map(|s| (STEP_KEY, s.to_string())),
            header.wall_time_ms.map(|t| (WALL_TIME_KEY, t.to_string())),
        ]
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.to_owned(), v)),
    ));
    let schema = Arc::new(schema);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(table.finish()),
        Arc::new(Int64Array::from(ids)),
        Arc::new(Int8Array::from(ops)),
        values_array,
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| bad(format!("its batch does not form: {e}")))?;
    let mut bytes = Vec::new();
    match encoding {
        Encoding::Arrow => {
            let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut bytes, &schema)
                .map_err(|e| bad(e.to_string()))?;
            w.write(&batch)
                .and_then(|()| w.finish())
                .map_err(|e| bad(e.to_string()))?;
        }
        Encoding::Parquet => {
            let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, schema, None)
                .map_err(|e| bad(e.to_string()))?;
            w.write(&batch).map_err(|e| bad(e.to_string()))?;
            w.close().map_err(|e| bad(e.to_string()))?;
        }
    }
    crate::sync::replace_file(path, &bytes)
}

/// One row's values: `len` of them from `start` of a table's.
#[derive(Clone, Copy)]
struct RowRef<'a> {
    values: &'a Values,
    start: usize,
    len: usize,
}

/// The `values` column: fixed-size lists (or binary) when every row with values has one width,
/// else lists (or variable binary); null where a row has none.
fn values_column(rows: &[Option<RowRef<'_>>], encoded: Option<DType>) -> (Field, ArrayRef) {
    let mut widths = rows.iter().flatten().map(|r| r.len);
    let first = widths.next();
    let fixed = first.filter(|&w| w > 0 && widths.all(|x| x == w));
    match encoded {
        None => {
            let mut flat: Vec<f32> = Vec::new();
            let mut offsets = vec![0i32];
            let mut valid = Vec::with_capacity(rows.len());
            for r in rows {
                match r {
                    Some(RowRef {
                        values: Values::F32(v),
                        start,
                        len,
                    }) => {
                        flat.extend_from_slice(&v[*start..start + len]);
                    }
                    _ => {
                        if let Some(w) = fixed {
                            flat.resize(flat.len() + w, 0.0);
                        }
                    }
                }
                valid.push(r.is_some());
                offsets.push(flat.len() as i32);
            }
            let item = Arc::new(Field::new("item", DataType::Float32, false));
            let nulls = Some(valid.into());
            let flat = Arc::new(arrow_array::Float32Array::from(flat));
            match fixed {
                Some(w) => (
                    Field::new(
                        "values",
                        DataType::FixedSizeList(item.clone(), w as i32),
                        true,
                    ),
                    Arc::new(FixedSizeListArray::new(item, w as i32, flat, nulls)),
                ),
                None => (
                    Field::new("values", DataType::List(item.clone()), true),
                    Arc::new(ListArray::new(
                        item,
                        OffsetBuffer::new(offsets.into()),
                        flat,
                        nulls,
                    )),
                ),
            }
        }
        Some(dtype) => {
            let meta = HashMap::from([(DTYPE_KEY.to_owned(), dtype.name().to_owned())]);
            fn bytes<'a>(r: &RowRef<'a>) -> &'a [u8] {
                match r.values {
                    Values::Encoded(b) => &b[r.start..r.start + r.len],
                    Values::F32(_) => unreachable!("checked: every table's rows are encoded"),
                }
            }
            let (field, array): (Field, ArrayRef) = match fixed {
                Some(w) => {
                    let mut b = FixedSizeBinaryBuilder::with_capacity(rows.len(), w as i32);
                    for r in rows {
                        match r {
                            Some(r) => b.append_value(bytes(r)).expect("rows of one width"),
                            None => b.append_null(),
                        }
                    }
                    (
                        Field::new("values", DataType::FixedSizeBinary(w as i32), true),
                        Arc::new(b.finish()),
                    )
                }
                None => {
                    let mut b = BinaryBuilder::new();
                    for r in rows {
                        b.append_option(r.as_ref().map(bytes));
                    }
                    (
                        Field::new("values", DataType::Binary, true),
                        Arc::new(b.finish()),
                    )
                }
            };
            (field.with_metadata(meta), array)
        }
    }
}
