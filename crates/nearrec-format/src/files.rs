//! Opening the files a store, a trace or a plan is made of: regular files only.
//!
//! `open(2)` on a FIFO blocks until a writer appears, and a read of a character device may never
//! end. Every file nearrec reads is opened non-blocking and checked with `fstat` before a byte
//! is read, so a FIFO or a device where a table or trace should be is refused at once.
//!
//! A store's own files (its manifest, tables, row orders, sector sums, attachments) are opened
//! with [`IN_STORE`]: a symbolic link among them is refused. Their names never hold a `/`, so a
//! store's files are the ones inside its directory and nothing else — a store served to other
//! users (the storage node) cannot be made to reach a file outside it. The store directory's own
//! path may be a link.

use std::fs::{File, OpenOptions};
use std::io::{Error, ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The open flag for a store's own files: a symbolic link is refused (see the module docs).
pub const IN_STORE: i32 = libc::O_NOFOLLOW;

/// Opens `path` for reading (with `flags` such as `O_DIRECT` or [`IN_STORE`] added), refusing
/// anything but a regular file without blocking on it: the error is [`ErrorKind::InvalidInput`]
/// and says what the path is.
pub fn open_regular(path: &Path, flags: i32) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if flags & IN_STORE != 0 => Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{} is a symbolic link; a store's files must be inside its directory",
                    path.display()
                ),
            ),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{} is {what}, not a regular file", path.display()),
        ));
    }
    // Regular files ignore O_NONBLOCK; clear it anyway so the descriptor is an ordinary one.
    // SAFETY: fcntl on a descriptor we own, with integer arguments.
    unsafe {
        let fd = file.as_raw_fd();
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// The whole of the regular file at `path` (see [`open_regular`]).
pub fn read_regular(path: &Path, flags: i32) -> std::io::Result<Vec<u8>> {
    let mut file = open_regular(path, flags)?;
    let mut bytes = Vec::with_capacity(file.metadata()?.len() as usize);
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The file a live store's writer holds its lock on, beside the tables: one writing process
/// per store, for as long as it is open. (The directory's own lock is the short one, taken by
/// whatever replaces the manifest: attach, gc, compaction.)
pub const WRITER_LOCK: &str = "WRITER.lock";

/// Bytes an unprivileged process may still write to the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| Error::new(ErrorKind::InvalidInput, e))?;
    // SAFETY: a plain C struct of integers, for which all zeros is a value
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes the one struct passed, given a NUL-terminated path
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Takes an exclusive `flock` on directory `dir`, held until the returned file is dropped or
/// the process ends, however it ends. With `wait`, waits for it; without, `Ok(None)` when
/// another process (or another open of it) holds it.
pub fn lock_dir(dir: &Path, wait: bool) -> std::io::Result<Option<File>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    flock(file, wait)
}

/// Removes the file at `path` a `step` of bytes at a time from its end, `pace` called with
/// each step's bytes (it may sleep), then unlinks it: on a filesystem that discards freed
/// blocks (ext4 `-o discard`), a large file unlinked at once frees them in one burst that
/// stalls the disk's other reads for a hundred milliseconds and more. A file already gone is
/// not an error.
pub fn remove_gradually(path: &Path, step: u64, pace: &mut dyn FnMut(u64)) -> std::io::Result<()> {
    let file = match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut len = file.metadata()?.len();
    while len > 0 {
        let cut = len.min(step.max(1));
        len -= cut;
        file.set_len(len)?;
        pace(cut);
    }
    drop(file);
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// [`lock_dir`] on the regular file `path` inside a store (made if missing; a link or anything
/// but a regular file is refused).
pub fn lock_file(path: &Path, wait: bool) -> std::io::Result<Option<File>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(IN_STORE | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    flock(file, wait)
}

fn flock(file: File, wait: bool) -> std::io::Result<Option<File>> {
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(Some(file));
        }
        let e = Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !wait => return Ok(None),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_directories_and_devices_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for p in [fifo.as_path(), dir.path(), Path::new("/dev/zero")] {
            let e = read_regular(p, 0).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{p:?}");
            assert!(e.to_string().contains("not a regular file"));
        }
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(read_regular(&file, 0).unwrap(), b"abc");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular(&link, 0).unwrap(), b"abc");
        let e = read_regular(&link, IN_STORE).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("symbolic link"));
    }

    #[test]
    fn a_directory_lock_is_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_dir(dir.path(), false).unwrap().expect("free");
        assert!(lock_dir(dir.path(), false).unwrap().is_none());
        drop(held);
        assert!(lock_dir(dir.path(), false).unwrap().is_some());
    }
}
