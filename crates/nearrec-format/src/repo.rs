//! A repository of versions: one served name, its stores as numbered versions, and the version
//! served now (`docs/format.md` §14).
//!
//! ```text
//! dlrm/              the repository: one name, served as one store
//!   1/  2/  5/       its versions, each a store directory; numbers only grow
//!   CURRENT          {"current": 5, "history": [1, 2]}: the version served, the ones served
//!                    before it (most recent last), written atomically
//!   .lock            held while the pointer is read and replaced
//! ```
//!
//! Without `CURRENT`, the newest version is the current one. A version is published by moving or
//! copying a closed store under a temporary name and renaming it to the next free number
//! (`RENAME_NOREPLACE`: two publishers never take one number); it is removed by renaming it
//! aside first, so that a half-removed version is never listed.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::error::{FormatError, Result};
use crate::files::{self, IN_STORE, WRITER_LOCK};
use crate::manifest::MANIFEST_FILE;
use crate::sync::{commit_dir, fsync_dir};

/// The pointer file of a repository.
pub const CURRENT_FILE: &str = "CURRENT";
const LOCK_FILE: &str = ".lock";
/// How many versions served before the current one the pointer remembers.
const HISTORY: usize = 32;

/// The version a repository serves and the ones it served before (most recent last).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pointer {
    pub current: u64,
    #[serde(default)]
    pub history: Vec<u64>,
}

impl Pointer {
    /// The pointer after serving `next` in place of this one's current version.
    pub fn moved_to(&self, next: u64) -> Self {
        let mut history = self.history.clone();
        if self.current != 0 && self.current != next {
            history.push(self.current);
        }
        let drop = history.len().saturating_sub(HISTORY);
        history.drain(..drop);
        Self {
            current: next,
            history,
        }
    }
}

/// How a store enters a repository ([`Repository::publish`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// Its files are copied; the source stays as it is.
    Copy,
    /// The directory is renamed into the repository (same file system only).
    Move,
}

/// A repository directory (see the module's doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    dir: PathBuf,
}

