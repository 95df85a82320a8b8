//! `nearrec.v1.Node`: each call decoded by `nearrec-wire`, admitted, run against the store's
//! contract ([`StoreApi`]: an embedded store, or any other implementation) — on a blocking
//! thread, or on the async worker itself for a lookup that never waits on a device
//! ([`crate::stores::inline`]) — and answered. Nothing here decides what a lookup means.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nearrec::{
    AsBatch, Decision, NewTable, OwnedBatch, RowWrite, Stages, StoreApi, SwapTo, WriteOptions,
};
use nearrec_wire::arrays::decode;
use nearrec_wire::status::{bounded, stream_error};
use nearrec_wire::v1 as pb;
use nearrec_wire::{SHARD_HEADER, convert, parse_shard_header, status_of};
use prost::Message as _;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::acl::{Acl, Permission, Principal};
use crate::admission::{Held, Slot, deadline};
use crate::audit::{Audit, Phase};
use crate::conns::ConnInfo;
use crate::fair::{self, Ticket};
use crate::limits::Entered;
use crate::node::Shared;
use crate::send::{Answered, Hold};
use crate::stores::{inline, pooled};
use crate::swap;

/// The caller of one call: its principal (`None`: anyone, when the node has no ACL), the
/// shard it means the store to be, when a router sent [`SHARD_HEADER`], and the call's place
/// in its principal's share of the node (`crate::limits`), held while the call runs.
#[derive(Debug, Clone)]
struct Caller {
    principal: Option<Arc<Principal>>,
    shard: Option<(String, usize)>,
    _entered: Option<Arc<Entered>>,
    /// Whom its work is charged to in the node's fair queues (`crate::fair`): the principal,
    /// without an ACL the client's address; and its weight.
    share: (Arc<str>, f64),
}

impl Caller {
    /// Whether the caller may know that store `name` exists: it holds some grant on it.
    fn sees(&self, name: &str) -> bool {
        (self.principal.as_ref()).is_none_or(|p| p.allow_any(name).is_ok())
    }

    /// The principal's name, if the node has an ACL.
    fn who(&self) -> Option<String> {
        self.principal.as_ref().map(|p| p.name.clone())
    }

    /// Its request's ticket in the node's fair queues: a request of `ids` ids (or rows).
    fn ticket(&self, ids: u64) -> Ticket {
        Ticket::new(self.share.0.clone(), self.share.1, fair::cost(ids))
    }
}

/// The shard a call's [`SHARD_HEADER`] names, if it has one; `INVALID_ARGUMENT` if it is not
/// `PLAN/SHARD`.
fn meant_shard(metadata: &MetadataMap) -> Result<Option<(String, usize)>, Status> {
    let Some(value) = metadata.get(SHARD_HEADER) else {
        return Ok(None);
    };
    let parsed = value.to_str().ok().and_then(parse_shard_header);
    match parsed {
        Some((plan, shard)) => Ok(Some((plan.to_owned(), shard))),
        None => Err(Status::invalid_argument(format!(
            "{SHARD_HEADER} must be PLAN/SHARD, not {value:?}"
        ))),
    }
}

/// How a call runs once admitted ([`NodeService::run`]).
struct How {
    /// Whose it is and what it costs, in the fair queues.
    ticket: Ticket,
    /// On the task that decoded it (a small DRAM-resident lookup), else a blocking thread.
    inline: bool,
    /// It takes a CPU turn too: DRAM-resident work, bound by the cores, not a device.
    cpu: bool,
}

impl How {
    fn blocking(ticket: Ticket, cpu: bool) -> Self {
        Self {
            ticket,
            inline: false,
            cpu,
        }
    }
}

/// Calls whose time is their work, never logged as slow requests.
const LONG_BY_NATURE: [&str; 2] = ["Swap", "Compact"];

/// What a call did, as its audit line says it, when the request alone does not say (a swap's
/// resolved directory): an extension of its answer.
#[derive(Debug, Clone)]
struct Audited(String);

/// What a call's request says of it before it runs: its size and deadline, and for the
/// access and slow-request lines its store, tables, rows and token (kept to name the
/// principal, never logged).
#[derive(Debug, Default, Clone)]
struct Seen {
    bytes: usize,
    deadline: Option<Instant>,
    store: String,
    /// Each table the request names and its rows (ids looked up or written).
    tables: Vec<(String, u64)>,
    auth: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// A transaction's step, or what a swap serves (the audit log's `what`).
    what: String,
    /// The client's address.
    peer: Option<std::net::SocketAddr>,
}

impl Seen {
    fn of<M: prost::Message + Summary>(request: &Request<M>) -> Self {
        let (store, tables) = request.get_ref().summary();
        let peer = request.extensions().get::<ConnInfo>();
        Self {
            bytes: request.get_ref().encoded_len(),
            deadline: deadline(request.metadata(), Instant::now()),
            store: store.to_owned(),
            tables,
            auth: request.metadata().get("authorization").cloned(),
            what: request.get_ref().what(),
            peer: peer.and_then(|c| c.tcp.remote_addr()),
        }
    }
}

/// What an access line and the per-table metrics say of a request: its store, and each table
/// it names with its rows (ids looked up or written).
trait Summary {
    fn summary(&self) -> (&str, Vec<(String, u64)>);

    /// What the call does beyond its name, for the audit log.
    fn what(&self) -> String {
        String::new()
    }
}

/// Ids in an int64 array.
fn ids(bytes: &[u8]) -> u64 {
    (bytes.len() / 8) as u64
}

/// Ids in a lookup's array of its index type (int32 or int64).
fn lookup_ids(t: &pb::TableLookup) -> u64 {
    let width = if t.index_type == pb::IndexType::Int32 as i32 {
        4
    } else {
        8
    };
    (t.ids.len() / width) as u64
}

