//! What killed writers leave behind, and how it is found.
//!
//! - A build writes its store in a temporary directory `.NAME.nrtmp-PID-NANOS` beside the
//!   target and renames it into place at commit. The writer holds an exclusive `flock` on that
//!   directory for as long as it runs; the kernel drops the lock when the process dies, however
//!   it dies. A temporary is stale exactly when nobody holds its lock (no age or pid guess).
//! - [`crate::attach`] writes its blob inside the store before the manifest names it, under the
//!   store directory's lock. A blob the manifest does not name, found while nobody holds that
//!   lock, was left by a killed attach: an orphan.
//!
//! Every build sweeps the stale temporaries beside its target (of any name); `verify` lists
//! orphans; [`gc`](crate::gc()) removes both. Finding them is apart from removing them because
//! the reader lists orphans and `gc` needs the reader: this module sits below both.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::files::lock_dir;
use crate::manifest::{MANIFEST_FILE, Manifest};

/// The infix of a build's temporary directory: `.NAME.nrtmp-PID-NANOS`.
pub(crate) const TEMP_INFIX: &str = ".nrtmp-";

/// A file or directory a killed writer left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub path: PathBuf,
    pub bytes: u64,
    /// Left by an interrupted nearrec write (not something else put in the directory).
    pub ours: bool,
    /// What it is, and why it was kept when it was.
    pub reason: String,
}

/// What [`gc`](crate::gc()) removed and what it left, with the reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed: Vec<Leftover>,
    pub kept: Vec<Leftover>,
}

/// The entries of store `dir` that `manifest` does not name: nearrec's own leftovers (a blob of
/// a killed attach, a manifest's temporary, the new files of an interrupted compaction) and
/// anything else put there. A live store's table files that a compaction replaced (their
/// version at or before the manifest's position: [`retired`]) are not leftovers: readers one
/// compaction behind may still open them, and the next compaction removes them.
pub fn orphans(dir: &Path, manifest: &Manifest) -> Vec<Leftover> {
    let old = retired(dir, manifest);
    let mut all = unnamed(dir, manifest);
    all.retain(|o| !old.contains(&o.path));
    all
}

/// The table files of live store `dir` that a compaction (or a dropped table) replaced: not
/// named by `manifest`, and written at or before its log position (a plain `table-NNNN.nrt`,
/// or `table-NNNN.<version>.nrt` with its version at most the position), with their sums.
pub fn retired(dir: &Path, manifest: &Manifest) -> Vec<std::path::PathBuf> {
    let Some(lsn) = manifest.lsn else {
        return Vec::new();
    };
    unnamed(dir, manifest)
        .into_iter()
        .filter(|o| {
            let name = o.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let Some(stem) = name
                .strip_suffix(".nrt")
                .or_else(|| name.strip_suffix(".sums"))
                .or_else(|| name.strip_suffix(".keys"))
                .and_then(|n| n.strip_prefix("table-"))
            else {
                return false;
            };
            match stem.split_once('.') {
                None => stem.len() == 4,
                Some((_, v)) => u64::from_str_radix(v, 16).is_ok_and(|v| v <= lsn),
            }
        })
        .map(|o| o.path)
        .collect()
}

fn unnamed(dir: &Path, manifest: &Manifest) -> Vec<Leftover> {
    let mut named: Vec<&str> = vec![MANIFEST_FILE];
    for t in &manifest.tables {
        named.extend(t.files());
    }
    named.extend(manifest.attachments.iter().map(|a| a.file.as_str()));
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Leftover> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if named.contains(&name.as_str()) {
                return None;
            }
            let ours = name.starts_with("attach-")
                || name.starts_with(&format!(".{MANIFEST_FILE}.tmp-"))
                || (name.starts_with("table-")
                    && [".nrt", ".order", ".sums", ".keys"]
                        .iter()
                        .any(|x| name.ends_with(x)));
            let reason = if ours {
                "left by an interrupted write; the manifest does not name it (`nearrec gc` \
                 removes it)"
            } else {
                "not a file nearrec writes; left alone"
            };
            Some(Leftover {
                bytes: size(&e.path()),
                path: e.path(),
                ours,
                reason: reason.to_owned(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Removes the build temporaries in `dir` whose writer is gone (nobody holds their lock). A
/// temporary holding a finished store whose target is missing is kept: a commit was
/// interrupted between its two renames (filesystems without `renameat2`), and it is the only
/// copy.
pub(crate) fn sweep_temps(dir: &Path, report: &mut GcReport) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(target) = name
            .strip_prefix('.')
            .and_then(|n| n.split_once(TEMP_INFIX))
            .map(|(base, _)| dir.join(base))
        else {
            continue;
        };
        let path = entry.path();
        let leftover = |reason: &str| Leftover {
            bytes: size(&path),
            path: path.clone(),
            ours: true,
            reason: reason.to_owned(),
        };
        // Held while it is removed, so that a writer that opened it meanwhile sees it gone.
        let lock = match lock_dir(&path, false) {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                report
                    .kept
                    .push(leftover("a build in progress (its writer holds the lock)"));
                continue;
            }
            Err(_) => continue, // vanished, or not a directory
        };
        if path.join(MANIFEST_FILE).exists() && !target.exists() {
            report.kept.push(leftover(&format!(
                "a finished store whose commit was interrupted; rename it to {} to recover it",
                target.display()
            )));
            continue;
        }
        let gone = leftover("a build whose writer is gone");
        if fs::remove_dir_all(&path).is_ok() {
            report.removed.push(gone);
        }
        drop(lock);
    }
}

/// Bytes under `path` (a file, or a directory's files).
fn size(path: &Path) -> u64 {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::read_dir(path)
            .map(|es| es.flatten().map(|e| size(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.size(),
        Err(_) => 0,
    }
}
