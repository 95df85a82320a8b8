//! Messages to and from the facade's types: a lookup's request and answer (`lookups.rs`), and
//! here everything else — writes, transactions, models, what a store holds and counts.

mod lookups;

pub use lookups::*;

use nearrec::{
    CacheStatsSnapshot, Compaction, FeedCursor, Info, LastWriter, OwnedValues, RowValues, RowWrite,
    Stats, TableCheck, TableInfo, TierReport, Transaction, TxState,
};

use bytes::Bytes;
use nearrec::model::Tensor;

use crate::arrays::{decode, encode_slice};
use crate::v1 as pb;

fn invalid(table: &str, reason: String) -> nearrec::Error {
    nearrec::Error::InvalidRequest {
        table: Some(table.to_owned()),
        position: None,
        reason,
    }
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
