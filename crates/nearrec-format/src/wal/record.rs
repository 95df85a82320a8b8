//! One write call as the log keeps it (`docs/format.md` §12): a record of operations applied
//! all together or not at all, framed with its log sequence number and a CRC-32C.

use crate::dtype::DType;
use crate::manifest::FeedCursor;

/// Bytes before a record's payload: its length, its CRC-32C and its sequence number.
pub const FRAME_BYTES: usize = 16;
/// The largest payload one record may hold (a call beyond it must be split by its caller).
pub const MAX_PAYLOAD: usize = 1 << 30;

/// How a table made by [`Op::CreateTable`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// Every value 0.
    Zeros,
    /// DeepRecInfra's U(−√(1/rows), √(1/rows)), seeded ([`crate::UniformInit`]).
    Uniform { seed: u64 },
}

/// One operation of a write call.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// EMB_WRITE: rows `ids` of `table` become `rows`, `row_bytes` bytes each in the table's
    /// encoding, in the order of `ids`.
    Write {
        table: String,
        ids: Vec<u64>,
        row_bytes: u32,
        rows: Vec<u8>,
    },
    /// EMB_REMOVE of rows: they pool as zero rows until written again.
    Remove { table: String, ids: Vec<u64> },
    /// RM_create_table.
    CreateTable {
        table: String,
        rows: u64,
        dim: u32,
        dtype: DType,
        init: Init,
    },
    /// EMB_REMOVE of a whole table.
    DropTable { table: String },
    /// Keys of keyed table `table` given rows: `keys[i]` is held by `rows[i]` from this record on
    /// (the writer chose rows no key holds; the record's `Write` gives them their values).
    AssignKeys {
        table: String,
        keys: Vec<u64>,
        rows: Vec<u64>,
    },
    /// Keys of keyed table `table` let go of (removed, evicted or expired: `cause`): unknown
    /// from this record on, and their rows free.
    ReleaseKeys {
        table: String,
        keys: Vec<u64>,
        cause: Release,
    },
    /// Delta feed `feed` has applied the delta file `cursor` names: the record's other
    /// operations are that file's rows (version 7, `docs/format.md` §17).
    Cursor { feed: String, cursor: FeedCursor },
    /// Transaction `tx`'s share of a cross-shard write prepared here (kind 10, version 9):
    /// `ops` held, none of them applied, until a [`Op::Decide`] of `tx`; `note` the
    /// coordinator's.
    Prepare {
        tx: u128,
        note: String,
        ops: Vec<Op>,
    },
    /// Transaction `tx` decided (kind 11, version 9): committed — the record's other operations
    /// are its rows, applied as a write's are — or aborted; `keep`: its outcome kept until the
    /// coordinator lets it go (not logged: only the deciding replica keeps one).
    Decide { tx: u128, commit: bool, keep: bool },
}

/// Why keys were let go of: each its own operation kind (6, 8, 9), so that replay tells the
/// keys a table let go of itself (its evicted keys' log) from the ones a caller removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// A caller removed them (kind 6).
    Removed,
    /// The table at its cap let them go for new keys (kind 8, version 8).
    Evicted,
    /// Their TTL passed (kind 9, version 8).
    Expired,
}

impl Op {
    /// The table the operation changes (`None`: a feed's cursor or a transaction's step,
    /// which change none).
    pub fn table(&self) -> Option<&str> {
        match self {
            Op::Write { table, .. }
            | Op::Remove { table, .. }
            | Op::CreateTable { table, .. }
            | Op::DropTable { table }
            | Op::AssignKeys { table, .. }
            | Op::ReleaseKeys { table, .. } => Some(table),
            Op::Cursor { .. } | Op::Prepare { .. } | Op::Decide { .. } => None,
        }
    }

    /// Whether it is a step of a transaction ([`Op::Prepare`], [`Op::Decide`]): the store's
    /// part in a cross-shard write, not a change of rows.
    pub fn is_txn(&self) -> bool {
        matches!(self, Op::Prepare { .. } | Op::Decide { .. })
    }
}

/// A write call read back from the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub lsn: u64,
    pub ops: Vec<Op>,
}

impl Record {
    /// Whether the record creates or drops a table (a change of the tables, not of rows).
    pub fn changes_tables(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, Op::CreateTable { .. } | Op::DropTable { .. }))
    }
}

