//! Delta files: what `write` writes `read` reads back, in both encodings, and every malformed
//! or misfit file is refused naming its row and column.

use std::path::{Path, PathBuf};

use nearrec_format::DType;
use nearrec_format::delta::{self, Changes, Encoding, Header, Shape, Values};

fn shapes(table: &str) -> Option<Shape> {
    match table {
        "a" => Some(Shape {
            rows: 100,
            dim: 4,
            dtype: DType::Fp32,
            keyed: false,
        }),
        "b" => Some(Shape {
            rows: 50,
            dim: 8,
            dtype: DType::Fp32,
            keyed: false,
        }),
        "k" => Some(Shape {
            rows: 64,
            dim: 4,
            dtype: DType::Fp32,
            keyed: true,
        }),
        "q" => Some(Shape {
            rows: 100,
            dim: 16,
            dtype: DType::Int8,
            keyed: false,
        }),
        _ => None,
    }
}

fn header(sequence: u64) -> Header {
    Header {
        sequence,
        step: Some(1000 * sequence),
        wall_time_ms: Some(1_764_000_000_000 + sequence),
    }
}

fn changes(table: &str, upserts: &[i64], dim: usize, deletes: &[i64]) -> Changes {
    let values = upserts
        .iter()
        .flat_map(|&id| (0..dim).map(move |j| id as f32 + j as f32 / 8.0))
        .collect();
    Changes {
        table: table.into(),
        upserts: upserts.to_vec(),
        values: Values::F32(values),
        deletes: deletes.to_vec(),
        deleted: None,
    }
}

fn path(dir: &Path, sequence: u64, encoding: Encoding) -> PathBuf {
    dir.join(delta::file_name(sequence, encoding))
}

#[test]
fn written_files_read_back_in_both_encodings() {
    let dir = tempfile::tempdir().unwrap();
    for encoding in [Encoding::Arrow, Encoding::Parquet] {
        // tables of one dim (fixed-size lists) and of two (lists); keys past i64::MAX
        let cases = [
            vec![changes("a", &[3, 1, 99], 4, &[7])],
            vec![
                changes("a", &[0, 5], 4, &[]),
                changes("b", &[49], 8, &[1, 2]),
                changes("k", &[-1, i64::MIN, 42], 4, &[-7]),
            ],
        ];
        for (seq, tables) in cases.into_iter().enumerate() {
            let p = path(dir.path(), seq as u64 + 1, encoding);
            delta::write(&p, &header(seq as u64 + 1), &tables, None).unwrap();
            let back = delta::read(&p, shapes).unwrap();
            assert_eq!(back.header, header(seq as u64 + 1));
            assert_eq!(back.tables, tables, "{encoding:?}");
        }
    }
}

#[test]
fn a_file_of_no_rows_reads_as_its_header() {
    let dir = tempfile::tempdir().unwrap();
    for encoding in [Encoding::Arrow, Encoding::Parquet] {
        let p = path(dir.path(), 3, encoding);
        delta::write(&p, &header(3), &[], None).unwrap();
        let back = delta::read(&p, shapes).unwrap();
        assert_eq!((back.header, back.rows()), (header(3), 0), "{encoding:?}");
    }
}

#[test]
fn encoded_rows_and_deleted_rows_are_taken_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let rb = DType::Int8.row_bytes(16) as usize;
    let mut rows = vec![0u8; 3 * rb];
    for (k, row) in rows.chunks_exact_mut(rb).enumerate() {
        let v: Vec<f32> = (0..16).map(|j| (k * 16 + j) as f32 * 0.1 - 1.0).collect();
        DType::Int8.encode_row(&v, row);
    }
    let tables = vec![Changes {
        table: "q".into(),
        upserts: vec![10, 20],
        values: Values::Encoded(rows[..2 * rb].to_vec()),
        deletes: vec![30],
        deleted: Some(Values::Encoded(rows[2 * rb..].to_vec())),
    }];
    for encoding in [Encoding::Arrow, Encoding::Parquet] {
        let p = path(dir.path(), 4, encoding);
        delta::write(&p, &header(4), &tables, Some(DType::Int8)).unwrap();
        assert_eq!(delta::read(&p, shapes).unwrap().tables, tables);
        // int8 rows are not a table of int4's
        let err = delta::read(&p, |t| {
            shapes(t).map(|s| Shape {
                dtype: DType::Int4,
                ..s
            })
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("row 0, column \"values\""), "{err}");
        assert!(err.contains("encoded as int8"), "{err}");
        std::fs::remove_file(&p).unwrap();
    }
}

