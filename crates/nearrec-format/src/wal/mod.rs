//! The write-ahead log of a live store (`docs/format.md` §12): each write call is one record,
//! appended with group commit and acknowledged once durable; on open the records the tables do
//! not hold yet are replayed, and a record cut short by a crash is dropped. A store's part in a
//! cross-shard write — a share prepared, a decision — is a record of the log too; what it holds
//! of them is checkpointed in files beside the log (`txn.rs`).

mod log;
mod record;
mod txn;

pub use log::{
    DroppedTail, Durability, Recovered, SEGMENT_HEADER, TailKind, WAL_MAGIC, Wal, WalConfig,
    WalRecovery, WalStats,
};
pub use record::{FRAME_BYTES, Init, MAX_PAYLOAD, Op, Record, Release, encode, payload_len};
pub use txn::{
    TXN_DIR, TXN_LOG_DIR, TxFile, TxState, read_checkpoint, read_txns, remove_tx, tx_path,
    txn_log_dir, write_checkpoint, write_tx,
};
