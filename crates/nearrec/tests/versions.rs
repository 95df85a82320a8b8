//! Versions of one served name: publishing into a repository (numbers only grow, two
//! publishers never share one), the pointer a swap writes and a restart reads, a swap refused
//! or failed leaving it as it was, writable versions, and `keep_last` pruning only what no call
//! still reads.

use nearrec::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nearrec::format::{Pointer, Publish, Repository};
use nearrec::{Bags, Batch, ErrorKind, Indices, Store, StoreApi, StoreConfig, SwapTo, TableLookup};
use nearrec_format::DType;

const ROWS: u64 = 2000;

/// A store of one fp32 table `a` (dim 8) whose row `r` is `k × r` in every column.
fn built(dir: &Path, k: u64) -> PathBuf {
    let path = dir.join(format!("built-{k}"));
    nearrec_testkit::write_store(&path, &[("a", ROWS, 8, DType::Fp32)], |_, i| {
        (k * (i / 8)) as f32
    })
}

/// Row 5's first value as served: 5 × the version's factor.
fn probe(s: &Store) -> f32 {
    let (ids, lengths) = ([5i64], [1i64]);
    let batch = Batch::new(vec![TableLookup::new(
        "a",
        Indices::I64(&ids),
        Bags::Lengths(Indices::I64(&lengths)),
    )]);
    s.lookup(&batch).unwrap().0.values[0]
}

/// A repository `dlrm` in `dir` holding versions 1..=n (version k's rows are k × r).
fn repository(dir: &Path, n: u64) -> Repository {
    let repo = Repository::create(&dir.join("dlrm")).unwrap();
    for k in 1..=n {
        assert_eq!(repo.publish(&built(dir, k), Publish::Move).unwrap(), k);
    }
    repo
}

#[test]
fn a_repository_serves_its_newest_version_until_a_pointer_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repository(dir.path(), 2);
    let s = Store::open(repo.path(), &StoreConfig::default()).unwrap();
    assert_eq!((probe(&s), s.served_version()), (10.0, Some(2)));
    let info = StoreApi::info(&s).unwrap();
    assert_eq!((info.name.as_str(), info.versions), ("dlrm", vec![1, 2]));
    drop(s);

    // the pointer names a version that is gone: an error, not another version served
    repo.set_pointer(&Pointer {
        current: 7,
        history: vec![],
    })
    .unwrap();
    let e = Store::open(repo.path(), &StoreConfig::default()).unwrap_err();
    assert!(e.to_string().contains("version 7"), "{e}");
    // a damaged pointer too
    std::fs::write(repo.path().join("CURRENT"), b"{\"current\": ").unwrap();
    let e = Store::open(repo.path(), &StoreConfig::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreCorrupted, "{e}");
    // an empty repository, and a directory that is neither a store nor a repository
    let empty = Repository::create(&dir.path().join("empty")).unwrap();
    std::fs::write(empty.path().join("CURRENT"), b"{\"current\": 1}").unwrap();
    assert!(Store::open(empty.path(), &StoreConfig::default()).is_err());
    let e = Store::open(dir.path().join("nothing"), &StoreConfig::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreNotFound, "{e}");
}

#[test]
fn publishing_copies_or_moves_and_numbers_only_grow() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repository(dir.path(), 1);
    let source = built(dir.path(), 2);
    assert_eq!(repo.publish(&source, Publish::Copy).unwrap(), 2);
    assert!(
        source.join("MANIFEST").is_file(),
        "a copy leaves its source"
    );
    // version 2 removed by hand: the next one is still 3 while the pointer remembers 2
    repo.set_pointer(&Pointer {
        current: 2,
        history: vec![1],
    })
    .unwrap();
    std::fs::remove_dir_all(repo.version_path(2)).unwrap();
    assert_eq!(repo.publish(&source, Publish::Move).unwrap(), 3);
    assert!(!source.exists(), "a move takes its source");
    // a directory named as a version that holds no store still takes its number
    std::fs::create_dir(repo.path().join("4")).unwrap();
    assert_eq!(
        repo.publish(&built(dir.path(), 5), Publish::Copy).unwrap(),
        5
    );
    assert_eq!(repo.versions().unwrap(), vec![1, 3, 5]);

    // what is not a closed store is refused, the repository unchanged
    let e = repo
        .publish(&dir.path().join("nothing"), Publish::Copy)
        .unwrap_err();
    assert!(
        matches!(e, nearrec::format::FormatError::NotFound { .. }),
        "{e}"
    );
    let open = built(dir.path(), 6);
    let writer = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let held = Store::open(&open, &writer).unwrap();
    let e = repo.publish(&open, Publish::Copy).unwrap_err();
    assert!(e.to_string().contains("writer holds"), "{e}");
    drop(held);
    let e = repo
        .publish(&repo.version_path(3), Publish::Move)
        .unwrap_err();
    assert!(e.to_string().contains("already"), "{e}");
    assert_eq!(repo.versions().unwrap(), vec![1, 3, 5]);
    // a store is not a repository
    assert!(Repository::create(&open).is_err());
}

