//! The write-ahead log of a live store (`docs/format.md` §12): each write call is one record,
//! appended with group commit and acknowledged once durable; on open the records the tables do
//! not hold yet are replayed, and a record cut short by a crash is dropped.

mod log;
mod record;

pub use log::{Durability, Recovered, SEGMENT_HEADER, WAL_MAGIC, Wal, WalConfig, WalStats};
pub use record::{FRAME_BYTES, Init, MAX_PAYLOAD, Op, Record, encode};
