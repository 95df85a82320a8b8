//! A lookup's request and answer. A request's arrays are decoded once, here, into an
//! [`OwnedBatch`]; what they mean (bags against ids, ids against rows, weights, padding) is the
//! engine's one validation, as for every other surface. A pooled answer travels in the dtype
//! asked (`out_dtype`), encoded once. The node decodes into, and answers from, vectors its
//! [`Spare`] keeps between requests ([`batch_in`], [`recycle`], [`pooled_in`]).

use nearrec::{
    Bags, Batch, IndexVec, Indices, OutDtype, OwnedBags, OwnedBatch, OwnedLookup, Pooled,
    PoolingMode, Rows, TableLookup,
};

use std::sync::Arc;

use bytes::Bytes;

use super::invalid;
use crate::arrays::{Spare, decode, decode_in, encode, encode_slice};
use crate::v1 as pb;

/// A request's tables as an owned batch; refuses an empty table list.
pub fn batch(tables: &[pb::TableLookup]) -> nearrec::Result<OwnedBatch> {
    batch_in(tables, Spare::none())
}

/// [`batch`], its arrays decoded into vectors `spare` kept.
pub fn batch_in(tables: &[pb::TableLookup], spare: &Spare) -> nearrec::Result<OwnedBatch> {
    if tables.is_empty() {
        return Err(nearrec::Error::invalid("the request names no table"));
    }
    let mut owned = Vec::with_capacity(tables.len());
    for t in tables {
        match lookup(t, spare) {
            Ok(l) => owned.push(l),
            Err(e) => {
                recycle(OwnedBatch::new(owned), spare);
                return Err(e);
            }
        }
    }
    Ok(OwnedBatch::new(owned))
}

/// A batch's arrays given back to `spare` once it is served.
pub fn recycle(batch: OwnedBatch, spare: &Spare) {
    let give = |v: IndexVec| match v {
        IndexVec::I32(v) => spare.give(v),
        IndexVec::I64(v) => spare.give(v),
    };
    for t in batch.tables {
        give(t.indices);
        match t.bags {
            OwnedBags::Offsets { offsets: v, .. } | OwnedBags::Lengths(v) => give(v),
            OwnedBags::Fixed { .. } => {}
        }
        if let Some(w) = t.per_sample_weights {
            spare.give(w);
        }
    }
}

fn indices(
    bytes: &[u8],
    kind: pb::IndexType,
    (table, field): (&str, &str),
    spare: &Spare,
) -> nearrec::Result<IndexVec> {
    Ok(match kind {
        pb::IndexType::Int32 => IndexVec::I32(decode_in(bytes, table, field, spare)?),
        _ => IndexVec::I64(decode_in(bytes, table, field, spare)?),
    })
}

/// One table's part of a request.
fn lookup(t: &pb::TableLookup, spare: &Spare) -> nearrec::Result<OwnedLookup> {
    let name = t.table.as_str();
    let kind = match pb::IndexType::try_from(t.index_type) {
        Ok(k @ (pb::IndexType::Int32 | pb::IndexType::Int64)) => k,
        _ => {
            return Err(invalid(
                name,
                format!(
                    "index_type {} is not INDEX_TYPE_INT64 or INDEX_TYPE_INT32",
                    t.index_type
                ),
            ));
        }
    };
    let bags = match &t.bags {
        Some(pb::table_lookup::Bags::Offsets(o)) => OwnedBags::Offsets {
            offsets: indices(&o.offsets, kind, (name, "offsets"), spare)?,
            include_last_offset: o.include_last_offset,
        },
        Some(pb::table_lookup::Bags::Lengths(l)) => {
            OwnedBags::Lengths(indices(l, kind, (name, "lengths"), spare)?)
        }
        Some(pb::table_lookup::Bags::Fixed(f)) => {
            let size = |v: u64, what: &str| {
                usize::try_from(v)
                    .map_err(|_| invalid(name, format!("fixed {what} {v} is too large")))
            };
            OwnedBags::Fixed {
                batch: size(f.batch, "batch")?,
                bag_size: size(f.bag_size, "bag_size")?,
            }
        }
        None => {
            return Err(invalid(
                name,
                "no bags: give offsets, lengths or fixed".into(),
            ));
        }
    };
    let mode = match pb::PoolingMode::try_from(t.mode) {
        Ok(pb::PoolingMode::Sum) => PoolingMode::Sum,
        Ok(pb::PoolingMode::Mean) => PoolingMode::Mean,
        Ok(pb::PoolingMode::Max) => PoolingMode::Max,
        Err(_) => return Err(invalid(name, format!("pooling mode {} is unknown", t.mode))),
    };
    Ok(OwnedLookup {
        table: t.table.clone(),
        indices: indices(&t.ids, kind, (name, "ids"), spare)?,
        bags,
        per_sample_weights: (!t.per_sample_weights.is_empty())
            .then(|| decode_in(&t.per_sample_weights, name, "per_sample_weights", spare))
            .transpose()?,
        mode,
        padding_idx: t.padding_idx,
    })
}

