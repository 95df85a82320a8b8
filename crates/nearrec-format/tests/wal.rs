//! The write-ahead log: what is appended is what recovery replays, a torn tail is cut and never
//! half-read, segments rotate and are released, and many threads share the group commit.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nearrec_format::FormatError;
use nearrec_format::wal::{
    Durability, Op, Record, SEGMENT_HEADER, TailKind, Wal, WalConfig, WalRecovery,
};
use proptest::prelude::*;

fn write(table: &str, id: u64, byte: u8) -> Op {
    Op::Write {
        table: table.into(),
        ids: vec![id, id + 1],
        row_bytes: 4,
        rows: vec![byte; 8],
    }
}

fn config(durability: Durability, segment_bytes: u64) -> WalConfig {
    WalConfig {
        durability,
        segment_bytes,
        ..WalConfig::default()
    }
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut s: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "nrwal"))
        .collect();
    s.sort();
    s
}

fn calls(n: u64) -> Vec<Vec<Op>> {
    (0..n)
        .map(|i| {
            let mut ops = vec![write("t", i, i as u8)];
            if i % 3 == 0 {
                ops.push(Op::Remove {
                    table: "u".into(),
                    ids: vec![i],
                });
            }
            ops
        })
        .collect()
}

fn replay(dir: &Path, applied: u64) -> Vec<Record> {
    let (_wal, rec) = Wal::open(dir, WalConfig::default(), applied).unwrap();
    rec.records
}

#[test]
fn recovery_replays_what_was_appended_after_the_applied_record() {
    let dir = tempfile::tempdir().unwrap();
    let ops = calls(20);
    {
        let (wal, rec) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
        assert!(rec.records.is_empty());
        for (i, call) in ops.iter().enumerate() {
            assert_eq!(wal.append(call).unwrap(), i as u64 + 1);
        }
        assert_eq!(wal.stats().records, 20);
    }
    let got = replay(dir.path(), 0);
    assert_eq!(got.len(), 20);
    for (i, r) in got.iter().enumerate() {
        assert_eq!((r.lsn, &r.ops), (i as u64 + 1, &ops[i]));
    }
    let later = replay(dir.path(), 15);
    assert_eq!(
        later.iter().map(|r| r.lsn).collect::<Vec<_>>(),
        [16, 17, 18, 19, 20]
    );
    // appends continue the sequence after a reopen
    let (wal, _) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
    assert_eq!(wal.append(&ops[0]).unwrap(), 21);
}

#[test]
fn a_record_appended_at_a_later_number_fills_the_gap_with_empty_records() {
    let dir = tempfile::tempdir().unwrap();
    let ops = calls(3);
    {
        let (wal, _) = Wal::open(dir.path(), config(Durability::Sync, 300), 0).unwrap();
        assert_eq!(wal.append(&ops[0]).unwrap(), 1);
        assert_eq!(wal.append_at(5, &ops[1]).unwrap(), 5);
        // at the next number: no gap; behind it: refused, nothing appended
        assert_eq!(wal.append_at(6, &[]).unwrap(), 6);
        assert!(wal.append_at(6, &ops[2]).is_err());
        assert_eq!(wal.append(&ops[2]).unwrap(), 7);
        assert_eq!(wal.stats().records, 7);
    }
    let got = replay(dir.path(), 0);
    let lsns: Vec<u64> = got.iter().map(|r| r.lsn).collect();
    assert_eq!(lsns, [1, 2, 3, 4, 5, 6, 7]);
    for (r, want) in got
        .iter()
        .zip([&ops[0][..], &[], &[], &[], &ops[1], &[], &ops[2]])
    {
        assert_eq!(r.ops, want, "record {}", r.lsn);
    }
    // a gap that spans the segment size stays one group, and the next segment follows it
    let (wal, _) = Wal::open(dir.path(), config(Durability::Sync, 300), 0).unwrap();
    assert_eq!(wal.append_at(100, &ops[0]).unwrap(), 100);
    assert_eq!(wal.append(&ops[1]).unwrap(), 101);
    drop(wal);
    assert_eq!(replay(dir.path(), 98).len(), 3);
}

