//! Attachments: added to built stores or at build time, replaced atomically, checked, carried by
//! co-located copies; damage is named.

use std::path::Path;

use nearrec_format::{
    DType, FormatError, StoreOptions, StoreReader, StoreWriter, TableSpec, attach, copy_ordered,
};

fn build(path: &Path, blob: Option<&[u8]>) {
    let mut w = StoreWriter::create(path, StoreOptions::default()).unwrap();
    let mut t = w.table(TableSpec::new("t", 100, 4, DType::Fp32)).unwrap();
    t.write_with(100, |r, v| v.fill(r as f32)).unwrap();
    w.finish_table(t).unwrap();
    if let Some(b) = blob {
        w.attach("model.json", b).unwrap();
        assert!(w.attach("model.json", b).is_err(), "attached twice");
    }
    w.commit().unwrap();
}

#[test]
fn attachments_are_added_replaced_and_copied() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    build(&a, None);
    // every new store has sector checksums: version 3, with or without attachments
    assert_eq!(StoreReader::open(&a).unwrap().manifest().format_version, 3);
    let m = attach(&a, "dense.npz", b"weights-1").unwrap();
    assert_eq!(m.format_version, 3);
    let r = StoreReader::open(&a).unwrap();
    assert_eq!(
        r.read_attachment("dense.npz").unwrap().unwrap(),
        b"weights-1"
    );
    assert_eq!(r.read_attachment("nope").unwrap(), None);
    let first = r.attachments()[0].file.clone();
    // replacing writes a new file and removes the old one once the manifest names the new
    attach(&a, "dense.npz", b"weights-two").unwrap();
    let r = StoreReader::open(&a).unwrap();
    assert_eq!(r.attachments().len(), 1);
    assert_eq!(
        r.read_attachment("dense.npz").unwrap().unwrap(),
        b"weights-two"
    );
    assert!(!a.join(&first).exists());
    assert!(r.verify(None).iter().all(|c| c.error.is_none()));
    assert!(
        r.verify(None)
            .iter()
            .any(|c| c.table == "attachment dense.npz")
    );
    // a co-located (or any) copy carries them
    copy_ordered(&r, &b, &[None], StoreOptions::default(), None).unwrap();
    let copy = StoreReader::open(&b).unwrap();
    assert_eq!(
        copy.read_attachment("dense.npz").unwrap().unwrap(),
        b"weights-two"
    );
    // and a store can be built with one
    let c = dir.path().join("c");
    build(&c, Some(b"{}"));
    assert_eq!(
        StoreReader::open(&c)
            .unwrap()
            .read_attachment("model.json")
            .unwrap()
            .unwrap(),
        b"{}"
    );
}

#[test]
fn damage_and_bad_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    build(&a, None);
    for bad in ["", ".hidden", "a/b", "sp ace"] {
        assert!(
            matches!(attach(&a, bad, b"x"), Err(FormatError::InvalidTable { .. })),
            "{bad:?}"
        );
    }
    attach(&a, "dense.npz", b"0123456789").unwrap();
    let file = a.join(&StoreReader::open(&a).unwrap().attachments()[0].file);
    // a flipped byte: the store opens, reading the blob names the damage, verify reports it
    std::fs::write(&file, b"0123456780").unwrap();
    let r = StoreReader::open(&a).unwrap();
    let err = r.read_attachment("dense.npz").unwrap_err().to_string();
    assert!(err.contains("attachment \"dense.npz\""), "{err}");
    assert!(r.verify(None).iter().any(|c| c.error.is_some()));
    // a truncated or missing blob: the store does not open
    std::fs::write(&file, b"01234").unwrap();
    assert!(matches!(
        StoreReader::open(&a),
        Err(FormatError::Corrupted { .. })
    ));
    std::fs::remove_file(&file).unwrap();
    let err = StoreReader::open(&a).unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");
    // nothing is attached to a damaged store
    assert!(attach(&a, "other", b"x").is_err());
}
