//! Messages to and from the facade's types. A request's arrays are decoded once, here, into an
//! [`OwnedBatch`]; what they mean (bags against ids, ids against rows, weights, padding) is the
//! engine's one validation, as for every other surface.

use nearrec::{
    Bags, Batch, CacheStatsSnapshot, Compaction, FeedCursor, IndexVec, Indices, Info, LastWriter,
    OutDtype, OwnedBags, OwnedBatch, OwnedLookup, OwnedValues, Pooled, PoolingMode, RowValues,
    RowWrite, Rows, Stats, TableCheck, TableInfo, TableLookup, TierReport, Transaction, TxState,
};

use bytes::Bytes;
use nearrec::model::Tensor;

use crate::arrays::{decode, encode, encode_slice};
use crate::v1 as pb;

fn invalid(table: &str, reason: String) -> nearrec::Error {
    nearrec::Error::InvalidRequest {
        table: Some(table.to_owned()),
        position: None,
        reason,
    }
}

/// A request's tables as an owned batch; refuses an empty table list.
pub fn batch(tables: &[pb::TableLookup]) -> nearrec::Result<OwnedBatch> {
    if tables.is_empty() {
        return Err(nearrec::Error::invalid("the request names no table"));
    }
    Ok(OwnedBatch::new(
        tables.iter().map(lookup).collect::<nearrec::Result<_>>()?,
    ))
}

fn indices(
    bytes: &[u8],
    kind: pb::IndexType,
    table: &str,
    field: &str,
) -> nearrec::Result<IndexVec> {
    Ok(match kind {
        pb::IndexType::Int32 => IndexVec::I32(decode(bytes, table, field)?),
        _ => IndexVec::I64(decode(bytes, table, field)?),
    })
}

