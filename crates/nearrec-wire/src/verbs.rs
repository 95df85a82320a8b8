//! The node's verbs, declared once: one row for each RPC of `nearrec.v1.Node` and one for each
//! step of a `Transaction` (each a verb of its own), then one for each RPC of the Open Inference
//! Protocol's `inference.GRPCInferenceService`, which the node serves beside it, saying the
//! grant it needs, whether it changes what the node serves (and so is audited), how the node
//! admits it and limits it, and whether a client may make it again. The node reads the table
//! around every call — its dispatch, ACL check, audit lines, admission and limits — and the
//! client reads it for its retries; a request names its row ([`Verbed::verb`]). `tests/verbs.rs` holds the table to the
//! protos' service descriptors (an RPC without a row, or a row without an RPC, fails it) and to
//! `docs/protocol.md`'s table of verbs ([`markdown`]).
//!
//! Adding an RPC: the proto, its row here, its line in `calls!` (its request's [`Call`]: the
//! verb and the RPC), the trait method and its implementations, the node's handler.

use std::future::Future;
use std::pin::Pin;

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::v1 as pb;
use pb::node_client::NodeClient;
use pb::transaction_request::Step;

/// What a call does to a table, as a principal's grants say it (`nearrec-server`'s ACL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Read,
    Write,
    Admin,
}

impl Permission {
    /// The grant's name in an ACL file.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }
}

/// What a caller must hold for a verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The permission on each table the request names.
    Tables(Permission),
    /// The permission on every table of the store (a `*` pattern).
    Store(Permission),
    /// Any grant on the store: enough to know it exists.
    Any,
    /// A caller the node knows (any token of its ACL), whatever its grants: a call about the
    /// node, not a store.
    Known,
}

/// How the node admits a verb to its engine, and what it charges the caller's share
/// (`nearrec-server`'s `admission` and `fair`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Pooled where the rows are: charged by its ids. On a DRAM-resident store a CPU turn (a
    /// small one runs at once on the async worker); else an engine slot, small ones coalesced.
    Lookup,
    /// The kept model run: an engine slot charged by its ids, and a CPU turn when
    /// DRAM-resident.
    Infer,
    /// An engine slot charged by the rows it writes.
    Rows,
    /// An engine slot at the base charge.
    Slot,
    /// Not queued: what a store holds and its counters, answered at once.
    Free,
}

impl Admit {
    /// Whether the request's tables and ids are held to the node's limits on one request
    /// (`max_tables_per_request`, `max_bags_per_request`, `max_indices_per_request`).
    pub const fn limited(self) -> bool {
        matches!(self, Self::Lookup | Self::Infer | Self::Rows)
    }
}

/// One verb of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verb {
    /// The RPC that carries it.
    pub rpc: &'static str,
    /// A `Transaction`'s step; `None`: the RPC's own row.
    pub step: Option<Step>,
    pub grant: Grant,
    /// It changes what the node serves: audited (an attempt line first with `audit_required`).
    pub changes: bool,
    pub admit: Admit,
    /// A client may make it again after `UNAVAILABLE` or `Overloaded`: twice answers as once.
    pub retry: bool,
    /// Checked against the shard a router means (`SHARD_HEADER`); `Info` is not: it is how a
    /// router learns what a node serves.
    pub shard: bool,
    /// Its time is its work (a paced warm-up, a rewrite): never logged as a slow request.
    pub long: bool,
}

impl Verb {
    /// Its name in logs, metrics and errors: the RPC's, a step's as `Transaction.prepare`.
    pub fn name(&self) -> String {
        match self.step {
            None => self.rpc.to_owned(),
            Some(s) => format!("{}.{}", self.rpc, step_name(s)),
        }
    }
}

/// A step's name as the audit log writes it (`STEP_SET_MEMBERSHIP` → `set_membership`).
pub fn step_name(step: Step) -> String {
    step.as_str_name()
        .trim_start_matches("STEP_")
        .to_lowercase()
}

