//! Attachments: named blobs kept with a store's tables (a model's dense weights and its
//! configuration), each its own file, listed in the manifest with its size and CRC-32C (format
//! version 2).
//!
//! [`attach`] adds or replaces one in an existing store without touching the tables: the blob is
//! written and fsynced under a fresh file name, then a manifest naming it replaces the old one in
//! one rename; a reader sees the old store or the new one, never a manifest naming a missing or
//! half-written blob. It holds the store directory's lock meanwhile, so a blob a killed attach
//! left can be told from one being written (see [`crate::gc`]).

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{FormatError, Result};
use crate::manifest::{Attachment, Manifest};

/// Attachment names: 1–128 of `A-Z a-z 0-9 . _ -`, not starting with a dot.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(FormatError::InvalidTable {
            table: name.to_owned(),
            reason: "attachment names are 1-128 letters, digits, '.', '_' or '-', not starting \
                     with '.'"
                .into(),
        })
    }
}

/// Writes `bytes` to a new file `dir/attach-NNNN-name` (a number no file there uses), fsynced.
pub(crate) fn write_blob(
    dir: &Path,
    taken: &[Attachment],
    name: &str,
    bytes: &[u8],
) -> Result<Attachment> {
    check_name(name)?;
    let file = (0u32..)
        .map(|n| format!("attach-{n:04}-{name}"))
        .find(|f| !taken.iter().any(|a| &a.file == f) && !dir.join(f).exists())
        .expect("some number is free");
    let path = dir.join(&file);
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| FormatError::io(&path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| FormatError::io(&path, e))?;
    Ok(Attachment {
        name: name.to_owned(),
        file,
        bytes: bytes.len() as u64,
        crc32c: crc32c::crc32c(bytes),
    })
}

/// Adds attachment `name` (or replaces the one of that name) to the store at `path`, atomically
/// (see the module docs). Returns the new manifest.
pub fn attach(path: impl AsRef<Path>, name: &str, bytes: &[u8]) -> Result<Manifest> {
    let path = path.as_ref();
    // One attach at a time per store (two would each replace the manifest, and one would be
    // lost), and no `gc` meanwhile: until the manifest names the new blob it looks orphaned.
    let _lock = crate::files::lock_dir(path, true).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FormatError::NotFound {
            path: path.to_path_buf(),
            source: e,
        },
        _ => FormatError::io(path, e),
    })?;
    // opening validates the store: an attachment never joins a damaged one
    let reader = crate::StoreReader::open(path)?;
    let mut manifest = reader.manifest().clone();
    drop(reader);
    let new = write_blob(path, &manifest.attachments, name, bytes)?;
    let new_file = path.join(&new.file);
    let old = match manifest.attachments.iter_mut().find(|a| a.name == name) {
        Some(slot) => Some(std::mem::replace(slot, new)),
        None => {
            manifest.attachments.push(new);
            None
        }
    };
    manifest.format_version = manifest.needed_version();
    if let Err(e) = manifest.publish(path) {
        let _ = std::fs::remove_file(&new_file);
        return Err(e);
    }
    if let Some(old) = old {
        let _ = std::fs::remove_file(path.join(old.file));
    }
    Ok(manifest)
}