impl Summary for pb::LookupRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let tables = self.tables.iter().map(|t| (t.table.clone(), lookup_ids(t)));
        (&self.store, tables.collect())
    }
}

impl Summary for pb::InferRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let tables = self.tables.iter().map(|t| (t.table.clone(), lookup_ids(t)));
        (&self.store, tables.collect())
    }
}

impl Summary for pb::WriteRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let tables = self.writes.iter().map(|t| (t.table.clone(), ids(&t.ids)));
        (&self.store, tables.collect())
    }
}

impl Summary for pb::TransactionRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let tables = self.writes.iter().map(|t| (t.table.clone(), ids(&t.ids)));
        (&self.store, tables.collect())
    }

    fn what(&self) -> String {
        let step = pb::transaction_request::Step::try_from(self.step);
        step.map_or_else(
            |_| format!("step {}", self.step),
            |s| s.as_str_name().trim_start_matches("STEP_").to_lowercase(),
        )
    }
}

impl Summary for pb::RemoveRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        (&self.store, vec![(self.table.clone(), ids(&self.ids))])
    }
}

impl Summary for pb::RowDigestsRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        (&self.store, vec![(self.table.clone(), self.count)])
    }
}

impl Summary for pb::CreateTableRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        (&self.store, vec![(self.name.clone(), self.rows)])
    }
}

impl Summary for pb::DropTableRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        (&self.store, vec![(self.name.clone(), 0)])
    }
}

/// Calls that name a store and nothing more.
macro_rules! store_only {
    ($($t:ty),*) => {$(
        impl Summary for $t {
            fn summary(&self) -> (&str, Vec<(String, u64)>) {
                (&self.store, Vec::new())
            }
        }
    )*};
}

store_only!(
    pb::UpdateModelRequest,
    pb::InfoRequest,
    pb::StatsRequest,
    pb::CompactRequest
);

