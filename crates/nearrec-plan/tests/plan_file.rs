//! The plan file: a plan saved and loaded is the placement it makes; each way a plan file or its
//! archive can be wrong is its own error, naming the file and the table; a FIFO is refused at once.

use std::io::Write;
use std::path::{Path, PathBuf};

use nearrec_plan::{
    DEFAULT_STEPS, PlanError, PlanFileProblem, PlanTable, SizeError, TraceTable, hot_rows_path,
    load_plan, make_plan,
};
use zip::write::SimpleFileOptions;

fn plan_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let store = [
        PlanTable {
            name: "big".into(),
            rows: 5_000,
            row_bytes: 64,
            data_bytes: 5_000 * 64,
        },
        PlanTable {
            name: "tiny \"q\"".into(),
            rows: 50,
            row_bytes: 64,
            data_bytes: 50 * 64,
        },
    ];
    // 150 busy rows, each back every 450 lookups between rows read once (a cache of the
    // budget's bytes would lose them to the scan; pinned they stay), and rows read twice close
    // together, new all along (only a cache serves them): the plan pins rows and keeps a cache
    let big: Vec<i64> = (0..6_000i64)
        .map(|i| match i % 3 {
            0 => i / 3 % 150,
            1 => 4_999 - i / 6,
            _ => 150 + i * 7919 % 3_800,
        })
        .collect();
    let tiny: Vec<i64> = (0..6_000i64).map(|i| i * 31 % 50).collect();
    let trace = [
        TraceTable {
            name: "big",
            rows: 5_000,
            indices: &big,
            keys: false,
        },
        TraceTable {
            name: "tiny \"q\"",
            rows: 50,
            indices: &tiny,
            keys: false,
        },
    ];
    let mut plan = make_plan(&store, &trace, 24_000, DEFAULT_STEPS).unwrap();
    plan.trace = "t.nrtrace".into();
    plan.store = "s".into();
    let path = dir.path().join("p.toml");
    plan.save(&path).unwrap();
    let back = load_plan(&path).unwrap();
    assert_eq!(
        back,
        plan.placement(),
        "a saved plan loads as its placement"
    );
    assert!(back.tables["tiny \"q\""].resident);
    assert!(!back.tables["big"].hot_rows.is_empty() && back.tables["big"].cache_bytes > 0);
    (dir, path)
}

