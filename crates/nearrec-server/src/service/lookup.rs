//! Lookups: one request decoded, sized, admitted as its store's tier wants (at once on the
//! async worker, coalesced, or on a blocking thread with a CPU turn) and pooled — or its
//! distinct rows answered — and a stream of them, up to [`STREAM_DEPTH`] at once, answered in
//! order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use nearrec::{AsBatch, OutDtype, OwnedBatch, Stages, StoreApi};
use nearrec_wire::arrays::Spare;
use nearrec_wire::convert;
use nearrec_wire::status::{bounded, stream_error};
use nearrec_wire::v1 as pb;
use nearrec_wire::verbs::LOOKUP_STREAM;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::seen::Seen;
use super::{Answer, Answers, Caller, Checked, How, NodeService, bad, conn_budget, holding};
use crate::admission::{Held, deadline};
use crate::stores::{inline, pooled_in, settle, writers};

/// How many requests of one stream run at once (batch i + 1 while batch i is answered).
const STREAM_DEPTH: usize = 4;

impl NodeService {
    pub(super) async fn call_lookup(
        &self,
        call: Checked<'_>,
        req: pb::LookupRequest,
    ) -> Answer<pb::LookupResponse> {
        let (answer, held) = self.answer(&call, req).await?;
        Ok(holding(answer, held))
    }

    /// One lookup request, checked, decoded, admitted and served; its answer comes with what it
    /// holds until sent: its place in the node, its bytes reserved from the node's budget and
    /// from its connection's.
    async fn answer(
        &self,
        call: &Checked<'_>,
        req: pb::LookupRequest,
    ) -> Result<(pb::LookupResponse, Held), Status> {
        let (name, store) = (call.name, call.store.clone());
        // pooled in fp32 here, answered in the asked dtype (a store's own rounding not applied
        // twice: an int8 vector quantised again would not be the same)
        let spare = &self.0.spare;
        let batch = convert::batch_in(&req.tables, spare).map_err(bad)?;
        let out = convert::unout_dtype(req.out_dtype, "out_dtype").map_err(bad)?;
        let limit = self.0.config.max_message_bytes;
        let (id, raw) = (req.id, req.raw);
        let at = (req.at_version > 0).then_some(req.at_version);
        let (lookups, bags) = {
            let view = batch.as_batch();
            let lookups: usize = view.tables.iter().map(|t| t.indices.len()).sum();
            (lookups, view.tables.iter().map(|t| t.declared_bags()).max())
        };
        let bytes = answer_bytes(&*store, &batch.as_batch(), (raw, out), limit).map_err(bad)?;
        let expect: Vec<u128> = (req.expect.iter().map(|t| convert::untx(t)))
            .collect::<nearrec::Result<_>>()
            .map_err(bad)?;
        settle(&store, &batch, &expect, call.deadline)
            .await
            .map_err(bad)?;
        let mut held = Held {
            slot: None,
            bytes: Some(self.0.admission.reserve(bytes, call.conn.as_ref())?),
        };
        let inline = inline(&*store, lookups, self.0.config.inline_lookups);
        // small lookups that read a device coalesce (on DRAM-resident tables the transport,
        // not the engine, is what a request costs: they run at once)
        if !raw && !store.resident() {
            let coalescer = &self.0.coalescers[name];
            if let Some(bags) = bags.filter(|&b| coalescer.takes(b)) {
                let rpc = call.verb.rpc;
                // a store that takes writes says which wrote the rows read: the batch kept
                let kept = store.writes().is_some().then(|| batch.clone());
                let lookup = coalescer.lookup(rpc, (batch, at), bags, call.deadline);
                let (pooled, version) = lookup.await?;
                let mut answer = convert::pooled(id, version, pooled, out);
                if let Some(batch) = kept {
                    answer.writers = convert::writers(writers(&store, &batch.as_batch()));
                }
                return Ok((answer, held));
            }
        }
        let how = How {
            ticket: call.caller.ticket(lookups as u64),
            inline,
            cpu: store.resident() && !inline,
        };
        let spare = spare.clone();
        let ((answer, stages), slot) = self
            .run(call.verb.rpc, call.deadline, how, move || {
                let (mut answer, stages) =
                    lookup(&*store, id, (raw, at, out), &batch, (limit, &spare))?;
                answer.writers = convert::writers(writers(&store, &batch.as_batch()));
                convert::recycle(batch, &spare);
                Ok((answer, stages))
            })
            .await?;
        if let Some(stages) = stages {
            self.0.metrics.stages(call.verb.rpc, &stages);
        }
        held.slot = Some(slot);
        Ok((answer, held))
    }