impl Summary for pb::SwapRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        (&self.store, Vec::new())
    }

    fn what(&self) -> String {
        let to = if self.rollback {
            "rollback".to_owned()
        } else if self.version > 0 {
            format!("version {}", self.version)
        } else if !self.path.is_empty() {
            format!("path {}", self.path)
        } else {
            String::new()
        };
        let more = [
            (self.stage, "stage"),
            (self.release, "release"),
            (self.force, "force"),
        ];
        let flags = more.iter().filter(|(on, _)| *on).map(|(_, n)| *n);
        std::iter::once(to)
            .filter(|t| !t.is_empty())
            .chain(flags.map(str::to_owned))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The service; clones share one node.
#[derive(Debug, Clone)]
pub struct NodeService(pub Arc<Shared>);

type Answer<T> = Result<Response<T>, Status>;

/// A stream's answers.
pub type Answers = Pin<Box<dyn Stream<Item = Result<pb::LookupResponse, Status>> + Send + 'static>>;

fn bad(e: nearrec::Error) -> Status {
    status_of(&e)
}

impl NodeService {
    /// The caller a call's token names (`UNAUTHENTICATED`, counted and logged without the
    /// token, when the node has an ACL and the token is missing or unknown), holding a place in
    /// its principal's share of the node for as long as it is kept (`RESOURCE_EXHAUSTED` when
    /// the principal has its most calls open or connections held, `crate::limits`).
    fn caller<T>(&self, request: &Request<T>, call: &'static str) -> Result<Caller, Status> {
        let mut caller = self.authenticate(request.metadata(), call)?;
        let conn = request.extensions().get::<ConnInfo>();
        let who = match (&caller.principal, conn) {
            (Some(p), _) => p.name.clone(),
            (None, Some(c)) => c.tcp.remote_addr().map_or_else(
                || "a client of unknown address".to_owned(),
                |a| format!("the client at {}", a.ip()),
            ),
            (None, None) => "a client of unknown address".to_owned(),
        };
        let entered = (self.0.quotas).enter(&who, conn.map(|c| &c.mark))?;
        caller._entered = Some(Arc::new(entered));
        caller.share.0 = who.into();
        Ok(caller)
    }

    /// The principal a call's token names, and the shard it means, without a place.
    fn authenticate(&self, metadata: &MetadataMap, call: &'static str) -> Result<Caller, Status> {
        let shard = meant_shard(metadata)?;
        let caller = |principal: Option<Arc<Principal>>| Caller {
            share: match &principal {
                Some(p) => (p.name.as_str().into(), p.weight),
                None => ("-".into(), 1.0),
            },
            principal,
            shard,
            _entered: None,
        };
        let Some(acl) = self.0.acl.load_full() else {
            return Ok(caller(None));
        };
        match acl.authenticate(metadata) {
            Ok(p) => Ok(caller(Some(p.clone()))),
            Err(s) => {
                self.0.unauthenticated.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(call, "refused: {}", s.message());
                Err(s)
            }
        }
    }

    /// The caller of a stream's next request: the stream's token checked against the ACL in
    /// force now, so that a reload (SIGHUP) that revokes the token or its grants takes effect
    /// on streams already open. `last` keeps the ACL it was checked against, so that the token
    /// is hashed again only when the ACL changed.
    fn stream_caller(
        &self,
        metadata: &MetadataMap,
        last: &mut Option<(Arc<Acl>, Caller)>,
    ) -> Result<Caller, Status> {
        let Some(acl) = self.0.acl.load_full() else {
            return self.authenticate(metadata, "LookupStream");
        };
        if let Some((seen, caller)) = last.as_ref()
            && Arc::ptr_eq(seen, &acl)
        {
            return Ok(caller.clone());
        }
        let caller = self.authenticate(metadata, "LookupStream")?;
        *last = Some((acl, caller.clone()));
        Ok(caller)
    }

    /// The store a call names; `NOT_FOUND` lists only the stores the caller holds a grant on.
    /// A call meant for a shard the store is not is refused `UNAVAILABLE` ([`SHARD_HEADER`]):
    /// to the router that sent it, the replica it meant is not at this address.
    fn store(&self, caller: &Caller, name: &str) -> Result<(&str, Arc<dyn StoreApi>), Status> {
        let (name, store) = self.named(caller, name)?;
        let Some((plan, shard)) = &caller.shard else {
            return Ok((name, store));
        };
        let is = store.shard().map_err(bad)?;
        if let Some(tag) = &is
            && (tag.plan.as_str(), tag.shard) == (plan.as_str(), *shard)
        {
            return Ok((name, store));
        }
        self.0.wrong_shard.fetch_add(1, Ordering::Relaxed);
        let is = match is {
            Some(tag) => format!("is shard {} of plan {}", tag.shard, tag.plan),
            None => "is no shard of any plan".into(),
        };
        Err(bad(nearrec::Error::Remote {
            kind: nearrec::ErrorKind::Unavailable,
            code: tonic::Code::Unavailable as i32,
            message: format!(
                "the call was meant for shard {shard} of plan {plan}; store {name:?} on this \
                 node {is} (another node at the replica's address?)"
            ),
            table: None,
            position: None,
        }))
    }

    /// [`NodeService::store`] whatever shard the call means it to be (`Info`: how a router
    /// learns what a node serves).
    fn named(&self, caller: &Caller, name: &str) -> Result<(&str, Arc<dyn StoreApi>), Status> {
        self.0.stores.get(name, |n| caller.sees(n))
    }

    /// `check` on the caller's principal (nothing without an ACL); a refusal is counted and
    /// logged.
    fn allow(
        &self,
        caller: &Caller,
        call: &'static str,
        check: impl FnOnce(&Principal) -> Result<(), Status>,
    ) -> Result<(), Status> {
        let Some(p) = &caller.principal else {
            return Ok(());
        };
        check(p).inspect_err(|s| {
            self.0.denied.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(call, principal = %p.name, "refused: {}", s.message());
        })
    }

    /// Each table `permission` on `store`.
    fn allow_tables<'a>(
        &self,
        caller: &Caller,
        call: &'static str,
        permission: Permission,
        store: &str,
        tables: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), Status> {
        self.allow(caller, call, |p| {
            tables
                .into_iter()
                .try_for_each(|t| p.allow(permission, store, t))
        })
    }

    /// The call's access line, if sampled, and its slow-request line, if it was slow.
    fn log_call(&self, call: &'static str, code: tonic::Code, seconds: f64, seen: &Seen) {
        let config = &self.0.config;
        // a swap or a compaction takes as long as its work (a paced warm-up, a rewrite): not a
        // slow request; its own lines say how long it took
        let slow = config.slow_request_ms > 0
            && seconds * 1e3 >= config.slow_request_ms as f64
            && !LONG_BY_NATURE.contains(&call);
        let every = config.access_log_every;
        let sampled = every > 0
            && self
                .0
                .calls
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(every);
        if !slow && !sampled {
            return;
        }
        let principal = self.principal(seen.auth.as_ref());
        let store = self.served_name(seen);
        let names: Vec<&str> = seen.tables.iter().map(|(t, _)| t.as_str()).collect();
        let (tables, rows) = (
            names.join(","),
            seen.tables.iter().map(|(_, n)| n).sum::<u64>(),
        );
        let status = format!("{code:?}");
        let ms = seconds * 1e3;
        if slow {
            tracing::warn!(
                target: "nearrec_server::slow",
                call, principal, store, tables, rows, status, ms, "slow request"
            );
        } else {
            tracing::info!(
                target: "nearrec_server::access",
                call, principal, store, tables, rows, status, ms, "request"
            );
        }
    }

    /// What the store served as `name` may swap to (`crate::swap`): its swap root, its
    /// directory, and the directories of every other store the node serves.
    fn reach(&self, name: &str, store: &dyn StoreApi) -> swap::Reach {
        let config = &self.0.config;
        let root = config.swap_roots.get(name).or(config.swap_root.as_ref());
        let others = (self.0.stores.iter())
            .filter(|(n, _)| *n != name)
            .filter_map(|(n, s)| Some((n.to_owned(), s.location()?)))
            .collect();
        swap::Reach {
            root: root.cloned(),
            served: store.location(),
            others,
        }
    }

    /// The store a call named, as served: a request's empty name is the node's only store.
    fn served_name(&self, seen: &Seen) -> String {
        match self.0.stores.get(&seen.store, |_| true) {
            Ok((name, _)) => name.to_owned(),
            Err(_) => seen.store.clone(),
        }
    }

    /// The call's audit line, if the node keeps an audit log and the call belongs in it.
    fn audit(&self, call: &'static str, code: tonic::Code, seen: &Seen, id: u64) {
        let Some(audit) = &self.0.audit else {
            return;
        };
        if Audit::wants(call, &seen.what, code) {
            // fails open: a lost outcome line is counted, and the call has happened
            let _ = self.audit_line(audit, id, Phase::Outcome, call, format!("{code:?}"), seen);
        }
    }

    /// With `audit_required`, a change's attempt line, written before it runs: `UNAVAILABLE`
    /// (and nothing of the call run) when it cannot be written.
    fn attempt(&self, call: &'static str, seen: &Seen, id: u64) -> Result<(), Status> {
        let Some(audit) = &self.0.audit else {
            return Ok(());
        };
        if !audit.required || !Audit::changes(call, &seen.what) {
            return Ok(());
        }
        self.audit_line(audit, id, Phase::Attempt, call, String::new(), seen)
            .map_err(|e| {
                Status::unavailable(format!(
                    "{e}; the node refuses changes it cannot audit (audit_required)"
                ))
            })
    }

    fn audit_line(
        &self,
        audit: &Audit,
        id: u64,
        phase: Phase,
        call: &'static str,
        status: String,
        seen: &Seen,
    ) -> Result<(), String> {
        audit.record(crate::audit::Line {
            unix_ms: 0,
            id,
            phase,
            call,
            what: &seen.what,
            principal: &self.principal(seen.auth.as_ref()),
            peer: seen.peer,
            store: &self.served_name(seen),
            tables: &seen.tables,
            status,
        })
    }

    /// The principal a token names, for a log line (`-` without an ACL, `?` for a token the ACL
    /// does not know); never the token.
    fn principal(
        &self,
        auth: Option<&tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) -> String {
        let Some(acl) = self.0.acl.load_full() else {
            return "-".into();
        };
        let mut metadata = MetadataMap::new();
        if let Some(v) = auth {
            metadata.insert("authorization", v.clone());
        }
        acl.authenticate(&metadata)
            .map_or_else(|_| "?".into(), |p| p.name.clone())
    }

    /// A call's answer, counted: the status its client saw, total seconds, bytes in and out;
    /// marked [`Answered`] for its `send` stage (`crate::send`) unless it is a stream's. An
    /// answer ready only after the call's deadline counts as `DEADLINE_EXCEEDED`: that is what
    /// its client saw, its own timer having fired first.
    async fn observed<T>(
        &self,
        call: &'static str,
        mut received: Seen,
        sent: impl FnOnce(&T) -> usize,
        answer: impl Future<Output = Answer<T>>,
    ) -> Answer<T> {
        let start = Instant::now();
        let id = self.0.audit.as_ref().map_or(0, Audit::next_id);
        let mut answer = match self.attempt(call, &received, id) {
            Ok(()) => answer.await.map_err(bounded),
            Err(refused) => Err(refused), // `answer` never runs
        };
        let (mut code, bytes) = match &answer {
            Ok(r) => (tonic::Code::Ok, sent(r.get_ref())),
            Err(s) => (s.code(), 0),
        };
        if code == tonic::Code::Ok && received.deadline.is_some_and(|d| Instant::now() > d) {
            code = tonic::Code::DeadlineExceeded;
        }
        let seconds = start.elapsed().as_secs_f64();
        self.0
            .metrics
            .call(call, code, seconds, received.bytes, bytes);
        // an inference's lookups name the model's inputs (features), not always tables
        if code == tonic::Code::Ok && call == "Lookup" {
            let store = match received.store.as_str() {
                "" => self.0.stores.names().next().unwrap_or_default(),
                named => named,
            };
            for (table, rows) in &received.tables {
                self.0.metrics.table(store, table, *rows);
            }
        }
        if let Ok(r) = &answer
            && let Some(Audited(what)) = r.extensions().get()
        {
            received.what.clone_from(what);
        }
        self.log_call(call, code, seconds, &received);
        self.audit(call, code, &received, id);
        if let Ok(r) = &mut answer
            && call != "LookupStream"
        {
            r.extensions_mut().insert(Answered {
                call,
                at: Instant::now(),
            });
        }
        answer
    }

    /// Runs `work` once admitted — on this task when `inline` (a DRAM-resident lookup:
    /// [`crate::stores::inline`]), else on a blocking thread; a request whose deadline has passed
    /// by then is answered `DEADLINE_EXCEEDED` without running. The wait and the work are timed
    /// as `call`'s `queue` and `engine` stages. Returns the answer with the request's place in
    /// the node, which its caller keeps until the answer is sent.
    async fn run<T, F>(
        &self,
        call: &'static str,
        deadline: Option<Instant>,
        how: How,
        work: F,
    ) -> Result<(T, Slot), Status>
    where
        T: Send + 'static,
        F: FnOnce() -> nearrec::Result<T> + Send + 'static,
    {
        let queued = Instant::now();
        let permit = (self.0.admission)
            .admit(deadline, &how.ticket, how.cpu)
            .await?;
        let inline = how.inline;
        self.0
            .metrics
            .stage(call, "queue", queued.elapsed().as_secs_f64());
        let shared = self.0.clone();
        let job = move || {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(shared.admission.expire());
            }
            let start = Instant::now();
            let answer = work().map_err(bad);
            shared
                .metrics
                .stage(call, "engine", start.elapsed().as_secs_f64());
            // the engine slot goes back now; the place in the node stays until the answer has
            // left (`crate::send`)
            answer.map(|a| (a, permit.ran()))
        };
        if inline {
            return job();
        }
        tokio::task::spawn_blocking(job)
            .await
            .map_err(|e| Status::internal(format!("a request's task failed: {e}")))?
    }

    /// `batch` if it fits the node's limits on one request (`crate::limits`), counted if not.
    fn fits(&self, batch: nearrec::Batch<'_>) -> Result<(), Status> {
        let tables = (batch.tables.iter()).map(|t| (t.table, t.declared_bags(), t.indices.len()));
        self.shaped(self.0.config.shape().check(tables))
    }

    /// [`NodeService::fits`] of a write: its tables and rows.
    fn fits_writes(&self, writes: &[convert::OwnedWrite]) -> Result<(), Status> {
        let tables = writes.iter().map(|(t, ids, _)| (t.as_str(), 0, ids.len()));
        self.shaped(self.0.config.shape().check(tables))
    }

    fn shaped(&self, checked: nearrec::Result<()>) -> Result<(), Status> {
        checked.map_err(|e| {
            self.0.misshapen.fetch_add(1, Ordering::Relaxed);
            bad(e)
        })
    }

    /// One lookup request, decoded, admitted and served; its answer comes with what it holds
    /// until sent: its place in the node, its bytes reserved from the node's budget and from
    /// `conn`, its connection's.
    async fn answer(
        &self,
        call: &'static str,
        caller: &Caller,
        req: pb::LookupRequest,
        deadline: Option<Instant>,
        conn: Option<&Arc<Semaphore>>,
    ) -> Result<(pb::LookupResponse, Held), Status> {
        let (name, store) = self.store(caller, &req.store)?;
        let tables = req.tables.iter().map(|t| t.table.as_str());
        self.allow_tables(caller, call, Permission::Read, name, tables)?;
        let batch = convert::batch(&req.tables).map_err(bad)?;
        self.fits(batch.as_batch())?;
        let limit = self.0.config.max_message_bytes;
        let (id, raw) = (req.id, req.raw);
        let at = (req.at_version > 0).then_some(req.at_version);
        let (lookups, bags) = {
            let view = batch.as_batch();
            let lookups: usize = view.tables.iter().map(|t| t.indices.len()).sum();
            (lookups, view.tables.iter().map(|t| t.declared_bags()).max())
        };
        let bytes = answer_bytes(&*store, &batch.as_batch(), raw, limit).map_err(bad)?;
        let mut held = Held {
            slot: None,
            bytes: Some(self.0.admission.reserve(bytes, conn)?),
        };
        let inline = inline(&*store, lookups);
        // small lookups that read a device coalesce (on DRAM-resident tables the transport,
        // not the engine, is what a request costs: they run at once)
        if !raw && !store.resident() {
            let coalescer = &self.0.coalescers[name];
            if let Some(bags) = bags.filter(|&b| coalescer.takes(b)) {
                let (pooled, version) = coalescer.lookup(call, (batch, at), bags, deadline).await?;
                return Ok((convert::pooled(id, version, pooled), held));
            }
        }
        let how = How {
            ticket: caller.ticket(lookups as u64),
            inline,
            cpu: store.resident() && !inline,
        };
        let ((answer, stages), slot) = self
            .run(call, deadline, how, move || {
                lookup(&*store, id, (raw, at), &batch, limit)
            })
            .await?;
        if let Some(stages) = stages {
            self.0.metrics.stages(call, &stages);
        }
        held.slot = Some(slot);
        Ok((answer, held))
    }
}

