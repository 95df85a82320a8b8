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
//! - `attach-NNNN-name` — attachments (version 2): named blobs such as a model's dense weights.
//!
//! Stores are written by [`StoreWriter`] (streaming, bounded memory, atomic commit) and opened by
//! [`StoreReader`] (validating).

mod aligned;
mod attach;
mod chunks;
mod dtype;
mod error;
pub mod files;
mod gc;
mod header;
mod init;
mod layout;
mod leftovers;
mod manifest;
mod memory;
pub mod npz;
mod order;
mod pyliteral;
mod reader;
mod reorder;
mod rewrite;
mod sums;
mod sync;
pub mod wal;
mod writer;

pub use aligned::{AlignedBuf, BUF_ALIGN};
pub use attach::attach;
pub use chunks::{CHUNK_BYTES, ProgressFn};
pub use dtype::{DType, int8_scale_bias};
pub use error::{FormatError, Result};
pub use gc::gc;
pub use header::{TABLE_MAGIC, TableHeader};
pub use init::UniformInit;
pub use layout::{DATA_OFFSET, DEFAULT_BLOCK_BYTES, RowLayout};
pub use leftovers::{GcReport, Leftover, orphans, retired};
pub use manifest::{
    Attachment, FORMAT_VERSION, MANIFEST_FILE, MANIFEST_MAGIC, Manifest, TableMeta,
};
pub use memory::{Memory, Shortfall};
pub use order::{OrderMeta, RowOrder};
pub use reader::{StoreReader, TableCheck};
pub use reorder::copy_ordered;
pub use rewrite::{rewrite_table, write_table};
pub use sums::{SECTOR_BYTES, SectorSums, SumsMeta};
pub use writer::{StoreOptions, StoreWriter, TableSpec, TableWriter};
