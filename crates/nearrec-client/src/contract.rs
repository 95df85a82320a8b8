//! The contract over the node's calls: the core and every capability, each verb one call
//! (`nearrec_wire::convert` builds and reads its messages; the verb's row in
//! `nearrec_wire::verbs` says whether it is made again).

use std::time::{Duration, Instant};

use nearrec::model::Tensor;
use nearrec::{
    AsBatch, Batch, Compaction, Decision, Fed, FeedCursor, Feeds, Inference, Inferred, Info,
    Membership, NewTable, Pooled, Read, Replica, RowWrite, Rows, SavedModel, Schema, Stats,
    StoreApi, Submitted, SwapTo, TableCheck, TierReport, Transaction, Versioned, Versions,
    WriteOptions, Writes,
};
use nearrec_wire::arrays::{decode, encode_slice};
use nearrec_wire::convert;
use nearrec_wire::v1 as pb;
use nearrec_wire::v1::transaction_request::Step;

use crate::{Client, Pending};

/// Each verb one call to the node. `refresh` reads the node's version (the node follows the
/// store's writer by itself). The node answers for its store: every capability is the
/// client's, and a verb its store lacks comes back refused, typed.
impl StoreApi for Client {
    fn describe(&self) -> String {
        let store = if self.store.is_empty() {
            "the store"
        } else {
            &self.store
        };
        format!("{store} on the node at {}", self.address())
    }

    fn info(&self) -> nearrec::Result<Info> {
        let req = pb::InfoRequest {
            store: self.store.clone(),
        };
        convert::uninfo(self.call(req)?)
    }

    fn lookup(&self, batch: &Batch<'_>) -> nearrec::Result<(Pooled, Read)> {
        self.pooled(self.lookup_request(batch, false, None))
    }

    fn lookup_rows(&self, batch: &Batch<'_>) -> nearrec::Result<Versioned<Vec<Rows>>> {
        self.rows(self.lookup_request(batch, true, None))
    }

    fn submit(&self, batch: Box<dyn AsBatch>) -> nearrec::Result<Submitted> {
        let deadline = self.options.timeout.map(|t| Instant::now() + t);
        let conn = self.conn()?;
        let req = self.lookup_request(&batch.as_batch(), false, None);
        let started = self.start(&conn, req, deadline, convert::unpooled);
        Ok(Box::new(Pending {
            runtime: conn.runtime.clone(),
            started,
        }))
    }

    fn refresh(&self) -> nearrec::Result<u64> {
        self.version()
    }

    fn row_digests(&self, table: &str, first: u64, count: u64) -> nearrec::Result<Vec<u64>> {
        let req = pb::RowDigestsRequest {
            store: self.store.clone(),
            table: table.to_owned(),
            first,
            count,
        };
        let answer = self.call(req)?;
        decode(&answer.digests, table, "digests")
    }

    fn stats(&self) -> nearrec::Result<Stats> {
        Ok(self.stats_and_tiers()?.0)
    }

    /// On the node, of the node's disk: as long as the pass takes (the client's timeout
    /// bounds it).
    fn scrub(&self, rate: u64) -> nearrec::Result<Vec<TableCheck>> {
        let req = pb::ScrubRequest {
            store: self.store.clone(),
            rate,
        };
        let answer = self.call(req)?;
        Ok(convert::unscrubbed(answer))
    }

    fn tier_report(&self) -> nearrec::Result<Vec<TierReport>> {
        Ok(self.stats_and_tiers()?.1)
    }

    /// Lets go of this process's connection (calls under way finish); every later call is
    /// `Unavailable`.
    fn close(&self) -> nearrec::Result<()> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }

    nearrec::capable!(writes, schema, versions, replica, inference);
}

impl Writes for Client {
    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> nearrec::Result<u64> {
        let req = pb::WriteRequest {
            store: self.store.clone(),
            writes: convert::writes(writes),
            allow_nonfinite: options.allow_nonfinite,
        };
        Ok(self.call(req)?.version)
    }

    fn compact(&self) -> nearrec::Result<Compaction> {
        let req = pb::CompactRequest {
            store: self.store.clone(),
        };
        let answer = self.call(req)?;
        Ok(convert::uncompaction(answer))
    }