#[test]
fn a_log_behind_the_tables_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let small = config(Durability::Sync, 200);
    {
        let (wal, _) = Wal::open(dir.path(), small, 0).unwrap();
        for call in calls(30) {
            wal.append(&call).unwrap();
        }
        wal.release(20).unwrap();
    }
    // the tables hold up to 20, the log still has 21..: fine; claiming only 5 are applied
    // means records 6.. are missing
    assert_eq!(replay(dir.path(), 20).first().map(|r| r.lsn), Some(21));
    let err = Wal::open(dir.path(), small, 5).unwrap_err();
    assert!(matches!(err, FormatError::Corrupted { .. }), "{err}");
}

#[test]
fn segments_rotate_and_are_released_once_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(dir.path(), config(Durability::Sync, 300), 0).unwrap();
    for call in calls(40) {
        wal.append(&call).unwrap();
    }
    let n = segments(dir.path()).len();
    assert!(n > 5, "{n} segments");
    assert_eq!(wal.stats().segments as usize, n);
    wal.release(25).unwrap();
    let left = segments(dir.path());
    assert!(left.len() < n);
    drop(wal);
    // every record after 25 is still there, and nothing at or before the oldest kept segment's
    // start is lost
    let got = replay(dir.path(), 25);
    assert_eq!(
        got.iter().map(|r| r.lsn).collect::<Vec<_>>(),
        (26..=40).collect::<Vec<_>>()
    );
    // releasing everything keeps the segment being appended to
    let (wal, _) = Wal::open(dir.path(), WalConfig::default(), 25).unwrap();
    wal.release(40).unwrap();
    assert_eq!(segments(dir.path()).len(), 1);
    assert_eq!(wal.append(&calls(1)[0]).unwrap(), 41);
    drop(wal);
    assert_eq!(replay(dir.path(), 40).len(), 1);
}

/// The newest segment is zero-filled past its records (its syncs then change no size); the
/// zeros are where the log ends, not a torn record, and only the newest segment has them.
#[test]
fn only_the_newest_segment_ends_in_zeros_and_they_are_not_torn() {
    let dir = tempfile::tempdir().unwrap();
    let records_end = |wal: &Wal| wal.stats().bytes;
    {
        let (wal, _) = Wal::open(dir.path(), config(Durability::Sync, 300), 0).unwrap();
        for call in calls(12) {
            wal.append(&call).unwrap();
        }
        let segs = segments(dir.path());
        assert!(segs.len() > 2);
        let lens: Vec<u64> = segs
            .iter()
            .map(|p| fs::metadata(p).unwrap().len())
            .collect();
        // older segments were cut to their records when the next one started
        let (_, older) = lens.split_last().unwrap();
        assert!(older.iter().all(|&len| len < 1024), "{older:?}");
        let n = fs::read(segs.last().unwrap()).unwrap();
        let in_newest = records_end(&wal) - older.iter().sum::<u64>();
        assert!(n.len() as u64 > in_newest, "zeros past the records");
        assert!(n[in_newest as usize..].iter().all(|&b| b == 0));
    }
    let (wal, rec) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
    assert_eq!(rec.records.len(), 12);
    assert_eq!(
        rec.torn_bytes, 0,
        "zeros never written over are not a torn record"
    );
    assert_eq!(wal.append(&calls(1)[0]).unwrap(), 13);
    drop(wal);
    assert_eq!(replay(dir.path(), 0).len(), 13);
}

