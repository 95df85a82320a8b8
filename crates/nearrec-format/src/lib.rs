//! The nearrec store: a directory holding a manifest and one file per embedding table.
//!
//! Layout, byte diagrams and invariants are specified in `docs/format.md`. In short:
//! - `MANIFEST` — a 32-byte envelope (magic `NRSTORE\0`, version, length, CRC-32C) around a JSON
//!   body listing the tables;
//! - `table-NNNN.nrt` — a 4 KiB header block (magic `NRTABLE\0`, shape, dtype, CRC-32C of the data
//!   and of the header) followed by the rows, placed by [`RowLayout`] so that no row straddles a
//!   block boundary;
//! - `table-NNNN.order` — only for co-located tables (version 2): the slot of each row
//!   ([`RowOrder`]);
//! - `attach-NNNN-name` — attachments (version 2): named blobs such as a model's dense weights;
//! - `table-NNNN.sums` — sector checksums (version 3): a CRC-32C per 512 B of a table's data, so
//!   that the SSD tier checks every read as it lands;
//! - `table-NNNN.keys` — a keyed table's keys (version 5): each raw 64-bit id with its row
//!   (row 0 holds zeros; rows no key holds are room for keys to come);
//! - `wal-*.nrwal` — a live store's write-ahead log (version 4, `docs/format.md` §12–13), and
//!   `table-NNNN.<lsn>.nrt`, a table file a compaction or a created table wrote.
//!
//! Stores are written by [`StoreWriter`] (streaming, bounded memory, atomic commit) and opened by
//! [`StoreReader`] (validating).
//!
//! Modules:
//! - `manifest.rs`, `header.rs`, `layout.rs`, `dtype.rs`: the manifest's envelope and body, the
//!   table header, where each row sits (`RowLayout`), row encodings (fp32 / fp16 / bf16, int8 / int4 /
//!   int2 row-wise with scale and bias, fp8 e4m3);
//! - `writer/` (`StoreWriter`; `table.rs`, one table's `TableWriter`; `pipeline.rs`, its writer
//!   thread), `reader.rs` (`StoreReader`, `verify`), `chunks.rs` (the chunk
//!   size both stream tables in, and the progress callback), `init.rs` (seeded random rows);
//! - `sync.rs`: atomic replacement — a build's directory, `Manifest::publish`, `replace_file`;
//! - `order.rs` + `reorder.rs`: row orders of co-located tables, and `copy_ordered`, the
//!   co-located copy of a store;
//! - `attach.rs`: attachments added or replaced in an existing store, atomically;
//! - `sums.rs`: sector checksums (`SectorSums`);
//! - `keys.rs`: keyed tables' keys files (`KeysMeta`), and the zero row every keyed table has;
//! - `wal/`: the write-ahead log — `record.rs` (one write call as checksummed operations: write,
//!   remove, create, drop), `log.rs` (segments appended with group commit, sync or async,
//!   read by other processes without writing; `log/scan.rs`: segments read back, a torn tail cut);
//! - `rewrite.rs`: table files written into a live store — `rewrite_table` (compaction's
//!   copy-on-write, every sector it copies checked first) and `write_table` (a created table);
//! - `leftovers.rs` + `gc.rs`: what killed writers leave (build temporaries nobody holds the lock
//!   of, files the manifest does not name) — listed by `verify`, removed by builds and `gc` —
//!   apart from the table files a compaction replaced (`retired`), kept for readers behind it;
//! - `repo.rs`: a repository of versions — one name's stores as numbered directories and the
//!   `CURRENT` pointer to the one served, written atomically; publishing and removing versions;
//! - `files.rs`: every file nearrec reads is opened non-blocking and must be a regular file (a FIFO
//!   is refused, not waited on), a store's own files may not be symbolic links; directory locks;
//! - `memory.rs`: `Memory`, what the process may take (physical memory narrowed by its cgroup),
//!   which every layer checks a caller's numbers against before allocating; `Shortfall`;
//! - `npz.rs` + `pyliteral.rs`: numpy's `.npz` archives, read and written as numpy does (a plan's
//!   hot rows, a model's dense weights), the `.npy` header parsed as numpy checks it;
//! - `aligned.rs`: `AlignedBuf`, block-aligned buffers, large ones on huge-page-advised mappings;
//! - `delta/`: delta files, a trainer's changed rows as Arrow IPC or Parquet (`read.rs`
//!   checked against the tables, `write.rs`), applied by a feeder (`docs/format.md` §17);
//! - `error.rs`: `FormatError`.
//!
//! Tests: `tests/attach.rs`, `tests/reorder.rs`, `tests/wal.rs`; the Python tests' frozen stores
//! (`tests/fixtures/`) hold every released version to opening.

mod aligned;
mod attach;
mod chunks;
pub mod delta;
mod dtype;
mod error;
pub mod files;
mod gc;
mod header;
mod init;
mod keys;
mod layout;
mod leftovers;
mod manifest;
mod memory;
pub mod npz;
mod order;
mod pyliteral;
mod reader;
mod reorder;
mod repo;
mod rewrite;
mod sums;
mod sync;
pub mod wal;
mod writer;

pub use aligned::{AlignedBuf, BUF_ALIGN};
pub use attach::attach;
pub use chunks::{CHUNK_BYTES, ProgressFn};
pub use dtype::{DType, FP8_MAX, fp8_decode, fp8_encode, int8_scale_bias, nbit_scale_bias};
pub use error::{FormatError, Result};
pub use gc::gc;
pub use header::{HEADER_BYTES, TABLE_MAGIC, TableHeader};
pub use init::UniformInit;
pub use keys::{KeyRow, KeysMeta, ZERO_ROW};
pub use layout::{DATA_OFFSET, DEFAULT_BLOCK_BYTES, RowLayout};
pub use leftovers::{GcReport, Leftover, orphans, retired};
pub use manifest::{
    Attachment, FEEDS_VERSION, FORMAT_VERSION, FeedCursor, MANIFEST_FILE, MANIFEST_MAGIC, Manifest,
    QuantError, RELEASES_VERSION, TXN_VERSION, TableMeta,
};
pub use memory::{Memory, Shortfall};
pub use order::{OrderMeta, RowOrder};
pub use reader::{StoreReader, TableCheck};
pub use reorder::copy_ordered;
pub use repo::{CURRENT_FILE, Pointer, Publish, Repository};
pub use rewrite::{rewrite_keys, rewrite_table, write_table};
pub use sums::{SECTOR_BYTES, SectorSums, SumsMeta};
pub use sync::replace_file;
pub use writer::{StoreOptions, StoreWriter, TableSpec, TableWriter};
