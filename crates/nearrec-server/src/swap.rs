//! Where a `Swap` may take a store from, and what it takes to expose one.
//!
//! A swap serves a new directory under the store's name, so it is confined. The path must
//! resolve (symbolic links followed) to a version of the store's own repository (`REPO/N`,
//! when the store is served from one), or to a directory under the store's swap root (its
//! entry in the node's `swap_roots`, else the node's `swap_root`); a relative path is taken
//! from the root, else from the repository. A directory another served store uses — its
//! directory, or its repository and every version in it — is refused even under a root: an
//! admin of one store never serves, nor writes into, another's. The caller needs admin of the
//! whole store, and the grants of what the swap exposes: read of every table of the new
//! store, and write of each when the node serves the store writable.

use std::path::{Path, PathBuf};

use nearrec::format::{Repository, StoreReader};
use nearrec::{Info, SwapTo};
use tonic::Status;

use nearrec_wire::v1 as pb;

use crate::acl::{Permission, Principal};

/// What one store's swaps may reach.
#[derive(Debug, Default)]
pub struct Reach {
    /// The store's swap root, if the node sets one.
    pub root: Option<PathBuf>,
    /// The store's directory now, where it has one.
    pub served: Option<PathBuf>,
    /// The other served stores, by name, and their directories now.
    pub others: Vec<(String, PathBuf)>,
}

/// The repository `dir` is a version of, if it is one.
fn repository_of(dir: &Path) -> Option<Repository> {
    dir.parent().and_then(Repository::detect)
}

/// What a store's directory claims: its repository when it is a version of one, else itself.
fn home(dir: &Path) -> Option<PathBuf> {
    let home = repository_of(dir).map_or_else(|| dir.to_path_buf(), |r| r.path().to_path_buf());
    home.canonicalize().ok()
}

/// The directory `requested` names, resolved and confined as the module's doc says.
/// Refusals are the caller's errors: `INVALID_ARGUMENT` for a path that is not a directory or
/// holds a NUL, `NOT_FOUND` for one that does not exist, `PERMISSION_DENIED` for one outside
/// what the store may reach or that another store uses; `FAILED_PRECONDITION` when the store
/// may reach nothing (no repository, no root).
pub fn resolve(reach: &Reach, requested: &str) -> Result<PathBuf, Status> {
    let shown = nearrec_wire::status::clip(requested, 256);
    if requested.is_empty() || requested.contains('\0') {
        return Err(Status::invalid_argument(format!(
            "{shown:?} is not a path: name the store directory to swap in"
        )));
    }
    let repo = reach.served.as_deref().and_then(repository_of);
    let repo_dir = repo.as_ref().and_then(|r| r.path().canonicalize().ok());
    let root = match &reach.root {
        Some(r) => Some(r.canonicalize().map_err(|e| {
            Status::failed_precondition(format!(
                "the store's swap root {} cannot be resolved: {e}",
                r.display()
            ))
        })?),
        None => None,
    };
    let Some(base) = root.as_ref().or(repo_dir.as_ref()) else {
        return Err(Status::failed_precondition(
            "this store is not served from a repository of versions and the node sets it no \
             swap root: publish its versions into a repository, or set swap_roots (or \
             --swap-root) in the node's config",
        ));
    };
    let path = base.join(requested); // an absolute `requested` stands for itself
    let path = path.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Status::not_found(format!("no directory {shown:?}")),
        std::io::ErrorKind::NotADirectory => {
            Status::invalid_argument(format!("{shown:?} is not a store directory"))
        }
        _ => Status::invalid_argument(format!("{shown:?} cannot be resolved: {e}")),
    })?;
    let in_root = root
        .as_ref()
        .is_some_and(|r| path.starts_with(r) && path != *r);
    let a_version = repo.as_ref().is_some_and(|r| r.version_of(&path).is_some());
    if !in_root && !a_version {
        let reachable = [
            repo_dir
                .as_ref()
                .map(|r| format!("the versions of {}", r.display())),
            root.as_ref()
                .map(|r| format!("directories under {}", r.display())),
        ];
        let reachable: Vec<String> = reachable.into_iter().flatten().collect();
        return Err(Status::permission_denied(format!(
            "{shown:?} is outside what this store swaps from ({}); the node's swap_roots \
             says where",
            reachable.join(" and ")
        )));
    }
    for (name, dir) in &reach.others {
        if let Some(theirs) = home(dir)
            && (path.starts_with(&theirs) || theirs.starts_with(&path))
        {
            return Err(Status::permission_denied(format!(
                "{shown:?} is in use by the store {name:?} ({}): a swap never serves another \
                 store's directory",
                theirs.display()
            )));
        }
    }
    if !path.is_dir() {
        return Err(Status::invalid_argument(format!(
            "{shown:?} is a file, not a store directory"
        )));
    }
    Ok(path)
}

/// What a swap request names: a path, a version or a rollback (`INVALID_ARGUMENT` for more
/// than one).
pub fn target(req: &pb::SwapRequest) -> Result<SwapTo, Status> {
    match (req.path.is_empty(), req.version, req.rollback) {
        (false, 0, false) => Ok(SwapTo::Path(req.path.clone())),
        (true, v, false) if v > 0 => Ok(SwapTo::Version(v)),
        (true, 0, true) => Ok(SwapTo::Previous),
        (true, 0, false) => Err(Status::invalid_argument(
            "name what to swap to: a store directory, a version, or a rollback",
        )),
        _ => Err(Status::invalid_argument(
            "a swap names one of a store directory, a version and a rollback",
        )),
    }
}

