//! The store's conformance suite: every implementation of [`StoreApi`] must give the same
//! answers and the same typed errors. Each crate with an implementation runs it over its own
//! (`nearrec`'s `tests/contract.rs`: the embedded store on the DRAM tier and on the SSD tier
//! behind DRAM tiers; `nearrec-client`'s `tests/contract.rs`: a loopback node). The answers are
//! checked against a pooling written here from the rows' values, not against another store.

#![allow(dead_code)] // each runner uses what its implementations serve

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nearrec::format::DType;
use nearrec::model::{GraphSpec, ModelConfig, OpSpec, Tensor};
use nearrec::{
    Bags, Batch, Decision, ErrorKind, Indices, NewTable, OwnedBatch, OwnedLookup, PoolingMode,
    RowValues, RowWrite, StoreApi, SwapTo, TableLookup, TxState, WriteOptions,
};
use nearrec_testkit::Xorshift;

/// An implementation opened over a store directory: the store, and whatever keeps it served
/// (a node) for as long as the test holds it.
pub struct Opened {
    pub store: Arc<dyn StoreApi>,
    pub keep: Box<dyn std::any::Any>,
    /// What this store cannot do beyond its capabilities' traits, each with why: a case that
    /// needs one ends where it asks (`lacking!`). Said by the runner that knows the store.
    pub lacks: Vec<(&'static str, &'static str)>,
}

/// Opens the store at `path` as the implementation under test serves it, writable or not.
pub type Open = fn(path: &Path, writable: bool) -> Opened;

/// The suite's tests over the implementation `$open` opens: one `#[test]` each, so a failure
/// names the check.
macro_rules! store_api_suite {
    ($open:path) => {
        #[test]
        fn lookups_pool_as_the_reference_for_every_mode() {
            crate::suite::lookups_pool_as_the_reference_for_every_mode($open);
        }

        #[test]
        fn answers_come_in_the_dtype_asked() {
            crate::suite::answers_come_in_the_dtype_asked($open);
        }

        #[test]
        fn writes_are_read_back_at_their_version() {
            crate::suite::writes_are_read_back_at_their_version($open);
        }

        #[test]
        fn a_replica_changes_membership_is_fenced_and_adopts_rows() {
            crate::suite::a_replica_changes_membership_is_fenced_and_adopts_rows($open);
        }

        #[test]
        fn a_prepared_write_commits_or_aborts_whole() {
            crate::suite::a_prepared_write_commits_or_aborts_whole($open);
        }

        #[test]
        fn keyed_tables_are_looked_up_by_key() {
            crate::suite::keyed_tables_are_looked_up_by_key($open);
        }

        #[test]
        fn keyed_tables_are_written_by_key() {
            crate::suite::keyed_tables_are_written_by_key($open);
        }

        #[test]
        fn bad_input_gets_a_typed_error_naming_table_and_position() {
            crate::suite::bad_input_gets_a_typed_error_naming_table_and_position($open);
        }

        #[test]
        fn readers_see_whole_writes_while_writes_go_on() {
            crate::suite::readers_see_whole_writes_while_writes_go_on($open);
        }

        #[test]
        fn tables_are_created_dropped_compacted_and_synced() {
            crate::suite::tables_are_created_dropped_compacted_and_synced($open);
        }

        #[test]
        fn a_training_feed_compares_digests_where_the_rows_are() {
            crate::suite::a_training_feed_compares_digests_where_the_rows_are($open);
        }

        #[test]
        fn a_swap_serves_the_new_store_and_refuses_an_incompatible_one() {
            crate::suite::a_swap_serves_the_new_store_and_refuses_an_incompatible_one($open);
        }

        #[test]
        fn versions_swap_roll_back_and_survive_a_reopen() {
            crate::suite::versions_swap_roll_back_and_survive_a_reopen($open);
        }

        #[test]
        fn info_stats_and_submitted_lookups_agree() {
            crate::suite::info_stats_and_submitted_lookups_agree($open);
        }

        #[test]
        fn a_model_update_runs_its_new_weights_and_refuses_a_bad_one() {
            crate::suite::a_model_update_runs_its_new_weights_and_refuses_a_bad_one($open);
        }

        #[test]
        fn a_feed_applies_each_file_once_with_its_cursor() {
            crate::suite::a_feed_applies_each_file_once_with_its_cursor($open);
        }

        #[test]
        fn a_feeds_share_commits_once() {
            crate::suite::a_feeds_share_commits_once($open);
        }

        #[test]
        fn encoded_rows_are_written_as_they_are() {
            crate::suite::encoded_rows_are_written_as_they_are($open);
        }

        #[test]
        fn a_scrub_reads_every_table_where_it_lies_and_names_the_damaged_one() {
            crate::suite::a_scrub_reads_every_table_where_it_lies_and_names_the_damaged_one($open);
        }
    };
}

/// The store's capability `$cap` (`store.writes()` and the rest), or the case ends here, said on
/// stderr: the implementation has none, so the case is not its (each runner's
/// `capabilities_are_...` test holds which it has).
macro_rules! needs {
    ($store:expr, $cap:ident) => {
        match $store.$cap() {
            Some(c) => c,
            None => {
                eprintln!("skipped: {} has no {}", $store.describe(), stringify!($cap));
                return;
            }
        }
    };
}

/// The case ends here, said on stderr, when the store under test lacks `$what`
/// ([`Opened::lacks`]).
macro_rules! lacking {
    ($opened:expr, $what:literal) => {
        if let Some((_, why)) = $opened.lacks.iter().find(|(w, _)| *w == $what) {
            eprintln!(
                "skipped: {} lacks {}: {why}",
                $opened.store.describe(),
                $what
            );
            return;
        }
    };
}

mod feed;
pub use feed::*;

pub const ROWS: u64 = 300;
pub const DIM: u32 = 8;
/// The suite's tables: name and dtype.
pub const TABLES: [(&str, DType); 3] = [
    ("t0", DType::Fp32),
    ("t1", DType::Fp16),
    ("t2", DType::Int8),
];

/// The value of column `c` of row `r` of table `t`, as written (before the table's dtype).
pub fn value(t: usize, r: u64, c: u32, sign: f32) -> f32 {
    sign * (((r * 7919 + u64::from(c) * 131 + t as u64 * 31) % 1013) as f32 * 0.003 - 1.5)
}

/// A store of `tables` (`ROWS` × `DIM` each) at `dir/name`, values [`value`] × `sign`.
pub fn write_store(dir: &Path, name: &str, tables: &[(&str, DType)], sign: f32) -> PathBuf {
    let specs: Vec<_> = tables
        .iter()
        .map(|&(t, dtype)| (t, ROWS, DIM, dtype))
        .collect();
    nearrec_testkit::write_store(dir.join(name), &specs, |t, i| {
        value(t, i / u64::from(DIM), (i % u64::from(DIM)) as u32, sign)
    })
}

/// The suite's store in a fresh directory.
pub fn fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_store(dir.path(), "store", &TABLES, 1.0);
    (dir, path)
}

