//! What a call's request says of it before it runs, read from the message without decoding its
//! arrays: its store, the tables it names with their rows and bags, its deadline, its token —
//! for the ACL check, the limits on one request, the access, slow-request and audit lines and
//! the per-table metrics.

use std::time::Instant;

use nearrec_wire::inference as oip_pb;
use nearrec_wire::oip;
use nearrec_wire::v1 as pb;
use nearrec_wire::verbs::step_name;
use tonic::Request;
use tonic::metadata::{Ascii, MetadataValue};

use crate::admission::deadline;
use crate::conns::ConnInfo;

/// A call's request as it arrived.
#[derive(Debug, Default, Clone)]
pub(super) struct Seen {
    pub bytes: usize,
    pub deadline: Option<Instant>,
    pub store: String,
    /// Each table the request names and its rows (ids looked up or written).
    pub tables: Vec<(String, u64)>,
    /// A lookup's bags, table by table (empty for other calls).
    pub bags: Vec<usize>,
    /// Kept to name the principal in log lines, never logged.
    pub auth: Option<MetadataValue<Ascii>>,
    /// A transaction's step, or what a swap serves (the audit log's `what`).
    pub what: String,
    /// The client's address.
    pub peer: Option<std::net::SocketAddr>,
}

impl Seen {
    /// A unary call's request, with its metadata and connection.
    pub fn of<M: prost::Message + Summary>(request: &Request<M>) -> Self {
        let conn = request.extensions().get::<ConnInfo>();
        Self {
            deadline: deadline(request.metadata(), Instant::now()),
            auth: request.metadata().get("authorization").cloned(),
            peer: conn.and_then(|c| c.tcp.remote_addr()),
            ..Self::from_message(request.get_ref())
        }
    }

    /// What a message says (a stream's request: the stream has the metadata).
    pub fn from_message<M: prost::Message + Summary>(message: &M) -> Self {
        let (store, tables) = message.summary();
        Self {
            bytes: message.encoded_len(),
            store: store.to_owned(),
            tables,
            bags: message.bags(),
            what: message.what(),
            ..Self::default()
        }
    }

    /// Each table's name, bags and rows, for the node's limits on one request.
    pub fn shape(&self) -> impl ExactSizeIterator<Item = (&str, usize, usize)> {
        let bags = |k: usize| self.bags.get(k).copied().unwrap_or(0);
        (self.tables.iter().enumerate())
            .map(move |(k, (t, rows))| (t.as_str(), bags(k), *rows as usize))
    }
}

/// What an access line and the per-table metrics say of a request: its store, and each table
/// it names with its rows (ids looked up or written).
pub(super) trait Summary {
    fn summary(&self) -> (&str, Vec<(String, u64)>);

    /// Each table's bags, for a lookup.
    fn bags(&self) -> Vec<usize> {
        Vec::new()
    }

    /// What the call does beyond its name, for the audit log.
    fn what(&self) -> String {
        String::new()
    }
}

/// Ids in an int64 array.
fn ids(bytes: &[u8]) -> u64 {
    (bytes.len() / 8) as u64
}

/// Bytes an element of a lookup's index type takes (int32 or int64).
fn width(t: &pb::TableLookup) -> usize {
    if t.index_type == pb::IndexType::Int32 as i32 {
        4
    } else {
        8
    }
}

/// Ids in a lookup's array of its index type.
fn lookup_ids(t: &pb::TableLookup) -> u64 {
    (t.ids.len() / width(t)) as u64
}

/// The bags a lookup declares, as the engine counts them (`TableLookup::declared_bags`).
fn lookup_bags(t: &pb::TableLookup) -> usize {
    use pb::table_lookup::Bags;
    match &t.bags {
        Some(Bags::Fixed(f)) => f.batch as usize,
        Some(Bags::Lengths(l)) => l.len() / width(t),
        Some(Bags::Offsets(o)) => {
            let n = o.offsets.len() / width(t);
            n - usize::from(o.include_last_offset && n > 0)
        }
        None => 0,
    }
}

/// Lookups of a request's tables.
macro_rules! lookups {
    ($($t:ty),*) => {$(
        impl Summary for $t {
            fn summary(&self) -> (&str, Vec<(String, u64)>) {
                let tables = self.tables.iter().map(|t| (t.table.clone(), lookup_ids(t)));
                (&self.store, tables.collect())
            }

            fn bags(&self) -> Vec<usize> {
                self.tables.iter().map(lookup_bags).collect()
            }
        }
    )*};
}

lookups!(pb::LookupRequest, pb::InferRequest);

impl Summary for pb::WriteRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let tables = self.writes.iter().map(|t| (t.table.clone(), ids(&t.ids)));
        (&self.store, tables.collect())
    }
}

impl Summary for pb::FeedRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let tables = self.writes.iter().map(|t| (t.table.clone(), ids(&t.ids)));
        (&self.store, tables.collect())
    }

    fn what(&self) -> String {
        let sequence = self.cursor.as_ref().map_or(0, |c| c.sequence);
        format!("feed {:?} file {sequence}", self.feed)
    }
}

impl Summary for pb::TransactionRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let tables = self.writes.iter().map(|t| (t.table.clone(), ids(&t.ids)));
        (&self.store, tables.collect())
    }

    fn what(&self) -> String {
        let step = pb::transaction_request::Step::try_from(self.step);
        step.map_or_else(|_| format!("step {}", self.step), step_name)
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
    pb::CompactRequest,
    pb::ScrubRequest,
    pb::ModelRequest,
    pb::FeedStatusRequest
);

/// The Open Inference Protocol's calls: a model's name is its store's ([`oip::store_of`]); an
/// inference's inputs are its tables (or the features of its model), each of as many rows as
/// its ids tensor has values, in bags of its samples.
impl Summary for oip_pb::ModelInferRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        let inputs = self.inputs.iter().filter(|t| is_lookup(&t.name));
        let rows = |t: &oip_pb::model_infer_request::InferInputTensor| {
            t.shape.iter().map(|&d| d.max(0) as u64).product()
        };
        let tables = inputs.map(|t| (t.name.clone(), rows(t)));
        (oip::store_of(&self.model_name).0, tables.collect())
    }

    fn bags(&self) -> Vec<usize> {
        let inputs = self.inputs.iter().filter(|t| is_lookup(&t.name));
        inputs
            .map(|t| t.shape.first().map_or(0, |&b| b.max(0) as usize))
            .collect()
    }
}

/// Whether an inference's input is the ids of a lookup.
fn is_lookup(input: &str) -> bool {
    input != oip::DENSE && !input.ends_with(oip::LENGTHS)
}

impl Summary for oip_pb::ModelReadyRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        (oip::store_of(&self.name).0, Vec::new())
    }
}

impl Summary for oip_pb::ModelMetadataRequest {
    fn summary(&self) -> (&str, Vec<(String, u64)>) {
        (oip::store_of(&self.name).0, Vec::new())
    }
}

/// Calls about the node, naming no store.
macro_rules! node_only {
    ($($t:ty),*) => {$(
        impl Summary for $t {
            fn summary(&self) -> (&str, Vec<(String, u64)>) {
                ("", Vec::new())
            }
        }
    )*};
}

node_only!(
    oip_pb::ServerLiveRequest,
    oip_pb::ServerReadyRequest,
    oip_pb::ServerMetadataRequest
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
