//! The calls but lookups, each past its verb's checks ([`Checked`]): its arguments decoded, its
//! work run on the store's contract as its verb is admitted ([`NodeService::work`]), its answer
//! encoded. What a call needs beyond its row — a swap's reach and the grants of what it would
//! expose — is checked here.

use std::time::Duration;

use nearrec::{AsBatch, Decision, NewTable, RowWrite, SwapTo, WriteOptions};
use nearrec_wire::arrays::{decode, encode};
use nearrec_wire::convert;
use nearrec_wire::v1 as pb;
use tonic::{Response, Status};

use super::{Answer, Audited, Checked, NodeService, bad, holding};
use crate::swap;

impl NodeService {
    /// One scrub pass of the node's disk, in an engine slot for as long as it takes.
    pub(super) async fn call_scrub(
        &self,
        call: Checked<'_>,
        req: pb::ScrubRequest,
    ) -> Answer<pb::ScrubResponse> {
        let store = call.store.clone();
        let (checks, held) = self.work(&call, move || store.scrub(req.rate)).await?;
        Ok(holding(convert::scrubbed(checks), held))
    }

    pub(super) async fn call_infer(
        &self,
        call: Checked<'_>,
        req: pb::InferRequest,
    ) -> Answer<pb::InferResponse> {
        let batch = convert::batch(&req.tables).map_err(bad)?;
        let dense: Vec<f32> = decode(&req.dense, "", "dense").map_err(bad)?;
        let store = call.store.clone();
        let (out, held) = self
            .work(&call, move || {
                store
                    .able(store.inference(), "infer")?
                    .infer(&dense, &batch.as_batch())
            })
            .await?;
        let metrics = &self.0.metrics;
        metrics.stages("Infer", &out.times.stages);
        metrics.stage("Infer", "infer", out.times.finish.as_secs_f64());
        let answer = pb::InferResponse {
            batch: out.batch as u64,
            width: out.width as u32,
            outputs: encode(out.outputs),
        };
        Ok(holding(answer, held))
    }

    pub(super) async fn call_write(
        &self,
        call: Checked<'_>,
        req: pb::WriteRequest,
    ) -> Answer<pb::WriteResponse> {
        let writes = convert::unwrites(&req.writes).map_err(bad)?;
        let options = WriteOptions {
            allow_nonfinite: req.allow_nonfinite,
        };
        let store = call.store.clone();
        let (version, held) = self
            .work(&call, move || {
                store
                    .able(store.writes(), "write")?
                    .write_many(&convert::row_writes(&writes), options)
            })
            .await?;
        Ok(holding(pb::WriteResponse { version }, held))
    }

    pub(super) async fn call_remove(
        &self,
        call: Checked<'_>,
        req: pb::RemoveRequest,
    ) -> Answer<pb::WriteResponse> {
        let ids: Vec<i64> = decode(&req.ids, &req.table, "ids").map_err(bad)?;
        let store = call.store.clone();
        let (version, held) = self
            .work(&call, move || {
                let w = RowWrite {
                    table: &req.table,
                    ids: &ids,
                    values: None,
                };
                store
                    .able(store.writes(), "remove")?
                    .write_many(&[w], WriteOptions::default())
            })
            .await?;
        Ok(holding(pb::WriteResponse { version }, held))
    }

    pub(super) async fn call_update_model(
        &self,
        call: Checked<'_>,
        req: pb::UpdateModelRequest,
    ) -> Answer<pb::UpdateModelResponse> {
        let weights = convert::unweights(&req.weights).map_err(bad)?;
        let count = weights.len();
        let store = call.store.clone();
        let ((), held) = self
            .work(&call, move || {
                store
                    .able(store.inference(), "update_model")?
                    .update_model(&convert::tensors(&weights))
            })
            .await?;
        let (store, principal) = (call.name, call.caller.who());
        tracing::info!(store, principal, weights = count, "model updated");
        Ok(holding(pb::UpdateModelResponse {}, held))
    }