/// A lookup on the facade: pooled at one version, with where its time went, or the distinct
/// rows when `raw`; as version `at` of the store's repository answers it, when one is given.
fn lookup(
    store: &dyn StoreApi,
    id: u64,
    (raw, at): (bool, Option<u64>),
    batch: &OwnedBatch,
    limit: usize,
) -> nearrec::Result<(pb::LookupResponse, Option<Stages>)> {
    let batch = batch.as_batch();
    if raw {
        let (rows, version) = match at {
            Some(v) => store.lookup_rows_version(&batch, v)?,
            None => store.lookup_rows(&batch)?,
        };
        let bytes: usize = rows
            .iter()
            .map(|r| r.values.len() * 4 + r.ids.len() * 8)
            .sum();
        too_large(rows.first().map_or("", |r| r.table.as_str()), bytes, limit)?;
        return Ok((convert::raw(id, version, rows), None));
    }
    let (pooled, read) = pooled(store, &batch, at)?;
    Ok((convert::pooled(id, read.version, pooled), Some(read.stages)))
}

/// The bytes of the answer `batch` declares — pooled, or at most its distinct rows with their
/// ids when `raw` — refused before anything is prepared when a pooled one would be over the
/// message limit (a raw one is checked once its distinct rows are known).
fn answer_bytes(
    store: &dyn StoreApi,
    batch: &nearrec::Batch<'_>,
    raw: bool,
    limit: usize,
) -> nearrec::Result<usize> {
    let (mut width, mut rows) = (0usize, 0usize);
    for t in &batch.tables {
        let dim = store.table(t.table)?.dim as usize;
        width += dim;
        rows = rows.saturating_add(t.indices.len().saturating_mul(dim * 4 + 8));
    }
    if raw {
        return Ok(rows.min(limit));
    }
    let Some(t) = batch.tables.iter().rev().max_by_key(|t| t.declared_bags()) else {
        return Ok(0);
    };
    let bytes = t.declared_bags().saturating_mul(width).saturating_mul(4);
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

/// How many requests of one stream run at once (batch i + 1 while batch i is answered).
const STREAM_DEPTH: usize = 4;

/// The calls themselves; the trait's impl below wraps each in [`NodeService::observed`].
impl NodeService {
    async fn call_lookup(&self, request: Request<pb::LookupRequest>) -> Answer<pb::LookupResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "Lookup")?;
        let conn = conn_budget(&request);
        let (answer, held) = self
            .answer(
                "Lookup",
                &caller,
                request.into_inner(),
                deadline,
                conn.as_ref(),
            )
            .await?;
        Ok(holding(answer, held))
    }

    async fn call_lookup_stream(
        &self,
        request: Request<Streaming<pb::LookupRequest>>,
    ) -> Answer<Answers> {
        // the stream's deadline bounds every request on it
        let deadline = deadline(request.metadata(), Instant::now());
        let metadata = request.metadata().clone();
        let mut last = None;
        // the stream is one call of its principal's for as long as it is open
        let opened = self.caller(&request, "LookupStream")?;
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
                                let node = node.clone();
                                let conn = conn.clone();
                                let id = req.id;
                                pending.push_back(tokio::spawn(async move {
                                    let start = Instant::now();
                                    let answer = node.answer("LookupStream", &caller, req, deadline, conn.as_ref()).await;
                                    let code = answer.as_ref().map_or_else(|s| s.code(), |_| tonic::Code::Ok);
                                    let sent = answer.as_ref().map_or(0, |(a, _)| a.encoded_len());
                                    node.0.metrics.call("LookupStream", code, start.elapsed().as_secs_f64(), 0, sent);
                                    answer.unwrap_or_else(|s| (failed(id, &s), Held::default()))
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

    async fn call_infer(&self, request: Request<pb::InferRequest>) -> Answer<pb::InferResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "Infer")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        let tables = req.tables.iter().map(|t| t.table.as_str());
        self.allow_tables(&caller, "Infer", Permission::Read, name, tables)?;
        let batch = convert::batch(&req.tables).map_err(bad)?;
        self.fits(batch.as_batch())?;
        let dense: Vec<f32> = decode(&req.dense, "", "dense").map_err(bad)?;
        let ids: usize = (batch.as_batch().tables.iter())
            .map(|t| t.indices.len())
            .sum();
        let how = How::blocking(caller.ticket(ids as u64), store.resident());
        let (out, slot) = self
            .run("Infer", deadline, how, move || {
                store.infer(&dense, &batch.as_batch())
            })
            .await?;
        let metrics = &self.0.metrics;
        metrics.stages("Infer", &out.times.stages);
        metrics.stage("Infer", "infer", out.times.finish.as_secs_f64());
        let answer = pb::InferResponse {
            batch: out.batch as u64,
            width: out.width as u32,
            outputs: nearrec_wire::arrays::encode(out.outputs),
        };
        Ok(holding(answer, Held::from(slot)))
    }

    async fn call_write(&self, request: Request<pb::WriteRequest>) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "Write")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        let tables = req.writes.iter().map(|w| w.table.as_str());
        self.allow_tables(&caller, "Write", Permission::Write, name, tables)?;
        let writes = convert::unwrites(&req.writes).map_err(bad)?;
        self.fits_writes(&writes)?;
        let options = WriteOptions {
            allow_nonfinite: req.allow_nonfinite,
        };
        let rows = writes.iter().map(|(_, ids, _)| ids.len() as u64).sum();
        let how = How::blocking(caller.ticket(rows), false);
        let (version, slot) = self
            .run("Write", deadline, how, move || {
                store.write_many(&convert::row_writes(&writes), options)
            })
            .await?;
        Ok(holding(pb::WriteResponse { version }, Held::from(slot)))
    }

    async fn call_update_model(
        &self,
        request: Request<pb::UpdateModelRequest>,
    ) -> Answer<pb::UpdateModelResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "UpdateModel")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow(&caller, "UpdateModel", |p| {
            p.allow_all(Permission::Write, name)
        })?;
        let weights = convert::unweights(&req.weights).map_err(bad)?;
        let count = weights.len();
        let who = caller.who();
        let ((), slot) = self
            .run(
                "UpdateModel",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || store.update_model(&convert::tensors(&weights)),
            )
            .await?;
        tracing::info!(store = %name, principal = who, weights = count, "model updated");
        Ok(holding(pb::UpdateModelResponse {}, Held::from(slot)))
    }

    async fn call_transaction(
        &self,
        request: Request<pb::TransactionRequest>,
    ) -> Answer<pb::TransactionResponse> {
        use pb::transaction_request::Step;
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "Transaction")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        let step = Step::try_from(req.step).map_err(|_| {
            Status::invalid_argument(format!("step {} is not a transaction's step", req.step))
        })?;
        if step == Step::Prepare {
            let tables = req.writes.iter().map(|w| w.table.as_str());
            self.allow_tables(&caller, "Transaction", Permission::Write, name, tables)?;
        } else if matches!(step, Step::SetMembership | Step::Fence | Step::Adopt) {
            // a replica's place in its shard, and rows written outside any write's checks
            self.allow(&caller, "Transaction", |p| {
                p.allow_all(Permission::Admin, name)
            })?;
        } else {
            self.allow(&caller, "Transaction", |p| {
                p.allow_all(Permission::Write, name)
            })?;
        }
        let tx = match (step, <[u8; 16]>::try_from(&req.tx[..])) {
            (_, Ok(b)) => u128::from_le_bytes(b),
            (Step::List, Err(_)) if req.tx.is_empty() => 0,
            (_, Err(_)) => {
                return Err(Status::invalid_argument(format!(
                    "a transaction's id is 16 bytes, not {}",
                    req.tx.len()
                )));
            }
        };
        let writes = convert::unwrites(&req.writes).map_err(bad)?;
        self.fits_writes(&writes)?;
        let options = WriteOptions {
            allow_nonfinite: req.allow_nonfinite,
        };
        let lease = Duration::try_from_secs_f64(req.lease_seconds)
            .map_err(|_| Status::invalid_argument(format!("lease {} s", req.lease_seconds)))?;
        let (answer, slot) = self
            .run(
                "Transaction",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || {
                    let membership = |m: nearrec::Membership| pb::TransactionResponse {
                        version: 0,
                        transactions: Vec::new(),
                        membership: Some(convert::membership(m)),
                    };
                    let version = match step {
                        Step::List => {
                            let listed = store.transactions()?;
                            return Ok(pb::TransactionResponse {
                                version: store.version()?,
                                transactions: listed.iter().map(convert::transaction).collect(),
                                membership: None,
                            });
                        }
                        Step::Prepare => {
                            let w = convert::row_writes(&writes);
                            store.prepare_write(tx, &w, options, &req.note, req.epoch)?;
                            store.version()?
                        }
                        Step::Membership => return Ok(membership(store.membership()?)),
                        Step::SetMembership => {
                            let to = convert::unmembership(req.membership.clone());
                            let expected = req.epoch.unwrap_or(0);
                            let set = store.set_membership(expected, to.epoch, &to.members)?;
                            return Ok(membership(set));
                        }
                        Step::Fence => store.fence(req.epoch.unwrap_or(0), lease)?,
                        Step::Adopt => {
                            let w = convert::row_writes(&writes);
                            store.adopt(&w, options, req.count)?
                        }
                        Step::Commit => store.decide(tx, Decision::Commit, req.keep)?,
                        Step::Abort => store.decide(tx, Decision::Abort, req.keep)?,
                        Step::Forget => {
                            store.forget(tx)?;
                            store.version()?
                        }
                    };
                    Ok(pb::TransactionResponse {
                        version,
                        transactions: Vec::new(),
                        membership: None,
                    })
                },
            )
            .await?;
        Ok(holding(answer, Held::from(slot)))
    }

    async fn call_remove(&self, request: Request<pb::RemoveRequest>) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "Remove")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow_tables(
            &caller,
            "Remove",
            Permission::Write,
            name,
            [req.table.as_str()],
        )?;
        let ids: Vec<i64> = decode(&req.ids, &req.table, "ids").map_err(bad)?;
        self.shaped(
            (self.0.config.shape()).check([(req.table.as_str(), 0, ids.len())].into_iter()),
        )?;
        let (version, slot) = self
            .run(
                "Remove",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || {
                    let w = RowWrite {
                        table: &req.table,
                        ids: &ids,
                        values: None,
                    };
                    store.write_many(&[w], WriteOptions::default())
                },
            )
            .await?;
        Ok(holding(pb::WriteResponse { version }, Held::from(slot)))
    }

    async fn call_create_table(
        &self,
        request: Request<pb::CreateTableRequest>,
    ) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "CreateTable")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow_tables(
            &caller,
            "CreateTable",
            Permission::Admin,
            name,
            [req.name.as_str()],
        )?;
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
        let (version, slot) = self
            .run(
                "CreateTable",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || {
                    store.create_table(&NewTable {
                        name: &req.name,
                        rows: req.rows,
                        dim: req.dim,
                        dtype,
                        init,
                    })
                },
            )
            .await?;
        Ok(holding(pb::WriteResponse { version }, Held::from(slot)))
    }

    async fn call_drop_table(
        &self,
        request: Request<pb::DropTableRequest>,
    ) -> Answer<pb::WriteResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "DropTable")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow_tables(
            &caller,
            "DropTable",
            Permission::Admin,
            name,
            [req.name.as_str()],
        )?;
        let (version, slot) = self
            .run(
                "DropTable",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || store.drop_table(&req.name),
            )
            .await?;
        Ok(holding(pb::WriteResponse { version }, Held::from(slot)))
    }

    async fn call_swap(&self, request: Request<pb::SwapRequest>) -> Answer<pb::SwapResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "Swap")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow(&caller, "Swap", |p| p.allow_all(Permission::Admin, name))?;
        if req.release {
            let (_, slot) = self
                .run(
                    "Swap",
                    deadline,
                    How::blocking(caller.ticket(0), false),
                    move || store.release(),
                )
                .await?;
            let who = caller.who();
            tracing::info!(store = %name, principal = who, "held versions released");
            let answer = pb::SwapResponse::default();
            return Ok(holding(answer, Held::from(slot)));
        }
        let to = swap::target(&req)?;
        let to = match to {
            SwapTo::Path(p) => {
                let path = swap::resolve(&self.reach(name, &*store), &p)?;
                SwapTo::Path(path.to_string_lossy().into_owned())
            }
            by_version => by_version,
        };
        if let Some(p) = caller.principal.clone() {
            let (name, to, store) = (name.to_owned(), to.clone(), store.clone());
            let exposed = tokio::task::spawn_blocking(move || {
                let info = store.info().map_err(bad)?;
                let path = swap::destination(&info, &to).map_err(bad)?;
                swap::allow_exposed(&p, &name, &path, info.writable)
            })
            .await
            .map_err(|e| Status::internal(format!("a request's task failed: {e}")))?;
            self.allow(&caller, "Swap", |_| exposed)?;
        }
        let who = caller.who();
        let (event, name) = (swap::event(&to), name.to_owned());
        if req.stage {
            let (staged, slot) = self
                .run(
                    "Swap",
                    deadline,
                    How::blocking(caller.ticket(0), false),
                    move || store.stage(&to, req.warm, req.force),
                )
                .await?;
            tracing::info!(store = %name, principal = who, staged, "version staged");
            let answer = pb::SwapResponse { version: 0, staged };
            return Ok(holding(answer, Held::from(slot)));
        }
        let (answer, slot) = self
            .run(
                "Swap",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || {
                    let before = store.info().ok();
                    let version = store.swap(&to, req.warm, req.force);
                    version.map(|v| (v, before, store.info().ok()))
                },
            )
            .await?;
        let (version, before, after) = answer;
        let (from, to) = (swap::served(before.as_ref()), swap::served(after.as_ref()));
        tracing::info!(store = %name, principal = who, %from, %to, "{event}");
        let answer = pb::SwapResponse { version, staged: 0 };
        let mut answer = holding(answer, Held::from(slot));
        // the audit line names what was served, resolved, not what the request said
        (answer.extensions_mut()).insert(Audited(format!("{event} to {to}")));
        Ok(answer)
    }

    async fn call_info(&self, request: Request<pb::InfoRequest>) -> Answer<pb::InfoResponse> {
        let caller = self.caller(&request, "Info")?;
        let req = request.into_inner();
        let (name, store) = self.named(&caller, &req.store)?;
        self.allow(&caller, "Info", |p| p.allow_any(name))?;
        let name = name.to_owned();
        let stores = self
            .0
            .stores
            .names()
            .filter(|n| caller.sees(n))
            .map(str::to_owned)
            .collect();
        let info = tokio::task::spawn_blocking(move || store.info())
            .await
            .map_err(|e| Status::internal(format!("a request's task failed: {e}")))?
            .map_err(bad)?;
        Ok(Response::new(pb::InfoResponse {
            stores,
            ..convert::info(&name, info)
        }))
    }

    async fn call_stats(&self, request: Request<pb::StatsRequest>) -> Answer<pb::StatsResponse> {
        let caller = self.caller(&request, "Stats")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow(&caller, "Stats", |p| p.allow_any(name))?;
        let answer = tokio::task::spawn_blocking(move || -> nearrec::Result<_> {
            Ok(convert::stats(store.stats()?, store.tier_report()?))
        })
        .await
        .map_err(|e| Status::internal(format!("a request's task failed: {e}")))?
        .map_err(bad)?;
        Ok(Response::new(answer))
    }

    async fn call_row_digests(
        &self,
        request: Request<pb::RowDigestsRequest>,
    ) -> Answer<pb::RowDigestsResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "RowDigests")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow(&caller, "RowDigests", |p| {
            p.allow(Permission::Read, name, &req.table)
        })?;
        let (digests, slot) = self
            .run(
                "RowDigests",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || store.row_digests(&req.table, req.first, req.count),
            )
            .await?;
        let answer = pb::RowDigestsResponse {
            digests: nearrec_wire::arrays::encode(digests),
        };
        Ok(holding(answer, Held::from(slot)))
    }

    async fn call_compact(
        &self,
        request: Request<pb::CompactRequest>,
    ) -> Answer<pb::CompactResponse> {
        let deadline = deadline(request.metadata(), Instant::now());
        let caller = self.caller(&request, "Compact")?;
        let req = request.into_inner();
        let (name, store) = self.store(&caller, &req.store)?;
        self.allow(&caller, "Compact", |p| p.allow_all(Permission::Admin, name))?;
        let (done, slot) = self
            .run(
                "Compact",
                deadline,
                How::blocking(caller.ticket(0), false),
                move || store.compact(),
            )
            .await?;
        Ok(holding(convert::compaction(done), Held::from(slot)))
    }
}

