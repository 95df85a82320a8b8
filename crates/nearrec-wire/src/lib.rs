//! The storage node's protocol, `nearrec.v1` (`proto/nearrec/v1/node.proto`,
//! `docs/protocol.md`): the generated messages, server and client ([`v1`]), and the one
//! translation between them and the facade — both the node (`nearrec-server`) and its clients
//! go through it, so that a request means the same on both ends:
//!
//! - [`arrays`]: little-endian `bytes` fields to and from slices, every length checked and a
//!   bad one named by table and field;
//! - [`convert`]: `TableLookup` messages to the facade's [`nearrec::OwnedBatch`] and back, answers
//!   to and from [`nearrec::Pooled`] and [`nearrec::Rows`], and every other call's arguments and
//!   answers (writes, info, stats, compaction) — one function each way;
//! - [`codec`]: prost's codec, a request that does not decode answered `INVALID_ARGUMENT`;
//! - [`oip`]: the Open Inference Protocol's tensors ([`inference`]) to and from a batch and an
//!   answer: how a store and its kept model are models there;
//! - [`status`]: a [`nearrec::Error`] as a gRPC status carrying a `google.rpc.ErrorInfo` (its
//!   [`nearrec::ErrorKind`], table and position), and back as a [`RemoteError`]; a stream's
//!   per-request errors; `bounded`, a status whose echoed names are clipped so that its headers
//!   fit every client's limit.
//!
//! `build.rs` compiles `proto/nearrec/v1/node.proto` and `proto/inference/grpc_predict_v2.proto`
//! in pure Rust (protox and tonic-prost-build, no protoc needed) and keeps the encoded
//! descriptor set for server reflection. The HTTP/2 window and frame sizes both ends open with
//! are here too, so that client and node agree.

pub mod arrays;
pub mod codec;
pub mod convert;
pub mod oip;
pub mod status;
pub mod verbs;

pub use status::{RemoteError, status_of};

/// HTTP/2 flow-control windows both ends of a node's connection open with. gRPC's default, 64
/// KiB, is smaller than one batch's request (8 tables × 1,280 int64 ids is 80 KiB): the sender
/// would stop for a `WINDOW_UPDATE` round trip in the middle of every batch.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// See [`STREAM_WINDOW`]: room for several batches in flight on one connection.
pub const CONNECTION_WINDOW: u32 = 16 << 20;
/// The largest HTTP/2 frame each end accepts. The protocol's default, 16 KiB, cuts one
/// batch's answer (64 bags × 256 floats is 64 KiB) into several frames, each framed, flushed
/// and parsed on its own.
pub const MAX_FRAME: u32 = 1 << 20;

/// The request header a router sends with every call to a replica: `PLAN/SHARD`, the plan id
/// and the shard the store it names must be. A node whose store is another shard, or none,
/// refuses the call (`UNAVAILABLE`), so that an address taken over by another node (a replica
/// gone, another started on its port) never answers as the replica. `Info` is not checked: it
/// is how a router learns what a node serves.
pub const SHARD_HEADER: &str = "nearrec-shard";

/// [`SHARD_HEADER`]'s value for shard `shard` of plan `plan`.
pub fn shard_header(plan: &str, shard: usize) -> String {
    format!("{plan}/{shard}")
}

/// The plan and shard a [`SHARD_HEADER`] names; `None` if it is not `PLAN/SHARD`.
pub fn parse_shard_header(value: &str) -> Option<(&str, usize)> {
    let (plan, shard) = value.rsplit_once('/')?;
    Some((plan, shard.parse().ok()?)).filter(|(p, _)| !p.is_empty())
}

/// The generated `nearrec.v1` package.
pub mod v1 {
    #![allow(missing_docs, missing_debug_implementations, clippy::all)]
    tonic::include_proto!("nearrec.v1");

    /// The encoded `FileDescriptorSet` of this package and [`super::inference`], for server
    /// reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/nearrec_v1_descriptor.bin"));
}

/// The generated `inference` package: the Open Inference Protocol's gRPC service
/// (`proto/inference/grpc_predict_v2.proto`), which the node serves beside `nearrec.v1.Node`.
pub mod inference {
    #![allow(missing_docs, missing_debug_implementations, clippy::all)]
    tonic::include_proto!("inference");
}