/// A batch as a request's tables (a client's side): each table's indices, bags and weights
/// copied into the message once.
pub fn tables(batch: &Batch<'_>) -> Vec<pb::TableLookup> {
    batch.tables.iter().map(table).collect()
}

fn table(t: &TableLookup<'_>) -> pb::TableLookup {
    // ids and bags share one width in the protocol: int32 whenever every value fits (half the
    // bytes on the wire for int64 ids of tables under 2^31 rows; lossless, the node widens them
    // back), else int64
    let bag_indices = match t.bags {
        Bags::Offsets { offsets, .. } => Some(offsets),
        Bags::Lengths(lengths) => Some(lengths),
        Bags::Fixed { .. } => None,
    };
    let fits = |i: Indices<'_>| match i {
        Indices::I32(_) => true,
        Indices::I64(v) => v.iter().all(|&x| i32::try_from(x).is_ok()),
    };
    let narrow = fits(t.indices) && bag_indices.is_none_or(fits);
    let put = |i: Indices<'_>| match i {
        Indices::I32(v) if narrow => encode_slice(v),
        Indices::I64(v) if narrow => encode(v.iter().map(|&x| x as i32).collect::<Vec<i32>>()),
        Indices::I64(v) => encode_slice(v),
        Indices::I32(v) => encode(v.iter().map(|&x| i64::from(x)).collect::<Vec<i64>>()),
    };
    let kind = if narrow {
        pb::IndexType::Int32
    } else {
        pb::IndexType::Int64
    };
    let bags = match t.bags {
        Bags::Offsets {
            offsets,
            include_last_offset,
        } => pb::table_lookup::Bags::Offsets(pb::Offsets {
            offsets: put(offsets),
            include_last_offset,
        }),
        Bags::Lengths(l) => pb::table_lookup::Bags::Lengths(put(l)),
        Bags::Fixed { batch, bag_size } => pb::table_lookup::Bags::Fixed(pb::FixedBags {
            batch: batch as u64,
            bag_size: bag_size as u64,
        }),
    };
    pb::TableLookup {
        table: t.table.to_owned(),
        index_type: kind as i32,
        ids: put(t.indices),
        bags: Some(bags),
        per_sample_weights: t.per_sample_weights.map(encode_slice).unwrap_or_default(),
        mode: match t.mode {
            PoolingMode::Sum => pb::PoolingMode::Sum,
            PoolingMode::Mean => pb::PoolingMode::Mean,
            PoolingMode::Max => pb::PoolingMode::Max,
        } as i32,
        padding_idx: t.padding_idx,
    }
}

