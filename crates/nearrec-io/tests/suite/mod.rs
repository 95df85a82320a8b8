//! The block-device suite: the same reads must give the same bytes, the same completions and the
//! same errors on every back-end. Each crate with a back-end runs it over its own devices
//! (`nearrec-io`'s `tests/devices.rs`, `nearrec-device`'s `tests/devices.rs`).

use std::path::PathBuf;

use nearrec_format::AlignedBuf;
use nearrec_io::{BlockDevice, IoError, ReadOp};

/// The devices under test over a fixture's files, named (names with "memory" cannot shrink).
pub type Devices = fn(&Fixture) -> Vec<(String, Box<dyn BlockDevice>)>;

/// The suite's tests over the devices `$devices` returns: one `#[test]` each, so a failure names
/// the check.
macro_rules! block_device_suite {
    ($devices:path) => {
        #[test]
        fn reads_return_the_file_bytes_once_each_in_any_order() {
            suite::reads_return_the_file_bytes_once_each_in_any_order($devices);
        }

        #[test]
        fn malformed_batches_are_refused_before_any_read() {
            suite::malformed_batches_are_refused_before_any_read($devices);
        }

        #[test]
        fn a_file_that_shrank_gives_a_short_read_naming_it() {
            suite::a_file_that_shrank_gives_a_short_read_naming_it($devices);
        }

        #[test]
        fn devices_work_in_a_forked_child() {
            suite::devices_work_in_a_forked_child($devices);
        }
    };
}

/// The byte at `pos` of file `file`: distinct enough that a read from the wrong place shows.
fn byte(file: usize, pos: u64) -> u8 {
    (pos.wrapping_mul(2654435761).wrapping_add(file as u64 * 97) >> 7) as u8
}

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub paths: Vec<PathBuf>,
    pub contents: Vec<Vec<u8>>,
}

pub fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [64 * 1024u64, (1 << 20) + 512, 4096];
    let mut paths = Vec::new();
    let mut contents = Vec::new();
    for (f, &n) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..n).map(|p| byte(f, p)).collect();
        let p = dir.path().join(format!("f{f}"));
        std::fs::write(&p, &data).unwrap();
        paths.push(p);
        contents.push(data);
    }
    Fixture {
        _dir: dir,
        paths,
        contents,
    }
}

/// `n` reads spread over the files, each into its own block-aligned slot of the buffer.
fn ops(fx: &Fixture, n: usize, block: u64, seed: u64) -> (Vec<ReadOp>, usize) {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut at = 0usize;
    let ops = (0..n)
        .map(|_| {
            let file = (next() % fx.contents.len() as u64) as usize;
            let blocks = fx.contents[file].len() as u64 / block;
            let len_blocks = 1 + next() % 8.min(blocks);
            let first = next() % (blocks - len_blocks + 1);
            let op = ReadOp {
                file: file as u32,
                offset: first * block,
                len: (len_blocks * block) as u32,
                buf_at: at,
            };
            at += op.len as usize;
            op
        })
        .collect();
    (ops, at)
}

