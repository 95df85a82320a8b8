//! `nearrec.v1.Node`: each call decoded by `nearrec-wire`, admitted, run on a blocking thread
//! against the facade, and answered. Nothing here decides what a lookup means.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use nearrec::{AsBatch, OwnedBatch, RowWrite, Store, WriteOptions};
use nearrec_wire::arrays::decode;
use nearrec_wire::status::stream_error;
use nearrec_wire::v1 as pb;
use nearrec_wire::{convert, status_of};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::admission::{Admission, deadline};
use crate::config::NodeConfig;
use crate::stores::Stores;

/// What every call of one node shares.
#[derive(Debug)]
pub struct Shared {
    pub stores: Stores,
    pub admission: Admission,
    pub config: NodeConfig,
}

/// The service; clones share one node.
#[derive(Debug, Clone)]
pub struct NodeService(pub Arc<Shared>);

type Answer<T> = Result<Response<T>, Status>;

fn bad(e: nearrec::Error) -> Status {
    status_of(&e)
}

impl NodeService {
    /// Runs `work` once admitted, on a blocking thread; a request whose deadline has passed by
    /// then is answered `DEADLINE_EXCEEDED` without running.
    async fn run<T, F>(&self, deadline: Option<Instant>, work: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce() -> nearrec::Result<T> + Send + 'static,
    {
        let permit = self.0.admission.admit(deadline).await?;
        let shared = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(shared.admission.expire());
            }
            work().map_err(bad)
        })
        .await
        .map_err(|e| Status::internal(format!("a request's task failed: {e}")))?
    }

    /// One lookup request, decoded, admitted and served.
    async fn answer(
        &self,
        req: pb::LookupRequest,
        deadline: Option<Instant>,
    ) -> Result<pb::LookupResponse, Status> {
        let (_, store) = self.0.stores.get(&req.store)?;
        let batch = convert::batch(&req.tables).map_err(bad)?;
        let limit = self.0.config.max_message_bytes;
        let (id, raw) = (req.id, req.raw);
        self.run(deadline, move || lookup(&store, id, raw, &batch, limit))
            .await
    }
}