    fn feed(
        &self,
        feed: &str,
        cursor: FeedCursor,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> nearrec::Result<Fed> {
        let req = pb::FeedRequest {
            store: self.store.clone(),
            feed: feed.to_owned(),
            cursor: Some(convert::cursor(cursor)),
            writes: convert::writes(writes),
            allow_nonfinite: options.allow_nonfinite,
        };
        let answer = self.call(req)?;
        Ok(Fed {
            version: answer.version,
            applied: answer.applied,
            cursor: convert::uncursor(answer.cursor),
        })
    }

    fn feed_status(&self) -> nearrec::Result<Feeds> {
        let req = pb::FeedStatusRequest {
            store: self.store.clone(),
        };
        let answer = self.call(req)?;
        Ok(answer
            .feeds
            .into_iter()
            .map(|(name, c)| (name, convert::uncursor(Some(c))))
            .collect())
    }
}

impl Schema for Client {
    fn create_table(&self, t: &NewTable<'_>) -> nearrec::Result<u64> {
        let (init, seed) = match t.init {
            nearrec::Init::Zeros => ("zeros", 0),
            nearrec::Init::Uniform { seed } => ("uniform", seed),
        };
        let req = pb::CreateTableRequest {
            store: self.store.clone(),
            name: t.name.to_owned(),
            rows: t.rows,
            dim: t.dim,
            dtype: t.dtype.name().to_owned(),
            init: init.to_owned(),
            seed,
        };
        Ok(self.call(req)?.version)
    }

    fn drop_table(&self, name: &str) -> nearrec::Result<u64> {
        let req = pb::DropTableRequest {
            store: self.store.clone(),
            name: name.to_owned(),
        };
        Ok(self.call(req)?.version)
    }
}

impl Versions for Client {
    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> nearrec::Result<u64> {
        Ok(self.swap_call(to, warm, force, false)?.version)
    }

    fn lookup_version(&self, batch: &Batch<'_>, version: u64) -> nearrec::Result<(Pooled, Read)> {
        self.pooled(self.lookup_request(batch, false, Some(version)))
    }

    fn lookup_rows_version(
        &self,
        batch: &Batch<'_>,
        version: u64,
    ) -> nearrec::Result<Versioned<Vec<Rows>>> {
        self.rows(self.lookup_request(batch, true, Some(version)))
    }
}

impl Client {
    /// Transaction `tx`'s prepare of `writes`, with its coordinator's note, the shard's epoch
    /// and the delta file it is, if one.
    fn prepare(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        (note, epoch, feed): (&str, Option<u64>, Option<(&str, FeedCursor)>),
    ) -> pb::TransactionRequest {
        pb::TransactionRequest {
            writes: convert::writes(writes),
            allow_nonfinite: options.allow_nonfinite,
            note: note.to_owned(),
            epoch,
            feed: feed.map(|(f, _)| f.to_owned()).unwrap_or_default(),
            cursor: feed.map(|(_, c)| convert::cursor(c)),
            ..self.transaction(tx, Step::Prepare)
        }
    }
}

impl Replica for Client {
    fn stage(&self, to: &SwapTo, warm: bool, force: bool) -> nearrec::Result<u64> {
        Ok(self.swap_call(to, warm, force, true)?.staged)
    }

    fn release(&self) -> nearrec::Result<()> {
        let req = pb::SwapRequest {
            store: self.store.clone(),
            release: true,
            ..Default::default()
        };
        self.call(req).map(drop)
    }

    fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
        feed: Option<(&str, FeedCursor)>,
    ) -> nearrec::Result<()> {
        let req = self.prepare(tx, writes, options, (note, epoch, feed));
        self.call(req)?;
        Ok(())
    }