/// One table's part of a request.
pub fn lookup(t: &pb::TableLookup) -> nearrec::Result<OwnedLookup> {
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
            offsets: indices(&o.offsets, kind, name, "offsets")?,
            include_last_offset: o.include_last_offset,
        },
        Some(pb::table_lookup::Bags::Lengths(l)) => {
            OwnedBags::Lengths(indices(l, kind, name, "lengths")?)
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
        indices: indices(&t.ids, kind, name, "ids")?,
        bags,
        per_sample_weights: (!t.per_sample_weights.is_empty())
            .then(|| decode(&t.per_sample_weights, name, "per_sample_weights"))
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
pub fn pooled(id: u64, version: u64, p: Pooled, out: OutDtype) -> pb::LookupResponse {
    let pooled = match out {
        OutDtype::F32 => encode(p.values),
        _ => {
            let widths: Vec<usize> = p.tables.iter().map(|t| t.1).collect();
            let mut bytes = Vec::new();
            nearrec::out::encode(&p.values, &widths, out, &mut bytes);
            Bytes::from(bytes)
        }
    };
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

/// A write call's rows (the client's side): a write without values removes its rows.
pub fn writes(writes: &[RowWrite<'_>]) -> Vec<pb::TableRows> {
    writes
        .iter()
        .map(|w| pb::TableRows {
            table: w.table.to_owned(),
            ids: encode_slice(w.ids),
            rows: match w.values {
                None => Bytes::new(),
                Some(RowValues::F32(v)) => encode_slice(v),
                Some(RowValues::Encoded(b)) => Bytes::copy_from_slice(b),
            },
            remove: w.values.is_none(),
            encoded: matches!(w.values, Some(RowValues::Encoded(_))),
        })
        .collect()
}

/// A write call's rows decoded (the node's side): `(table, ids, values or None to remove)`.
pub type OwnedWrite = (String, Vec<i64>, Option<OwnedValues>);

/// [`writes`] back (the node's side); a remove that carries rows is refused.
pub fn unwrites(writes: &[pb::TableRows]) -> nearrec::Result<Vec<OwnedWrite>> {
    writes
        .iter()
        .map(|w| {
            let ids: Vec<i64> = decode(&w.ids, &w.table, "ids")?;
            if w.remove {
                if !w.rows.is_empty() {
                    return Err(invalid(&w.table, "a remove carries no rows".into()));
                }
                return Ok((w.table.clone(), ids, None));
            }
            let values = if w.encoded {
                OwnedValues::Encoded(w.rows.to_vec())
            } else {
                OwnedValues::F32(decode(&w.rows, &w.table, "rows")?)
            };
            Ok((w.table.clone(), ids, Some(values)))
        })
        .collect()
}

/// [`unwrites`] as the facade's call.
pub fn row_writes(owned: &[OwnedWrite]) -> Vec<RowWrite<'_>> {
    owned
        .iter()
        .map(|(table, ids, values)| RowWrite {
            table,
            ids,
            values: values.as_ref().map(OwnedValues::as_values),
        })
        .collect()
}

/// A feed's cursor on the wire.
pub fn cursor(c: FeedCursor) -> pb::FeedCursor {
    pb::FeedCursor {
        sequence: c.sequence,
        step: c.step,
        wall_time_ms: c.wall_time_ms,
        applied_ms: c.applied_ms,
        rows: c.rows,
    }
}

/// [`cursor`] back (a missing one is the zero cursor).
pub fn uncursor(c: Option<pb::FeedCursor>) -> FeedCursor {
    let c = c.unwrap_or_default();
    FeedCursor {
        sequence: c.sequence,
        step: c.step,
        wall_time_ms: c.wall_time_ms,
        applied_ms: c.applied_ms,
        rows: c.rows,
    }
}

/// A model update's weights (the client's side).
pub fn weights(weights: &[Tensor<'_>]) -> Vec<pb::Weight> {
    weights
        .iter()
        .map(|t| pb::Weight {
            name: t.name.to_owned(),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            values: encode_slice(t.values),
        })
        .collect()
}

/// A model update's weights decoded (the node's side): `(name, shape, values)`.
pub use nearrec::model::OwnedWeight;

/// [`weights`] back (the node's side).
pub fn unweights(weights: &[pb::Weight]) -> nearrec::Result<Vec<OwnedWeight>> {
    weights
        .iter()
        .map(|w| {
            let values: Vec<f32> = decode(&w.values, &w.name, "values")?;
            let shape = w.shape.iter().map(|&d| d as usize).collect();
            Ok((w.name.clone(), shape, values))
        })
        .collect()
}

/// [`unweights`] as the facade's call.
pub use nearrec::model::tensors;

/// The kept model as it travels (the node's side).
pub fn saved_model(saved: &nearrec::SavedModel) -> pb::ModelResponse {
    let shapes: Vec<Vec<usize>> = (saved.weights())
        .map(|(_, shape, _)| shape.iter().map(|&d| d as usize).collect())
        .collect();
    let tensors: Vec<Tensor<'_>> = (saved.weights().zip(&shapes))
        .map(|((name, _, values), shape)| Tensor {
            name,
            shape,
            values,
        })
        .collect();
    pb::ModelResponse {
        config: saved.config_json(),
        weights: weights(&tensors),
    }
}

/// [`saved_model`] back (the client's side).
pub fn unsaved_model(m: &pb::ModelResponse) -> nearrec::Result<nearrec::SavedModel> {
    let owned = unweights(&m.weights)?;
    nearrec::SavedModel::from_json(&m.config, &tensors(&owned))
}

/// What a store holds (the node's side); `name` is the store's name on the node.
pub fn info(name: &str, i: Info) -> pb::InfoResponse {
    pb::InfoResponse {
        store: name.to_owned(),
        tables: i
            .tables
            .into_iter()
            .map(|t| pb::TableInfo {
                name: t.name,
                rows: t.rows,
                dim: t.dim,
                dtype: t.dtype.name().to_owned(),
                keys: t.keys,
            })
            .collect(),
        version: i.version,
        tier: i.tier,
        writable: i.writable,
        model: i.model,
        stores: i.stores,
        path: i.path,
        served_version: i.served_version.unwrap_or(0),
        versions: i.versions,
        shard: i.shard.map(shard_tag),
    }
}

/// A shard's tag on the wire.
pub fn shard_tag(t: nearrec::shard::ShardTag) -> pb::ShardTag {
    pb::ShardTag {
        plan: t.plan,
        shard: t.shard as u32,
        store: t.store,
        previous: t.previous,
    }
}

/// [`shard_tag`] back.
pub fn unshard_tag(t: pb::ShardTag) -> nearrec::shard::ShardTag {
    nearrec::shard::ShardTag {
        plan: t.plan,
        shard: t.shard as usize,
        store: t.store,
        previous: t.previous,
    }
}

/// [`info`] back (the client's side).
pub fn uninfo(i: pb::InfoResponse) -> nearrec::Result<Info> {
    let tables = i
        .tables
        .into_iter()
        .map(|t| {
            let dtype = t.dtype.parse().map_err(|_| {
                nearrec::Error::Internal(format!(
                    "the node named dtype {:?} for table {:?}",
                    t.dtype, t.name
                ))
            })?;
            Ok(TableInfo {
                name: t.name,
                rows: t.rows,
                dim: t.dim,
                dtype,
                keys: t.keys,
            })
        })
        .collect::<nearrec::Result<_>>()?;
    Ok(Info {
        name: i.store,
        tables,
        version: i.version,
        tier: i.tier,
        writable: i.writable,
        model: i.model,
        stores: i.stores,
        path: i.path,
        served_version: (i.served_version > 0).then_some(i.served_version),
        versions: i.versions,
        shard: i.shard.map(unshard_tag),
    })
}

/// A store's counters and DRAM tiers (the node's side).
pub fn stats(s: Stats, tiers: Vec<TierReport>) -> pb::StatsResponse {
    pb::StatsResponse {
        values: s.values.into_iter().collect(),
        device: s.device,
        direct_io: s.direct_io,
        block_bytes: s.block_bytes as u64,
        tiers: tiers
            .into_iter()
            .map(|r| pb::TierReport {
                table: r.table,
                resident: r.resident,
                hot_rows: r.hot_rows,
                cache_rows: r.cache_rows,
                bytes: r.bytes,
                lookups_resident: r.lookups_resident,
                lookups_hot: r.lookups_hot,
                lookups_cache: r.lookups_cache,
                lookups_ssd: r.lookups_ssd,
                cache_hits: r.cache.hits,
                cache_misses: r.cache.misses,
                cache_admissions: r.cache.admissions,
                cache_rejections: r.cache.rejections,
                cache_evictions: r.cache.evictions,
            })
            .collect(),
    }
}

/// [`stats`]'s counters back (the client's side), by name.
pub fn unstats(s: pb::StatsResponse) -> (Stats, Vec<TierReport>) {
    let mut values: Vec<(String, f64)> = s.values.into_iter().collect();
    values.sort_by(|a, b| a.0.cmp(&b.0));
    let tiers = s
        .tiers
        .into_iter()
        .map(|r| TierReport {
            table: r.table,
            resident: r.resident,
            hot_rows: r.hot_rows,
            cache_rows: r.cache_rows,
            bytes: r.bytes,
            lookups_resident: r.lookups_resident,
            lookups_hot: r.lookups_hot,
            lookups_cache: r.lookups_cache,
            lookups_ssd: r.lookups_ssd,
            cache: CacheStatsSnapshot {
                hits: r.cache_hits,
                misses: r.cache_misses,
                admissions: r.cache_admissions,
                rejections: r.cache_rejections,
                evictions: r.cache_evictions,
            },
        })
        .collect();
    let stats = Stats {
        device: s.device,
        direct_io: s.direct_io,
        block_bytes: usize::try_from(s.block_bytes).unwrap_or(usize::MAX),
        values,
    };
    (stats, tiers)
}

/// A compaction (the node's side).
pub fn compaction(c: Compaction) -> pb::CompactResponse {
    pb::CompactResponse {
        version: c.version,
        tables: c.tables as u64,
        rows: c.rows,
        bytes: c.bytes,
        seconds: c.seconds,
    }
}

/// [`compaction`] back (the client's side).
pub fn uncompaction(c: pb::CompactResponse) -> Compaction {
    Compaction {
        version: c.version,
        tables: c.tables as usize,
        rows: c.rows,
        bytes: c.bytes,
        seconds: c.seconds,
    }
}

/// A transaction a store holds (the node's side).
pub fn membership(m: nearrec::Membership) -> pb::Membership {
    pb::Membership {
        replica: m.replica,
        epoch: m.epoch,
        members: m.members,
        fenced_at_ms: m.fenced_at_ms,
        fence_lease_ms: m.fence_lease_ms,
    }
}

/// A membership as sent (none sent: epoch 0, no id).
pub fn unmembership(m: Option<pb::Membership>) -> nearrec::Membership {
    m.map_or_else(nearrec::Membership::default, |m| nearrec::Membership {
        replica: m.replica,
        epoch: m.epoch,
        members: m.members,
        fenced_at_ms: m.fenced_at_ms,
        fence_lease_ms: m.fence_lease_ms,
    })
}

pub fn transaction(t: &Transaction) -> pb::TransactionState {
    pb::TransactionState {
        tx: tx(t.tx),
        state: t.state.name().to_owned(),
        note: t.note.clone(),
        age_seconds: t.age.as_secs_f64(),
    }
}

/// A transaction's id as sent: 16 bytes, little-endian.
pub fn tx(tx: u128) -> Bytes {
    tx.to_le_bytes().to_vec().into()
}

/// [`tx`] back.
pub fn untx(b: &[u8]) -> nearrec::Result<u128> {
    let b = <[u8; 16]>::try_from(b).map_err(|_| {
        nearrec::Error::invalid(format!("a transaction's id of {} bytes, not 16", b.len()))
    })?;
    Ok(u128::from_le_bytes(b))
}

/// The last writers of a lookup's rows, as its answer carries them.
pub fn writers(writers: Vec<LastWriter>) -> Vec<pb::LastWriter> {
    (writers.into_iter())
        .map(|w| pb::LastWriter {
            tx: tx(w.tx),
            note: w.note.to_string(),
        })
        .collect()
}

/// [`writers`] back (the client's side).
pub fn unwriters(r: &pb::LookupResponse) -> nearrec::Result<Vec<LastWriter>> {
    (r.writers.iter())
        .map(|w| {
            Ok(LastWriter {
                tx: untx(&w.tx)?,
                note: w.note.as_str().into(),
            })
        })
        .collect()
}

/// [`transaction`] back (the client's side).
pub fn untransaction(t: &pb::TransactionState) -> nearrec::Result<Transaction> {
    let bad = |reason: String| nearrec::Error::invalid(reason);
    let tx = untx(&t.tx)?;
    let state = (TxState::ALL.into_iter())
        .find(|s| s.name() == t.state)
        .ok_or_else(|| bad(format!("{:?} is not a transaction's state", t.state)))?;
    Ok(Transaction {
        tx,
        state,
        note: t.note.clone(),
        age: std::time::Duration::try_from_secs_f64(t.age_seconds).unwrap_or_default(),
    })
}

/// A scrub pass's checks (the node's side); a sound table's error is empty.
pub fn scrubbed(checks: Vec<TableCheck>) -> pb::ScrubResponse {
    let tables = checks.into_iter().map(|c| pb::TableScrubbed {
        table: c.table,
        bytes: c.bytes,
        error: c.error.unwrap_or_default(),
    });
    pb::ScrubResponse {
        tables: tables.collect(),
    }
}

/// [`scrubbed`]'s checks back (the client's side).
pub fn unscrubbed(r: pb::ScrubResponse) -> Vec<TableCheck> {
    let checks = r.tables.into_iter().map(|t| TableCheck {
        table: t.table,
        bytes: t.bytes,
        error: (!t.error.is_empty()).then_some(t.error),
    });
    checks.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nearrec::{AsBatch, OwnedBatch, OwnedLookup};

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
            let back = lookup(got).unwrap();
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
