//! Versions of one served name: a store opened from a repository (`REPO/NAME/1`, `2`, ... and
//! the `CURRENT` pointer, `nearrec_format::Repository`) serves the version the pointer names,
//! after a restart too. A swap to a version, or back to the one served before it (a rollback),
//! replaces the pointer atomically between opening the new version and serving it; with
//! `keep_last`, the versions beyond the newest few are removed once the last call on them has
//! ended. `docs/serving.md` ("Versions") is the user's side of it.

use std::path::{Path, PathBuf};

use nearrec_format::{Pointer, Repository, StoreReader};

use crate::error::{Error, Result};

/// What a swap serves next ([`crate::Versions::swap`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwapTo {
    /// A store directory on the serving side's file system; in a repository, one of its
    /// versions' directories.
    Path(String),
    /// A version of the repository the store is served from.
    Version(u64),
    /// The version served before the current one (a rollback).
    Previous,
}

impl SwapTo {
    /// The store directory at `path`.
    pub fn path(path: impl AsRef<std::path::Path>) -> Self {
        Self::Path(path.as_ref().to_string_lossy().into_owned())
    }
}

/// A store found from a path: the store there, or the current version of the repository
/// there.
#[derive(Debug)]
pub struct Located {
    pub reader: StoreReader,
    pub repo: Option<Repository>,
}

impl Located {
    /// The store at `path`, or the version the repository at `path` serves now.
    pub fn open(path: &Path) -> Result<Self> {
        match Repository::detect(path) {
            Some(repo) => {
                let reader = StoreReader::open(repo.version_path(repo.current()?))?;
                Ok(Self {
                    reader,
                    repo: Some(repo),
                })
            }
            None => Ok(Self {
                reader: StoreReader::open(path)?,
                repo: None,
            }),
        }
    }
}

/// Where a swap of a store served from `repo` goes: the version, its directory and the
/// pointer that serves it. `served` is the version served now.
pub fn target(repo: &Repository, served: u64, to: &SwapTo) -> Result<(u64, PathBuf, Pointer)> {
    let pointer = repo.pointer()?.unwrap_or(Pointer {
        current: served,
        history: Vec::new(),
    });
    let (version, next) = match to {
        SwapTo::Version(v) => (*v, pointer.moved_to(*v)),
        SwapTo::Path(p) => {
            let path = Path::new(p);
            let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
            let v = repo.version_of(&path).ok_or_else(|| {
                Error::invalid(format!(
                    "{p} is not a version of the repository at {} this store is served from: \
                     publish it there (nearrec publish) and swap to its version",
                    repo.path().display()
                ))
            })?;
            (v, pointer.moved_to(v))
        }
        SwapTo::Previous => {
            let versions = repo.versions()?;
            let mut history = pointer.history.clone();
            loop {
                match history.pop() {
                    Some(v) if v != served && versions.contains(&v) => {
                        break (
                            v,
                            Pointer {
                                current: v,
                                history,
                            },
                        );
                    }
                    Some(_) => {}
                    None => {
                        return Err(Error::invalid(format!(
                            "the repository at {} has no version served before {served} that \
                             is still there: nothing to roll back to (its versions: {versions:?})",
                            repo.path().display()
                        )));
                    }
                }
            }
        }
    };
    let path = repo.version_path(version);
    if !path.join(nearrec_format::MANIFEST_FILE).is_file() {
        return Err(Error::Format(nearrec_format::FormatError::NotFound {
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "the repository has no version {version} (its versions: {:?})",
                    repo.versions()?
                ),
            ),
        }));
    }
    if version == served {
        return Err(Error::invalid(format!(
            "version {version} is the one being served; swap to another one"
        )));
    }
    Ok((version, path, next))
}

/// Removes the versions of `repo` beyond its `keep_last` newest, apart from the current one
/// and those in `held` (still being let go), under the repository's lock; false, removing
/// nothing, when someone holds the lock. A version that cannot be removed is left for the next
/// prune.
pub(crate) fn prune(repo: &Repository, keep_last: usize, held: &[u64]) -> Result<bool> {
    let Some(_lock) = repo.try_lock()? else {
        return Ok(false);
    };
    for v in repo.beyond(keep_last, held)? {
        let _ = repo.remove(v);
    }
    Ok(true)
}