#[test]
fn damage_before_the_newest_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _) = Wal::open(dir.path(), config(Durability::Sync, 300), 0).unwrap();
        for call in calls(20) {
            wal.append(&call).unwrap();
        }
    }
    let first = &segments(dir.path())[0];
    let mut bytes = fs::read(first).unwrap();
    let at = SEGMENT_HEADER + 20;
    bytes[at] ^= 0x10;
    fs::write(first, bytes).unwrap();
    let err = Wal::open(dir.path(), WalConfig::default(), 0).unwrap_err();
    assert!(matches!(err, FormatError::Corrupted { .. }), "{err}");
    assert!(err.to_string().contains("write-ahead log"), "{err}");
}

/// One flipped bit inside record 51 of 100 synced writes: the 49 after it were acknowledged, so
/// the log refuses to open (the writer and a reader alike), names the record, and keeps every
/// byte for whoever repairs it.
#[test]
fn a_damaged_record_with_intact_ones_after_it_is_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut ends = vec![SEGMENT_HEADER as u64];
    {
        let (wal, _) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
        for call in calls(100) {
            wal.append(&call).unwrap();
            ends.push(wal.stats().bytes);
        }
    }
    let seg = &segments(dir.path())[0];
    let mut bytes = fs::read(seg).unwrap();
    // a payload byte of record 51 (its frame is 16 bytes)
    bytes[ends[50] as usize + 20] ^= 0x04;
    fs::write(seg, &bytes).unwrap();
    for err in [
        Wal::read(dir.path(), 0).unwrap_err(),
        Wal::open(dir.path(), WalConfig::default(), 0).unwrap_err(),
    ] {
        assert!(matches!(err, FormatError::Corrupted { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("record 51 at byte {}", ends[50])),
            "{msg}"
        );
        assert!(msg.contains("record 52"), "{msg}");
    }
    assert_eq!(fs::read(seg).unwrap(), bytes, "the evidence is kept");
    // the last record damaged is a torn tail still: cut, and the 99 before it replayed
    bytes[ends[50] as usize + 20] ^= 0x04;
    bytes[ends[99] as usize + 20] ^= 0x04;
    fs::write(seg, &bytes).unwrap();
    assert_eq!(replay(dir.path(), 0).len(), 99);
}

#[test]
fn a_newest_segment_cut_while_being_made_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
        for call in calls(3) {
            wal.append(&call).unwrap();
        }
        // rotation cuts the old segment to its records first
        let old = fs::OpenOptions::new()
            .write(true)
            .open(&segments(dir.path())[0])
            .unwrap();
        old.set_len(wal.stats().bytes).unwrap();
    }
    // a crash between creating the next segment and syncing its header
    fs::write(dir.path().join("wal-0000000000000004.nrwal"), b"NRWAL\0").unwrap();
    let (wal, rec) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
    assert_eq!(rec.records.len(), 3);
    assert_eq!(rec.torn_bytes, 6);
    assert_eq!(segments(dir.path()).len(), 1);
    assert_eq!(wal.append(&calls(1)[0]).unwrap(), 4);
}

#[test]
fn async_appends_reach_the_kernel_before_they_return() {
    let dir = tempfile::tempdir().unwrap();
    let window = Duration::from_secs(3600);
    let (wal, _) = Wal::open(dir.path(), config(Durability::Async { window }, 1 << 20), 0).unwrap();
    for call in calls(5) {
        wal.append(&call).unwrap();
    }
    // what a killed process leaves: the files as the kernel has them, this log still open
    let copy = tempfile::tempdir().unwrap();
    for s in segments(dir.path()) {
        fs::copy(&s, copy.path().join(s.file_name().unwrap())).unwrap();
    }
    assert_eq!(replay(copy.path(), 0).len(), 5);
    assert!(wal.stats().syncs < 5, "async appends do not each sync");
    wal.sync().unwrap();
    assert!(wal.stats().syncs >= 1);
}