/// Row `r` of table `t` as the store serves it: written, then through its dtype.
fn row(t: usize, r: u64) -> Vec<f32> {
    let dtype = TABLES[t].1;
    let raw: Vec<f32> = (0..DIM).map(|c| value(t, r, c, 1.0)).collect();
    let mut bytes = vec![0u8; dtype.row_bytes(DIM) as usize];
    dtype.encode_row(&raw, &mut bytes);
    let mut out = vec![0f32; DIM as usize];
    dtype.decode_row(&bytes, &mut out);
    out
}

/// One table's random bags: ids, lengths, weights.
struct Bagged {
    ids: Vec<i64>,
    lengths: Vec<i64>,
    weights: Vec<f32>,
}

fn bags(rng: &mut Xorshift, batch: usize) -> Bagged {
    let lengths: Vec<i64> = (0..batch).map(|_| rng.below(6) as i64).collect();
    let n: i64 = lengths.iter().sum();
    let ids = (0..n).map(|_| rng.below(ROWS) as i64).collect();
    let weights = (0..n).map(|_| rng.below(100) as f32 * 0.02 - 1.0).collect();
    Bagged {
        ids,
        lengths,
        weights,
    }
}

/// The reference pooling of one table's bags (`torch.nn.EmbeddingBag`'s meaning).
fn pool(t: usize, b: &Bagged, mode: PoolingMode, weighted: bool, padding: Option<i64>) -> Vec<f32> {
    let dim = DIM as usize;
    let mut out = Vec::new();
    let mut at = 0usize;
    for &len in &b.lengths {
        let mut acc = vec![0f32; dim];
        let mut max = vec![f32::NEG_INFINITY; dim];
        let mut n = 0usize;
        for k in at..at + len as usize {
            let id = b.ids[k];
            if Some(id) == padding {
                continue;
            }
            let r = row(t, id as u64);
            let w = if weighted { b.weights[k] } else { 1.0 };
            for c in 0..dim {
                acc[c] += w * r[c];
                max[c] = max[c].max(r[c]);
            }
            n += 1;
        }
        at += len as usize;
        match mode {
            PoolingMode::Max if n == 0 => out.extend(vec![0f32; dim]),
            PoolingMode::Max => out.extend(max),
            PoolingMode::Mean if n > 0 => out.extend(acc.iter().map(|v| v / n as f32)),
            _ => out.extend(acc),
        }
    }
    out
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{what}: value {i}: got {g}, want {w}"
        );
    }
}

pub fn lookups_pool_as_the_reference_for_every_mode(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, false);
    let store = &*s.store;
    let mut rng = Xorshift::new(1);
    let modes = [
        (PoolingMode::Sum, false),
        (PoolingMode::Sum, true),
        (PoolingMode::Mean, false),
        (PoolingMode::Max, false),
    ];
    for round in 0..12 {
        let batch = 1 + rng.below(9) as usize;
        let (mode, weighted) = modes[round % modes.len()];
        let padding = (round % 3 == 0).then(|| rng.below(ROWS) as i64);
        let parts: Vec<Bagged> = (0..TABLES.len()).map(|_| bags(&mut rng, batch)).collect();
        let narrow: Vec<Vec<i32>> = parts
            .iter()
            .map(|b| b.ids.iter().map(|&i| i as i32).collect())
            .collect();
        let offsets: Vec<Vec<i64>> = parts
            .iter()
            .map(|b| {
                let mut at = 0;
                b.lengths
                    .iter()
                    .map(|&l| {
                        at += l;
                        at - l
                    })
                    .collect()
            })
            .collect();
        let lookups = TABLES
            .iter()
            .enumerate()
            .map(|(t, (name, _))| {
                // the ways of giving bags and ids take turns over the tables
                let (ids, bags) = match (round + t) % 3 {
                    0 => (
                        Indices::I64(&parts[t].ids),
                        Bags::Lengths(Indices::I64(&parts[t].lengths)),
                    ),
                    1 => (
                        Indices::I32(&narrow[t]),
                        Bags::Offsets {
                            offsets: Indices::I64(&offsets[t]),
                            include_last_offset: false,
                        },
                    ),
                    _ => (
                        Indices::I64(&parts[t].ids),
                        Bags::Offsets {
                            offsets: Indices::I64(&offsets[t]),
                            include_last_offset: false,
                        },
                    ),
                };
                let mut l = TableLookup::new(name, ids, bags).with_mode(mode);
                if weighted {
                    l = l.with_weights(&parts[t].weights);
                }
                if let Some(p) = padding {
                    l = l.with_padding_idx(p);
                }
                l
            })
            .collect();
        let batch_ = Batch::new(lookups);
        let (pooled, _) = store.lookup(&batch_).unwrap();
        assert_eq!(pooled.batch, batch);
        let want: Vec<Vec<f32>> = (0..TABLES.len())
            .map(|t| pool(t, &parts[t], mode, weighted, padding))
            .collect();
        let width = DIM as usize * TABLES.len();
        for b in 0..batch {
            for (t, want) in want.iter().enumerate() {
                let got = &pooled.values[b * width + t * DIM as usize..][..DIM as usize];
                let what = format!("round {round}, {mode:?}, table {t}, bag {b}");
                close(got, &want[b * DIM as usize..][..DIM as usize], &what);
            }
        }
        // the same answer into the caller's buffer (to rounding: the SSD tier pools rows in
        // the order they land, the cached ones first)
        let mut out = vec![f32::NAN; pooled.values.len()];
        store.lookup_into(&batch_, &mut out).unwrap();
        close(&out, &pooled.values, &format!("round {round}: lookup_into"));
    }
    // the distinct rows a batch reads, ascending
    let ids = [7i64, 3, 7, 299];
    let b = Batch::new(vec![TableLookup::new(
        "t1",
        Indices::I64(&ids),
        Bags::Fixed {
            batch: 2,
            bag_size: 2,
        },
    )]);
    let (rows, _) = store.lookup_rows(&b).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].ids, vec![3, 7, 299]);
    let want: Vec<f32> = [3, 7, 299].iter().flat_map(|&r| row(1, r)).collect();
    close(&rows[0].values, &want, "lookup_rows");
    let mut out = vec![0f32; 2 * DIM as usize];
    store.read_rows("t2", &[5, 0], &mut out).unwrap();
    let want: Vec<f32> = [5, 0].iter().flat_map(|&r| row(2, r)).collect();
    close(&out, &want, "read_rows");
}

