//! Durable, atomic replacement: of a store directory (a build's commit), of its manifest, of any
//! small file ([`replace_file`]: a repository's pointer, a store's kept hot set).

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{FormatError, Result};
use crate::manifest::{MANIFEST_FILE, MANIFEST_MAGIC, Manifest};

/// Makes `bytes` the contents of `path`, atomically and durably: written and synced under a
/// temporary name beside it, renamed over it, its directory synced. A reader sees the old file
/// or the new one; a crash leaves one of them (and perhaps the temporary, `.NAME.tmp-PID`).
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(FormatError::io(path, e));
    }
    fsync_dir(dir)
}

/// fsyncs a directory so that renames and creations inside it are durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| FormatError::io(dir, e))
}

impl Manifest {
    /// Makes this the manifest of store `dir`, atomically: written and synced under a temporary
    /// name, renamed over `MANIFEST`, the directory synced. A reader sees the old manifest or
    /// this one, never a mix; a crash leaves one of them (and perhaps the temporary, which
    /// [`crate::gc()`] removes). The caller holds the store's directory lock.
    pub fn publish(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join(format!(".{MANIFEST_FILE}.tmp-{}", std::process::id()));
        let written = File::create(&tmp)
            .and_then(|mut f| f.write_all(&self.encode()).and_then(|()| f.sync_all()))
            .and_then(|()| {
                fail::fail_point!("manifest::publish", |_| Err(
                    std::io::Error::from_raw_os_error(libc::EIO)
                ));
                std::fs::rename(&tmp, dir.join(MANIFEST_FILE))
            });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(FormatError::io(dir.join(MANIFEST_FILE), e));
        }
        fsync_dir(dir)
    }
}

/// Starts the writeback of `len` bytes at `at` of `file`, then waits for the range before
/// (`previous`) to reach the disk and drops its pages from the page cache: a steady writer's
/// step (see `WritePipeline::start_with`).
pub(crate) fn write_back(
    file: &File,
    at: u64,
    len: u64,
    previous: Option<(u64, u64)>,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let range = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: plain syscalls on an open descriptor; the ranges are within what was written
    unsafe {
        range(libc::sync_file_range(
            fd,
            at as i64,
            len as i64,
            libc::SYNC_FILE_RANGE_WRITE,
        ))?;
        if let Some((at, len)) = previous {
            range(libc::sync_file_range(
                fd,
                at as i64,
                len as i64,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            ))?;
            libc::posix_fadvise(fd, at as i64, len as i64, libc::POSIX_FADV_DONTNEED);
        }
    }
    Ok(())
}

/// True if `path` is an empty directory or holds a nearrec manifest: the only things a build
/// with `overwrite` may replace.
pub(crate) fn is_store_or_empty(path: &Path) -> bool {
    if let Ok(mut entries) = fs::read_dir(path)
        && entries.next().is_none()
    {
        return true;
    }
    let mut magic = [0u8; 8];
    crate::files::open_regular(&path.join(MANIFEST_FILE), crate::files::IN_STORE)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| magic == MANIFEST_MAGIC)
}

/// Moves the finished store `tmp` to `target` in one step and makes it durable.
///
/// With `overwrite`, an existing target is swapped out with `renameat2(RENAME_EXCHANGE)` (readers
/// see the old store or the new one, never neither) and then deleted. Without it,
/// `RENAME_NOREPLACE` refuses to clobber a target that appeared meanwhile.
pub(crate) fn commit_dir(tmp: &Path, target: &Path, overwrite: bool) -> Result<()> {
    let parent = target.parent().unwrap_or(Path::new("/"));
    let exists = target.exists();
    if exists && !overwrite {
        return Err(FormatError::AlreadyExists {
            path: target.to_path_buf(),
        });
    }
    let flags = if exists {
        libc::RENAME_EXCHANGE
    } else {
        libc::RENAME_NOREPLACE
    };
    match rename2(tmp, target, flags) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            return Err(FormatError::AlreadyExists {
                path: target.to_path_buf(),
            });
        }
        // Filesystems without renameat2 flags: fall back to plain renames (a crash between the
        // two leaves the old store under `tmp`'s sibling name and none at the target).
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
            if exists {
                let old = tmp.with_extension("old");
                fs::rename(target, &old).map_err(|e| FormatError::io(target, e))?;
                fs::rename(tmp, target).map_err(|e| FormatError::io(target, e))?;
                fsync_dir(parent)?;
                let _ = fs::remove_dir_all(&old);
                return Ok(());
            }
            fs::rename(tmp, target).map_err(|e| FormatError::io(target, e))?;
        }
        Err(e) => return Err(FormatError::io(target, e)),
    }
    fsync_dir(parent)?;
    if exists {
        // `tmp` now holds the old store.
        let _ = fs::remove_dir_all(tmp);
    }
    Ok(())
}

fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD is accepted for absolute and relative paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
