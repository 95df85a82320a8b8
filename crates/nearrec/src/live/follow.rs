//! A read-only store that follows its writer (`StoreConfig::follow_ms`): a thread looks at the
//! store's directory every interval and, when the writer (another process) has logged records
//! or compacted since, replays them ([`Live::refresh`]), so that what the writer acknowledged
//! is served within about one interval — never a success that nobody serving can see.
//!
//! Looking is cheap: the manifest's and the log segments' sizes and modification times. A
//! segment is written over zeros laid ahead (its size does not move), and a file's time moves
//! in the kernel's coarse ticks, so a write in the same tick as the last look would not show:
//! while the newest change is recent the thread refreshes anyway.

use std::path::Path;
use std::sync::Weak;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime};

use super::Live;
use crate::error::{Error, Result};

/// What following did, for `live_stats`.
#[derive(Debug, Default)]
pub(crate) struct FollowStats {
    /// Refreshes that moved the store to a newer version.
    pub moved: AtomicU64,
    /// Refreshes that failed (the store serves the version it had; the next look tries again).
    pub errors: AtomicU64,
    /// The interval, in ms (0: not following).
    pub every_ms: AtomicU64,
}

/// The state of the store's directory as a look sees it: each file's name, size and time.
type Look = Vec<(String, u64, SystemTime)>;

/// A change younger than this is refreshed again whatever the look says (see the module docs).
const RECENT: Duration = Duration::from_secs(2);

fn look(dir: &Path) -> std::io::Result<Look> {
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == nearrec_format::MANIFEST_FILE || name.ends_with(".nrwal") {
            let meta = entry.metadata()?;
            seen.push((name, meta.len(), meta.modified()?));
        }
    }
    seen.sort();
    Ok(seen)
}

/// Starts the thread following `store`'s live side (`live(store)`) every `every`, calling
/// `moved(store)` after each refresh of a changed directory; it ends once the store is let go
/// of.
pub(crate) fn spawn<T: Send + Sync + 'static>(
    store: Weak<T>,
    live: fn(&T) -> &Live,
    moved: fn(&T),
    every: Duration,
) -> Result<()> {
    let run = move || {
        let mut last: Option<Look> = None;
        loop {
            std::thread::sleep(every);
            let Some(inner) = store.upgrade() else {
                return;
            };
            let live = live(&inner);
            let now = look(&live.dir).ok();
            let recent = now.as_ref().is_some_and(|l| {
                l.iter()
                    .filter_map(|(_, _, t)| t.elapsed().ok())
                    .any(|age| age < RECENT)
            });
            if now.is_none() || now != last || recent {
                let before = live.snapshot().version;
                match live.refresh() {
                    Ok(v) => {
                        if v != before {
                            live.follows.moved.fetch_add(1, Relaxed);
                        }
                        if now != last {
                            moved(&inner);
                        }
                        last = now;
                    }
                    // the look is not kept: the next one tries again
                    Err(_) => drop(live.follows.errors.fetch_add(1, Relaxed)),
                }
            }
        }
    };
    std::thread::Builder::new()
        .name("nearrec-follow".into())
        .spawn(run)
        .map(drop)
        .map_err(|e| Error::Internal(format!("cannot start the thread following the writer: {e}")))
}