    /// A stream's requests, each checked as a lookup of its own against the ACL in force when
    /// it arrives, up to [`STREAM_DEPTH`] at once, answered in order.
    pub(super) async fn call_lookup_stream(
        &self,
        request: Request<Streaming<pb::LookupRequest>>,
    ) -> Answer<Answers> {
        // the stream's deadline bounds every request on it
        let deadline = deadline(request.metadata(), Instant::now());
        let metadata = request.metadata().clone();
        let mut last = None;
        // the stream is one call of its principal's for as long as it is open
        let opened = self.caller(&request, LOOKUP_STREAM.rpc)?;
        let conn = conn_budget(&request);
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_DEPTH);
        let node = self.clone();
        tokio::spawn(async move {
            let _opened = opened;
            let mut pending = VecDeque::new();
            let mut open = true;
            while open || !pending.is_empty() {
                tokio::select! {
                    biased;
                    next = incoming.message(), if open && pending.len() < STREAM_DEPTH => {
                        match next {
                            Ok(Some(req)) => {
                                // a revoked token ends the stream; a revoked grant fails the
                                // requests that need it
                                let caller = match node.stream_caller(&metadata, &mut last) {
                                    // charged as the stream's opener (its address, without
                                    // an ACL)
                                    Ok(c) => Caller { share: _opened.share.clone(), ..c },
                                    Err(status) => {
                                        let _ = tx.send(Err(bounded(status))).await;
                                        return;
                                    }
                                };
                                let (node, conn) = (node.clone(), conn.clone());
                                pending.push_back(tokio::spawn(async move {
                                    node.stream_answer(caller, req, deadline, conn).await
                                }));
                            }
                            Ok(None) => open = false,
                            Err(status) => {
                                let _ = tx.send(Err(status)).await;
                                return;
                            }
                        }
                    }
                    done = async { pending.front_mut().expect("pending").await }, if !pending.is_empty() => {
                        pending.pop_front();
                        let answer = done.unwrap_or_else(|e| (failed(0, &Status::internal(e.to_string())), Held::default()));
                        if tx.send(Ok(answer)).await.is_err() {
                            return; // the client went away
                        }
                    }
                }
            }
        });
        // an answer lets go of what it holds once the encoder takes it: the connection then
        // holds it, and takes the next only once it has room (HTTP/2 flow control)
        let answers = ReceiverStream::new(rx).map(|a| a.map(|(answer, _held)| answer));
        Ok(Response::new(Box::pin(answers)))
    }

    /// One request of a stream, checked and answered; a failure is its answer's error.
    async fn stream_answer(
        &self,
        caller: Caller,
        req: pb::LookupRequest,
        deadline: Option<Instant>,
        conn: Option<Arc<tokio::sync::Semaphore>>,
    ) -> (pb::LookupResponse, Held) {
        let (start, id) = (Instant::now(), req.id);
        let seen = Seen::from_message(&req);
        let answer = match self.admit_to(LOOKUP_STREAM, &caller, &seen) {
            Ok((name, store)) => {
                let call = Checked {
                    verb: LOOKUP_STREAM,
                    caller,
                    name,
                    store,
                    deadline,
                    conn,
                    rows: 0,
                };
                self.answer(&call, req).await
            }
            Err(s) => Err(s),
        };
        let code = answer
            .as_ref()
            .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        let sent = answer.as_ref().map_or(0, |(a, _)| a.encoded_len());
        let seconds = start.elapsed().as_secs_f64();
        (self.0.metrics).call(LOOKUP_STREAM.rpc, code, seconds, 0, sent);
        answer.unwrap_or_else(|s| (failed(id, &s), Held::default()))
    }
}

/// A lookup on the facade: pooled at one version, with where its time went, or the distinct
/// rows when `raw`; as version `at` of the store's repository answers it, when one is given;
/// pooled answers in `out`, from a vector `spare` kept and given back to it once sent.
fn lookup(
    store: &dyn StoreApi,
    id: u64,
    (raw, at, out): (bool, Option<u64>, OutDtype),
    batch: &OwnedBatch,
    (limit, spare): (usize, &Arc<Spare>),
) -> nearrec::Result<(pb::LookupResponse, Option<Stages>)> {
    let batch = batch.as_batch();
    if raw {
        let (rows, version) = match at {
            Some(v) => (store.able(store.versions(), "lookup_rows_version")?)
                .lookup_rows_version(&batch, v)?,
            None => store.lookup_rows(&batch)?,
        };
        let bytes: usize = rows
            .iter()
            .map(|r| r.values.len() * 4 + r.ids.len() * 8)
            .sum();
        too_large(rows.first().map_or("", |r| r.table.as_str()), bytes, limit)?;
        return Ok((convert::raw(id, version, rows), None));
    }
    let (pooled, read) = pooled_in(store, &batch, at, spare)?;
    Ok((
        convert::pooled_in(id, read.version, pooled, out, spare),
        Some(read.stages),
    ))
}

/// The bytes of the answer `batch` declares — pooled, or at most its distinct rows with their
/// ids when `raw` — refused before anything is prepared when a pooled one (in `out`) would be
/// over the message limit (a raw one is checked once its distinct rows are known).
fn answer_bytes(
    store: &dyn StoreApi,
    batch: &nearrec::Batch<'_>,
    (raw, out): (bool, OutDtype),
    limit: usize,
) -> nearrec::Result<usize> {
    let (mut widths, mut rows) = (Vec::with_capacity(batch.tables.len()), 0usize);
    for t in &batch.tables {
        let dim = store.table(t.table)?.dim as usize;
        widths.push(dim);
        rows = rows.saturating_add(t.indices.len().saturating_mul(dim * 4 + 8));
    }
    if raw {
        return Ok(rows.min(limit));
    }
    let Some(t) = batch.tables.iter().rev().max_by_key(|t| t.declared_bags()) else {
        return Ok(0);
    };
    let bytes = out.bytes(t.declared_bags(), &widths);
    too_large(t.table, bytes, limit)?;
    Ok(bytes)
}

/// An answer over the node's message limit is refused (`table`: the one that makes it so).
fn too_large(table: &str, bytes: usize, limit: usize) -> nearrec::Result<()> {
    if bytes > limit {
        return Err(nearrec::Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!(
                "the answer would be {bytes} bytes, over the node's message limit of {limit}; \
                 send smaller batches"
            ),
        });
    }
    Ok(())
}

/// A failed request of a stream, as its answer.
fn failed(id: u64, status: &Status) -> pb::LookupResponse {
    pb::LookupResponse {
        id,
        error: Some(stream_error(&bounded(status.clone()))),
        ..Default::default()
    }
}