/// A lookup on the facade: pooled at one version, or the distinct rows.
fn lookup(
    store: &Store,
    id: u64,
    raw: bool,
    batch: &OwnedBatch,
    limit: usize,
) -> nearrec::Result<pb::LookupResponse> {
    let batch = batch.as_batch();
    if raw {
        let (rows, version) = store.lookup_rows(&batch)?;
        let bytes: usize = rows
            .iter()
            .map(|r| r.values.len() * 4 + r.ids.len() * 8)
            .sum();
        too_large(rows.first().map_or("", |r| r.table.as_str()), bytes, limit)?;
        return Ok(convert::raw(id, version, rows));
    }
    // the answer the request declares, refused before anything is prepared
    let mut width = 0usize;
    for t in &batch.tables {
        width += store.table(t.table)?.dim as usize;
    }
    if let Some(t) = batch.tables.iter().rev().max_by_key(|t| t.declared_bags()) {
        let bytes = t.declared_bags().saturating_mul(width).saturating_mul(4);
        too_large(t.table, bytes, limit)?;
    }
    let snapshot = store.snapshot();
    let pooled = store.lookup_at(&batch, &snapshot)?;
    Ok(convert::pooled(id, snapshot.version(), pooled))
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

/// How many requests of one stream run at once (batch i + 1 while batch i is answered).
const STREAM_DEPTH: usize = 4;

#[tonic::async_trait]
impl pb::node_server::Node for NodeService {
    async fn lookup(&self, request: Request<pb::LookupRequest>) -> Answer<pb::LookupResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        Ok(Response::new(
            self.answer(request.into_inner(), deadline).await?,
        ))
    }

    type LookupStreamStream =
        Pin<Box<dyn Stream<Item = Result<pb::LookupResponse, Status>> + Send + 'static>>;

    async fn lookup_stream(
        &self,
        request: Request<Streaming<pb::LookupRequest>>,
    ) -> Answer<Self::LookupStreamStream> {
        // the stream's deadline bounds every request on it
        let deadline = deadline(request.metadata(), Instant::now());
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_DEPTH);
        let node = self.clone();
        tokio::spawn(async move {
            let mut pending = VecDeque::new();
            let mut open = true;
            while open || !pending.is_empty() {
                tokio::select! {
                    biased;
                    next = incoming.message(), if open && pending.len() < STREAM_DEPTH => {
                        match next {
                            Ok(Some(req)) => {
                                let node = node.clone();
                                let id = req.id;
                                pending.push_back(tokio::spawn(async move {
                                    node.answer(req, deadline).await.unwrap_or_else(|s| {
                                        failed(id, &s)
                                    })
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
                        let answer = done.unwrap_or_else(|e| failed(0, &Status::internal(e.to_string())));
                        if tx.send(Ok(answer)).await.is_err() {
                            return; // the client went away
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn infer(&self, request: Request<pb::InferRequest>) -> Answer<pb::InferResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let req = request.into_inner();
        let (_, store) = self.0.stores.get(&req.store)?;
        let batch = convert::batch(&req.tables).map_err(bad)?;
        let dense: Vec<f32> = decode(&req.dense, "", "dense").map_err(bad)?;
        let out = self
            .run(deadline, move || store.infer(&dense, &batch.as_batch()))
            .await?;
        Ok(Response::new(pb::InferResponse {
            batch: out.batch as u64,
            width: out.width as u32,
            outputs: nearrec_wire::arrays::encode(out.outputs),
        }))
    }

    async fn write(&self, request: Request<pb::WriteRequest>) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let req = request.into_inner();
        let (_, store) = self.0.stores.get(&req.store)?;
        let mut writes = Vec::with_capacity(req.writes.len());
        for w in &req.writes {
            let ids: Vec<i64> = decode(&w.ids, &w.table, "ids").map_err(bad)?;
            let rows: Vec<f32> = decode(&w.rows, &w.table, "rows").map_err(bad)?;
            writes.push((w.table.clone(), ids, rows));
        }
        let options = WriteOptions {
            allow_nonfinite: req.allow_nonfinite,
        };
        let version = self
            .run(deadline, move || {
                let calls: Vec<RowWrite<'_>> = writes
                    .iter()
                    .map(|(table, ids, rows)| RowWrite {
                        table,
                        ids,
                        values: Some(rows),
                    })
                    .collect();
                store.write_many(&calls, options)
            })
            .await?;
        Ok(Response::new(pb::WriteResponse { version }))
    }

    async fn remove(&self, request: Request<pb::RemoveRequest>) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let req = request.into_inner();
        let (_, store) = self.0.stores.get(&req.store)?;
        let ids: Vec<i64> = decode(&req.ids, &req.table, "ids").map_err(bad)?;
        let version = self
            .run(deadline, move || store.remove(&req.table, &ids))
            .await?;
        Ok(Response::new(pb::WriteResponse { version }))
    }

    async fn create_table(
        &self,
        request: Request<pb::CreateTableRequest>,
    ) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let req = request.into_inner();
        let (_, store) = self.0.stores.get(&req.store)?;
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
        let version = self
            .run(deadline, move || {
                store.create_table(&req.name, req.rows, req.dim, dtype, init)
            })
            .await?;
        Ok(Response::new(pb::WriteResponse { version }))
    }

    async fn drop_table(
        &self,
        request: Request<pb::DropTableRequest>,
    ) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let req = request.into_inner();
        let (_, store) = self.0.stores.get(&req.store)?;
        let version = self
            .run(deadline, move || store.drop_table(&req.name))
            .await?;
        Ok(Response::new(pb::WriteResponse { version }))
    }

    async fn swap(&self, request: Request<pb::SwapRequest>) -> Answer<pb::SwapResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let req = request.into_inner();
        let (_, store) = self.0.stores.get(&req.store)?;
        let version = self
            .run(deadline, move || store.swap(&req.path, req.warm))
            .await?;
        Ok(Response::new(pb::SwapResponse { version }))
    }

    async fn info(&self, request: Request<pb::InfoRequest>) -> Answer<pb::InfoResponse> {
        let req = request.into_inner();
        let (name, store) = self.0.stores.get(&req.store)?;
        let name = name.to_owned();
        let stores = self.0.stores.names().map(str::to_owned).collect();
        let manifest = store.manifest();
        Ok(Response::new(pb::InfoResponse {
            store: name,
            tables: manifest
                .tables
                .iter()
                .map(|t| pb::TableInfo {
                    name: t.name.clone(),
                    rows: t.rows,
                    dim: t.dim,
                    dtype: t.dtype.name().to_owned(),
                })
                .collect(),
            version: store.version(),
            tier: store.tier().name().to_owned(),
            writable: store.writable(),
            model: store.model().is_ok(),
            stores,
        }))
    }

    async fn stats(&self, request: Request<pb::StatsRequest>) -> Answer<pb::StatsResponse> {
        let req = request.into_inner();
        let (_, store) = self.0.stores.get(&req.store)?;
        let stats = store.stats();
        let mut values: std::collections::HashMap<String, f64> = stats
            .as_ref()
            .map(|s| s.values.iter().cloned().collect())
            .unwrap_or_default();
        values.extend(
            store
                .live_stats()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
        Ok(Response::new(pb::StatsResponse {
            values,
            device: stats.map_or("dram", |s| s.device).to_owned(),
        }))
    }
}

/// A failed request of a stream, as its answer.
fn failed(id: u64, status: &Status) -> pb::LookupResponse {
    pb::LookupResponse {
        id,
        error: Some(stream_error(status)),
        ..Default::default()
    }
}