#[test]
fn concurrent_publishers_never_share_a_number() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::create(&dir.path().join("dlrm")).unwrap();
    let sources: Vec<PathBuf> = (1..=6).map(|k| built(dir.path(), k)).collect();
    let mut numbers: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .iter()
            .map(|s| scope.spawn(|| repo.publish(s, Publish::Copy).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    numbers.sort_unstable();
    assert_eq!(numbers, (1..=6).collect::<Vec<_>>());
    assert_eq!(repo.versions().unwrap(), numbers);
}

#[test]
fn a_refused_swap_leaves_the_pointer_and_a_path_inside_names_a_version() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repository(dir.path(), 2);
    // version 3 has another table: refused unless forced
    let other = dir.path().join("other");
    nearrec_testkit::write_store(&other, &[("b", ROWS, 8, DType::Fp32)], |_, _| 1.0);
    assert_eq!(repo.publish(&other, Publish::Move).unwrap(), 3);
    repo.set_pointer(&Pointer {
        current: 1,
        history: vec![],
    })
    .unwrap();
    let s = Store::open(repo.path(), &StoreConfig::default()).unwrap();
    let before = std::fs::read(repo.path().join("CURRENT")).unwrap();
    let e = s.swap(&SwapTo::Version(3), false, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!(std::fs::read(repo.path().join("CURRENT")).unwrap(), before);
    assert_eq!(probe(&s), 5.0);
    // a path outside the repository is refused; a version's directory is that version
    let e = s
        .swap(
            &SwapTo::path(other.with_file_name("elsewhere")),
            false,
            false,
        )
        .unwrap_err();
    assert!(e.to_string().contains("not a version"), "{e}");
    s.swap(&SwapTo::path(repo.version_path(2)), false, false)
        .unwrap();
    assert_eq!((probe(&s), s.served_version()), (10.0, Some(2)));
    assert_eq!(
        repo.pointer().unwrap(),
        Some(Pointer {
            current: 2,
            history: vec![1]
        })
    );
}

#[test]
fn a_writable_repository_writes_to_the_version_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repository(dir.path(), 2);
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let s = Store::open(repo.path(), &config).unwrap();
    let row = [42f32; 8];
    s.write("a", &[5], &row).unwrap();
    assert_eq!(probe(&s), 42.0);
    s.swap(&SwapTo::Version(1), false, false).unwrap();
    assert_eq!(probe(&s), 5.0, "version 1 never saw the write");
    s.swap(&SwapTo::Previous, false, false).unwrap();
    assert_eq!(probe(&s), 42.0, "version 2 kept it");
    drop(s);
    // and a restart reads it back from version 2's log
    let s = Store::open(repo.path(), &config).unwrap();
    assert_eq!((probe(&s), s.served_version()), (42.0, Some(2)));
}