#[test]
fn many_threads_share_the_group_commit() {
    for durability in [
        Durability::Sync,
        Durability::Async {
            window: Duration::from_millis(5),
        },
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), config(durability, 4096), 0).unwrap();
        let wal = Arc::new(wal);
        let threads: Vec<_> = (0..6u8)
            .map(|t| {
                let wal = wal.clone();
                std::thread::spawn(move || {
                    (0..50u64)
                        .map(|i| wal.append(&[write(&format!("t{t}"), i, t)]).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut lsns: Vec<u64> = threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        lsns.sort_unstable();
        assert_eq!(lsns, (1..=300).collect::<Vec<_>>(), "{durability:?}");
        let stats = wal.stats();
        assert!(stats.groups <= 300 && stats.groups >= 1);
        drop(wal);
        let got = replay(dir.path(), 0);
        assert_eq!(got.len(), 300);
        // each thread's calls come back in the order it made them
        for t in 0..6u8 {
            let ids: Vec<u64> = got
                .iter()
                .filter_map(|r| match &r.ops[0] {
                    Op::Write { table, ids, .. } if *table == format!("t{t}") => Some(ids[0]),
                    _ => None,
                })
                .collect();
            assert_eq!(ids, (0..50).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_malformed_call_is_refused_and_takes_no_sequence_number() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
    let bad = Op::Write {
        table: "t".into(),
        ids: vec![1],
        row_bytes: 4,
        rows: vec![0; 3],
    };
    let err = wal.append(&[bad]).unwrap_err();
    assert!(err.to_string().contains("table \"t\""), "{err}");
    assert_eq!(wal.append(&calls(1)[0]).unwrap(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A crash can leave any prefix of the newest segment's bytes, or damage after the last
    /// synced record: recovery gives exactly the whole records before the cut, cuts the file
    /// there, and the log goes on from it. Damage to a record that intact records follow is
    /// not a torn tail: the log is refused, naming the record, and the file is left as it was.
    #[test]
    fn a_torn_tail_is_cut_at_the_last_whole_record(n in 1u64..12, cut in any::<prop::sample::Index>(),
                                                    flip in any::<Option<u8>>()) {
        let dir = tempfile::tempdir().unwrap();
        let ops = calls(n);
        let mut ends = vec![SEGMENT_HEADER as u64];
        {
            let (wal, _) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
            for call in &ops {
                wal.append(call).unwrap();
                ends.push(wal.stats().bytes);
            }
        }
        let seg = &segments(dir.path())[0];
        let mut bytes = fs::read(seg).unwrap();
        let len = bytes.len() as u64;
        let at = SEGMENT_HEADER as u64 + cut.index((len - SEGMENT_HEADER as u64) as usize) as u64;
        match flip {
            Some(bit) => bytes[at as usize] ^= 1 << (bit % 8),
            None => bytes.truncate(at as usize),
        }
        fs::write(seg, &bytes).unwrap();
        // the whole records are those ending at or before the damage (a flip damages the record
        // holding the byte; a cut keeps records ending at or before it)
        let whole = ends.iter().filter(|&&e| e <= at).count() as u64 - 1;
        if flip.is_some() && whole + 1 < n {
            let err = Wal::open(dir.path(), WalConfig::default(), 0).unwrap_err();
            let named = format!("record {} at byte {}", whole + 1, ends[whole as usize]);
            prop_assert!(err.to_string().contains(&named), "{}", err);
            prop_assert_eq!(fs::read(seg).unwrap(), bytes);
            return Ok(());
        }
        let (wal, rec) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
        prop_assert_eq!(rec.records.len() as u64, whole);
        for (i, r) in rec.records.iter().enumerate() {
            prop_assert_eq!(&r.ops, &ops[i]);
        }
        prop_assert_eq!(fs::metadata(seg).unwrap().len(), ends[whole as usize]);
        prop_assert_eq!(wal.append(&ops[0]).unwrap(), whole + 1);
        drop(wal);
        prop_assert_eq!(replay(dir.path(), 0).len() as u64, whole + 1);
    }
}

#[test]
fn a_reader_replays_what_is_whole_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
    for call in calls(4) {
        wal.append(&call).unwrap();
    }
    // the writer is in the middle of its next group: half a record after the last one, over
    // the zeros the segment holds past its records
    let seg = &segments(dir.path())[0];
    let end = wal.stats().bytes as usize;
    let mut torn = fs::read(seg).unwrap();
    assert!(torn.len() > end && torn[end..].iter().all(|&b| b == 0));
    let mut more = Vec::new();
    nearrec_format::wal::encode(5, &calls(5)[4], &mut more).unwrap();
    torn[end..end + more.len() / 2].copy_from_slice(&more[..more.len() / 2]);
    fs::write(seg, &torn).unwrap();
    let rec = Wal::read(dir.path(), 1).unwrap();
    assert_eq!(
        rec.records.iter().map(|r| r.lsn).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    // the torn record and the zeros after it: all past the last whole record
    assert_eq!(rec.torn_bytes, (torn.len() - end) as u64);
    assert_eq!(
        fs::read(seg).unwrap(),
        torn,
        "a reader leaves the log as it is"
    );
}

/// Four calls appended and the log closed; the newest segment's path and where record 4 starts.
fn four_records(dir: &Path) -> (PathBuf, usize) {
    let (wal, _) = Wal::open(dir, WalConfig::default(), 0).unwrap();
    let mut starts = Vec::new();
    for call in calls(4) {
        starts.push(wal.stats().bytes as usize);
        wal.append(&call).unwrap();
    }
    (segments(dir)[0].clone(), starts[3])
}

fn recovering(recovery: WalRecovery) -> WalConfig {
    WalConfig {
        recovery,
        ..WalConfig::default()
    }
}

/// Issue 62, item 3: a flipped bit in the last record dropped an acknowledged write without a
/// word, as a torn tail. Now `absolute` refuses the open, naming the record and the byte to cut
/// at, and leaves the segment as it was; `tolerate_torn_tail` drops it and says so, telling a
/// record written whole and damaged from one cut short.
#[test]
fn a_bad_last_record_is_reported_and_refused_when_recovery_is_absolute() {
    for flip in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (seg, at) = four_records(dir.path());
        let mut bytes = fs::read(&seg).unwrap();
        if flip {
            bytes[at + 20] ^= 0x10; // a bit of record 4's payload
        } else {
            // cut short: its last bytes never written (zeros, as the segment is zero-filled)
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            bytes[at + 16 + len / 2..at + 16 + len].fill(0);
        }
        fs::write(&seg, &bytes).unwrap();

        let e = Wal::open(dir.path(), recovering(WalRecovery::Absolute), 0).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, FormatError::Corrupted { .. }), "{e}");
        for said in [
            "record 4",
            &format!("byte {at}"),
            &format!("truncate -s {at}"),
        ] {
            assert!(text.contains(said), "{said:?} in {text}");
        }
        assert_eq!(
            fs::read(&seg).unwrap(),
            bytes,
            "a refused open cuts nothing"
        );

        let (_wal, rec) = Wal::open(dir.path(), WalConfig::default(), 0).unwrap();
        assert_eq!(rec.records.len(), 3);
        let dropped = rec.dropped.expect("the dropped record is reported");
        assert_eq!((dropped.lsn, dropped.offset), (4, at as u64));
        let kind = if flip {
            TailKind::Damaged
        } else {
            TailKind::Torn
        };
        assert_eq!(dropped.kind, kind, "{dropped:?}");
    }
}

/// The zeros past the last record are the segment's fill, not a bad record: nothing is
/// dropped or refused, whatever the recovery mode.
#[test]
fn a_log_ending_in_its_fill_drops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    four_records(dir.path());
    let (_wal, rec) = Wal::open(dir.path(), recovering(WalRecovery::Absolute), 0).unwrap();
    assert_eq!((rec.records.len(), rec.dropped), (4, None));
}