/// Every call observed: its status, seconds and bytes counted (`crate::metrics`).
#[tonic::async_trait]
impl pb::node_server::Node for NodeService {
    type LookupStreamStream = Answers;

    async fn lookup(&self, request: Request<pb::LookupRequest>) -> Answer<pb::LookupResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Lookup",
            received,
            |r| r.encoded_len(),
            self.call_lookup(request),
        )
        .await
    }

    async fn lookup_stream(
        &self,
        request: Request<Streaming<pb::LookupRequest>>,
    ) -> Answer<Answers> {
        let received = Seen::default();
        self.observed(
            "LookupStream",
            received,
            |_| 0,
            self.call_lookup_stream(request),
        )
        .await
    }

    async fn infer(&self, request: Request<pb::InferRequest>) -> Answer<pb::InferResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Infer",
            received,
            |r| r.encoded_len(),
            self.call_infer(request),
        )
        .await
    }

    async fn write(&self, request: Request<pb::WriteRequest>) -> Answer<pb::WriteResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Write",
            received,
            |r| r.encoded_len(),
            self.call_write(request),
        )
        .await
    }

    async fn transaction(
        &self,
        request: Request<pb::TransactionRequest>,
    ) -> Answer<pb::TransactionResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Transaction",
            received,
            |r| r.encoded_len(),
            self.call_transaction(request),
        )
        .await
    }

    async fn update_model(
        &self,
        request: Request<pb::UpdateModelRequest>,
    ) -> Answer<pb::UpdateModelResponse> {
        let received = Seen::of(&request);
        self.observed(
            "UpdateModel",
            received,
            |r| r.encoded_len(),
            self.call_update_model(request),
        )
        .await
    }

    async fn remove(&self, request: Request<pb::RemoveRequest>) -> Answer<pb::WriteResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Remove",
            received,
            |r| r.encoded_len(),
            self.call_remove(request),
        )
        .await
    }

    async fn create_table(
        &self,
        request: Request<pb::CreateTableRequest>,
    ) -> Answer<pb::WriteResponse> {
        let received = Seen::of(&request);
        self.observed(
            "CreateTable",
            received,
            |r| r.encoded_len(),
            self.call_create_table(request),
        )
        .await
    }

    async fn drop_table(
        &self,
        request: Request<pb::DropTableRequest>,
    ) -> Answer<pb::WriteResponse> {
        let received = Seen::of(&request);
        self.observed(
            "DropTable",
            received,
            |r| r.encoded_len(),
            self.call_drop_table(request),
        )
        .await
    }

    async fn swap(&self, request: Request<pb::SwapRequest>) -> Answer<pb::SwapResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Swap",
            received,
            |r| r.encoded_len(),
            self.call_swap(request),
        )
        .await
    }

    async fn info(&self, request: Request<pb::InfoRequest>) -> Answer<pb::InfoResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Info",
            received,
            |r| r.encoded_len(),
            self.call_info(request),
        )
        .await
    }

    async fn stats(&self, request: Request<pb::StatsRequest>) -> Answer<pb::StatsResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Stats",
            received,
            |r| r.encoded_len(),
            self.call_stats(request),
        )
        .await
    }

    async fn row_digests(
        &self,
        request: Request<pb::RowDigestsRequest>,
    ) -> Answer<pb::RowDigestsResponse> {
        let received = Seen::of(&request);
        self.observed(
            "RowDigests",
            received,
            |r| r.encoded_len(),
            self.call_row_digests(request),
        )
        .await
    }

    async fn compact(&self, request: Request<pb::CompactRequest>) -> Answer<pb::CompactResponse> {
        let received = Seen::of(&request);
        self.observed(
            "Compact",
            received,
            |r| r.encoded_len(),
            self.call_compact(request),
        )
        .await
    }
}

/// `answer`, holding `held` until it has left (`crate::send`).
fn holding<T>(answer: T, held: Held) -> Response<T> {
    let mut response = Response::new(answer);
    response.extensions_mut().insert(Hold::new(held));
    response
}

/// The budget of unsent answer bytes of the connection `request` came over, if the node
/// accepted it (`crate::conns`; tonic puts the connection's info in every request's extensions,
/// under TLS too).
fn conn_budget<T>(request: &Request<T>) -> Option<Arc<Semaphore>> {
    let info = request.extensions().get::<ConnInfo>();
    info.map(|c| c.answers.clone())
}

/// A failed request of a stream, as its answer.
fn failed(id: u64, status: &Status) -> pb::LookupResponse {
    pb::LookupResponse {
        id,
        error: Some(stream_error(&bounded(status.clone()))),
        ..Default::default()
    }
}