const WRITE: u8 = 1;
const REMOVE: u8 = 2;
const CREATE: u8 = 3;
const DROP: u8 = 4;
const ASSIGN: u8 = 5;
const RELEASE: u8 = 6;
const CURSOR: u8 = 7;
const EVICT: u8 = 8;
const EXPIRE: u8 = 9;
const PREPARE: u8 = 10;
const DECIDE: u8 = 11;
/// A transaction id's bytes.
const TX_BYTES: usize = 16;
/// A cursor's bytes after its feed's name: sequence, step, wall time, applied time, rows, and
/// which of step and wall time it holds.
const CURSOR_BYTES: usize = 5 * 8 + 1;

/// The bytes `ops` take in a record's payload (what [`MAX_PAYLOAD`] bounds): a caller that
/// decides a record's operations checks it before it commits to them.
pub fn payload_len(ops: &[Op]) -> usize {
    let head = |table: &str| 1 + 2 + table.len();
    ops.iter()
        .map(|op| match op {
            Op::Write {
                table, ids, rows, ..
            } => head(table) + 4 + 8 + 8 * ids.len() + rows.len(),
            Op::Remove { table, ids } => head(table) + 8 + 8 * ids.len(),
            Op::CreateTable { table, init, .. } => {
                head(table)
                    + 8
                    + 4
                    + 1
                    + 1
                    + if matches!(init, Init::Uniform { .. }) {
                        8
                    } else {
                        0
                    }
            }
            Op::DropTable { table } => head(table),
            Op::AssignKeys { table, keys, rows } => {
                head(table) + 16 + 8 * (keys.len() + rows.len())
            }
            Op::ReleaseKeys { table, keys, .. } => head(table) + 8 + 8 * keys.len(),
            Op::Cursor { feed, .. } => head(feed) + CURSOR_BYTES,
            Op::Prepare { note, ops, .. } => 1 + TX_BYTES + 4 + note.len() + 4 + payload_len(ops),
            Op::Decide { .. } => 1 + TX_BYTES + 1,
        })
        .sum()
}

/// Appends `ops`, framed as record `lsn`, to `out`. Fails (appending nothing) when the payload
/// would pass [`MAX_PAYLOAD`] or an operation is malformed (rows not `ids × row_bytes`, a table
/// name over 65,535 bytes).
pub fn encode(lsn: u64, ops: &[Op], out: &mut Vec<u8>) -> Result<(), String> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_BYTES]);
    let result = ops.iter().try_for_each(|op| encode_op(op, out));
    let payload = out.len() - start - FRAME_BYTES;
    if let Err(e) = result.and_then(|()| {
        if payload > MAX_PAYLOAD {
            Err(format!(
                "the call holds {payload} bytes, more than one record's {MAX_PAYLOAD}: split it"
            ))
        } else {
            Ok(())
        }
    }) {
        out.truncate(start);
        return Err(e);
    }
    let crc = crc32c::crc32c_append(
        crc32c::crc32c(&lsn.to_le_bytes()),
        &out[start + FRAME_BYTES..],
    );
    out[start..start + 4].copy_from_slice(&(payload as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&lsn.to_le_bytes());
    Ok(())
}

