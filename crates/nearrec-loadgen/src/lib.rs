//! An open-loop load generator for the storage node (`nearrec bench serve`).
//!
//! Requests leave at Poisson arrival times for a fixed offered rate, whatever the answers do:
//! each latency is taken from the request's *intended* send time, so a stall delays — and is
//! charged to — every request scheduled behind it (no coordinated omission). Arrivals are paced
//! on one thread by the kernel's high-resolution sleep (tens of µs late at worst), not by
//! tokio's millisecond timer.
//!
//! What a request is depends on the [`Mode`]: the node pools next to the data (EMB-SSD's
//! design), or returns the distinct rows and the client pools them — with or without a cache
//! of the hottest rows on the client (EMB-SSD's host-caching baseline) — or the same store is
//! called in this process, with no network (the floor), or a Redis server holds each row and
//! the client pools (HugeCTR HPS's distributed tier; [`load_redis`] fills it).
//!
//! [`run`] drives one mode at one offered rate over several connections and returns an
//! [`Outcome`]: each answered request's latency, what was sent, failed or dropped past the
//! in-flight limit, and the message bytes on the wire. The client's cache is a
//! [`CachedTable`] per table: the rows in one block, found by id through an Fx hash map.
//! Bound for Python in `nearrec-bench-py` (`load.rs`); the product does not link it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nearrec::{AsBatch, IndexVec, OwnedBags, OwnedBatch, OwnedLookup, Store, StoreApi};
use nearrec_wire::convert;
use nearrec_wire::v1 as pb;
use nearrec_wire::v1::node_client::NodeClient;
use prost::Message as _;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};
use rustc_hash::FxHashMap;
use tonic::transport::{Channel, Endpoint};

/// Rows a client keeps, by table.
#[derive(Debug, Clone, Default)]
pub struct ClientCache {
    pub tables: HashMap<String, CachedTable>,
}

/// The rows a client keeps of one table, in one block, found by id through a fast hash map (as
/// a client that means to be quick keeps them; a map of boxed rows would make the baseline
/// slower than it need be).
#[derive(Debug, Clone, Default)]
pub struct CachedTable {
    pub dim: usize,
    at: FxHashMap<i64, usize>,
    values: Vec<f32>,
}

impl CachedTable {
    /// `ids[k]`'s row is `values[k * dim..][..dim]`.
    pub fn new(dim: usize, ids: &[i64], values: Vec<f32>) -> Self {
        assert_eq!(ids.len() * dim, values.len(), "a row per id");
        let at = ids
            .iter()
            .enumerate()
            .map(|(k, &id)| (id, k * dim))
            .collect();
        Self { dim, at, values }
    }

    pub fn get(&self, id: i64) -> Option<&[f32]> {
        self.at.get(&id).map(|&k| &self.values[k..k + self.dim])
    }

    pub fn holds(&self, id: i64) -> bool {
        self.at.contains_key(&id)
    }
}

/// How a request is served.
#[derive(Debug, Clone)]
pub enum Mode {
    /// `Lookup`: pooled on the node; only `[batch, Σ dim]` crosses the network.
    Pooled,
    /// `Lookup` with `raw`: each table's distinct rows cross the network; the client pools.
    Raw,
    /// As `Raw`, but rows the client caches are not asked for.
    RawCached(Arc<ClientCache>),
    /// The store in this process: no network; at most as many calls at once as the semaphore
    /// allows (the node's `max_in_flight`), each on a blocking thread of the runtime `Handle`
    /// (as the node runs each on its own: a runtime whose threads sit on other cores than the
    /// load generator's gives the store those cores alone).
    Embedded(
        Arc<Store>,
        Arc<tokio::sync::Semaphore>,
        tokio::runtime::Handle,
    ),
    /// A Redis server holding each row as a value (`TABLE:ID` → little-endian float32): one
    /// pipelined `MGET` per request for every table's distinct ids, the client pools (HugeCTR
    /// HPS's distributed tier). `dims`: each table's width.
    Redis(Arc<HashMap<String, usize>>),
}

/// A connection of the run.
#[derive(Clone)]
enum Connection {
    Node(NodeClient<Channel>),
    Redis(redis::aio::MultiplexedConnection),
}

