//! `gc`: removes what killed writers left (found by [`crate::leftovers`]), under the store's
//! lock so that nothing an attach or a build is still writing goes.

use std::fs;
use std::path::Path;

use crate::error::{FormatError, Result};
use crate::files::lock_dir;
use crate::leftovers::{GcReport, orphans, sweep_temps};
use crate::manifest::MANIFEST_FILE;

/// Removes what killed writers left at `path`: for a store, the blobs its manifest does not
/// name (under the store's lock: never while an attach is under way) and the stale build
/// temporaries beside it; for any other directory, the stale build temporaries in it.
pub fn gc(path: &Path) -> Result<GcReport> {
    let mut report = GcReport::default();
    let is_store = path.join(MANIFEST_FILE).exists();
    if is_store {
        let Some(_lock) = lock_dir(path, false).map_err(|e| FormatError::io(path, e))? else {
            return Err(FormatError::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "another process is writing to this store; run gc when it is done",
                ),
            ));
        };
        // read under the lock: an attach's blob is named by the manifest before it lets go
        let reader = crate::StoreReader::open(path)?;
        for o in orphans(path, reader.manifest()) {
            if o.ours {
                remove(&o.path).map_err(|e| FormatError::io(&o.path, e))?;
                report.removed.push(o);
            } else {
                report.kept.push(o);
            }
        }
    }
    let dir = if is_store {
        path.parent().unwrap_or(Path::new("/"))
    } else {
        path
    };
    sweep_temps(dir, &mut report);
    Ok(report)
}

fn remove(path: &Path) -> std::io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}
