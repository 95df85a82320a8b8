//! `nearrec.v1.Node`: every call passes through `NodeService::around`, which applies its
//! verb's row of the table of verbs (`nearrec_wire::verbs`) once — the caller authenticated and
//! given its place, the store found (and the router's shard checked), the grant checked, the
//! limits on one request applied, the audit lines written, the call counted and logged — and
//! hands the handler a `Checked` call; the handler decodes its arguments, runs its work on the
//! store's contract ([`StoreApi`]) as its verb is admitted (`NodeService::work`: on a blocking
//! thread, or on the async worker itself for a lookup that never waits on a device) and encodes
//! the answer. Nothing here decides what a lookup means.
//!
//! - `seen.rs`: what a request says before it runs (store, tables, rows, bags, deadline);
//! - `lookup.rs`: lookups and lookup streams;
//! - `calls.rs`: every other call of `nearrec.v1.Node`;
//! - `oip.rs`: the Open Inference Protocol's calls (`inference.GRPCInferenceService`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use nearrec::StoreApi;
use nearrec_wire::status::bounded;
use nearrec_wire::v1 as pb;
use nearrec_wire::verbs::{Admit, LOOKUP, LOOKUP_STREAM, Verb, Verbed};
use nearrec_wire::{SHARD_HEADER, parse_shard_header, status_of};
use tokio::sync::Semaphore;
use tokio_stream::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::acl::{Acl, Principal};
use crate::admission::{Held, Slot};
use crate::audit::{Audit, Phase};
use crate::conns::ConnInfo;
use crate::fair::{self, Ticket};
use crate::limits::Entered;
use crate::node::Shared;
use crate::send::{Answered, Hold};
use crate::swap;

mod calls;
mod lookup;
mod oip;
mod seen;

use seen::{Seen, Summary};

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

/// What a call did, as its audit line says it, when the request alone does not say (a swap's
/// resolved directory): an extension of its answer.
#[derive(Debug, Clone)]
struct Audited(String);

/// A call past its verb's checks, as its handler gets it.
struct Checked<'s> {
    verb: &'static Verb,
    caller: Caller,
    /// The store it names, as served, and the store.
    name: &'s str,
    store: Arc<dyn StoreApi>,
    deadline: Option<Instant>,
    /// Its connection's budget of unsent answer bytes.
    conn: Option<Arc<Semaphore>>,
    /// The rows (ids) its request names, what its verb may charge.
    rows: u64,
}