/// One run's outcome.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Latency of each answered request, µs, from its intended send time.
    pub latencies_us: Vec<f64>,
    pub sent: usize,
    pub failed: usize,
    /// Requests not sent because too many were already in flight (the system fell behind).
    pub dropped: usize,
    /// Message bytes on the wire, both ways (protobuf, without HTTP/2 framing).
    pub wire_bytes: u64,
    /// Samples (bags) answered.
    pub samples: u64,
    /// The first request's pooled output, for checking modes against each other.
    pub first: Option<Vec<f32>>,
    pub seconds: f64,
}

/// The most requests a run keeps in flight; past it, arrivals are dropped and counted (a load
/// past saturation then measures the system's rate without queueing without bound — the
/// node's own queue holds 256 and refuses the rest).
const MAX_IN_FLIGHT: usize = 256;

/// A request's answer: bytes on the wire, samples, the pooled output when asked for.
type Answered = Result<(u64, u64, Option<Vec<f32>>), String>;

/// Runs `batches` (cycled) at `rate` requests per second for `seconds` against `target`
/// (`host:port`, ignored when embedded) with `mode`, over `connections` connections.
#[allow(clippy::too_many_arguments)]
pub fn run(
    target: &str,
    store: &str,
    mode: Mode,
    batches: Arc<Vec<OwnedBatch>>,
    rate: f64,
    seconds: f64,
    connections: usize,
    seed: u64,
) -> Result<Outcome, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let clients = runtime.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..connections.max(1) {
            clients.push(match mode {
                Mode::Embedded(..) => break,
                Mode::Redis(_) => {
                    let client = redis::Client::open(format!("redis://{target}/"))
                        .map_err(|e| e.to_string())?;
                    // no response timeout (redis-rs defaults to 500 ms): a request queued
                    // behind others is timed, not dropped as a failure
                    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
                    Connection::Redis(
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                            .map_err(|e| format!("cannot connect to redis at {target}: {e}"))?,
                    )
                }
                _ => {
                    let channel = Endpoint::from_shared(format!("http://{target}"))
                        .map_err(|e| e.to_string())?
                        .tcp_nodelay(true)
                        .initial_stream_window_size(nearrec_wire::STREAM_WINDOW)
                        .initial_connection_window_size(nearrec_wire::CONNECTION_WINDOW)
                        .max_frame_size(nearrec_wire::MAX_FRAME)
                        .connect()
                        .await
                        .map_err(|e| format!("cannot connect to {target}: {e}"))?;
                    Connection::Node(
                        NodeClient::new(channel)
                            .max_decoding_message_size(256 << 20)
                            .max_encoding_message_size(256 << 20),
                    )
                }
            });
        }
        Ok::<_, String>(clients)
    })?;
    let requests: Arc<Vec<Vec<pb::TableLookup>>> = Arc::new(
        batches
            .iter()
            .map(|b| convert::tables(&b.as_batch()))
            .collect(),
    );
    let n = (rate * seconds).ceil().max(1.0) as usize;
    let exp = Exp::new(rate).map_err(|e| e.to_string())?;
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    // requests leave from this thread, paced by the kernel's high-resolution sleep (tokio's
    // timer ticks in milliseconds)
    let start = Instant::now() + Duration::from_millis(20);
    let mut at = 0.0f64;
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(n);
    let mut dropped = 0;
    for i in 0..n {
        at += exp.sample(&mut rng);
        let due = start + Duration::from_secs_f64(at);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if in_flight.load(std::sync::atomic::Ordering::Relaxed) >= MAX_IN_FLIGHT {
            dropped += 1;
            continue;
        }
        in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let k = i % batches.len();
        let (mode, batches, requests, store) = (
            mode.clone(),
            batches.clone(),
            requests.clone(),
            store.to_owned(),
        );
        let client = clients.get(i % clients.len().max(1)).cloned();
        let counter = in_flight.clone();
        let keep = i == 0;
        tasks.push(runtime.spawn(async move {
            let answer = one(&mode, client, &store, &batches[k], &requests[k], keep).await;
            counter.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            (due, Instant::now(), answer)
        }));
    }
    runtime.block_on(async move {
        let mut out = Outcome {
            sent: tasks.len(),
            dropped,
            ..Outcome::default()
        };
        let mut last = start;
        for t in tasks {
            let (due, done, answer) = t.await.map_err(|e| e.to_string())?;
            last = last.max(done);
            match answer {
                Ok((bytes, samples, first)) => {
                    out.latencies_us.push((done - due).as_secs_f64() * 1e6);
                    out.wire_bytes += bytes;
                    out.samples += samples;
                    if first.is_some() {
                        out.first = first;
                    }
                }
                Err(_) => out.failed += 1,
            }
        }
        out.seconds = (last - start).as_secs_f64();
        Ok(out)
    })
}