/// A lookup asked in fp16, bf16 or int8 answers its fp32 answer rounded once, whatever serves
/// it — pooled in fp32 where the rows are, rounded where the answer leaves — by `lookup`,
/// `lookup_into`, `submit` and `stream`.
pub fn answers_come_in_the_dtype_asked(open: Open) {
    use nearrec::{AsBatch, OutDtype};
    let (_dir, path) = fixture();
    let s = open(&path, false);
    let store = &*s.store;
    let mut rng = Xorshift::new(5);
    let batch = 7;
    let parts: Vec<Bagged> = (0..TABLES.len()).map(|_| bags(&mut rng, batch)).collect();
    let owned = OwnedBatch::new(
        (TABLES.iter().zip(&parts))
            .map(|((name, _), b)| {
                OwnedLookup::with_lengths(*name, b.ids.clone(), b.lengths.clone())
            })
            .collect(),
    );
    let (fp32, _) = store.lookup(&owned.as_batch()).unwrap();
    let widths = vec![DIM as usize; TABLES.len()];
    for out in [OutDtype::F16, OutDtype::Bf16, OutDtype::Int8] {
        let asked = OwnedBatch {
            out,
            ..owned.clone()
        };
        let (got, _) = store.lookup(&asked.as_batch()).unwrap();
        assert_eq!(
            (got.batch, &got.tables),
            (fp32.batch, &fp32.tables),
            "{out:?}"
        );
        let mut want = fp32.values.clone();
        nearrec::out::round(&mut want, &widths, out);
        // one rounding of the fp32 answer: the same but where the fp32 answers differ in their
        // last bits (the SSD tier sums rows in the order they land), then by one step of the
        // dtype at most
        let same = got.values.iter().zip(&want).filter(|(g, w)| g == w).count();
        if out != OutDtype::Int8 {
            let n = want.len();
            assert!(same * 10 >= n * 9, "{out:?}: {same} of {n} as rounded");
        }
        // int8: each bag's vector of each table lies on its own grid of 256 steps
        let segments = got.values.chunks(DIM as usize);
        for segment in segments.filter(|_| out == OutDtype::Int8) {
            let lo = segment.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = segment.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let step = (hi - lo) / 255.0;
            if step > 0.0 {
                let off = |v: f32| ((v - lo) / step - ((v - lo) / step).round()).abs();
                assert!(
                    segment.iter().all(|&v| off(v) < 1e-2),
                    "{out:?}: {segment:?}"
                );
            }
        }
        for (i, ((g, w), v)) in got.values.iter().zip(&want).zip(&fp32.values).enumerate() {
            let bag = i / (DIM as usize * TABLES.len());
            let segment = &fp32.values[i - i % DIM as usize..][..DIM as usize];
            let step = match out {
                OutDtype::F16 => v.abs() / 1024.0,
                OutDtype::Bf16 => v.abs() / 128.0,
                _ => {
                    let lo = segment.iter().copied().fold(f32::INFINITY, f32::min);
                    let hi = segment.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    (hi - lo) / 255.0
                }
            };
            assert!(
                g == w || (g - w).abs() <= step * 1.01 + 1e-6,
                "{out:?}: bag {bag} value {i}: got {g}, want {w} (fp32 {v})"
            );
            if out != OutDtype::Int8 {
                let mut again = [*g];
                nearrec::out::round(&mut again, &[1], out);
                assert_eq!(again[0], *g, "{out:?}: value {i} is not a {}", out.name());
            }
        }
        let mut into = vec![f32::NAN; got.values.len()];
        store.lookup_into(&asked.as_batch(), &mut into).unwrap();
        assert_eq!(into, got.values, "{out:?}: lookup_into");
        let submitted = store
            .submit(Box::new(asked.clone()))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(submitted.values, got.values, "{out:?}: submit");
        let mut streamed = store.stream(vec![Box::new(asked) as Box<dyn AsBatch>], 1);
        let streamed = streamed.next().unwrap().unwrap();
        assert_eq!(streamed.values, got.values, "{out:?}: stream");
    }
}

/// One bag of one id per row of `ids` in table `t0`.
fn rows_batch(ids: &[i64]) -> Batch<'_> {
    Batch::new(vec![TableLookup::new(
        "t0",
        Indices::I64(ids),
        Bags::Fixed {
            batch: ids.len(),
            bag_size: 1,
        },
    )])
}

pub fn writes_are_read_back_at_their_version(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let writes = needs!(store, writes);
    let v0 = store.version().unwrap();
    let ids = [4i64, 9];
    let new: Vec<f32> = (0..2 * DIM).map(|i| i as f32 + 0.25).collect();
    let w = RowWrite {
        table: "t0",
        ids: &ids,
        values: Some(RowValues::F32(&new)),
    };
    let v1 = writes.write_many(&[w], WriteOptions::default()).unwrap();
    assert!(v1 > v0);
    assert_eq!(store.version().unwrap(), v1);
    let (pooled, read) = store.lookup(&rows_batch(&ids)).unwrap();
    assert_eq!(read.version, v1);
    assert_eq!(pooled.values, new);
    // a write and a remove in one atomic call
    let one = [1.5f32; DIM as usize];
    let calls = [
        RowWrite {
            table: "t0",
            ids: &ids[..1],
            values: None,
        },
        RowWrite {
            table: "t1",
            ids: &[2],
            values: Some(RowValues::F32(&one)),
        },
    ];
    let v2 = writes.write_many(&calls, WriteOptions::default()).unwrap();
    assert!(v2 > v1);
    let (pooled, _) = store.lookup(&rows_batch(&ids)).unwrap();
    assert_eq!(&pooled.values[..DIM as usize], &[0.0; DIM as usize]);
    assert_eq!(&pooled.values[DIM as usize..], &new[DIM as usize..]);
    let mut out = vec![0f32; DIM as usize];
    store.read_rows("t1", &[2], &mut out).unwrap();
    assert_eq!(out, one);
    // a refused write changes nothing
    let nan = [f32::NAN; DIM as usize];
    let bad = RowWrite {
        table: "t0",
        ids: &[1],
        values: Some(RowValues::F32(&nan)),
    };
    let e = writes
        .write_many(&[bad], WriteOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!(e.table(), Some("t0"), "{e}");
    assert_eq!(store.version().unwrap(), v2);
}

/// A replica's place in its shard (`docs/distributed.md`, "A replica catching up"): its
/// membership changed only by compare-and-set of its epoch; a write at another epoch, or to a
/// replica that is no member, refused; a fence that drains what is prepared and refuses new
/// prepares until the membership changes; rows adopted at the shard's count of writes, by a
/// replica that is no member only, read back exactly — int8 rows too.
pub fn a_replica_changes_membership_is_fenced_and_adopts_rows(open: Open) {
    use std::time::Duration;
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let replica = needs!(store, replica);
    let writes = needs!(store, writes);
    let d = DIM as usize;
    let m = replica.membership().unwrap();
    let me = m.replica;
    assert!(
        me != 0 && m.epoch == 0 && m.members.is_empty() && m.is_member(),
        "{m:?}"
    );
    let new: Vec<f32> = (0..d).map(|i| i as f32 * 0.25).collect();
    let w = RowWrite {
        table: "t0",
        ids: &[9],
        values: Some(RowValues::F32(&new)),
    };
    // a write at another epoch is refused before it is prepared
    let e =
        (replica.prepare_write(1, &[w], WriteOptions::default(), "", Some(3), None)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MembershipChanged, "{e}");
    assert!(replica.transactions().unwrap().is_empty());
    // compare-and-set: from the epoch held, forward only
    let e = replica.set_membership(1, 2, &[me]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MembershipChanged, "{e}");
    let e = replica.set_membership(0, 0, &[me]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MembershipChanged, "{e}");
    let m = replica.set_membership(0, 4, &[77, me]).unwrap();
    assert_eq!((m.epoch, m.members.len()), (4, 2));
    assert_eq!(replica.membership().unwrap(), m);
    // past epoch 0, a write sent to one replica alone is refused: it would miss the others
    let e = writes
        .write_many(&[w], WriteOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MembershipChanged, "{e}");
    replica
        .prepare_write(1, &[w], WriteOptions::default(), "", Some(4), None)
        .unwrap();
    // a fence waits for what is prepared to be decided, then holds the count of writes
    let fenced = std::thread::scope(|scope| {
        let fence = scope.spawn(|| replica.fence(4, Duration::from_secs(20)));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !fence.is_finished(),
            "the fence drains the prepared write first"
        );
        let v = replica.decide(1, Decision::Commit, false).unwrap();
        (fence.join().unwrap().unwrap(), v)
    });
    assert_eq!(fenced.0, fenced.1);
    let m = replica.membership().unwrap();
    assert!(m.fenced_at_ms.is_some() && !m.fence_expired(), "{m:?}");
    let e =
        (replica.prepare_write(2, &[w], WriteOptions::default(), "", Some(4), None)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "fenced: {e}");
    let e = replica.fence(3, Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MembershipChanged, "{e}");
    // a member does not adopt rows
    let e = replica
        .adopt(&[w], WriteOptions::default(), 99)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MembershipChanged, "{e}");
    // out: no write at all is taken; the fence is lifted
    let m = replica.set_membership(4, 5, &[77]).unwrap();
    assert!(!m.is_member() && m.fenced_at_ms.is_none(), "{m:?}");
    let e =
        (replica.prepare_write(2, &[w], WriteOptions::default(), "", Some(5), None)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MembershipChanged, "{e}");
    // rows copied from a replica ahead: its count becomes this one's; int8 rows read and
    // adopted stay the same rows
    let v = store.version().unwrap();
    let mut int8 = vec![0f32; 3 * d];
    store.read_rows("t2", &[0, 1, 299], &mut int8).unwrap();
    let before = store.row_digests("t2", 0, ROWS).unwrap();
    let copied = [
        RowWrite {
            table: "t0",
            ids: &[9],
            values: Some(RowValues::F32(&new)),
        },
        RowWrite {
            table: "t2",
            ids: &[0, 1, 299],
            values: Some(RowValues::F32(&int8)),
        },
    ];
    let e = replica
        .adopt(&copied, WriteOptions::default(), v)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "not behind: {e}");
    assert_eq!(
        replica
            .adopt(&copied, WriteOptions::default(), v + 40)
            .unwrap(),
        v + 40
    );
    assert_eq!(store.version().unwrap(), v + 40);
    assert_eq!(store.row_digests("t2", 0, ROWS).unwrap(), before);
    let mut got = vec![0f32; d];
    store.read_rows("t0", &[9], &mut got).unwrap();
    assert_eq!(got, new);
    // no rows: only the count; behind it: refused
    assert_eq!(
        replica.adopt(&[], WriteOptions::default(), v + 41).unwrap(),
        v + 41
    );
    assert_eq!(
        replica.adopt(&[], WriteOptions::default(), v + 41).unwrap(),
        v + 41
    );
    let e = replica.adopt(&[], WriteOptions::default(), v).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    // back in: writes at the new epoch are taken and counted on from the adopted count
    replica.set_membership(5, 6, &[me, 77]).unwrap();
    replica
        .prepare_write(3, &[w], WriteOptions::default(), "", Some(6), None)
        .unwrap();
    assert_eq!(replica.decide(3, Decision::Commit, false).unwrap(), v + 42);
}