/// The table: each row once, as a constant of its own and in [`VERBS`].
macro_rules! verbs {
    ($(
        $(#[$doc:meta])*
        $id:ident = $rpc:literal $(. $step:ident)?:
            $grant:expr, $changes:ident, $admit:ident, $retry:ident $(, $flag:ident)*;
    )*) => {
        $(
            $(#[$doc])*
            pub const $id: &Verb = &Verb {
                rpc: $rpc,
                step: verbs!(@step $($step)?),
                grant: $grant,
                changes: verbs!(@changes $changes),
                admit: Admit::$admit,
                retry: verbs!(@retry $retry),
                shard: !verbs!(@has any_shard $($flag)*),
                long: verbs!(@has long $($flag)*),
            };
        )*
        /// Every verb, RPCs in the proto's order, each `Transaction` step after its RPC's row.
        pub const VERBS: &[&Verb] = &[$($id),*];
    };
    (@step) => { None };
    (@step $s:ident) => { Some(Step::$s) };
    (@changes changes) => { true };
    (@changes reads) => { false };
    (@retry again) => { true };
    (@retry once) => { false };
    (@has $want:ident) => { false };
    (@has long long $($rest:ident)*) => { true };
    (@has any_shard any_shard $($rest:ident)*) => { true };
    (@has $want:ident $other:ident $($rest:ident)*) => { verbs!(@has $want $($rest)*) };
}

use Grant::{Any, Known, Store, Tables};
use Permission::{Admin, Read, Write};

verbs! {
    LOOKUP = "Lookup": Tables(Read), reads, Lookup, again;
    LOOKUP_STREAM = "LookupStream": Tables(Read), reads, Lookup, again;
    INFER = "Infer": Tables(Read), reads, Infer, again;
    WRITE = "Write": Tables(Write), changes, Rows, once;
    REMOVE = "Remove": Tables(Write), changes, Rows, once;
    CREATE_TABLE = "CreateTable": Tables(Admin), changes, Slot, once;
    DROP_TABLE = "DropTable": Tables(Admin), changes, Slot, once;
    /// A swap, a stage or a release of held versions.
    SWAP = "Swap": Store(Admin), changes, Slot, once, long;
    INFO = "Info": Any, reads, Free, again, any_shard;
    STATS = "Stats": Any, reads, Free, again;
    COMPACT = "Compact": Store(Admin), changes, Slot, once, long;
    ROW_DIGESTS = "RowDigests": Tables(Read), reads, Slot, again;
    UPDATE_MODEL = "UpdateModel": Store(Write), changes, Slot, once;
    /// A step this node does not know: refused (`INVALID_ARGUMENT`) once the caller is known
    /// to hold write of the store.
    TRANSACTION = "Transaction": Store(Write), changes, Slot, once;
    LIST = "Transaction".List: Store(Write), reads, Slot, again;
    PREPARE = "Transaction".Prepare: Tables(Write), changes, Rows, once;
    /// Each step done again is done already.
    COMMIT = "Transaction".Commit: Store(Write), changes, Slot, again;
    ABORT = "Transaction".Abort: Store(Write), changes, Slot, again;
    FORGET = "Transaction".Forget: Store(Write), changes, Slot, again;
    MEMBERSHIP = "Transaction".Membership: Store(Write), reads, Slot, again;
    /// A compare-and-set: sent again after it took, it is refused.
    SET_MEMBERSHIP = "Transaction".SetMembership: Store(Admin), changes, Slot, once;
    FENCE = "Transaction".Fence: Store(Admin), changes, Slot, again;
    /// Rows written outside any write's checks.
    ADOPT = "Transaction".Adopt: Store(Admin), changes, Rows, once;
    KEY_DIGESTS = "Transaction".Keys: Store(Write), reads, Slot, again;
    /// A compare-and-set done again as nothing: the tag it set is the one asked. Taken from a
    /// router at any plan: it is how one behind the router's is brought to it.
    RETAG = "Transaction".Retag: Store(Admin), changes, Slot, again, any_shard;
    /// One scrub pass over the node's own disk: every table read back, at the caller's rate.
    SCRUB = "Scrub": Store(Admin), reads, Slot, again, long;
    /// The kept model's configuration and weights, read from the store's attachments.
    MODEL = "Model": Store(Read), reads, Slot, again;
    /// Sent again, a file the feed applied is not applied twice (its cursor says so).
    FEED = "Feed": Tables(Write), changes, Rows, again;
    FEED_STATUS = "FeedStatus": Store(Read), reads, Free, again;
    // `inference.GRPCInferenceService` (`crate::oip`): the node, then its models (a store's
    // kept model, `STORE`, and its pooled lookups, `STORE.pooled`)
    SERVER_LIVE = "ServerLive": Known, reads, Free, again, any_shard;
    SERVER_READY = "ServerReady": Known, reads, Free, again, any_shard;
    SERVER_METADATA = "ServerMetadata": Known, reads, Free, again, any_shard;
    MODEL_READY = "ModelReady": Any, reads, Free, again;
    MODEL_METADATA = "ModelMetadata": Any, reads, Free, again;
    /// The kept model run, or lookups pooled, on the protocol's tensors.
    MODEL_INFER = "ModelInfer": Tables(Read), reads, Infer, again;
}

/// The verb of a `Transaction` of step number `step` ([`TRANSACTION`] for one this node does
/// not know).
pub fn transaction(step: i32) -> &'static Verb {
    let step = Step::try_from(step).ok();
    (VERBS.iter())
        .find(|v| v.rpc == TRANSACTION.rpc && step.is_some() && v.step == step)
        .copied()
        .unwrap_or(TRANSACTION)
}

/// What an RPC's call on a client gives: the node's answer, or its status.
pub type Sent<T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send>>;

/// A request, by the verb it is.
pub trait Verbed {
    fn verb(&self) -> &'static Verb;
}

/// A request of `nearrec.v1.Node`, by the verb it is and the RPC that carries it.
pub trait Call: Verbed + Clone + Send + 'static {
    /// What the node answers.
    type Reply;
    /// The request's RPC on a client of the node.
    fn send(node: NodeClient<Channel>, request: Request<Self>) -> Sent<Self::Reply>;
}