impl Checked<'_> {
    /// How its verb is admitted (a lookup's own way is `lookup.rs`'s).
    fn how(&self) -> How {
        let cost = match self.verb.admit {
            Admit::Lookup | Admit::Infer | Admit::Rows => self.rows,
            Admit::Slot | Admit::Free => 0,
        };
        How {
            ticket: self.caller.ticket(cost),
            inline: false,
            cpu: self.verb.admit == Admit::Infer && self.store.resident(),
        }
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
    /// A call meant for a shard the store is not (another shard, or of a plan it is not at nor
    /// moving from) is refused `UNAVAILABLE` ([`SHARD_HEADER`]):
    /// to the router that sent it, the replica it meant is not at this address.
    fn store(&self, caller: &Caller, name: &str) -> Result<(&str, Arc<dyn StoreApi>), Status> {
        let (name, store) = self.named(caller, name)?;
        let Some((plan, shard)) = &caller.shard else {
            return Ok((name, store));
        };
        let is = store.shard().map_err(bad)?;
        if let Some(tag) = &is
            && tag.takes(plan)
            && tag.shard == *shard
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
        verb: &Verb,
        check: impl FnOnce(&Principal) -> Result<(), Status>,
    ) -> Result<(), Status> {
        let Some(p) = &caller.principal else {
            return Ok(());
        };
        check(p).inspect_err(|s| {
            self.0.denied.fetch_add(1, Ordering::Relaxed);
            let call = verb.name();
            tracing::warn!(call, principal = %p.name, "refused: {}", s.message());
        })
    }

    /// The call's access line, if sampled, and its slow-request line, if it was slow.
    fn log_call(&self, verb: &Verb, code: tonic::Code, seconds: f64, seen: &Seen) {
        let (config, call) = (&self.0.config, verb.rpc);
        // a swap or a compaction takes as long as its work (a paced warm-up, a rewrite): not a
        // slow request; its own lines say how long it took
        let slow = config.slow_request_ms > 0
            && seconds * 1e3 >= config.slow_request_ms as f64
            && !verb.long;
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
    fn audit(&self, verb: &Verb, code: tonic::Code, seen: &Seen, id: u64) {
        let Some(audit) = &self.0.audit else {
            return;
        };
        if Audit::wants(verb, code) {
            // fails open: a lost outcome line is counted, and the call has happened
            let status = format!("{code:?}");
            let _ = self.audit_line(audit, id, Phase::Outcome, verb.rpc, status, seen);
        }
    }

    /// With `audit_required`, a change's attempt line, written before it runs: `UNAVAILABLE`
    /// (and nothing of the call run) when it cannot be written.
    fn attempt(&self, verb: &Verb, seen: &Seen, id: u64) -> Result<(), Status> {
        let Some(audit) = &self.0.audit else {
            return Ok(());
        };
        if !audit.required || !verb.changes {
            return Ok(());
        }
        self.audit_line(audit, id, Phase::Attempt, verb.rpc, String::new(), seen)
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
        verb: &'static Verb,
        received: &Seen,
        sent: impl FnOnce(&T) -> usize,
        answer: impl Future<Output = Answer<T>>,
    ) -> Answer<T> {
        let (start, call) = (Instant::now(), verb.rpc);
        let id = self.0.audit.as_ref().map_or(0, Audit::next_id);
        let mut answer = match self.attempt(verb, received, id) {
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
        if code == tonic::Code::Ok && verb == LOOKUP {
            let store = match received.store.as_str() {
                "" => self.0.stores.names().next().unwrap_or_default(),
                named => named,
            };
            for (table, rows) in &received.tables {
                self.0.metrics.table(store, table, *rows);
            }
        }
        let resolved = match answer.as_ref().map(|r| r.extensions().get()) {
            Ok(Some(Audited(what))) => Some(Seen {
                what: what.clone(),
                ..received.clone()
            }),
            _ => None,
        };
        let received = resolved.as_ref().unwrap_or(received);
        self.log_call(verb, code, seconds, received);
        self.audit(verb, code, received, id);
        if let Ok(r) = &mut answer
            && verb != LOOKUP_STREAM
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

    fn shaped(&self, checked: nearrec::Result<()>) -> Result<(), Status> {
        checked.map_err(|e| {
            self.0.misshapen.fetch_add(1, Ordering::Relaxed);
            bad(e)
        })
    }

    /// A unary call: its verb's row applied around `handler` ([`NodeService::check`]), and the
    /// call observed ([`NodeService::observed`]).
    async fn around<'s, M, T, F, Fut>(&'s self, request: Request<M>, handler: F) -> Answer<T>
    where
        M: Verbed + Summary + prost::Message,
        T: prost::Message,
        F: FnOnce(&'s Self, Checked<'s>, M) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let verb = request.get_ref().verb();
        let seen = Seen::of(&request);
        let answer = async {
            let call = self.check(verb, &request, &seen)?;
            handler(self, call, request.into_inner()).await
        };
        self.observed(verb, &seen, |r: &T| r.encoded_len(), answer)
            .await
    }

    /// `verb`'s row applied to a call: its caller authenticated and given its place, then
    /// [`NodeService::admit_to`].
    fn check<'s, M>(
        &'s self,
        verb: &'static Verb,
        request: &Request<M>,
        seen: &Seen,
    ) -> Result<Checked<'s>, Status> {
        let caller = self.caller(request, verb.rpc)?;
        let (name, store) = self.admit_to(verb, &caller, seen)?;
        Ok(Checked {
            verb,
            caller,
            name,
            store,
            deadline: seen.deadline,
            conn: conn_budget(request),
            rows: seen.tables.iter().map(|(_, rows)| rows).sum(),
        })
    }

    /// The store a call names (checked against the shard its router means, if its verb is),
    /// the caller's grant on it, and the limits on one request when its verb carries rows.
    fn admit_to(
        &self,
        verb: &'static Verb,
        caller: &Caller,
        seen: &Seen,
    ) -> Result<(&str, Arc<dyn StoreApi>), Status> {
        let (name, store) = match verb.shard {
            true => self.store(caller, &seen.store)?,
            false => self.named(caller, &seen.store)?,
        };
        let tables = seen.tables.iter().map(|(t, _)| t.as_str());
        self.allow(caller, verb, |p| p.holds(verb.grant, name, tables))?;
        if verb.admit.limited() {
            self.shaped(self.0.config.shape().check(seen.shape()))?;
        }
        Ok((name, store))
    }

    /// Runs a checked call's `work` as its verb is admitted ([`NodeService::run`]); a verb that
    /// is not queued runs on a blocking thread at once. The answer comes with what it holds
    /// until sent.
    async fn work<T, F>(&self, call: &Checked<'_>, work: F) -> Result<(T, Held), Status>
    where
        T: Send + 'static,
        F: FnOnce() -> nearrec::Result<T> + Send + 'static,
    {
        if call.verb.admit == Admit::Free {
            let answer = tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| Status::internal(format!("a request's task failed: {e}")))?;
            return Ok((answer.map_err(bad)?, Held::default()));
        }
        let (answer, slot) = self
            .run(call.verb.rpc, call.deadline, call.how(), work)
            .await?;
        Ok((answer, Held::from(slot)))
    }
}