    pub(super) async fn call_model(
        &self,
        call: Checked<'_>,
        _req: pb::ModelRequest,
    ) -> Answer<pb::ModelResponse> {
        let store = call.store.clone();
        let (saved, held) = self
            .work(&call, move || {
                store.able(store.inference(), "model")?.saved_model()
            })
            .await?;
        Ok(holding(convert::saved_model(&saved), held))
    }

    pub(super) async fn call_feed(
        &self,
        call: Checked<'_>,
        req: pb::FeedRequest,
    ) -> Answer<pb::FeedResponse> {
        let writes = convert::unwrites(&req.writes).map_err(bad)?;
        let options = WriteOptions {
            allow_nonfinite: req.allow_nonfinite,
        };
        let cursor = convert::uncursor(req.cursor);
        let store = call.store.clone();
        let (fed, held) = self
            .work(&call, move || {
                store.able(store.writes(), "feed")?.feed(
                    &req.feed,
                    cursor,
                    &convert::row_writes(&writes),
                    options,
                )
            })
            .await?;
        Ok(holding(
            pb::FeedResponse {
                version: fed.version,
                applied: fed.applied,
                cursor: Some(convert::cursor(fed.cursor)),
            },
            held,
        ))
    }

    pub(super) async fn call_feed_status(
        &self,
        call: Checked<'_>,
        _req: pb::FeedStatusRequest,
    ) -> Answer<pb::FeedStatusResponse> {
        let store = call.store.clone();
        let (feeds, _) = self
            .work(&call, move || {
                store.able(store.writes(), "feed_status")?.feed_status()
            })
            .await?;
        let feeds = feeds
            .into_iter()
            .map(|(name, c)| (name, convert::cursor(c)))
            .collect();
        Ok(Response::new(pb::FeedStatusResponse { feeds }))
    }

    pub(super) async fn call_transaction(
        &self,
        call: Checked<'_>,
        req: pb::TransactionRequest,
    ) -> Answer<pb::TransactionResponse> {
        use pb::transaction_request::Step;
        let Some(step) = call.verb.step else {
            return Err(Status::invalid_argument(format!(
                "step {} is not a transaction's step",
                req.step
            )));
        };
        let tx = match (step, <[u8; 16]>::try_from(&req.tx[..])) {
            (_, Ok(b)) => u128::from_le_bytes(b),
            (Step::List | Step::Keys | Step::Retag, Err(_)) if req.tx.is_empty() => 0,
            (_, Err(_)) => {
                return Err(Status::invalid_argument(format!(
                    "a transaction's id is 16 bytes, not {}",
                    req.tx.len()
                )));
            }
        };
        let writes = convert::unwrites(&req.writes).map_err(bad)?;
        let options = WriteOptions {
            allow_nonfinite: req.allow_nonfinite,
        };
        let lease = Duration::try_from_secs_f64(req.lease_seconds)
            .map_err(|_| Status::invalid_argument(format!("lease {} s", req.lease_seconds)))?;
        let store = call.store.clone();
        let (answer, held) = self
            .work(&call, move || {
                let replica = store.able(store.replica(), "transaction")?;
                let membership = |m: nearrec::Membership| pb::TransactionResponse {
                    membership: Some(convert::membership(m)),
                    ..Default::default()
                };
                let version = match step {
                    Step::List => {
                        let listed = replica.transactions()?;
                        return Ok(pb::TransactionResponse {
                            version: store.version()?,
                            transactions: listed.iter().map(convert::transaction).collect(),
                            ..Default::default()
                        });
                    }
                    Step::Prepare => {
                        let w = convert::row_writes(&writes);
                        let feed = (!req.feed.is_empty())
                            .then(|| (req.feed.as_str(), convert::uncursor(req.cursor)));
                        let (note, epoch) = (&req.note, req.epoch);
                        match req.hold {
                            true => replica.hold_write(tx, &w, options, note, epoch, feed)?,
                            false => replica.prepare_write(tx, &w, options, note, epoch, feed)?,
                        }
                        store.version()?
                    }
                    Step::Membership => return Ok(membership(replica.membership()?)),
                    Step::SetMembership => {
                        let to = convert::unmembership(req.membership.clone());
                        let expected = req.epoch.unwrap_or(0);
                        let set = replica.set_membership(expected, to.epoch, &to.members)?;
                        return Ok(membership(set));
                    }
                    Step::Fence => replica.fence(req.epoch.unwrap_or(0), lease)?,
                    Step::Keys => {
                        let keyed = replica.key_digests(&req.table, req.after, req.count)?;
                        let (keys, digests) = keyed.into_iter().unzip();
                        return Ok(pb::TransactionResponse {
                            keys,
                            digests,
                            ..Default::default()
                        });
                    }
                    Step::Retag => {
                        let previous = req.previous.as_deref();
                        let tag = replica.retag(&req.expected, &req.plan, previous)?;
                        return Ok(pb::TransactionResponse {
                            shard: Some(convert::shard_tag(tag)),
                            ..Default::default()
                        });
                    }
                    Step::Adopt => {
                        let w = convert::row_writes(&writes);
                        replica.adopt(&w, options, req.count)?
                    }
                    Step::Commit => replica.decide(tx, Decision::Commit, req.keep)?,
                    Step::Abort => replica.decide(tx, Decision::Abort, req.keep)?,
                    Step::Forget => {
                        replica.forget(tx)?;
                        store.version()?
                    }
                };
                Ok(pb::TransactionResponse {
                    version,
                    ..Default::default()
                })
            })
            .await?;
        Ok(holding(answer, held))
    }

