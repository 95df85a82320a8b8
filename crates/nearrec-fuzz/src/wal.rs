//! The write-ahead log's target: calls logged, the log damaged as a crash or a bad disk would,
//! and recovered.

use crate::scratch;

/// A write-ahead log of calls made from the input, then damaged as the input says — cut at a
/// byte (what follows lost, as in a crash), and one byte changed — and recovered: recovery either refuses the damage or returns
/// calls the log was given, whole and in order, from the first; a cut alone (a crash mid-write)
/// is always recovered, and returns every call written wholly before the cut.
pub fn wal_replay(data: &[u8]) {
    use nearrec::format::wal::{Op, Release, Wal, WalConfig};
    let [calls, cut_at, flip_at, flip, rest @ ..] = data else {
        return;
    };
    let dir = scratch();
    // small segments and zero tails: what is fuzzed is their bytes, not megabytes of zeros
    let config = WalConfig {
        segment_bytes: 1 << 12,
        zero_ahead: 1 << 12,
        ..WalConfig::default()
    };
    // up to 8 calls of a few rows each, their ids and bytes taken from the input
    let mut written: Vec<Vec<Op>> = Vec::new();
    let mut bytes = rest.chunks(12);
    for _ in 0..(calls % 8) + 1 {
        let Some(chunk) = bytes.next() else { break };
        let ids: Vec<u64> = chunk.iter().take(3).map(|&b| u64::from(b)).collect();
        let rows: Vec<u8> = (0..ids.len() * 4)
            .map(|i| chunk.get(i % chunk.len()).copied().unwrap_or(0))
            .collect();
        let table = "t".to_owned();
        let tx = u128::from(chunk[0]) << 64 | ids.len() as u128;
        let op = match chunk[0] % 8 {
            0 => Op::Remove { table, ids },
            // a cross-shard write's steps: a share prepared (the rows held inside), a decision
            6 => Op::Prepare {
                tx,
                note: "decider=0/0".into(),
                ops: vec![Op::Write {
                    table,
                    ids,
                    row_bytes: 4,
                    rows,
                }],
            },
            7 => Op::Decide {
                tx,
                commit: chunk[0] & 0x10 != 0,
                keep: chunk[0] & 0x20 != 0,
            },
            // a keyed table's decisions: keys given rows, keys let go of
            1 => Op::AssignKeys {
                table,
                rows: ids.iter().map(|k| k + 1).collect(),
                keys: ids,
            },
            2 => Op::ReleaseKeys {
                table,
                keys: ids,
                cause: [Release::Removed, Release::Evicted, Release::Expired]
                    [usize::from(chunk[0] / 6 % 3)],
            },
            _ => Op::Write {
                table,
                ids,
                row_bytes: 4,
                rows,
            },
        };
        written.push(vec![op]);
    }
    {
        let (wal, _) = Wal::open(dir.path(), config, 0).expect("a new log opens");
        for ops in &written {
            wal.append(ops).expect("an append");
        }
    }
    // the segments, oldest first: the cut and the changed byte fall in their bytes, end to end
    let mut segments: Vec<_> = std::fs::read_dir(dir.path())
        .expect("the log's directory")
        .map(|e| e.expect("an entry").path())
        .collect();
    segments.sort();
    let lens: Vec<usize> = segments
        .iter()
        .map(|p| std::fs::metadata(p).expect("a segment").len() as usize)
        .collect();
    let total: usize = lens.iter().sum();
    let at = |share: u8| total * usize::from(share) / 256;
    let (cut, changed) = (at(*cut_at), (*flip != 0).then(|| at(*flip_at)));
    let mut start = 0;
    for (path, len) in segments.iter().zip(&lens) {
        let mut b = std::fs::read(path).expect("a segment");
        if let Some(c) = changed.filter(|c| (start..start + len).contains(c)) {
            b[c - start] ^= flip;
        }
        // a crash loses the log's tail: the segment the cut falls in is cut, later ones go
        if start >= cut {
            std::fs::remove_file(path).expect("a segment removed");
            start += len;
            continue;
        }
        if cut < start + len {
            b.truncate(cut - start);
        }
        std::fs::write(path, &b).expect("a segment rewritten");
        start += len;
    }
    match Wal::open(dir.path(), config, 0) {
        Ok((_, recovered)) => {
            let got: Vec<&Vec<Op>> = recovered.records.iter().map(|r| &r.ops).collect();
            assert!(
                got.len() <= written.len(),
                "more calls recovered than written"
            );
            for (i, (g, w)) in got.iter().zip(&written).enumerate() {
                assert_eq!(*g, w, "call {i} recovered other than written");
                assert_eq!(recovered.records[i].lsn, i as u64 + 1);
            }
        }
        Err(e) => assert!(
            changed.is_some(),
            "a log only cut short (a crash) is refused: {e}"
        ),
    }
}