/// A pooled answer (the node's side).
pub fn pooled(id: u64, version: u64, mut p: Pooled, out: OutDtype) -> pb::LookupResponse {
    let pooled = match out {
        OutDtype::F32 => encode(std::mem::take(&mut p.values)),
        _ => Bytes::from(encoded(&p.values, &p.tables, out, Vec::new())),
    };
    answer(id, version, p, pooled, out)
}

/// [`pooled`], its values (or their encoding in `out`) lent from `spare`, and the pooled
/// vector given back to it.
pub fn pooled_in(
    id: u64,
    version: u64,
    mut p: Pooled,
    out: OutDtype,
    spare: &Arc<Spare>,
) -> pb::LookupResponse {
    let values = std::mem::take(&mut p.values);
    let pooled = match out {
        OutDtype::F32 => Spare::lend(spare, values),
        _ => {
            let mut bytes = spare.take::<u8>();
            bytes.clear();
            let bytes = encoded(&values, &p.tables, out, bytes);
            spare.give(values);
            Spare::lend(spare, bytes)
        }
    };
    answer(id, version, p, pooled, out)
}

/// `values` (the tables' columns side by side) in `out`, appended to `bytes`.
fn encoded(
    values: &[f32],
    tables: &[(String, usize)],
    out: OutDtype,
    mut bytes: Vec<u8>,
) -> Vec<u8> {
    let widths: Vec<usize> = tables.iter().map(|t| t.1).collect();
    nearrec::out::encode(values, &widths, out, &mut bytes);
    bytes
}

fn answer(id: u64, version: u64, p: Pooled, pooled: Bytes, out: OutDtype) -> pb::LookupResponse {
    pb::LookupResponse {
        id,
        batch: p.batch as u64,
        tables: p
            .tables
            .into_iter()
            .map(|(table, dim)| pb::TableWidth {
                table,
                dim: dim as u32,
            })
            .collect(),
        pooled,
        version,
        dtype: out_dtype(out).into(),
        ..Default::default()
    }
}

/// A pooled answer's dtype on the wire.
pub fn out_dtype(out: OutDtype) -> pb::OutDtype {
    match out {
        OutDtype::F32 => pb::OutDtype::Fp32,
        OutDtype::F16 => pb::OutDtype::Fp16,
        OutDtype::Bf16 => pb::OutDtype::Bf16,
        OutDtype::Int8 => pb::OutDtype::Int8,
    }
}

/// A message's dtype field as the facade's; an unknown one refused, naming `field`.
pub fn unout_dtype(value: i32, field: &str) -> nearrec::Result<OutDtype> {
    Ok(match pb::OutDtype::try_from(value) {
        Ok(pb::OutDtype::Fp32) => OutDtype::F32,
        Ok(pb::OutDtype::Fp16) => OutDtype::F16,
        Ok(pb::OutDtype::Bf16) => OutDtype::Bf16,
        Ok(pb::OutDtype::Int8) => OutDtype::Int8,
        Err(_) => {
            return Err(nearrec::Error::invalid(format!(
                "{field} {value} is no OutDtype (OUT_DTYPE_FP32, _FP16, _BF16 or _INT8)"
            )));
        }
    })
}

/// A raw answer (the node's side).
pub fn raw(id: u64, version: u64, rows: Vec<Rows>) -> pb::LookupResponse {
    pb::LookupResponse {
        id,
        raw: rows
            .into_iter()
            .map(|r| pb::RawRows {
                table: r.table,
                dim: r.dim as u32,
                ids: encode(r.ids),
                rows: encode(r.values),
            })
            .collect(),
        version,
        ..Default::default()
    }
}