pub fn reads_return_the_file_bytes_once_each_in_any_order(devices: Devices) {
    let fx = fixture();
    for (name, dev) in devices(&fx) {
        let block = dev.block_size() as u64;
        // more reads than the queue depth, so queues refill
        let (ops, bytes) = ops(&fx, 300, block, 7);
        let mut buf = AlignedBuf::zeroed(bytes);
        let mut seen = vec![0u32; ops.len()];
        dev.read_batch(&ops, buf.as_mut_slice(), &mut |i, got| {
            seen[i] += 1;
            let op = ops[i];
            let want = &fx.contents[op.file as usize][op.offset as usize..][..op.len as usize];
            assert!(got == want, "{name}: read {i} returned the wrong bytes");
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            seen.iter().all(|&s| s == 1),
            "{name}: every read completes exactly once"
        );
        for op in &ops {
            let want = &fx.contents[op.file as usize][op.offset as usize..][..op.len as usize];
            assert!(
                &buf.as_slice()[op.buf_at..][..op.len as usize] == want,
                "{name}: buffer"
            );
        }
        // an empty batch is fine
        dev.read_batch(&[], buf.as_mut_slice(), &mut |_, _| panic!("no reads"))
            .unwrap();
    }
}

pub fn malformed_batches_are_refused_before_any_read(devices: Devices) {
    let fx = fixture();
    for (name, dev) in devices(&fx) {
        let b = dev.block_size() as u32;
        let mut buf = AlignedBuf::zeroed(16 * b as usize);
        let ok = ReadOp {
            file: 0,
            offset: 0,
            len: b,
            buf_at: 0,
        };
        let file_len = dev.file_lens()[2];
        let cases = [
            (ReadOp { offset: 1, ..ok }, "multiples"),
            (ReadOp { len: b + 1, ..ok }, "multiples"),
            (ReadOp { len: 0, ..ok }, "multiples"),
            (ReadOp { buf_at: 8, ..ok }, "aligned"),
            (ReadOp { file: 9, ..ok }, "does not exist"),
            (
                ReadOp {
                    file: 2,
                    offset: file_len,
                    ..ok
                },
                "past the end",
            ),
            (
                ReadOp {
                    buf_at: 16 * b as usize,
                    ..ok
                },
                "does not fit",
            ),
        ];
        for (bad, msg) in cases {
            let batch = [
                ReadOp {
                    buf_at: 8 * b as usize,
                    ..ok
                },
                bad,
            ];
            let err = dev
                .read_batch(&batch, buf.as_mut_slice(), &mut |_, _| {
                    panic!("{name}: read done")
                })
                .expect_err(msg);
            match &err {
                IoError::InvalidRead { op: 1, reason } => {
                    assert!(
                        reason.contains(msg),
                        "{name}: {reason:?} should say {msg:?}"
                    )
                }
                other => panic!("{name}: {other}"),
            }
        }
        let overlap = [
            ok,
            ReadOp {
                offset: b as u64,
                ..ok
            },
        ];
        let err = dev
            .read_batch(&overlap, buf.as_mut_slice(), &mut |_, _| {
                panic!("read done")
            })
            .unwrap_err();
        assert!(err.to_string().contains("overlaps"), "{name}: {err}");
    }
}

pub fn a_file_that_shrank_gives_a_short_read_naming_it(devices: Devices) {
    let fx = fixture();
    let devs: Vec<_> = devices(&fx)
        .into_iter()
        .filter(|(name, _)| !name.contains("memory"))
        .collect();
    let path = fx.paths[1].clone();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(8192).unwrap();
    for (name, dev) in devs {
        let b = dev.block_size() as u32;
        let mut buf = AlignedBuf::zeroed(2 * b as usize);
        // the device still believes the old length, so the batch passes validation
        let op = ReadOp {
            file: 1,
            offset: 65536,
            len: b,
            buf_at: 0,
        };
        let err = dev
            .read_batch(&[op], buf.as_mut_slice(), &mut |_, _| {
                panic!("{name}: read done")
            })
            .unwrap_err();
        assert!(
            matches!(err, IoError::ShortRead { got: 0, .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains("f1"), "{name}: {err}");
    }
}

pub fn devices_work_in_a_forked_child(devices: Devices) {
    let fx = fixture();
    for (name, dev) in devices(&fx) {
        let (ops, bytes) = ops(&fx, 50, dev.block_size() as u64, 3);
        let mut buf = AlignedBuf::zeroed(bytes);
        // use it in the parent first, so there is a ring / pool to inherit
        dev.read_batch(&ops, buf.as_mut_slice(), &mut |_, _| {})
            .unwrap();
        // SAFETY: the child only reads through the device and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut ok = true;
            let res = dev.read_batch(&ops, buf.as_mut_slice(), &mut |i, got| {
                let op = ops[i];
                ok &=
                    got == &fx.contents[op.file as usize][op.offset as usize..][..op.len as usize];
            });
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(if res.is_ok() && ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{name} in child"
        );
    }
}