#[test]
fn keep_last_prunes_old_versions_once_no_call_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, s) = keeping_two(dir.path(), 5);
    // lookups run on version 1 throughout the swap; none fails
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(Ordering::Relaxed) {
                let v = probe(&s);
                assert!(v == 5.0 || v == 20.0, "{v}");
                seen += 1;
            }
            seen
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(20));
    s.swap(&SwapTo::Version(4), false, false).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    // versions beyond the two newest go, the served one stays, once the reaper has the lock
    assert_eq!(pruned_to(&repo, &[4, 5]), vec![4, 5]);
    assert_eq!(probe(&s), 20.0);
    // the rollback target went with them: nothing to roll back to
    let e = s.swap(&SwapTo::Previous, false, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    // nothing left aside half-removed
    let names: Vec<String> = std::fs::read_dir(repo.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".removing") || n.starts_with(".incoming"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn keep_last_prunes_once_the_repository_s_lock_is_free_again() {
    // the old version is let go while another holds the repository's lock (CI, stop 84: the
    // swap's own lock, not yet released when its last holder let go): the prune waits for it
    let dir = tempfile::tempdir().unwrap();
    let (repo, s) = keeping_two(dir.path(), 4);
    let old = s.engine();
    s.swap(&SwapTo::Version(4), false, false).unwrap();
    let held = repo.lock().unwrap();
    drop(old);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        repo.versions().unwrap(),
        vec![1, 2, 3, 4],
        "pruned under another's lock"
    );
    drop(held);
    assert_eq!(pruned_to(&repo, &[3, 4]), vec![3, 4]);
    assert_eq!(probe(&s), 20.0);
}

/// A repository in `dir` of versions 1..=n (as [`repository`]), served from version 1 with
/// `keep_last` 2.
fn keeping_two(dir: &Path, n: u64) -> (Repository, Store) {
    let repo = repository(dir, n);
    repo.set_pointer(&Pointer {
        current: 1,
        history: vec![],
    })
    .unwrap();
    let config = StoreConfig {
        keep_last: Some(2),
        ..StoreConfig::default()
    };
    let s = Store::open(repo.path(), &config).unwrap();
    (repo, s)
}

/// `repo`'s versions once they are `want`, or as they are after 30 s (the reaper prunes on a
/// thread of its own).
fn pruned_to(repo: &Repository, want: &[u64]) -> Vec<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while repo.versions().unwrap() != want && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    repo.versions().unwrap()
}

/// Row 5's first value as version `version` answers it.
fn probe_at(s: &Store, version: u64) -> nearrec::Result<f32> {
    let (ids, lengths) = ([5i64], [1i64]);
    let batch = Batch::new(vec![TableLookup::new(
        "a",
        Indices::I64(&ids),
        Bags::Lengths(Indices::I64(&lengths)),
    )]);
    Ok(s.lookup_version(&batch, version)?.0.values[0])
}

#[test]
fn a_staged_version_answers_pinned_lookups_then_switches_keeping_the_one_it_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repository(dir.path(), 3);
    repo.set_pointer(&Pointer {
        current: 1,
        history: vec![],
    })
    .unwrap();
    let s = Store::open(repo.path(), &StoreConfig::default()).unwrap();
    // not held: refused, typed, naming what is
    let e = probe_at(&s, 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::VersionNotServed, "{e}");
    assert!(e.to_string().contains("[1]"), "{e}");

    assert_eq!(s.stage(&SwapTo::Version(2), true, false).unwrap(), 2);
    assert_eq!(
        (probe(&s), s.served_version()),
        (5.0, Some(1)),
        "staged, not served"
    );
    assert_eq!(
        (probe_at(&s, 1).unwrap(), probe_at(&s, 2).unwrap()),
        (5.0, 10.0)
    );
    assert_eq!(s.held_versions(), vec![2]);
    // the pointer moves only with the swap
    assert_eq!(repo.current().unwrap(), 1);
    let e = s.stage(&SwapTo::Version(1), false, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "the served one: {e}");

    s.swap(&SwapTo::Version(2), false, false).unwrap();
    assert_eq!((probe(&s), s.served_version()), (10.0, Some(2)));
    assert_eq!(repo.current().unwrap(), 2);
    // the replaced version still answers lookups pinned to it, until the next stage
    assert_eq!(
        (probe_at(&s, 1).unwrap(), probe_at(&s, 2).unwrap()),
        (5.0, 10.0)
    );
    assert_eq!(s.held_versions(), vec![1]);
    s.stage(&SwapTo::Version(3), false, false).unwrap();
    assert_eq!(s.held_versions(), vec![3]);
    assert_eq!(
        probe_at(&s, 1).unwrap_err().kind(),
        ErrorKind::VersionNotServed
    );
    // a swap to another version lets go of what was staged
    s.swap(&SwapTo::Version(1), false, false).unwrap();
    assert_eq!((probe(&s), s.held_versions()), (5.0, vec![]));
    // a store not from a repository stages nothing
    let plain = Store::open(built(dir.path(), 7), &StoreConfig::default()).unwrap();
    let e = plain.stage(&SwapTo::Version(1), false, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
}

#[test]
fn a_pinned_lookup_never_reads_another_version_while_a_staged_swap_switches() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repository(dir.path(), 2);
    repo.set_pointer(&Pointer {
        current: 1,
        history: vec![],
    })
    .unwrap();
    let s = Store::open(repo.path(), &StoreConfig::default()).unwrap();
    s.stage(&SwapTo::Version(2), false, false).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = [1u64, 2]
        .into_iter()
        .map(|v| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(probe_at(&s, v).unwrap(), 5.0 * v as f32);
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(20));
    s.swap(&SwapTo::Version(2), false, false).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}