#[test]
fn a_saved_plan_loads_as_its_placement() {
    let (dir, path) = plan_dir();
    assert!(hot_rows_path(&path).ends_with("p.hot.npz"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("hot_rows_file = \"p.hot.npz\"\n"));
    // a name TOML cannot leave bare is quoted as TOML quotes it
    assert!(text.contains("[tables.'tiny \"q\"']\ntype = \""), "{text}");
    assert!(!dir.path().join("p.toml.tmp").exists() && !dir.path().join("p.hot.npz.tmp").exists());
    // sizes as strings are read as sizes
    let edited = text.replace("cache_bytes = ", "cache_bytes = \"64KiB\"\n# ");
    let p = variant(&path, "sized", &edited, None);
    assert!(
        load_plan(&p)
            .unwrap()
            .tables
            .values()
            .all(|t| t.cache_bytes == 64 << 10)
    );
}

/// `name.toml` with `text` (its hot_rows_file pointed at `name.hot.npz`) and that archive: a
/// copy of the original's, or `hot`.
fn variant(path: &Path, name: &str, text: &str, hot: Option<&[u8]>) -> PathBuf {
    let dir = path.parent().unwrap();
    let text = text.replace("\"p.hot.npz\"", &format!("\"{name}.hot.npz\""));
    std::fs::write(dir.join(format!("{name}.toml")), text).unwrap();
    let npz = match hot {
        Some(bytes) => bytes.to_vec(),
        None => std::fs::read(hot_rows_path(path)).unwrap(),
    };
    std::fs::write(dir.join(format!("{name}.hot.npz")), npz).unwrap();
    dir.join(format!("{name}.toml"))
}

/// An archive holding `.npy` members: (name, header dict, data).
fn npz(members: &[(&str, &str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for &(name, dict, data) in members {
        w.start_file(format!("{name}.npy"), SimpleFileOptions::default())
            .unwrap();
        let header = format!("{dict}\n");
        w.write_all(b"\x93NUMPY\x01\x00").unwrap();
        w.write_all(&(header.len() as u16).to_le_bytes()).unwrap();
        w.write_all(header.as_bytes()).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

fn problem(path: &Path) -> (Option<String>, PlanFileProblem) {
    match load_plan(path) {
        Err(PlanError::BadPlan {
            path: p,
            table,
            problem,
        }) => {
            assert_eq!(p, path);
            (table, problem)
        }
        other => panic!("{path:?}: {other:?}"),
    }
}

#[test]
fn each_malformed_plan_file_is_its_own_error() {
    use PlanFileProblem as P;
    let (_dir, path) = plan_dir();
    let text = std::fs::read_to_string(&path).unwrap();
    let big = Some("big".to_owned());
    let edit = |name: &str, from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        variant(&path, name, &text.replacen(from, to, 1), None)
    };
    let big_at = text.find("[tables.big]").unwrap();
    let (head, big_text) = text.split_at(big_at);
    let in_big = |name: &str, from: &str, to: &str| {
        let t = format!("{head}{}", big_text.replacen(from, to, 1));
        variant(&path, name, &t, None)
    };
    let p = in_big("res_no", "resident = false", "resident = \"no\"");
    assert_eq!(
        problem(&p),
        (big.clone(), P::ResidentNotBool("\"no\"".into()))
    );
    let p = in_big("res_1", "resident = false", "resident = 1");
    assert_eq!(problem(&p), (big.clone(), P::ResidentNotBool("1".into())));
    let p = in_big("neg_cache", "cache_bytes = ", "cache_bytes = -");
    assert!(matches!(problem(&p), (t, P::CacheBytes(SizeError::Negative(_))) if t == big));
    let p = in_big("x_cache", "cache_bytes = ", "cache_bytes = \"x\"\n# ");
    assert!(matches!(
        problem(&p),
        (_, P::CacheBytes(SizeError::NotASize(_)))
    ));
    let p = in_big("f_cache", "cache_bytes = ", "cache_bytes = 1.5\n# ");
    assert!(matches!(
        problem(&p),
        (_, P::CacheBytes(SizeError::NotBytes(_)))
    ));
    let p = in_big("b_cache", "cache_bytes = ", "cache_bytes = true\n# ");
    assert!(matches!(
        problem(&p),
        (_, P::CacheBytes(SizeError::Bool(true)))
    ));
    let p = in_big("count", "hot_rows = ", "hot_rows = 1");
    assert!(matches!(problem(&p), (t, P::HotRowsCount { .. }) if t == big));
    let p = edit("hot3", "hot_rows_file = \"p.hot.npz\"", "hot_rows_file = 3");
    assert_eq!(problem(&p), (None, P::NoHotRowsFile));
    let p = edit("nohot", "hot_rows_file = \"p.hot.npz\"", "");
    assert_eq!(problem(&p), (None, P::NoHotRowsFile));
    let p = variant(&path, "tables3", &format!("tables = 3\n{text}"), None);
    assert!(matches!(problem(&p), (None, P::NotToml(_))), "tables twice");
    let p = variant(
        &path,
        "tables3",
        "hot_rows_file = \"x\"\ntables = 3\n",
        None,
    );
    assert_eq!(problem(&p), (None, P::TablesNotTables));
    let p = variant(
        &path,
        "tablesa3",
        "hot_rows_file = \"x\"\ntables.a = 3\n",
        None,
    );
    assert_eq!(problem(&p), (None, P::TablesNotTables));
    let p = variant(&path, "nottoml", "[[[", None);
    assert!(matches!(problem(&p), (None, P::NotToml(_))));
    std::fs::write(&p, b"x = \"\xff\"\n").unwrap();
    assert!(matches!(problem(&p), (None, P::NotToml(_))));
}

#[test]
fn each_malformed_archive_is_its_own_error() {
    use PlanFileProblem as P;
    let (_dir, path) = plan_dir();
    let text = std::fs::read_to_string(&path).unwrap();
    let hot = std::fs::read(hot_rows_path(&path)).unwrap();
    let unreadable = |p: &Path| match problem(p) {
        (_, P::HotRowsUnreadable { file, reason }) => {
            assert!(
                p.to_string_lossy()
                    .contains(file.trim_end_matches(".hot.npz"))
            );
            reason
        }
        other => panic!("{p:?}: {other:?}"),
    };
    for (name, bytes) in [
        ("badzip", &b"PK\x03\x04garbage"[..]),
        ("empty", &b""[..]),
        ("trunc", &hot[..hot.len() / 2]),
    ] {
        unreadable(&variant(&path, name, &text, Some(bytes)));
    }
    // a byte of the stored big array flipped: its CRC fails
    let mut flipped = hot.clone();
    let magic = hot.windows(6).position(|w| w == b"\x93NUMPY").unwrap();
    let at = magic + 10 + usize::from(u16::from_le_bytes([hot[magic + 8], hot[magic + 9]]));
    flipped[at] ^= 0x40;
    let reason = unreadable(&variant(&path, "flipped", &text, Some(&flipped)));
    assert!(reason.starts_with("big: "), "{reason}");
    // the archive missing
    let p = variant(&path, "missing", &text, None);
    std::fs::remove_file(p.with_extension("hot.npz")).unwrap();
    unreadable(&p);
    let dict = |descr: &str, shape: &str| {
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
    };
    let npy = |name: &str, descr: &str, shape: &str, data: &[u8]| {
        let d = dict(descr, shape);
        variant(&path, name, &text, Some(&npz(&[("big", &d, data)])))
    };
    let floats: Vec<u8> = [1.5f64, 2.5].iter().flat_map(|f| f.to_le_bytes()).collect();
    let not_ints = |p: &Path| match problem(p) {
        (Some(t), P::HotRowsNotIntegers { dtype, shape }) if t == "big" => (dtype, shape),
        other => panic!("{p:?}: {other:?}"),
    };
    assert_eq!(
        not_ints(&npy("float", "<f8", "(2,)", &floats)),
        ("<f8".into(), vec![2])
    );
    assert_eq!(
        not_ints(&npy("twod", "<i8", "(1, 2)", &[0; 16])),
        ("<i8".into(), vec![1, 2])
    );
    assert_eq!(
        not_ints(&npy("str", "<U1", "(1,)", &[b'x', 0, 0, 0])),
        ("<U1".into(), vec![1])
    );
    let neg: Vec<u8> = [3i32, -4].iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = npy("neg", "<i4", "(2,)", &neg);
    let t = text.replacen("hot_rows = ", "hot_rows = 2\n# ", 1);
    std::fs::write(&p, t.replace("\"p.hot.npz\"", "\"neg.hot.npz\"")).unwrap();
    assert_eq!(
        problem(&p),
        (
            Some("big".into()),
            P::NegativeHotRow {
                row: -4,
                position: 1
            }
        )
    );
    // a claim of more data than the member holds: refused, not allocated
    let p = npy("claims", "<i8", "(1000000000000,)", &[0; 8]);
    assert!(unreadable(&p).contains("truncated"));
    // other integer types and byte orders are row ids too
    let be: Vec<u8> = [7u16, 300].iter().flat_map(|v| v.to_be_bytes()).collect();
    let p = npy("be", ">u2", "(2,)", &be);
    let t = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, t.replacen("hot_rows = ", "hot_rows = 2\n# ", 1)).unwrap();
    assert_eq!(load_plan(&p).unwrap().tables["big"].hot_rows, vec![7, 300]);
}

#[test]
fn a_fifo_is_refused_at_once() {
    let (dir, path) = plan_dir();
    let mkfifo = |p: &Path| {
        let status = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(status.success());
    };
    let fifo = dir.path().join("fifo.toml");
    mkfifo(&fifo);
    let text = std::fs::read_to_string(&path).unwrap();
    let p = variant(&path, "fifohot", &text, None);
    std::fs::remove_file(p.with_extension("hot.npz")).unwrap();
    mkfifo(&p.with_extension("hot.npz"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tx.send((load_plan(&fifo), load_plan(&p))).unwrap();
    });
    let (plan, hot) = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("a FIFO was waited on");
    match plan {
        Err(PlanError::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput);
            assert!(source.to_string().contains("a FIFO"));
        }
        other => panic!("{other:?}"),
    }
    match hot {
        Err(PlanError::BadPlan {
            problem: PlanFileProblem::HotRowsUnreadable { reason, .. },
            ..
        }) => assert!(reason.contains("a FIFO"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let missing = load_plan(&dir.path().join("nope.toml"));
    assert!(
        matches!(missing, Err(PlanError::Io { ref source, .. }) if source.kind() == std::io::ErrorKind::NotFound)
    );
}