async fn one(
    mode: &Mode,
    client: Option<Connection>,
    store: &str,
    batch: &OwnedBatch,
    tables: &[pb::TableLookup],
    keep: bool,
) -> Answered {
    let request = |tables: Vec<pb::TableLookup>, raw: bool| pb::LookupRequest {
        store: store.to_owned(),
        tables,
        raw,
        id: 0,
        at_version: 0,
        expect: Vec::new(),
        out_dtype: convert::out_dtype(batch.out).into(),
    };
    match mode {
        Mode::Embedded(s, slots, runs_on) => {
            let _slot = slots.acquire().await.map_err(|e| e.to_string())?;
            let (s, batch) = (s.clone(), batch.clone());
            let pooled = runs_on
                .spawn_blocking(move || s.lookup(&batch.as_batch()).map(|(p, _)| p))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            Ok((0, pooled.batch as u64, keep.then_some(pooled.values)))
        }
        Mode::Redis(dims) => {
            let Some(Connection::Redis(mut redis)) = client else {
                return Err("no redis connection".into());
            };
            let mut pipe = redis::pipe();
            let mut asked = Vec::with_capacity(batch.tables.len());
            let mut sent = 0u64;
            for t in &batch.tables {
                let mut distinct = ids(t);
                distinct.sort_unstable();
                distinct.dedup();
                let keys: Vec<String> = distinct
                    .iter()
                    .map(|i| format!("{}:{i}", t.table))
                    .collect();
                sent += keys.iter().map(|k| k.len() as u64).sum::<u64>();
                pipe.cmd("MGET").arg(keys);
                asked.push(distinct);
            }
            let values: Vec<Vec<Option<Vec<u8>>>> = pipe
                .query_async(&mut redis)
                .await
                .map_err(|e| e.to_string())?;
            let mut got = 0u64;
            let rows = batch
                .tables
                .iter()
                .zip(asked)
                .zip(values)
                .map(|((t, ids), values)| {
                    let dim = dims.get(&t.table).copied().unwrap_or(0);
                    let mut flat = Vec::with_capacity(ids.len() * dim);
                    for (id, v) in ids.iter().zip(values) {
                        let v = v.ok_or_else(|| format!("redis has no row {}:{id}", t.table))?;
                        got += v.len() as u64;
                        if v.len() != dim * 4 {
                            return Err(format!(
                                "row {}:{id} is {} bytes, not {}",
                                t.table,
                                v.len(),
                                dim * 4
                            ));
                        }
                        flat.extend(
                            v.chunks_exact(4)
                                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                        );
                    }
                    Ok(nearrec::Rows {
                        table: t.table.clone(),
                        dim,
                        ids,
                        values: flat,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            let (pooled, bags) = pool(batch, &rows, None)?;
            Ok((sent + got, bags as u64, keep.then_some(pooled)))
        }
        Mode::Pooled => {
            let (answer, bytes) = lookup_call(client, request(tables.to_vec(), false)).await?;
            let pooled = convert::unpooled(&answer).map_err(|e| e.to_string())?;
            Ok((bytes, pooled.batch as u64, keep.then_some(pooled.values)))
        }
        Mode::Raw | Mode::RawCached(_) => {
            let cache = match mode {
                Mode::RawCached(c) => Some(c.as_ref()),
                _ => None,
            };
            // ask only for the rows the client does not hold
            let asked: Vec<pb::TableLookup> = match cache {
                None => tables.to_vec(),
                Some(c) => batch
                    .tables
                    .iter()
                    .map(|t| {
                        let held = c.tables.get(&t.table);
                        let ids: Vec<i64> = ids(t)
                            .into_iter()
                            .filter(|&i| !held.is_some_and(|h| h.holds(i)))
                            .collect();
                        let n = ids.len() as i64;
                        let one = OwnedBatch::new(vec![OwnedLookup::with_lengths(
                            t.table.clone(),
                            ids,
                            vec![n],
                        )]);
                        convert::tables(&one.as_batch()).remove(0)
                    })
                    .collect(),
            };
            let (answer, bytes) = lookup_call(client, request(asked, true)).await?;
            let rows = convert::unraw(&answer).map_err(|e| e.to_string())?;
            let (pooled, bags) = pool(batch, &rows, cache)?;
            Ok((bytes, bags as u64, keep.then_some(pooled)))
        }
    }
}

/// One `Lookup` on the node: its answer and the message bytes both ways.
async fn lookup_call(
    c: Option<Connection>,
    req: pb::LookupRequest,
) -> Result<(pb::LookupResponse, u64), String> {
    let Some(Connection::Node(mut node)) = c else {
        return Err("no connection to a node".into());
    };
    let sent = req.encoded_len() as u64;
    let answer = node
        .lookup(req)
        .await
        .map_err(|s| s.to_string())?
        .into_inner();
    let got = answer.encoded_len() as u64;
    Ok((answer, sent + got))
}

/// Loads `tables` (name → `[rows, dim]` float32, row-major) into the Redis server at `target`,
/// each row a value `TABLE:ID`, in pipelines of 4,096 rows.
pub fn load_redis(target: &str, tables: &[(String, usize, &[f32])]) -> Result<(), String> {
    let client = redis::Client::open(format!("redis://{target}/")).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        for (name, dim, values) in tables {
            for (start, rows) in values.chunks(dim * 4096).enumerate() {
                let mut pipe = redis::pipe();
                for (k, row) in rows.chunks_exact(*dim).enumerate() {
                    let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
                    pipe.cmd("SET")
                        .arg(format!("{name}:{}", start * 4096 + k))
                        .arg(bytes)
                        .ignore();
                }
                let () = pipe.query_async(&mut c).await.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    })
}

fn ids(t: &OwnedLookup) -> Vec<i64> {
    match &t.indices {
        IndexVec::I64(v) => v.clone(),
        IndexVec::I32(v) => v.iter().map(|&i| i64::from(i)).collect(),
    }
}

/// Sum pooling on the client of a batch given as lengths, from the rows the node sent and the
/// client's cache: `[batch, Σ dim]` and the batch.
fn pool(
    batch: &OwnedBatch,
    rows: &[nearrec::Rows],
    cache: Option<&ClientCache>,
) -> Result<(Vec<f32>, usize), String> {
    let lengths = |t: &OwnedLookup| -> Result<Vec<usize>, String> {
        match &t.bags {
            OwnedBags::Lengths(IndexVec::I64(v)) => Ok(v.iter().map(|&l| l as usize).collect()),
            OwnedBags::Lengths(IndexVec::I32(v)) => Ok(v.iter().map(|&l| l as usize).collect()),
            _ => Err("the load generator's batches give bags as lengths".into()),
        }
    };
    let dims: Vec<usize> = batch
        .tables
        .iter()
        .zip(rows)
        .map(|(t, r)| {
            cache
                .and_then(|c| c.tables.get(&t.table))
                .map_or(r.dim, |h| h.dim)
        })
        .collect();
    let width: usize = dims.iter().sum();
    let bags = batch
        .tables
        .first()
        .map_or(Ok(0), |t| lengths(t).map(|l| l.len()))?;
    let mut out = vec![0f32; bags * width];
    let mut col = 0;
    for ((t, r), &dim) in batch.tables.iter().zip(rows).zip(&dims) {
        let ids = ids(t);
        let held = cache.and_then(|c| c.tables.get(&t.table));
        let mut at = 0;
        for (bag, len) in lengths(t)?.into_iter().enumerate() {
            let dst = &mut out[bag * width + col..][..dim];
            for &id in &ids[at..at + len] {
                let row: &[f32] = match held.and_then(|h| h.get(id)) {
                    Some(row) => row,
                    None => {
                        let k = r
                            .ids
                            .binary_search(&id)
                            .map_err(|_| format!("row {id} of {} was not sent", t.table))?;
                        &r.values[k * dim..][..dim]
                    }
                };
                for (d, v) in dst.iter_mut().zip(row) {
                    *d += v;
                }
            }
            at += len;
        }
        col += dim;
    }
    Ok((out, bags))
}

/// What a batch asks of one table, as the harness builds it.
pub fn lookup(table: &str, ids: Vec<i64>, lengths: Vec<i64>) -> OwnedLookup {
    OwnedLookup {
        table: table.to_owned(),
        indices: IndexVec::I64(ids),
        bags: OwnedBags::Lengths(IndexVec::I64(lengths)),
        per_sample_weights: None,
        mode: nearrec::PoolingMode::Sum,
        padding_idx: None,
    }
}
