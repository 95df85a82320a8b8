//! The write-ahead log of a live store (`docs/format.md` §12): each write call is one record,
//! appended with group commit and acknowledged once durable; on open the records the tables do
//! not hold yet are replayed, and a record cut short by a crash is dropped. A store's part in a
//! cross-shard write, its prepared transactions and the outcomes it keeps, are files beside the
//! log (`txn.rs`).

mod log;
mod record;
mod txn;

pub use log::{
    DroppedTail, Durability, Recovered, SEGMENT_HEADER, TailKind, WAL_MAGIC, Wal, WalConfig,
    WalRecovery, WalStats,
};
pub use record::{FRAME_BYTES, Init, MAX_PAYLOAD, Op, Record, Release, encode, payload_len};
pub use txn::{TXN_DIR, TxFile, TxState, move_tx, read_txns, remove_tx, tx_path, write_tx};