/// The node's calls, each to its handler through [`NodeService::around`].
macro_rules! node {
    ($($method:ident($request:ty) -> $answer:ty = $handler:ident;)*) => {
        #[tonic::async_trait]
        impl pb::node_server::Node for NodeService {
            type LookupStreamStream = Answers;

            async fn lookup_stream(
                &self,
                request: Request<Streaming<pb::LookupRequest>>,
            ) -> Answer<Answers> {
                let answer = self.call_lookup_stream(request);
                self.observed(LOOKUP_STREAM, &Seen::default(), |_| 0, answer).await
            }

            $(
                async fn $method(&self, request: Request<$request>) -> Answer<$answer> {
                    self.around(request, Self::$handler).await
                }
            )*
        }
    };
}

node! {
    lookup(pb::LookupRequest) -> pb::LookupResponse = call_lookup;
    infer(pb::InferRequest) -> pb::InferResponse = call_infer;
    write(pb::WriteRequest) -> pb::WriteResponse = call_write;
    remove(pb::RemoveRequest) -> pb::WriteResponse = call_remove;
    create_table(pb::CreateTableRequest) -> pb::WriteResponse = call_create_table;
    drop_table(pb::DropTableRequest) -> pb::WriteResponse = call_drop_table;
    swap(pb::SwapRequest) -> pb::SwapResponse = call_swap;
    info(pb::InfoRequest) -> pb::InfoResponse = call_info;
    stats(pb::StatsRequest) -> pb::StatsResponse = call_stats;
    compact(pb::CompactRequest) -> pb::CompactResponse = call_compact;
    row_digests(pb::RowDigestsRequest) -> pb::RowDigestsResponse = call_row_digests;
    update_model(pb::UpdateModelRequest) -> pb::UpdateModelResponse = call_update_model;
    transaction(pb::TransactionRequest) -> pb::TransactionResponse = call_transaction;
    scrub(pb::ScrubRequest) -> pb::ScrubResponse = call_scrub;
    model(pb::ModelRequest) -> pb::ModelResponse = call_model;
    feed(pb::FeedRequest) -> pb::FeedResponse = call_feed;
    feed_status(pb::FeedStatusRequest) -> pb::FeedStatusResponse = call_feed_status;
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