/// A cross-shard write as one shard takes part in it: prepared (durable, not served), then
/// committed (served) or aborted (never served); a second transaction on a held row refused.
pub fn a_prepared_write_commits_or_aborts_whole(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let replica = needs!(store, replica);
    let d = DIM as usize;
    let ids = [5i64, 6];
    let before = {
        let mut out = vec![0f32; 2 * d];
        store.read_rows("t0", &ids, &mut out).unwrap();
        out
    };
    let new: Vec<f32> = (0..2 * d).map(|i| i as f32 - 3.5).collect();
    let w = RowWrite {
        table: "t0",
        ids: &ids,
        values: Some(RowValues::F32(&new)),
    };
    let (t1, t2, t3) = (0x11u128 << 100 | 1, 0x22u128 << 100 | 2, 3u128);
    let v0 = store.version().unwrap();
    replica
        .prepare_write(t1, &[w], WriteOptions::default(), "decider=0/0", None, None)
        .unwrap();
    // again: the same transaction, prepared already
    replica
        .prepare_write(t1, &[w], WriteOptions::default(), "decider=0/0", None, None)
        .unwrap();
    let mut out = vec![0f32; 2 * d];
    // a prepared write is not served: its rows read as before, or, through a node (whose
    // lookups wait for the decision of a transaction holding a row they read), not at all
    match store.read_rows("t0", &ids, &mut out) {
        Ok(()) => assert_eq!(out, before, "a prepared write is not served"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}"),
    }
    // nothing of it served, and no write counted (its record is in the transactions' own log)
    assert_eq!(store.version().unwrap(), v0);
    let listed = replica.transactions().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].tx, listed[0].state), (t1, TxState::Prepared));
    assert_eq!(listed[0].note, "decider=0/0");
    // another transaction on a held row is refused, naming the table; one on other rows is not
    let other = RowWrite {
        table: "t0",
        ids: &[7, 6],
        values: Some(RowValues::F32(&new)),
    };
    let e = replica
        .prepare_write(t2, &[other], WriteOptions::default(), "", None, None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}");
    assert_eq!(e.table(), Some("t0"), "{e}");
    let apart = RowWrite {
        table: "t1",
        ids: &[6],
        values: Some(RowValues::F32(&new[..d])),
    };
    replica
        .prepare_write(t2, &[apart], WriteOptions::default(), "", None, None)
        .unwrap();
    // bad input is refused as a write's is, and nothing is prepared
    let e = replica
        .prepare_write(
            t3,
            &[RowWrite {
                table: "t2",
                ids: &[1, ROWS as i64],
                values: Some(RowValues::F32(&new)),
            }],
            WriteOptions::default(),
            "",
            None,
            None,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!((e.table(), e.position()), (Some("t2"), Some(1)), "{e}");
    // commit: served at a new version; again: done already
    let v1 = replica.decide(t1, Decision::Commit, true).unwrap();
    assert!(v1 > v0);
    assert_eq!(replica.decide(t1, Decision::Commit, true).unwrap(), v1);
    store.read_rows("t0", &ids, &mut out).unwrap();
    assert_eq!(out, new);
    // abort: never served; kept, a late prepare of it is refused; an abort cannot commit
    replica.decide(t2, Decision::Abort, true).unwrap();
    let mut one = vec![0f32; d];
    store.read_rows("t1", &[6], &mut one).unwrap();
    assert_eq!(one, row(1, 6));
    let e = replica
        .prepare_write(t2, &[apart], WriteOptions::default(), "", None, None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    let e = replica.decide(t2, Decision::Commit, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    let e = replica.decide(t1, Decision::Abort, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    // an unknown transaction: nothing to commit; its abort is kept when asked
    let e = replica.decide(t3, Decision::Commit, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    replica.decide(t3, Decision::Abort, true).unwrap();
    let mut states: Vec<_> = (replica.transactions().unwrap().iter())
        .map(|t| (t.tx, t.state))
        .collect();
    states.sort_unstable_by_key(|s| s.0);
    assert_eq!(
        states,
        [
            (t3, TxState::Aborted),
            (t1, TxState::Applied),
            (t2, TxState::Aborted)
        ]
    );
    for t in [t1, t2, t3] {
        replica.forget(t).unwrap();
    }
    assert!(replica.transactions().unwrap().is_empty());
    // no write after the commit: aborts and forgets are none
    assert_eq!(store.version().unwrap(), v1);
}

pub fn bad_input_gets_a_typed_error_naming_table_and_position(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, false);
    let store = &*s.store;
    let writes = needs!(store, writes);
    let inference = needs!(store, inference);
    let check = |batch: &Batch<'_>, kind: ErrorKind, table: &str, position: Option<usize>| {
        let e = store.lookup(batch).unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert_eq!(e.table(), Some(table), "{e}");
        if position.is_some() {
            assert_eq!(e.position(), position, "{e}");
        }
    };
    let ids = [1i64, 2, 300];
    check(&rows_batch(&ids), ErrorKind::IndexOutOfRange, "t0", Some(2));
    let neg = [0i64, -1];
    check(&rows_batch(&neg), ErrorKind::IndexOutOfRange, "t0", Some(1));
    let unknown = Batch::new(vec![TableLookup::new(
        "nope",
        Indices::I64(&ids[..1]),
        Bags::Fixed {
            batch: 1,
            bag_size: 1,
        },
    )]);
    check(&unknown, ErrorKind::UnknownTable, "nope", None);
    let lengths = [1i64, 5];
    let short = Batch::new(vec![TableLookup::new(
        "t1",
        Indices::I64(&ids[..2]),
        Bags::Lengths(Indices::I64(&lengths)),
    )]);
    check(&short, ErrorKind::InvalidRequest, "t1", None);
    let weights = [1.0f32];
    let unweighted = Batch::new(vec![
        TableLookup::new(
            "t2",
            Indices::I64(&ids[..2]),
            Bags::Fixed {
                batch: 1,
                bag_size: 2,
            },
        )
        .with_weights(&weights),
    ]);
    check(&unweighted, ErrorKind::InvalidRequest, "t2", None);
    // writes to a store opened read-only
    let one = [0f32; DIM as usize];
    let w = RowWrite {
        table: "t0",
        ids: &[0],
        values: Some(RowValues::F32(&one)),
    };
    let e = writes
        .write_many(&[w], WriteOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreReadOnly, "{e}");
    // a model the store does not keep
    let e = inference.infer(&[], &rows_batch(&ids[..1])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    // nothing failed for good: the store still answers
    assert!(store.lookup(&rows_batch(&ids[..2])).is_ok());
}

pub fn readers_see_whole_writes_while_writes_go_on(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = s.store.clone();
    let writes = needs!(store, writes);
    let ids: Vec<i64> = (0..32).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, ids, stop) = (store.clone(), ids.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0.0f32;
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) || reads == 0 {
                    let (pooled, _) = store.lookup(&rows_batch(&ids)).unwrap();
                    // every write sets all 32 rows to one value: a lookup sees one write whole
                    let first = pooled.values[0];
                    if first >= 1000.0 {
                        assert!(pooled.values.iter().all(|&v| v == first), "a torn write");
                        assert!(first >= seen, "a write seen, then an older one");
                        seen = first;
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for k in 0..20 {
        let values = vec![1000.0 + k as f32; ids.len() * DIM as usize];
        let w = RowWrite {
            table: "t0",
            ids: &ids,
            values: Some(RowValues::F32(&values)),
        };
        writes.write_many(&[w], WriteOptions::default()).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let (pooled, _) = store.lookup(&rows_batch(&ids)).unwrap();
    assert!(pooled.values.iter().all(|&v| v == 1019.0));
}

pub fn tables_are_created_dropped_compacted_and_synced(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let writes = needs!(store, writes);
    let schema = needs!(store, schema);
    let v = schema
        .create_table(&NewTable {
            name: "fresh",
            rows: 50,
            dim: 4,
            dtype: DType::Fp32,
            init: nearrec::Init::Zeros,
        })
        .unwrap();
    assert_eq!(store.version().unwrap(), v);
    let t = store.table("fresh").unwrap();
    assert_eq!((t.rows, t.dim, t.dtype), (50, 4, DType::Fp32));
    let mut out = vec![1f32; 8];
    store.read_rows("fresh", &[0, 49], &mut out).unwrap();
    assert_eq!(out, vec![0.0; 8]);
    // a trainer's copy of the table: two rows differ
    let mut values = vec![0f32; 50 * 4];
    values[4..8].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    values[196..200].copy_from_slice(&[5.0; 4]);
    let synced = writes.sync_table("fresh", &values, 0.0).unwrap();
    assert_eq!((synced.compared, synced.written), (50, 2));
    assert_eq!(writes.sync_table("fresh", &values, 0.0).unwrap().written, 0);
    store.read_rows("fresh", &[1, 49], &mut out).unwrap();
    assert_eq!(out, vec![1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]);
    let done = writes.compact().unwrap();
    assert_eq!(done.version, store.version().unwrap());
    store.read_rows("fresh", &[1, 49], &mut out).unwrap();
    assert_eq!(out, vec![1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]);
    schema.drop_table("fresh").unwrap();
    let e = store.table("fresh").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownTable, "{e}");
    let e = schema.drop_table("fresh").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownTable, "{e}");
    assert_eq!(e.table(), Some("fresh"), "{e}");
}

pub fn a_training_feed_compares_digests_where_the_rows_are(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let writes = needs!(store, writes);
    let (rows, dim) = (ROWS as usize, DIM as usize);
    // each row's digest is the digest of the row as served, every table's dtype
    for (t, &(name, _)) in TABLES.iter().enumerate() {
        let digests = store.row_digests(name, 0, ROWS).unwrap();
        assert_eq!(digests.len(), rows);
        for r in [0, 1, 150, ROWS - 1] {
            assert_eq!(
                digests[r as usize],
                nearrec::row_digest(&row(t, r)),
                "{name}[{r}]"
            );
        }
        assert_eq!(store.row_digests(name, 10, 5).unwrap(), digests[10..15]);
    }
    // one NaN and one zero whatever their signs: equal rows, equal digests
    assert_eq!(
        nearrec::row_digest(&[f32::NAN, -0.0, 1.0]),
        nearrec::row_digest(&[-f32::NAN, 0.0, 1.0])
    );
    assert_ne!(
        nearrec::row_digest(&[1.0, 2.0]),
        nearrec::row_digest(&[2.0, 1.0])
    );
    for (first, count) in [
        (ROWS - 5, 6),
        (0, nearrec::MAX_DIGEST_ROWS + 1),
        (u64::MAX, 2),
    ] {
        let e = store.row_digests("t0", first, count).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        assert_eq!(e.table(), Some("t0"), "{e}");
    }
    let e = store.row_digests("nope", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownTable, "{e}");
    // the values as written: every fp16 and int8 row rounds to what is served, none is written
    for (t, &(name, _)) in TABLES.iter().enumerate() {
        let values: Vec<f32> = (0..ROWS)
            .flat_map(|r| (0..DIM).map(move |c| value(t, r, c, 1.0)))
            .collect();
        let done = writes.sync_table(name, &values, 0.0).unwrap();
        assert_eq!(
            (done.compared, done.written, done.calls),
            (ROWS, 0, 0),
            "{name}"
        );
    }
    // a trainer's copy of t0: row 3 moved within the tolerance, row 7 past it
    let mut values: Vec<f32> = (0..ROWS).flat_map(|r| row(0, r)).collect();
    values[3 * dim] += 0.001;
    values[7 * dim + 1] += 1.0;
    let before = store.version().unwrap();
    let done = writes.sync_table("t0", &values, 0.01).unwrap();
    assert_eq!((done.written, done.calls), (1, 1));
    assert_eq!(done.version, store.version().unwrap());
    assert!(done.version > before);
    let mut out = vec![0f32; dim];
    store.read_rows("t0", &[7], &mut out).unwrap();
    assert_eq!(out, values[7 * dim..8 * dim]);
    // no tolerance: the small change is a change too, and then nothing is left
    assert_eq!(writes.sync_table("t0", &values, 0.0).unwrap().written, 1);
    assert_eq!(writes.sync_table("t0", &values, 0.0).unwrap().written, 0);
    let digests = store.row_digests("t0", 0, ROWS).unwrap();
    assert_eq!(digests[3], nearrec::row_digest(&values[3 * dim..4 * dim]));
}

pub fn a_swap_serves_the_new_store_and_refuses_an_incompatible_one(open: Open) {
    let (dir, path) = fixture();
    let next = write_store(dir.path(), "next", &TABLES, -1.0);
    let other = write_store(dir.path(), "other", &TABLES[..1], 1.0);
    let s = open(&path, false);
    lacking!(s, "path swaps");
    let store = &*s.store;
    let versions = needs!(store, versions);
    let ids = [3i64, 8];
    let (before, _) = store.lookup(&rows_batch(&ids)).unwrap();
    let e = versions.swap(&to(&other), false, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!(
        store.lookup(&rows_batch(&ids)).unwrap().0.values,
        before.values
    );
    versions.swap(&to(&next), true, false).unwrap();
    let (after, _) = store.lookup(&rows_batch(&ids)).unwrap();
    let negated: Vec<f32> = before.values.iter().map(|v| -v).collect();
    close(&after.values, &negated, "after the swap");
    // with force, a store that answers less is served too
    versions.swap(&to(&other), false, true).unwrap();
    assert_eq!(store.info().unwrap().tables.len(), 1);
    // a store not served from a repository has no versions to swap to
    for by_version in [SwapTo::Version(1), SwapTo::Previous] {
        let e = versions.swap(&by_version, false, false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    }
}

/// A swap to a path.
fn to(path: &Path) -> SwapTo {
    SwapTo::Path(path.to_string_lossy().into_owned())
}

/// A repository of three versions of the suite's store (rows × 1, × −1, × 2) whose pointer
/// names version 1.
pub fn repository() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = nearrec::format::Repository::create(&dir.path().join("dlrm")).unwrap();
    for (k, sign) in [(1, 1.0), (2, -1.0), (3, 2.0)] {
        let built = write_store(dir.path(), &format!("built{k}"), &TABLES, sign);
        let how = nearrec::format::Publish::Move;
        assert_eq!(repo.publish(&built, how).unwrap(), k);
    }
    let pointer = nearrec::format::Pointer {
        current: 1,
        history: Vec::new(),
    };
    repo.set_pointer(&pointer).unwrap();
    (dir, repo.path().to_path_buf())
}

pub fn versions_swap_roll_back_and_survive_a_reopen(open: Open) {
    let (_dir, path) = repository();
    let ids = [3i64, 8];
    let served = |store: &dyn StoreApi| store.lookup(&rows_batch(&ids)).unwrap().0.values;
    let s = open(&path, false);
    lacking!(s, "a repository's versions");
    let store = &*s.store;
    let versions = needs!(store, versions);
    let first = served(store);
    let info = store.info().unwrap();
    assert_eq!(
        (info.served_version, info.versions.clone()),
        (Some(1), vec![1, 2, 3])
    );
    assert!(info.path.ends_with("dlrm/1"), "{}", info.path);

    versions.swap(&SwapTo::Version(3), true, false).unwrap();
    let doubled: Vec<f32> = first.iter().map(|v| v * 2.0).collect();
    close(&served(store), &doubled, "version 3");
    versions.swap(&SwapTo::Version(2), false, false).unwrap();
    let negated: Vec<f32> = first.iter().map(|v| -v).collect();
    close(&served(store), &negated, "version 2");
    // a rollback goes to the version served before (3), not the one numbered before (1)
    versions.swap(&SwapTo::Previous, false, false).unwrap();
    close(&served(store), &doubled, "rolled back to 3");
    assert_eq!(store.info().unwrap().served_version, Some(3));

    for (bad, kind) in [
        (SwapTo::Version(9), ErrorKind::StoreNotFound),
        (SwapTo::Version(3), ErrorKind::InvalidRequest), // served now
    ] {
        let e = versions.swap(&bad, false, false).unwrap_err();
        assert_eq!(e.kind(), kind, "{bad:?}: {e}");
    }
    // a refused swap leaves what is served, and what a restart serves, as it was
    close(&served(store), &doubled, "after refused swaps");
    drop(s);

    let s = open(&path, false);
    assert_eq!(
        s.store.info().unwrap().served_version,
        Some(3),
        "after a reopen"
    );
    close(&served(&*s.store), &doubled, "version 3 after a reopen");
    s.store
        .versions()
        .expect("versions, as before")
        .swap(&SwapTo::Previous, false, false)
        .unwrap();
    close(&served(&*s.store), &first, "rolled back to 1");
    let e = s
        .store
        .versions()
        .expect("versions, as before")
        .swap(&SwapTo::Previous, false, false)
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidRequest,
        "nothing left to roll back to: {e}"
    );
}

pub fn info_stats_and_submitted_lookups_agree(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, false);
    let store = &*s.store;
    let info = store.info().unwrap();
    let names: Vec<&str> = info.tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["t0", "t1", "t2"]);
    assert!(info.tables.iter().all(|t| (t.rows, t.dim) == (ROWS, DIM)));
    assert!(!info.writable && !info.model);
    assert!(
        ["dram", "ssd"].contains(&info.tier.as_str()),
        "{}",
        info.tier
    );
    // submitted and streamed lookups answer as lookups do
    let batches: Vec<OwnedBatch> = (0..6)
        .map(|k| {
            let ids: Vec<i64> = (0..4).map(|i| (k * 37 + i * 11) % ROWS as i64).collect();
            OwnedBatch::new(vec![OwnedLookup::with_lengths("t0", ids, vec![2i64, 2])])
        })
        .collect();
    let direct: Vec<Vec<f32>> = batches
        .iter()
        .map(|b| {
            use nearrec::AsBatch;
            store.lookup(&b.as_batch()).unwrap().0.values
        })
        .collect();
    let pending: Vec<_> = batches
        .iter()
        .map(|b| store.submit(Box::new(b.clone())).unwrap())
        .collect();
    for (p, want) in pending.into_iter().zip(&direct) {
        close(&p.wait().unwrap().values, want, "submit");
    }
    let boxed = batches
        .into_iter()
        .map(|b| Box::new(b) as Box<dyn nearrec::AsBatch>);
    let streamed = store.stream(boxed.collect::<Vec<_>>(), 3);
    let mut n = 0;
    for (got, want) in streamed.zip(&direct) {
        close(&got.unwrap().values, want, "stream");
        n += 1;
    }
    assert_eq!(n, direct.len());
    // the counters: one per table in the tier report where there are DRAM tiers
    let stats = store.stats().unwrap();
    assert!(stats.get("version").is_some(), "{stats:?}");
    let report = store.tier_report().unwrap();
    assert!(
        report.is_empty() || report.len() == TABLES.len(),
        "{report:?}"
    );
}

/// Keeps with the store at `path` a model of one linear layer over `t0`'s pooled rows:
/// `top.weight` (`[1, DIM]`) and `top.bias` (`[1]`).
pub fn keep_model(path: &Path, weight: &[f32], bias: f32) {
    let dim = DIM as usize;
    let config = ModelConfig {
        model: "graph".into(),
        variant: "deeprecsys".into(),
        interaction: "cat".into(),
        tasks: 1,
        tables: Some(vec!["t0".into()]),
        features: None,
        pooling: None,
        sequence: false,
        graph: Some(GraphSpec {
            dense: 0,
            ops: vec![OpSpec::Linear {
                input: vec![(1, 0, dim)],
                weight: "top.weight".into(),
                bias: Some("top.bias".into()),
                activation: "none".into(),
            }],
            output: vec![(2, 0, 1)],
        }),
    };
    nearrec::model::save(path, &config, &top(weight, &[bias])).unwrap();
}

/// The one-layer model's weights, as `top.weight` and `top.bias`.
fn top<'a>(weight: &'a [f32], bias: &'a [f32]) -> Vec<Tensor<'a>> {
    vec![
        Tensor {
            name: "top.weight",
            shape: &[1, DIM as usize],
            values: weight,
        },
        Tensor {
            name: "top.bias",
            shape: &[1],
            values: bias,
        },
    ]
}

pub fn a_model_update_runs_its_new_weights_and_refuses_a_bad_one(open: Open) {
    let (_dir, path) = fixture();
    let old: Vec<f32> = (0..DIM).map(|c| c as f32 * 0.1).collect();
    keep_model(&path, &old, 0.5);
    let ids = [3i64, 8, 299];
    // the model's output for each row: its weights' dot product with the row, plus the bias
    let want = |w: &[f32], b: f32| -> Vec<f32> {
        ids.iter()
            .map(|&r| {
                row(0, r as u64)
                    .iter()
                    .zip(w)
                    .map(|(x, y)| x * y)
                    .sum::<f32>()
                    + b
            })
            .collect()
    };
    let s = open(&path, true);
    let store = &*s.store;
    let inference = needs!(store, inference);
    assert!(store.info().unwrap().model);
    let out = inference.infer(&[], &rows_batch(&ids)).unwrap();
    close(&out.outputs, &want(&old, 0.5), "the kept model");

    let new: Vec<f32> = (0..DIM).map(|c| 1.0 - c as f32 * 0.2).collect();
    inference.update_model(&top(&new, &[-2.0])).unwrap();
    let out = inference.infer(&[], &rows_batch(&ids)).unwrap();
    close(&out.outputs, &want(&new, -2.0), "after the update");
    // a partial update keeps the rest; a trainer's wrapper prefix finds the kept name
    let bias = Tensor {
        name: "model.top.bias",
        ..top(&new, &[3.0])[1]
    };
    inference.update_model(&[bias]).unwrap();
    close(
        &inference.infer(&[], &rows_batch(&ids)).unwrap().outputs,
        &want(&new, 3.0),
        "after an update of the bias alone",
    );
    // the model as kept, with its weights as updated
    let saved = inference.saved_model().unwrap();
    assert_eq!(saved.config.tables.as_deref(), Some(&["t0".to_owned()][..]));
    let mut kept: Vec<(&str, Vec<f32>)> = (saved.weights())
        .map(|(name, _, values)| (name, values.to_vec()))
        .collect();
    kept.sort_by_key(|w| w.0);
    assert_eq!(kept, [("top.bias", vec![3.0]), ("top.weight", new.clone())]);

    // refused whole, naming the weight: unknown, misshapen, non-finite, twice, none
    let short = [0f32; 3];
    let nan = [f32::NAN; DIM as usize];
    let unknown = Tensor {
        name: "bottom.weight",
        shape: &[1, DIM as usize],
        values: &new,
    };
    let misshapen = Tensor {
        name: "top.weight",
        shape: &[1, 3],
        values: &short,
    };
    let twice = [top(&new, &[0.0])[1], top(&new, &[1.0])[1]];
    for (bad, says) in [
        (vec![top(&old, &[9.0])[1], unknown], "bottom.weight"),
        (vec![misshapen], "top.weight"),
        (top(&nan, &[9.0]), "top.weight"),
        (twice.to_vec(), "twice"),
        (Vec::new(), "no weights"),
    ] {
        let e = inference.update_model(&bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    close(
        &inference.infer(&[], &rows_batch(&ids)).unwrap().outputs,
        &want(&new, 3.0),
        "after the refused updates",
    );
    // durable: a reopen runs the updated weights; a read-only store refuses an update
    lacking!(s, "its model's updates at the path");
    drop(s);
    let s = open(&path, false);
    close(
        &s.store
            .inference()
            .expect("inference, as before")
            .infer(&[], &rows_batch(&ids))
            .unwrap()
            .outputs,
        &want(&new, 3.0),
        "after a reopen",
    );
    let e = s
        .store
        .inference()
        .expect("inference, as before")
        .update_model(&top(&old, &[0.0]))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreReadOnly, "{e}");
    // and a store that keeps no model says so: by its capabilities, or naming what is missing
    let (_other, bare) = fixture();
    let s = open(&bare, true);
    if let Some(inference) = s.store.inference() {
        let e = inference.update_model(&top(&old, &[0.0])).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        let e = inference.saved_model().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    }
}

/// Keys of the suite's keyed table: spread over the 64-bit range, negative as `i64` too.
pub fn suite_keys() -> Vec<u64> {
    (0..ROWS)
        .map(|r| (r + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555)
        .collect()
}

/// The suite's keyed store under `dir`: table `k` of [`suite_keys`], key `i`'s row
/// [`keyed_row`]`(i)`; the keys and the store's path.
fn keyed_store(dir: &Path) -> (Vec<u64>, PathBuf) {
    let keys = suite_keys();
    let path = nearrec_testkit::write_keyed_store(
        dir.join("keyed"),
        "k",
        &keys,
        DIM,
        DType::Fp32,
        |_, i| value(0, i / u64::from(DIM), (i % u64::from(DIM)) as u32, 1.0),
    );
    (keys, path)
}

/// The row [`keyed_store`] gives its `r`-th key.
fn keyed_row(r: usize) -> Vec<f32> {
    (0..DIM).map(|c| value(0, r as u64, c, 1.0)).collect()
}

/// A keyed table (`docs/format.md` §16) is looked up by raw key on every implementation: its
/// bags pool the keys' rows, its rows are read by key, an unknown key is `UnknownKey` naming the
/// table and position, and `info` says how many keys it holds.
pub fn keyed_tables_are_looked_up_by_key(open: Open) {
    let dir = tempfile::tempdir().unwrap();
    let (keys, path) = keyed_store(dir.path());
    let s = open(&path, true);
    let store = &*s.store;
    let info = store.info().unwrap();
    assert_eq!(info.tables[0].keys, Some(ROWS));
    let raw = keyed_row;
    let picks = [17usize, 3, 17, ROWS as usize - 1, 0];
    let ids: Vec<i64> = picks.iter().map(|&r| keys[r] as i64).collect();
    let lengths = [2i64, 0, 3];
    let batch = Batch::new(vec![TableLookup::new(
        "k",
        Indices::I64(&ids),
        Bags::Lengths(Indices::I64(&lengths)),
    )]);
    let (pooled, _) = store.lookup(&batch).unwrap();
    let mut want = vec![0f32; 3 * DIM as usize];
    for (b, rows) in [(0, &picks[..2]), (2, &picks[2..])] {
        for &r in rows {
            for (w, v) in want[b * DIM as usize..][..DIM as usize]
                .iter_mut()
                .zip(raw(r))
            {
                *w += v;
            }
        }
    }
    close(&pooled.values, &want, "keyed sums");
    let (rows, _) = store.lookup_rows(&batch).unwrap();
    let mut by_key: Vec<(i64, Vec<f32>)> =
        picks.iter().map(|&r| (keys[r] as i64, raw(r))).collect();
    by_key.sort_by_key(|p| p.0);
    by_key.dedup_by_key(|p| p.0);
    assert_eq!(rows[0].ids, by_key.iter().map(|p| p.0).collect::<Vec<_>>());
    close(
        &rows[0].values,
        &by_key.iter().flat_map(|p| p.1.clone()).collect::<Vec<_>>(),
        "rows by key",
    );
    // a key the table does not hold: named by its position
    let missing = [keys[5] as i64, 12345];
    let e = store
        .lookup(&Batch::new(vec![TableLookup::new(
            "k",
            Indices::I64(&missing),
            Bags::Fixed {
                batch: 1,
                bag_size: 2,
            },
        )]))
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.table(), e.position()),
        (ErrorKind::UnknownKey, Some("k"), Some(1)),
        "{e}"
    );
}

/// A writable keyed table built with no room: a new key is `KeysFull` naming the table and its
/// position, nothing of its call applied; an existing key's row is written by key, the key
/// removed (then unknown), and its freed row taken by a new key.
pub fn keyed_tables_are_written_by_key(open: Open) {
    let dir = tempfile::tempdir().unwrap();
    let (keys, path) = keyed_store(dir.path());
    let s = open(&path, true);
    let store = &*s.store;
    let writes = needs!(store, writes);
    let raw = keyed_row;
    let picks = [17usize];
    let ids: Vec<i64> = picks.iter().map(|&r| keys[r] as i64).collect();
    let d = DIM as usize;
    // a new key on the part of the key removed below however a sharded store cuts the table
    // (into up to 8 parts): the row the removal frees is one it can take
    let part = |key: i64, n: usize| nearrec::plan::key_part(key as u64, n);
    let new_key = (987_654_321i64..)
        .find(|&k| (2..=8).all(|n| part(k, n) == part(ids[0], n)) && !keys.contains(&(k as u64)))
        .unwrap();
    let one = Batch::new(vec![TableLookup::new(
        "k",
        Indices::I64(&ids[..1]),
        Bags::Lengths(Indices::I64(&[1])),
    )]);
    let both = [ids[0], new_key];
    let w = RowWrite {
        table: "k",
        ids: &both,
        values: Some(RowValues::F32(&[0.5; 2 * DIM as usize])),
    };
    let e = writes
        .write_many(&[w], WriteOptions::default())
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.table(), e.position()),
        (ErrorKind::KeysFull, Some("k"), Some(1)),
        "{e}"
    );
    close(
        &store.lookup(&one).unwrap().0.values,
        &raw(picks[0]),
        "nothing applied",
    );
    // an existing key's row is written, then the key removed
    let w = RowWrite {
        table: "k",
        ids: &ids[..1],
        values: Some(RowValues::F32(&vec![0.5; d])),
    };
    writes.write_many(&[w], WriteOptions::default()).unwrap();
    close(
        &store.lookup(&one).unwrap().0.values,
        &vec![0.5; d],
        "written by key",
    );
    writes
        .write_many(
            &[RowWrite {
                table: "k",
                ids: &ids[..1],
                values: None,
            }],
            WriteOptions::default(),
        )
        .unwrap();
    let e = store.lookup(&one).unwrap_err();
    assert_eq!(
        (e.kind(), e.position()),
        (ErrorKind::UnknownKey, Some(0)),
        "{e}"
    );
    assert_eq!(store.info().unwrap().tables[0].keys, Some(ROWS - 1));
    // its row is free again: a new key takes it
    let w = RowWrite {
        table: "k",
        ids: &[new_key],
        values: Some(RowValues::F32(&vec![0.25; d])),
    };
    writes.write_many(&[w], WriteOptions::default()).unwrap();
    let fresh_ids = [new_key];
    let fresh = Batch::new(vec![TableLookup::new(
        "k",
        Indices::I64(&fresh_ids),
        Bags::Lengths(Indices::I64(&[1])),
    )]);
    close(
        &store.lookup(&fresh).unwrap().0.values,
        &vec![0.25; d],
        "a new key",
    );
}