/// The directory a swap to `to` would serve for the store `info` describes (a path already
/// resolved, or a version of its repository), to check the caller's grants on it first.
pub fn destination(info: &Info, to: &SwapTo) -> nearrec::Result<PathBuf> {
    if let SwapTo::Path(p) = to {
        return Ok(PathBuf::from(p));
    }
    let served = Path::new(&info.path);
    let repo = served
        .parent()
        .and_then(Repository::detect)
        .filter(|_| info.served_version.is_some());
    let Some(repo) = repo else {
        return Err(nearrec::Error::InvalidRequest {
            table: None,
            position: None,
            reason: format!(
                "store {:?} is not served from a repository of versions: swap it to a path",
                info.name
            ),
        });
    };
    let served = info.served_version.unwrap_or(0);
    Ok(nearrec::versions::target(&repo, served, to)?.1)
}

/// What a swap is called in the node's log.
pub fn event(to: &SwapTo) -> &'static str {
    match to {
        SwapTo::Previous => "rollback",
        _ => "swap",
    }
}

/// What a store serves, for the log: `version N (PATH)`, or the path.
pub fn served(info: Option<&Info>) -> String {
    match info {
        Some(Info {
            served_version: Some(v),
            path,
            ..
        }) => format!("version {v} ({path})"),
        Some(i) => i.path.clone(),
        None => "?".into(),
    }
}

/// `PERMISSION_DENIED` unless `p` may read every table of the store at `path` (and write each
/// when `writable`): what swapping it in exposes under the store's name `store`.
pub fn allow_exposed(
    p: &Principal,
    store: &str,
    path: &Path,
    writable: bool,
) -> Result<(), Status> {
    let reader =
        StoreReader::open(path).map_err(|e| nearrec_wire::status_of(&nearrec::Error::from(e)))?;
    for t in &reader.manifest().tables {
        p.allow(Permission::Read, store, &t.name)?;
        if writable {
            p.allow(Permission::Write, store, &t.name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn code(r: Result<PathBuf, Status>) -> Result<PathBuf, Code> {
        r.map_err(|s| s.code())
    }

    /// A directory that reads as a store to [`Repository::detect`] (a manifest file).
    fn store_dir(dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(nearrec::format::MANIFEST_FILE), b"{}").unwrap();
        dir.canonicalize().unwrap()
    }

    #[test]
    fn a_swap_is_confined_to_its_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("stores");
        let (served, next) = (store_dir(&root.join("v1")), store_dir(&root.join("v2")));
        std::fs::write(root.join("file"), b"x").unwrap();
        let outside = dir.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let reach = Reach {
            root: Some(root.clone()),
            served: Some(served.clone()),
            others: Vec::new(),
        };

        assert_eq!(code(resolve(&reach, "v2")), Ok(next.clone()));
        assert_eq!(code(resolve(&reach, next.to_str().unwrap())), Ok(next));
        for bad in [
            outside.to_str().unwrap(),
            "link",
            "../elsewhere",
            "/",
            ".",
            "/etc",
        ] {
            assert_eq!(
                code(resolve(&reach, bad)),
                Err(Code::PermissionDenied),
                "{bad}"
            );
        }
        assert_eq!(code(resolve(&reach, "nope")), Err(Code::NotFound));
        assert_eq!(code(resolve(&reach, "file")), Err(Code::InvalidArgument));
        assert_eq!(code(resolve(&reach, "file/x")), Err(Code::InvalidArgument));
        assert_eq!(code(resolve(&reach, "v2\0x")), Err(Code::InvalidArgument));
        assert_eq!(code(resolve(&reach, "")), Err(Code::InvalidArgument));
        // without a root, a store outside a repository reaches nothing: its siblings are not
        // its own
        let unrooted = Reach {
            root: None,
            ..reach
        };
        assert_eq!(
            code(resolve(&unrooted, "v2")),
            Err(Code::FailedPrecondition)
        );
        assert_eq!(
            code(resolve(&Reach::default(), "v2")),
            Err(Code::FailedPrecondition)
        );
    }

    #[test]
    fn a_swap_reaches_its_own_versions_and_never_another_stores_directory() {
        let dir = tempfile::tempdir().unwrap();
        let b2 = dir.path().join("b2");
        // a repository `s` with two versions, a store `other` beside it, and a repository
        // `t` of another store
        let (s1, s2) = (store_dir(&b2.join("s/1")), store_dir(&b2.join("s/2")));
        let other = store_dir(&b2.join("other"));
        let t1 = store_dir(&b2.join("t/1"));
        let staged = store_dir(&b2.join("staging/s-next"));
        let others = vec![("other".to_owned(), other.clone()), ("t".to_owned(), t1)];
        let own = Reach {
            root: None,
            served: Some(s1.clone()),
            others: others.clone(),
        };
        assert_eq!(code(resolve(&own, "2")), Ok(s2.clone()));
        assert_eq!(code(resolve(&own, s2.to_str().unwrap())), Ok(s2.clone()));
        for bad in [
            other.to_str().unwrap(),
            "../other",
            "../t/1",
            "../staging/s-next",
        ] {
            assert_eq!(
                code(resolve(&own, bad)),
                Err(Code::PermissionDenied),
                "{bad}"
            );
        }
        // a root over every store's directory still keeps the others' out
        let rooted = Reach {
            root: Some(b2.clone()),
            ..own
        };
        assert_eq!(code(resolve(&rooted, "s/2")), Ok(s2));
        assert_eq!(code(resolve(&rooted, "staging/s-next")), Ok(staged));
        for bad in ["other", "t", "t/1", "."] {
            let e = resolve(&rooted, bad).unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{bad}: {e:?}");
        }
        let e = resolve(&rooted, "other").unwrap_err();
        assert!(e.message().contains("\"other\""), "{e:?}");
    }
}