    fn hold_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
        feed: Option<(&str, FeedCursor)>,
    ) -> nearrec::Result<()> {
        let req = pb::TransactionRequest {
            hold: true,
            ..self.prepare(tx, writes, options, (note, epoch, feed))
        };
        self.call(req)?;
        Ok(())
    }

    fn decide(&self, tx: u128, decision: Decision, keep: bool) -> nearrec::Result<u64> {
        let step = match decision {
            Decision::Commit => Step::Commit,
            Decision::Abort => Step::Abort,
        };
        let req = pb::TransactionRequest {
            keep,
            ..self.transaction(tx, step)
        };
        Ok(self.call(req)?.version)
    }

    fn forget(&self, tx: u128) -> nearrec::Result<()> {
        let req = self.transaction(tx, Step::Forget);
        self.call(req)?;
        Ok(())
    }

    fn transactions(&self) -> nearrec::Result<Vec<Transaction>> {
        let req = self.transaction(0, Step::List);
        let answer = self.call(req)?;
        answer
            .transactions
            .iter()
            .map(convert::untransaction)
            .collect()
    }

    fn membership(&self) -> nearrec::Result<Membership> {
        let req = self.transaction(0, Step::Membership);
        let answer = self.call(req)?;
        Ok(convert::unmembership(answer.membership))
    }

    fn set_membership(
        &self,
        expected: u64,
        epoch: u64,
        members: &[u64],
    ) -> nearrec::Result<Membership> {
        let to = Membership {
            epoch,
            members: members.to_vec(),
            ..Membership::default()
        };
        let req = pb::TransactionRequest {
            epoch: Some(expected),
            membership: Some(convert::membership(to)),
            ..self.transaction(0, Step::SetMembership)
        };
        let answer = self.call(req)?;
        Ok(convert::unmembership(answer.membership))
    }

    fn fence(&self, epoch: u64, lease: Duration) -> nearrec::Result<u64> {
        let req = pb::TransactionRequest {
            epoch: Some(epoch),
            lease_seconds: lease.as_secs_f64(),
            ..self.transaction(0, Step::Fence)
        };
        Ok(self.call(req)?.version)
    }

    fn adopt(
        &self,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        count: u64,
    ) -> nearrec::Result<u64> {
        let req = pb::TransactionRequest {
            writes: convert::writes(writes),
            allow_nonfinite: options.allow_nonfinite,
            count,
            ..self.transaction(0, Step::Adopt)
        };
        Ok(self.call(req)?.version)
    }

    fn key_digests(
        &self,
        table: &str,
        after: Option<u64>,
        count: u64,
    ) -> nearrec::Result<Vec<(u64, u64)>> {
        let req = pb::TransactionRequest {
            table: table.to_owned(),
            after,
            count,
            ..self.transaction(0, Step::Keys)
        };
        let answer = self.call(req)?;
        if answer.keys.len() != answer.digests.len() {
            return Err(nearrec::Error::Internal(format!(
                "the node answered {} keys of table {table:?} with {} digests",
                answer.keys.len(),
                answer.digests.len()
            )));
        }
        Ok(answer.keys.into_iter().zip(answer.digests).collect())
    }

    fn retag(
        &self,
        expected: &str,
        plan: &str,
        previous: Option<&str>,
    ) -> nearrec::Result<nearrec::shard::ShardTag> {
        let req = pb::TransactionRequest {
            expected: expected.to_owned(),
            plan: plan.to_owned(),
            previous: previous.map(str::to_owned),
            ..self.transaction(0, Step::Retag)
        };
        let tag = self.call(req)?.shard.ok_or_else(|| {
            nearrec::Error::Internal("the node answered a retag without the tag".into())
        })?;
        Ok(convert::unshard_tag(tag))
    }
}

impl Inference for Client {
    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> nearrec::Result<Inferred> {
        let req = pb::InferRequest {
            store: self.store.clone(),
            dense: encode_slice(dense),
            tables: convert::tables(batch),
        };
        let answer = self.call(req)?;
        Ok(Inferred {
            outputs: decode(&answer.outputs, "", "outputs")?,
            batch: answer.batch as usize,
            width: answer.width as usize,
            times: Default::default(),
        })
    }

    fn update_model(&self, weights: &[Tensor<'_>]) -> nearrec::Result<()> {
        let req = pb::UpdateModelRequest {
            store: self.store.clone(),
            weights: convert::weights(weights),
        };
        self.call(req)?;
        Ok(())
    }

    fn saved_model(&self) -> nearrec::Result<SavedModel> {
        let req = pb::ModelRequest {
            store: self.store.clone(),
        };
        convert::unsaved_model(&self.call(req)?)
    }
}