    pub(super) async fn call_create_table(
        &self,
        call: Checked<'_>,
        req: pb::CreateTableRequest,
    ) -> Answer<pb::WriteResponse> {
        let invalid = |reason: String| {
            bad(nearrec::Error::InvalidRequest {
                table: Some(req.name.clone()),
                position: None,
                reason,
            })
        };
        let dtype = if req.dtype.is_empty() {
            "fp32"
        } else {
            req.dtype.as_str()
        };
        let dtype: nearrec::format::DType = dtype
            .parse()
            .map_err(|_| invalid(format!("dtype {dtype:?} is not fp32, fp16, bf16 or int8")))?;
        let init = match req.init.as_str() {
            "" | "uniform" => nearrec::Init::Uniform { seed: req.seed },
            "zeros" => nearrec::Init::Zeros,
            other => return Err(invalid(format!("init {other:?} is not uniform or zeros"))),
        };
        let store = call.store.clone();
        let (version, held) = self
            .work(&call, move || {
                store
                    .able(store.schema(), "create_table")?
                    .create_table(&NewTable {
                        name: &req.name,
                        rows: req.rows,
                        dim: req.dim,
                        dtype,
                        init,
                    })
            })
            .await?;
        Ok(holding(pb::WriteResponse { version }, held))
    }

    pub(super) async fn call_drop_table(
        &self,
        call: Checked<'_>,
        req: pb::DropTableRequest,
    ) -> Answer<pb::WriteResponse> {
        let store = call.store.clone();
        let (version, held) = self
            .work(&call, move || {
                store
                    .able(store.schema(), "drop_table")?
                    .drop_table(&req.name)
            })
            .await?;
        Ok(holding(pb::WriteResponse { version }, held))
    }