fn encode_op(op: &Op, out: &mut Vec<u8>) -> Result<(), String> {
    let name = |out: &mut Vec<u8>, table: &str| -> Result<(), String> {
        let n = u16::try_from(table.len())
            .map_err(|_| format!("table name of {} bytes is too long", table.len()))?;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(table.as_bytes());
        Ok(())
    };
    let ids = |out: &mut Vec<u8>, ids: &[u64]| {
        out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
        for id in ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
    };
    match op {
        Op::Write {
            table,
            ids: row_ids,
            row_bytes,
            rows,
        } => {
            if rows.len() as u64 != row_ids.len() as u64 * u64::from(*row_bytes) {
                return Err(format!(
                    "table {table:?}: {} bytes of rows for {} ids of {row_bytes} bytes",
                    rows.len(),
                    row_ids.len()
                ));
            }
            out.push(WRITE);
            name(out, table)?;
            out.extend_from_slice(&row_bytes.to_le_bytes());
            ids(out, row_ids);
            out.extend_from_slice(rows);
        }
        Op::Remove {
            table,
            ids: row_ids,
        } => {
            out.push(REMOVE);
            name(out, table)?;
            ids(out, row_ids);
        }
        Op::CreateTable {
            table,
            rows,
            dim,
            dtype,
            init,
        } => {
            out.push(CREATE);
            name(out, table)?;
            out.extend_from_slice(&rows.to_le_bytes());
            out.extend_from_slice(&dim.to_le_bytes());
            out.push(dtype.code());
            match init {
                Init::Zeros => out.push(0),
                Init::Uniform { seed } => {
                    out.push(1);
                    out.extend_from_slice(&seed.to_le_bytes());
                }
            }
        }
        Op::DropTable { table } => {
            out.push(DROP);
            name(out, table)?;
        }
        Op::AssignKeys { table, keys, rows } => {
            if keys.len() != rows.len() {
                return Err(format!(
                    "table {table:?}: {} keys assigned {} rows",
                    keys.len(),
                    rows.len()
                ));
            }
            out.push(ASSIGN);
            name(out, table)?;
            ids(out, keys);
            ids(out, rows);
        }
        Op::ReleaseKeys { table, keys, cause } => {
            out.push(match cause {
                Release::Removed => RELEASE,
                Release::Evicted => EVICT,
                Release::Expired => EXPIRE,
            });
            name(out, table)?;
            ids(out, keys);
        }
        Op::Cursor { feed, cursor } => {
            out.push(CURSOR);
            name(out, feed)?;
            let has =
                u8::from(cursor.step.is_some()) | (u8::from(cursor.wall_time_ms.is_some()) << 1);
            out.push(has);
            for v in [
                cursor.sequence,
                cursor.step.unwrap_or(0),
                cursor.wall_time_ms.unwrap_or(0),
                cursor.applied_ms,
                cursor.rows,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Op::Prepare { tx, note, ops } => {
            if ops.iter().any(Op::is_txn) {
                return Err(format!(
                    "transaction {tx:032x}: a prepare holds another step"
                ));
            }
            let n = u32::try_from(note.len())
                .map_err(|_| format!("a note of {} bytes is too long", note.len()))?;
            out.push(PREPARE);
            out.extend_from_slice(&tx.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(note.as_bytes());
            // the held operations, as a record's payload of their own, behind their length
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            ops.iter().try_for_each(|op| encode_op(op, out))?;
            let len = u32::try_from(out.len() - at - 4).map_err(|_| "a prepare too large")?;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
        Op::Decide { tx, commit, keep } => {
            out.push(DECIDE);
            out.extend_from_slice(&tx.to_le_bytes());
            out.push(u8::from(*commit) | (u8::from(*keep) << 1));
        }
    }
    Ok(())
}

/// What a frame at the start of `bytes` holds.
pub(crate) enum Frame {
    /// A whole record and the bytes it took.
    Record(Record, usize),
    /// Not a whole, intact record (cut short, or its checksum fails): the log ends before it.
    Torn(String),
}

/// Reads the frame at the start of `bytes`, which must be record `lsn`.
pub(crate) fn decode(bytes: &[u8], lsn: u64) -> Frame {
    if bytes.len() < FRAME_BYTES {
        return Frame::Torn(format!("{} bytes, short of a frame", bytes.len()));
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let (len, crc) = (word(0) as usize, word(4));
    let found = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if len > MAX_PAYLOAD || bytes.len() - FRAME_BYTES < len {
        return Frame::Torn(format!("a payload of {len} bytes is cut short"));
    }
    let payload = &bytes[FRAME_BYTES..FRAME_BYTES + len];
    if crc32c::crc32c_append(crc32c::crc32c(&bytes[8..16]), payload) != crc {
        return Frame::Torn("its checksum does not match".into());
    }
    if found != lsn {
        return Frame::Torn(format!("it is record {found}, not the next one, {lsn}"));
    }
    match decode_ops(payload) {
        Ok(ops) => Frame::Record(Record { lsn, ops }, FRAME_BYTES + len),
        // an intact checksum over a payload that does not parse is not a torn write
        Err(e) => Frame::Torn(format!("record {lsn} does not parse: {e}")),
    }
}

/// A cursor over a payload; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!("{n} bytes wanted, {} left", self.bytes.len()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn name(&mut self) -> Result<String, String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a table name is not UTF-8".into())
    }
    fn tx(&mut self) -> Result<u128, String> {
        Ok(u128::from_le_bytes(
            self.take(TX_BYTES)?.try_into().expect("16"),
        ))
    }
    fn ids(&mut self) -> Result<Vec<u64>, String> {
        let n = usize::try_from(self.u64()?).map_err(|_| "too many ids")?;
        let bytes = self.take(n.checked_mul(8).ok_or("too many ids")?)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
            .collect())
    }
}

fn decode_ops(payload: &[u8]) -> Result<Vec<Op>, String> {
    let mut r = Reader { bytes: payload };
    let mut ops = Vec::new();
    while !r.bytes.is_empty() {
        let kind = r.u8()?;
        let op = match kind {
            WRITE => {
                let table = r.name()?;
                let row_bytes = r.u32()?;
                let ids = r.ids()?;
                let n = (ids.len() as u64)
                    .checked_mul(u64::from(row_bytes))
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or("rows too large")?;
                let rows = r.take(n)?.to_vec();
                Op::Write {
                    table,
                    ids,
                    row_bytes,
                    rows,
                }
            }
            REMOVE => Op::Remove {
                table: r.name()?,
                ids: r.ids()?,
            },
            CREATE => {
                let table = r.name()?;
                let rows = r.u64()?;
                let dim = r.u32()?;
                let code = r.u8()?;
                let dtype = DType::from_code(code).ok_or(format!("dtype code {code}"))?;
                let init = match r.u8()? {
                    0 => Init::Zeros,
                    1 => Init::Uniform { seed: r.u64()? },
                    other => return Err(format!("init kind {other}")),
                };
                Op::CreateTable {
                    table,
                    rows,
                    dim,
                    dtype,
                    init,
                }
            }
            DROP => Op::DropTable { table: r.name()? },
            ASSIGN => {
                let table = r.name()?;
                let keys = r.ids()?;
                let rows = r.ids()?;
                if keys.len() != rows.len() {
                    return Err(format!("{} keys assigned {} rows", keys.len(), rows.len()));
                }
                Op::AssignKeys { table, keys, rows }
            }
            RELEASE | EVICT | EXPIRE => Op::ReleaseKeys {
                table: r.name()?,
                keys: r.ids()?,
                cause: match kind {
                    RELEASE => Release::Removed,
                    EVICT => Release::Evicted,
                    _ => Release::Expired,
                },
            },
            CURSOR => {
                let feed = r.name()?;
                let has = r.u8()?;
                if has > 3 {
                    return Err(format!("a cursor's flags {has}"));
                }
                let (sequence, step, wall) = (r.u64()?, r.u64()?, r.u64()?);
                Op::Cursor {
                    feed,
                    cursor: FeedCursor {
                        sequence,
                        step: (has & 1 != 0).then_some(step),
                        wall_time_ms: (has & 2 != 0).then_some(wall),
                        applied_ms: r.u64()?,
                        rows: r.u64()?,
                    },
                }
            }
            PREPARE => {
                let tx = r.tx()?;
                let n = r.u32()? as usize;
                let note = String::from_utf8(r.take(n)?.to_vec())
                    .map_err(|_| "a transaction's note is not UTF-8")?;
                let n = r.u32()? as usize;
                let held = decode_ops(r.take(n)?)?;
                if held.iter().any(Op::is_txn) {
                    return Err(format!(
                        "transaction {tx:032x}: a prepare holds another step"
                    ));
                }
                Op::Prepare {
                    tx,
                    note,
                    ops: held,
                }
            }
            DECIDE => {
                let tx = r.tx()?;
                let flags = r.u8()?;
                if flags > 3 {
                    return Err(format!("a decision's flags {flags}"));
                }
                Op::Decide {
                    tx,
                    commit: flags & 1 != 0,
                    keep: flags & 2 != 0,
                }
            }
            other => return Err(format!("operation kind {other}")),
        };
        ops.push(op);
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every operation: a row's, a feed's cursor, or a transaction's step (a prepare holding
    /// operations of the first two kinds).
    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => row_op(),
            1 => (any::<u128>(), "[a-z =/,0-9]{0,12}", prop::collection::vec(row_op(), 0..4))
                .prop_map(|(tx, note, ops)| Op::Prepare { tx, note, ops }),
            1 => any::<(u128, bool, bool)>()
                .prop_map(|(tx, commit, keep)| Op::Decide { tx, commit, keep }),
        ]
    }

    fn row_op() -> impl Strategy<Value = Op> {
        let table = "[a-z]{1,8}";
        prop_oneof![
            (table, prop::collection::vec(any::<u64>(), 0..6), 1u32..9).prop_flat_map(
                |(table, ids, row_bytes)| {
                    let n = ids.len() * row_bytes as usize;
                    prop::collection::vec(any::<u8>(), n).prop_map(move |rows| Op::Write {
                        table: table.clone(),
                        ids: ids.clone(),
                        row_bytes,
                        rows,
                    })
                }
            ),
            (table, prop::collection::vec(any::<u64>(), 0..6))
                .prop_map(|(table, ids)| Op::Remove { table, ids }),
            (
                table,
                any::<u64>(),
                1u32..1000,
                1u8..8,
                any::<Option<u64>>()
            )
                .prop_map(|(table, rows, dim, code, seed)| Op::CreateTable {
                    table,
                    rows,
                    dim,
                    dtype: DType::from_code(code).expect("codes 1-7"),
                    init: seed.map_or(Init::Zeros, |seed| Init::Uniform { seed }),
                }),
            table.prop_map(|table| Op::DropTable { table }),
            (
                table,
                prop::collection::vec((any::<u64>(), any::<u64>()), 0..6)
            )
                .prop_map(|(table, pairs)| Op::AssignKeys {
                    table,
                    keys: pairs.iter().map(|p| p.0).collect(),
                    rows: pairs.iter().map(|p| p.1).collect(),
                }),
            (table, prop::collection::vec(any::<u64>(), 0..6), 0..3u8).prop_map(
                |(table, keys, c)| Op::ReleaseKeys {
                    table,
                    keys,
                    cause: [Release::Removed, Release::Evicted, Release::Expired][c as usize],
                }
            ),
            (table, any::<(u64, Option<u64>, Option<u64>, u64, u64)>()).prop_map(
                |(feed, (sequence, step, wall_time_ms, applied_ms, rows))| Op::Cursor {
                    feed,
                    cursor: FeedCursor {
                        sequence,
                        step,
                        wall_time_ms,
                        applied_ms,
                        rows,
                    },
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn records_round_trip(lsn in any::<u64>(), ops in prop::collection::vec(op(), 0..5)) {
            let mut bytes = vec![7u8; 3];
            encode(lsn, &ops, &mut bytes).unwrap();
            prop_assert_eq!(payload_len(&ops), bytes.len() - 3 - FRAME_BYTES);
            match decode(&bytes[3..], lsn) {
                Frame::Record(r, n) => {
                    prop_assert_eq!(n, bytes.len() - 3);
                    prop_assert_eq!(r, Record { lsn, ops });
                }
                Frame::Torn(why) => prop_assert!(false, "torn: {}", why),
            }
        }

        /// Any cut or any flipped bit of a record is a torn frame, never another record.
        #[test]
        fn damage_is_never_read_as_a_record(ops in prop::collection::vec(op(), 1..4),
                                            at in any::<prop::sample::Index>(),
                                            bit in 0u8..8, cut in any::<bool>()) {
            let mut bytes = Vec::new();
            encode(5, &ops, &mut bytes).unwrap();
            let i = at.index(bytes.len());
            if cut {
                bytes.truncate(i);
            } else {
                bytes[i] ^= 1 << bit;
            }
            prop_assert!(matches!(decode(&bytes, 5), Frame::Torn(_)));
        }
    }

    #[test]
    fn a_record_must_be_the_next_one() {
        let mut bytes = Vec::new();
        encode(9, &[Op::DropTable { table: "t".into() }], &mut bytes).unwrap();
        assert!(matches!(decode(&bytes, 9), Frame::Record(..)));
        assert!(matches!(decode(&bytes, 10), Frame::Torn(why) if why.contains("record 9")));
    }

    #[test]
    fn malformed_operations_append_nothing() {
        let mut bytes = vec![1, 2];
        let bad = Op::Write {
            table: "t".into(),
            ids: vec![1, 2],
            row_bytes: 4,
            rows: vec![0; 7],
        };
        let err = encode(1, &[Op::DropTable { table: "u".into() }, bad], &mut bytes).unwrap_err();
        assert!(err.contains("7 bytes of rows for 2 ids"), "{err}");
        assert_eq!(bytes, [1, 2]);
    }
}