/// Requests and their unary RPCs; those whose RPC is one verb name it, the rest how to find it.
macro_rules! calls {
    ($($method:ident($request:ty) -> $reply:ty = $verb:expr;)*) => {$(
        impl Verbed for $request {
            fn verb(&self) -> &'static Verb {
                let verb: fn(&Self) -> &'static Verb = $verb;
                verb(self)
            }
        }

        impl Call for $request {
            type Reply = $reply;

            fn send(mut node: NodeClient<Channel>, request: Request<Self>) -> Sent<$reply> {
                Box::pin(async move { node.$method(request).await })
            }
        }
    )*};
}

calls! {
    lookup(pb::LookupRequest) -> pb::LookupResponse = |_| LOOKUP;
    infer(pb::InferRequest) -> pb::InferResponse = |_| INFER;
    write(pb::WriteRequest) -> pb::WriteResponse = |_| WRITE;
    remove(pb::RemoveRequest) -> pb::WriteResponse = |_| REMOVE;
    create_table(pb::CreateTableRequest) -> pb::WriteResponse = |_| CREATE_TABLE;
    drop_table(pb::DropTableRequest) -> pb::WriteResponse = |_| DROP_TABLE;
    swap(pb::SwapRequest) -> pb::SwapResponse = |_| SWAP;
    info(pb::InfoRequest) -> pb::InfoResponse = |_| INFO;
    stats(pb::StatsRequest) -> pb::StatsResponse = |_| STATS;
    compact(pb::CompactRequest) -> pb::CompactResponse = |_| COMPACT;
    row_digests(pb::RowDigestsRequest) -> pb::RowDigestsResponse = |_| ROW_DIGESTS;
    update_model(pb::UpdateModelRequest) -> pb::UpdateModelResponse = |_| UPDATE_MODEL;
    transaction(pb::TransactionRequest) -> pb::TransactionResponse = |r| transaction(r.step);
    scrub(pb::ScrubRequest) -> pb::ScrubResponse = |_| SCRUB;
    model(pb::ModelRequest) -> pb::ModelResponse = |_| MODEL;
    feed(pb::FeedRequest) -> pb::FeedResponse = |_| FEED;
    feed_status(pb::FeedStatusRequest) -> pb::FeedStatusResponse = |_| FEED_STATUS;
}

/// The Open Inference Protocol's requests, each its RPC's verb.
macro_rules! verbed {
    ($($request:ident = $verb:ident;)*) => {$(
        impl Verbed for crate::inference::$request {
            fn verb(&self) -> &'static Verb {
                $verb
            }
        }
    )*};
}

verbed! {
    ServerLiveRequest = SERVER_LIVE;
    ServerReadyRequest = SERVER_READY;
    ServerMetadataRequest = SERVER_METADATA;
    ModelReadyRequest = MODEL_READY;
    ModelMetadataRequest = MODEL_METADATA;
    ModelInferRequest = MODEL_INFER;
}

/// The table as `docs/protocol.md` shows it ("Verbs"): one line a verb.
pub fn markdown() -> String {
    let mut out = String::from(
        "| verb | grant | audited | admitted as | retried by the client |\n|---|---|---|---|---|\n",
    );
    for v in VERBS {
        let grant = match v.grant {
            Tables(p) => format!("{} of each table named", p.name()),
            Store(p) => format!("{} of the store", p.name()),
            Any => "any grant on the store".to_owned(),
            Known => "a known caller".to_owned(),
        };
        let admit = match v.admit {
            Admit::Lookup => "lookup",
            Admit::Infer => "inference",
            Admit::Rows => "slot, by rows",
            Admit::Slot => "slot",
            Admit::Free => "not queued",
        };
        let yes = |b: bool| if b { "yes" } else { "no" };
        out += &format!(
            "| `{}` | {grant} | {} | {admit} | {} |\n",
            v.name(),
            yes(v.changes),
            yes(v.retry)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_finds_its_step_and_an_unknown_step_the_strictest_row() {
        assert_eq!(transaction(Step::Prepare as i32), PREPARE);
        assert_eq!(transaction(Step::List as i32), LIST);
        assert_eq!(transaction(99), TRANSACTION);
        let request = pb::TransactionRequest {
            step: Step::Fence as i32,
            ..Default::default()
        };
        assert_eq!(request.verb().name(), "Transaction.fence");
    }

    #[test]
    fn flags_land_on_their_rows_only() {
        let long: Vec<_> = VERBS.iter().filter(|v| v.long).map(|v| v.rpc).collect();
        assert_eq!(long, ["Swap", "Compact", "Scrub"]);
        let anywhere: Vec<_> = VERBS
            .iter()
            .filter(|v| !v.shard)
            .map(|v| v.name())
            .collect();
        assert_eq!(
            anywhere,
            [
                "Info",
                "Transaction.retag",
                "ServerLive",
                "ServerReady",
                "ServerMetadata"
            ]
        );
    }
}
