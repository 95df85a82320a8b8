//! Where a `Swap` may take a store from, and what it takes to expose one.
//!
//! A swap serves a new directory under the store's name, so it is confined: the path must
//! resolve (symbolic links followed) to a directory under the node's swap root — the
//! configured `--swap-root`, or else the directory holding the store served now — and a
//! relative path is taken from that root. The caller needs admin of the whole store (as
//! before), and the grants of what the swap exposes: read of every table of the new store, and
//! write of each when the node serves the store writable.

use std::path::{Path, PathBuf};

use nearrec::format::{Repository, StoreReader};
use nearrec::{Info, SwapTo};
use tonic::Status;

use nearrec_wire::v1 as pb;

use crate::acl::{Permission, Principal};

/// The directory `requested` names, resolved and confined to `root` (`None`: the parent of
/// `served`, the store's directory now, where it has one). Refusals are the caller's errors: `INVALID_ARGUMENT`
/// for a path that is not a directory or holds a NUL, `NOT_FOUND` for one that does not exist,
/// `PERMISSION_DENIED` for one outside the root.
pub fn resolve(
    root: Option<&Path>,
    served: Option<&Path>,
    requested: &str,
) -> Result<PathBuf, Status> {
    let shown = nearrec_wire::status::clip(requested, 256);
    if requested.is_empty() || requested.contains('\0') {
        return Err(Status::invalid_argument(format!(
            "{shown:?} is not a path: name the store directory to swap in"
        )));
    }
    let root = match (root, served) {
        (Some(r), _) => r.to_path_buf(),
        (None, Some(s)) => s.parent().unwrap_or(Path::new("/")).to_path_buf(),
        (None, None) => {
            return Err(Status::failed_precondition(
                "this store has no directory on the node to swap beside; the node's \
                 --swap-root says where stores are swapped from",
            ));
        }
    };
    let root = root.canonicalize().map_err(|e| {
        Status::failed_precondition(format!(
            "the node's swap root {} cannot be resolved: {e}",
            root.display()
        ))
    })?;
    let path = root.join(requested); // an absolute `requested` stands for itself
    let path = path.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Status::not_found(format!("no directory {shown:?}")),
        std::io::ErrorKind::NotADirectory => {
            Status::invalid_argument(format!("{shown:?} is not a store directory"))
        }
        _ => Status::invalid_argument(format!("{shown:?} cannot be resolved: {e}")),
    })?;
    if !path.starts_with(&root) || path == root {
        return Err(Status::permission_denied(format!(
            "{shown:?} is outside the directory this node swaps stores from ({}); the node's \
             --swap-root says where",
            root.display()
        )));
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

    #[test]
    fn a_swap_is_confined_to_its_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("stores");
        let (served, next) = (root.join("v1"), root.join("v2"));
        for d in [&served, &next] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(root.join("file"), b"x").unwrap();
        let outside = dir.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let code = |r: Result<PathBuf, Status>| r.map_err(|s| s.code());

        let next = next.canonicalize().unwrap();
        assert_eq!(code(resolve(None, Some(&served), "v2")), Ok(next.clone()));
        assert_eq!(
            code(resolve(None, Some(&served), next.to_str().unwrap())),
            Ok(next.clone())
        );
        assert_eq!(code(resolve(Some(&root), Some(&outside), "v2")), Ok(next));
        for bad in [
            outside.to_str().unwrap(),
            "link",
            "../elsewhere",
            "/",
            ".",
            "/etc",
        ] {
            assert_eq!(
                code(resolve(None, Some(&served), bad)),
                Err(Code::PermissionDenied),
                "{bad}"
            );
        }
        assert_eq!(
            code(resolve(None, Some(&served), "nope")),
            Err(Code::NotFound)
        );
        assert_eq!(
            code(resolve(None, Some(&served), "file")),
            Err(Code::InvalidArgument)
        );
        assert_eq!(
            code(resolve(None, Some(&served), "file/x")),
            Err(Code::InvalidArgument)
        );
        assert_eq!(
            code(resolve(None, Some(&served), "v2\0x")),
            Err(Code::InvalidArgument)
        );
        assert_eq!(
            code(resolve(None, Some(&served), "")),
            Err(Code::InvalidArgument)
        );
        // a store with no directory here swaps only from a configured root
        assert_eq!(
            code(resolve(None, None, "v2")),
            Err(Code::FailedPrecondition)
        );
    }
}