/// Whether `dir` holds a store (its manifest).
fn is_store(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

impl Repository {
    /// The repository at `dir` if it is one: a directory that is not a store itself and holds
    /// a `CURRENT` pointer or at least one numbered version.
    pub fn detect(dir: &Path) -> Option<Self> {
        if !dir.is_dir() || is_store(dir) {
            return None;
        }
        let repo = Self {
            dir: dir.to_path_buf(),
        };
        let versions = repo.versions().unwrap_or_default();
        (dir.join(CURRENT_FILE).is_file() || !versions.is_empty()).then_some(repo)
    }

    /// The repository at `dir`, made (empty) if there is no directory there. A store directory
    /// is refused: a repository holds stores, it is not one.
    pub fn create(dir: &Path) -> Result<Self> {
        if is_store(dir) {
            return Err(FormatError::Repository {
                path: dir.to_path_buf(),
                reason: "it is a store; a repository is the directory that holds a name's \
                         versions (REPO/NAME/1, REPO/NAME/2, ...)"
                    .into(),
            });
        }
        fs::create_dir_all(dir).map_err(|e| FormatError::io(dir, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The directory of version `version` (whether or not it exists).
    pub fn version_path(&self, version: u64) -> PathBuf {
        self.dir.join(version.to_string())
    }

    /// The version `path` is the directory of, if it is one of this repository's.
    pub fn version_of(&self, path: &Path) -> Option<u64> {
        let parent = path.parent()?;
        let same = parent == self.dir
            || parent
                .canonicalize()
                .ok()
                .zip(self.dir.canonicalize().ok())
                .is_some_and(|(a, b)| a == b);
        same.then(|| parse_version(path.file_name()?.to_str()?))
            .flatten()
    }

    /// The versions that hold a store, lowest first.
    pub fn versions(&self) -> Result<Vec<u64>> {
        let mut out = self.numbered()?;
        out.retain(|v| is_store(&self.version_path(*v)));
        Ok(out)
    }

    /// Every entry named as a version, store or not, lowest first.
    fn numbered(&self) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(|e| FormatError::io(&self.dir, e))? {
            let entry = entry.map_err(|e| FormatError::io(&self.dir, e))?;
            out.extend(entry.file_name().to_str().and_then(parse_version));
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The pointer as written (`None` before any).
    pub fn pointer(&self) -> Result<Option<Pointer>> {
        let path = self.dir.join(CURRENT_FILE);
        let bytes = match files::read_regular(&path, IN_STORE) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FormatError::io(&path, e)),
        };
        let pointer: Pointer = serde_json::from_slice(&bytes)
            .map_err(|e| FormatError::corrupted(&path, format!("not a version pointer: {e}")))?;
        Ok(Some(pointer))
    }

    /// The version served now: the pointer's, else the newest. A pointer naming a version
    /// that is gone is an error, not a silent fall back to another one.
    pub fn current(&self) -> Result<u64> {
        match self.pointer()? {
            Some(p) if is_store(&self.version_path(p.current)) => Ok(p.current),
            Some(p) => Err(FormatError::Repository {
                path: self.dir.clone(),
                reason: format!(
                    "{CURRENT_FILE} names version {}, which holds no store; point it at one of \
                     {:?} (nearrec swap --version N)",
                    p.current,
                    self.versions()?
                ),
            }),
            None => self
                .versions()?
                .last()
                .copied()
                .ok_or_else(|| FormatError::NotFound {
                    path: self.dir.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "the repository holds no version yet (nearrec publish)",
                    ),
                }),
        }
    }

    /// Takes the repository's lock (waiting for it): held while its pointer is read and
    /// replaced, so that two processes never lose one another's update.
    pub fn lock(&self) -> Result<File> {
        let path = self.dir.join(LOCK_FILE);
        files::lock_file(&path, true)
            .map_err(|e| FormatError::io(&path, e))
            .map(|f| f.expect("a waiting lock is always taken"))
    }

    /// [`Repository::lock`] if no one holds it now (`None` otherwise).
    pub fn try_lock(&self) -> Result<Option<File>> {
        let path = self.dir.join(LOCK_FILE);
        files::lock_file(&path, false).map_err(|e| FormatError::io(&path, e))
    }

    /// Makes `pointer` the repository's, atomically and durably: written and synced under a
    /// temporary name, renamed over `CURRENT`, the directory synced. The caller holds
    /// [`Repository::lock`].
    pub fn set_pointer(&self, pointer: &Pointer) -> Result<()> {
        let mut body = serde_json::to_vec(pointer).expect("a pointer serializes");
        body.push(b'\n');
        crate::sync::replace_file(&self.dir.join(CURRENT_FILE), &body)
    }

    /// Adds the closed store at `store` as the next version (one above every version there is
    /// and every one the pointer names: numbers only grow); returns its number. The store must
    /// open and no writer may hold it. It is not served until the pointer names it.
    pub fn publish(&self, store: &Path, how: Publish) -> Result<u64> {
        self.publish_as(store, how, None)
    }

    /// [`Repository::publish`] as version `version` exactly, which must be above every version
    /// there is and every one the pointer names: what publishes one store's cut as the same
    /// version of every shard's repository. A number taken is refused (`AlreadyExists`).
    pub fn publish_at(&self, store: &Path, how: Publish, version: u64) -> Result<u64> {
        let next = self.next_version()?;
        if version < next {
            return Err(FormatError::AlreadyExists {
                path: self.version_path(version),
            });
        }
        self.publish_as(store, how, Some(version))
    }

    /// The highest version there is (a store or not) or the pointer remembers, plus one: the
    /// number the next [`Repository::publish`] takes.
    pub fn next_version(&self) -> Result<u64> {
        let pointer = self.pointer()?.unwrap_or_default();
        let named = pointer.history.iter().chain([&pointer.current]).copied();
        let highest = self.numbered()?.into_iter().chain(named).max().unwrap_or(0);
        Ok(highest + 1)
    }

    fn publish_as(&self, store: &Path, how: Publish, at: Option<u64>) -> Result<u64> {
        crate::StoreReader::open(store)?;
        let _writer = match files::lock_file(&store.join(WRITER_LOCK), false) {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                return Err(FormatError::Repository {
                    path: store.to_path_buf(),
                    reason: "a writer holds the store open; close it before publishing it".into(),
                });
            }
            Err(e) => return Err(FormatError::io(store.join(WRITER_LOCK), e)),
        };
        let staged = match how {
            Publish::Move => {
                if store
                    .canonicalize()
                    .ok()
                    .and_then(|s| self.version_of(&s))
                    .is_some()
                {
                    return Err(FormatError::Repository {
                        path: store.to_path_buf(),
                        reason: "it is a version of this repository already".into(),
                    });
                }
                store.to_path_buf()
            }
            Publish::Copy => self.copy_in(store)?,
        };
        loop {
            let next = match at {
                Some(v) => v,
                None => self.next_version()?,
            };
            match commit_dir(&staged, &self.version_path(next), false) {
                Ok(()) => return Ok(next),
                // another publisher won it
                Err(FormatError::AlreadyExists { .. }) if at.is_none() => continue,
                Err(FormatError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::EXDEV) =>
                {
                    return Err(FormatError::Repository {
                        path: store.to_path_buf(),
                        reason: format!(
                            "it is on another file system than {}; publish a copy instead",
                            self.dir.display()
                        ),
                    });
                }
                Err(e) => {
                    if how == Publish::Copy {
                        let _ = fs::remove_dir_all(&staged);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// `store`'s regular files copied and synced into a temporary directory of the repository.
    fn copy_in(&self, store: &Path) -> Result<PathBuf> {
        let tmp = self
            .dir
            .join(format!(".incoming-{}-{}", std::process::id(), unique()));
        fs::create_dir(&tmp).map_err(|e| FormatError::io(&tmp, e))?;
        let copied = (|| {
            for entry in fs::read_dir(store).map_err(|e| FormatError::io(store, e))? {
                let entry = entry.map_err(|e| FormatError::io(store, e))?;
                let name = entry.file_name();
                let kind = entry
                    .file_type()
                    .map_err(|e| FormatError::io(entry.path(), e))?;
                if !kind.is_file() || name == WRITER_LOCK {
                    continue;
                }
                let to = tmp.join(&name);
                fs::copy(entry.path(), &to)
                    .and_then(|_| File::open(&to)?.sync_all())
                    .map_err(|e| FormatError::io(&to, e))?;
            }
            fsync_dir(&tmp)
        })();
        match copied {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                Err(e)
            }
        }
    }

    /// Removes version `version`: renamed aside first (no longer listed), then deleted.
    pub fn remove(&self, version: u64) -> Result<()> {
        let path = self.version_path(version);
        let aside = self.dir.join(format!(".removing-{version}-{}", unique()));
        fs::rename(&path, &aside).map_err(|e| FormatError::io(&path, e))?;
        fsync_dir(&self.dir)?;
        fs::remove_dir_all(&aside).map_err(|e| FormatError::io(&aside, e))
    }

    /// The versions `keep_last` would remove: all but the `keep_last` newest, never the
    /// current one nor one in `held`.
    pub fn beyond(&self, keep_last: usize, held: &[u64]) -> Result<Vec<u64>> {
        let current = self.current().ok();
        let versions = self.versions()?;
        let old = versions.len().saturating_sub(keep_last);
        Ok(versions[..old]
            .iter()
            .copied()
            .filter(|v| Some(*v) != current && !held.contains(v))
            .collect())
    }
}

/// A version's number from its directory's name: decimal digits, no sign or leading zero.
fn parse_version(name: &str) -> Option<u64> {
    let digits = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
    (digits && !name.starts_with('0'))
        .then(|| name.parse().ok())
        .flatten()
}

/// A number distinct within this process, for temporary names.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names() {
        assert_eq!(parse_version("12"), Some(12));
        for bad in [
            "",
            "0",
            "012",
            "-1",
            "+1",
            "1a",
            "CURRENT",
            "99999999999999999999999",
        ] {
            assert_eq!(parse_version(bad), None, "{bad}");
        }
    }

    #[test]
    fn history_keeps_the_most_recent() {
        let mut p = Pointer::default();
        for v in 1..=40 {
            p = p.moved_to(v);
        }
        assert_eq!(p.current, 40);
        assert_eq!(p.history, (8..40).collect::<Vec<_>>());
        assert_eq!(
            p.moved_to(40),
            p,
            "serving the current version again changes nothing"
        );
    }
}