/// A scrub pass checks every table where its data lies (a router's: each part on each of its
/// replicas, named `TABLE on ADDRESS`) and finds a byte rotted on disk, naming its table; the
/// store serves on.
pub fn a_scrub_reads_every_table_where_it_lies_and_names_the_damaged_one(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, false);
    let store = &*s.store;
    let checks = store.scrub(0).unwrap();
    for &(name, _) in &TABLES {
        let of = |t: &str| t == name || t.starts_with(&format!("{name} on "));
        let checked: Vec<_> = checks.iter().filter(|c| of(&c.table)).collect();
        assert!(!checked.is_empty(), "{name} was not scrubbed: {checks:?}");
        assert!(
            checked.iter().all(|c| c.error.is_none() && c.bytes > 0),
            "{checked:?}"
        );
    }
    lacking!(s, "its table files at the path");
    nearrec_testkit::flip_bits(&path, 1, 5, 0x40);
    let checks = store.scrub(0).unwrap();
    let damaged: Vec<_> = checks.iter().filter(|c| c.error.is_some()).collect();
    assert_eq!(damaged.len(), 1, "{checks:?}");
    assert_eq!(damaged[0].table, TABLES[1].0);
    // the sound tables serve on, as before
    let t0 = OwnedBatch::new(vec![OwnedLookup::with_lengths(
        "t0",
        vec![1, 2],
        vec![1, 1],
    )]);
    let got = store
        .lookup(&nearrec::AsBatch::as_batch(&t0))
        .unwrap()
        .0
        .values;
    close(&got, &[row(0, 1), row(0, 2)].concat(), "t0 after the scrub");
}