    pub(super) async fn call_swap(
        &self,
        call: Checked<'_>,
        req: pb::SwapRequest,
    ) -> Answer<pb::SwapResponse> {
        let (name, store, who) = (call.name, call.store.clone(), call.caller.who());
        if req.release {
            let (_, held) = self
                .work(&call, move || {
                    store.able(store.replica(), "release")?.release()
                })
                .await?;
            tracing::info!(store = %name, principal = who, "held versions released");
            return Ok(holding(pb::SwapResponse::default(), held));
        }
        let to = match swap::target(&req)? {
            SwapTo::Path(p) => {
                let path = swap::resolve(&self.reach(name, &*store), &p)?;
                SwapTo::Path(path.to_string_lossy().into_owned())
            }
            by_version => by_version,
        };
        if let Some(p) = call.caller.principal.clone() {
            let (name, to, store) = (name.to_owned(), to.clone(), store.clone());
            let exposed = tokio::task::spawn_blocking(move || {
                let info = store.info().map_err(bad)?;
                let path = swap::destination(&info, &to).map_err(bad)?;
                swap::allow_exposed(&p, &name, &path, info.writable)
            })
            .await
            .map_err(|e| Status::internal(format!("a request's task failed: {e}")))?;
            self.allow(&call.caller, call.verb, |_| exposed)?;
        }
        let event = swap::event(&to);
        if req.stage {
            let (staged, held) = self
                .work(&call, move || {
                    store
                        .able(store.replica(), "stage")?
                        .stage(&to, req.warm, req.force)
                })
                .await?;
            tracing::info!(store = %name, principal = who, staged, "version staged");
            return Ok(holding(pb::SwapResponse { version: 0, staged }, held));
        }
        let (answer, held) = self
            .work(&call, move || {
                let before = store.info().ok();
                let version = (store.able(store.versions(), "swap"))
                    .and_then(|v| v.swap(&to, req.warm, req.force));
                version.map(|v| (v, before, store.info().ok()))
            })
            .await?;
        let (version, before, after) = answer;
        let (from, to) = (swap::served(before.as_ref()), swap::served(after.as_ref()));
        tracing::info!(store = %name, principal = who, %from, %to, "{event}");
        let mut answer = holding(pb::SwapResponse { version, staged: 0 }, held);
        // the audit line names what was served, resolved, not what the request said
        (answer.extensions_mut()).insert(Audited(format!("{event} to {to}")));
        Ok(answer)
    }

    pub(super) async fn call_info(
        &self,
        call: Checked<'_>,
        _req: pb::InfoRequest,
    ) -> Answer<pb::InfoResponse> {
        let stores = (self.0.stores.names())
            .filter(|n| call.caller.sees(n))
            .map(str::to_owned)
            .collect();
        let (name, store) = (call.name.to_owned(), call.store.clone());
        let (info, _) = self.work(&call, move || store.info()).await?;
        Ok(Response::new(pb::InfoResponse {
            stores,
            ..convert::info(&name, info)
        }))
    }

    pub(super) async fn call_stats(
        &self,
        call: Checked<'_>,
        _req: pb::StatsRequest,
    ) -> Answer<pb::StatsResponse> {
        let store = call.store.clone();
        let (answer, _) = self
            .work(&call, move || {
                Ok(convert::stats(store.stats()?, store.tier_report()?))
            })
            .await?;
        Ok(Response::new(answer))
    }

    pub(super) async fn call_row_digests(
        &self,
        call: Checked<'_>,
        req: pb::RowDigestsRequest,
    ) -> Answer<pb::RowDigestsResponse> {
        let store = call.store.clone();
        let (digests, held) = self
            .work(&call, move || {
                store.row_digests(&req.table, req.first, req.count)
            })
            .await?;
        let answer = pb::RowDigestsResponse {
            digests: encode(digests),
        };
        Ok(holding(answer, held))
    }

    pub(super) async fn call_compact(
        &self,
        call: Checked<'_>,
        _req: pb::CompactRequest,
    ) -> Answer<pb::CompactResponse> {
        let store = call.store.clone();
        let (done, held) = self
            .work(&call, move || {
                store.able(store.writes(), "compact")?.compact()
            })
            .await?;
        Ok(holding(convert::compaction(done), held))
    }
}