/// A pooled answer back as the facade's (the client's side), its size checked.
pub fn unpooled(r: &pb::LookupResponse) -> nearrec::Result<Pooled> {
    let dtype = unout_dtype(r.dtype, "the answer's dtype").map_err(|e| {
        nearrec::Error::Internal(format!("the node's answer is not understood here: {e}"))
    })?;
    let tables: Vec<(String, usize)> = r
        .tables
        .iter()
        .map(|t| (t.table.clone(), t.dim as usize))
        .collect();
    let widths: Vec<usize> = tables.iter().map(|t| t.1).collect();
    let width: usize = widths.iter().sum();
    let batch = usize::try_from(r.batch).unwrap_or(usize::MAX);
    let wrong = || {
        nearrec::Error::Internal(format!(
            "the node answered {} bytes of {} for a [{batch}, {width}] batch",
            r.pooled.len(),
            dtype.name()
        ))
    };
    let values = if dtype == OutDtype::F32 {
        let values: Vec<f32> = decode(&r.pooled, "", "pooled")?;
        if Some(values.len()) != batch.checked_mul(width) {
            return Err(wrong());
        }
        values
    } else {
        // the answer's bytes bound its size: a batch over them is refused before allocating
        let floats = batch.checked_mul(width).filter(|&n| n <= r.pooled.len());
        let mut values = vec![0f32; floats.ok_or_else(wrong)?];
        nearrec::out::decode(&r.pooled, &widths, dtype, &mut values).map_err(|_| wrong())?;
        values
    };
    Ok(Pooled {
        values,
        batch,
        tables,
    })
}

/// A raw answer back as the facade's rows (the client's side), sizes and order checked.
pub fn unraw(r: &pb::LookupResponse) -> nearrec::Result<Vec<Rows>> {
    r.raw
        .iter()
        .map(|t| {
            let ids: Vec<i64> = decode(&t.ids, &t.table, "ids")?;
            let values: Vec<f32> = decode(&t.rows, &t.table, "rows")?;
            // a caller finds a row by its id in them (a router pooling split bags)
            if let Some(k) = ids.windows(2).position(|w| w[0] >= w[1]) {
                return Err(nearrec::Error::Internal(format!(
                    "the node answered table {:?}'s ids out of order (id {} after {})",
                    t.table,
                    ids[k + 1],
                    ids[k]
                )));
            }
            if Some(values.len()) != ids.len().checked_mul(t.dim as usize) {
                return Err(nearrec::Error::Internal(format!(
                    "the node answered {} floats for {} rows of width {} of table {:?}",
                    values.len(),
                    ids.len(),
                    t.dim,
                    t.table
                )));
            }
            Ok(Rows {
                table: t.table.clone(),
                dim: t.dim as usize,
                ids,
                values,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nearrec::AsBatch;

    fn widened(v: &IndexVec) -> Vec<i64> {
        match v {
            IndexVec::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            IndexVec::I64(v) => v.clone(),
        }
    }

    #[test]
    fn ids_travel_as_int32_whenever_every_value_fits_and_arrive_unchanged() {
        let small = OwnedLookup::with_lengths("a", vec![0i64, 7, -1, 2_147_483_647], vec![1i64, 3]);
        let large = OwnedLookup::with_lengths("b", vec![1i64, 2_147_483_648], vec![2i64]);
        let narrow = OwnedLookup::with_lengths("c", vec![5i32, 6], vec![2i32]);
        let batch = OwnedBatch::new(vec![small, large, narrow]);
        let wire = tables(&batch.as_batch());
        let kinds: Vec<i32> = wire.iter().map(|t| t.index_type).collect();
        assert_eq!(
            kinds,
            [
                pb::IndexType::Int32 as i32,
                pb::IndexType::Int64 as i32,
                pb::IndexType::Int32 as i32
            ]
        );
        assert_eq!(wire[0].ids.len(), 4 * 4, "four ids of four bytes");
        for (sent, got) in batch.tables.iter().zip(&wire) {
            let back = lookup(got, Spare::none()).unwrap();
            assert_eq!(
                widened(&back.indices),
                widened(&sent.indices),
                "{}",
                sent.table
            );
            let (OwnedBags::Lengths(a), OwnedBags::Lengths(b)) = (&back.bags, &sent.bags) else {
                panic!("lengths stay lengths");
            };
            assert_eq!(widened(a), widened(b));
        }
    }
}