/// Each misfit file's message, with the row and column it must name.
#[test]
fn misfits_are_refused_naming_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<Changes>, &str)> = vec![
        (
            vec![changes("nope", &[1], 4, &[])],
            "row 0, column \"table\"",
        ),
        (
            vec![changes("a", &[1, 100], 4, &[])],
            "row 1, column \"id\"",
        ),
        (vec![changes("a", &[-1], 4, &[])], "row 0, column \"id\""),
        (vec![changes("a", &[2], 4, &[2])], "row 1, column \"id\""),
        (
            vec![changes("a", &[1], 4, &[]), changes("b", &[3, 4], 4, &[])],
            "row 1, column \"values\"",
        ),
    ];
    for (k, (tables, names)) in cases.into_iter().enumerate() {
        let p = path(dir.path(), k as u64, Encoding::Arrow);
        delta::write(&p, &header(k as u64), &tables, None).unwrap();
        let err = delta::read(&p, shapes).unwrap_err().to_string();
        assert!(err.contains(names), "case {k}: {err}");
        assert!(err.contains(&p.display().to_string()), "{err}");
    }
    // a value not finite
    let mut t = changes("a", &[1, 2], 4, &[]);
    if let Values::F32(v) = &mut t.values {
        v[6] = f32::NAN;
    }
    let p = path(dir.path(), 90, Encoding::Arrow);
    delta::write(&p, &header(90), &[t], None).unwrap();
    let err = delta::read(&p, shapes).unwrap_err().to_string();
    assert!(
        err.contains("row 1, column \"values\": values[2] is NaN"),
        "{err}"
    );
}

#[test]
fn damaged_and_misnamed_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = path(dir.path(), 5, Encoding::Arrow);
    delta::write(&p, &header(5), &[changes("a", &[1, 2, 3], 4, &[])], None).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    // cut short
    let cut = path(dir.path(), 6, Encoding::Arrow);
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = delta::read(&cut, shapes).unwrap_err().to_string();
    assert!(err.contains("delta file"), "{err}");
    // the name's sequence is not the schema's
    std::fs::copy(&p, path(dir.path(), 7, Encoding::Arrow)).unwrap();
    let err = delta::read(&path(dir.path(), 7, Encoding::Arrow), shapes)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("its schema says sequence 5, its name 7"),
        "{err}"
    );
    // not a delta file's name
    let odd = dir.path().join("5.arrow.tmp");
    std::fs::copy(&p, &odd).unwrap();
    assert!(delta::read(&odd, shapes).is_err());
    assert_eq!(
        delta::list(dir.path())
            .unwrap()
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        [5, 6, 7]
    );
    // two files of one sequence
    std::fs::copy(&p, path(dir.path(), 5, Encoding::Parquet)).unwrap();
    assert!(delta::list(dir.path()).is_err());
}

#[test]
fn names_sort_as_sequences() {
    assert_eq!(
        delta::parse_name("00000000000000000042.arrow"),
        Some((42, Encoding::Arrow))
    );
    assert_eq!(delta::parse_name("7.parquet"), Some((7, Encoding::Parquet)));
    for odd in [
        "x.arrow",
        ".arrow",
        "1.dense.npz",
        "1.arrow.tmp",
        "123456789012345678901.arrow",
    ] {
        assert_eq!(delta::parse_name(odd), None, "{odd}");
    }
    assert!(delta::file_name(9, Encoding::Arrow) < delta::file_name(10, Encoding::Arrow));
}
