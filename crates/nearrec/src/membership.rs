//! A replica's place in its shard: the membership every write to a replicated shard checks, the
//! fence a catch-up holds on the live replicas, and the rows a replica catching up adopts
//! (`docs/distributed.md`, "A replica catching up"; the router's side is `nearrec-cluster`'s
//! `members/`).
//!
//! Each replica keeps a [`Membership`]: its own id, an epoch, and the shard's members at that
//! epoch by id. The shard's members are those named at the highest epoch any replica holds;
//! every prepare of a write carries the epoch its router believes, and a replica at another
//! epoch, or one that is no member, refuses it ([`crate::ErrorKind::MembershipChanged`]) — so
//! a router that missed a change of the shard's replicas learns it at its next write, before
//! that write lands anywhere. A change is a compare-and-set of each replica's epoch
//! ([`Store::set_membership`]), durable in the `MEMBERSHIP` file beside the store (in its
//! repository, when it is served from one: the membership is the replica's, not a version's).
//!
//! A catch-up copies the rows that differ from a member to the replica catching up
//! ([`Store::adopt`]), fences the members ([`Store::fence`]: new prepares and writes refused,
//! those under way drained) for its last pass, makes the replica's count of writes the shard's,
//! and admits it at the next epoch. Only a change of membership lifts a fence: a fence past its
//! lease still refuses writes (lifting it by itself could let a write reach the members and miss
//! a replica just admitted), but says so, and a router may then settle it.
//!
//! Where the shard's membership is kept in etcd, its node **holds** the replica
//! ([`Store::hold`]): each time it renews its lease there and reads the shard's record, it
//! installs an epoch newer than the replica's, and holds it for the record's hold time from
//! when that round began if the record names it a member. A replica that is not held — cut off
//! from etcd past its hold, or left out — serves no reads and takes no writes
//! ([`crate::Error::Unheld`]): a router that leaves it out waits one hold time (or for it to
//! say it is out) before the members take a write it lacks.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// The file a replica's membership is kept in.
pub const MEMBERSHIP_FILE: &str = "MEMBERSHIP";

/// A replica's membership of its shard, as its `MEMBERSHIP` file (TOML) keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Membership {
    /// This replica's id among its shard's (random; made with its `MEMBERSHIP` file, 0 for a
    /// read-only store that has none).
    pub replica: u64,
    pub epoch: u64,
    /// The shard's members at `epoch`, by id, ascending. Epoch 0 names none: every replica of
    /// the shard is one.
    pub members: Vec<u64>,
    /// Fenced for a catch-up since this many milliseconds after the Unix epoch, for a lease of
    /// `fence_lease_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_at_ms: Option<u64>,
    #[serde(default)]
    pub fence_lease_ms: u64,
}

impl Membership {
    /// Whether this replica is one of its shard's members at its epoch.
    pub fn is_member(&self) -> bool {
        self.epoch == 0 || self.members.contains(&self.replica)
    }

    /// `members` (ids, any order) made the shard's members at `epoch`; a fence lifted, as any
    /// change lifts it.
    pub(crate) fn install(&mut self, epoch: u64, members: &[u64]) {
        self.epoch = epoch;
        self.members = members.to_vec();
        self.members.sort_unstable();
        self.members.dedup();
        self.fenced_at_ms = None;
    }

    /// Whether a fence is held past its lease (a router may settle it).
    pub fn fence_expired(&self) -> bool {
        self.fenced_at_ms
            .is_some_and(|at| now_ms() >= at.saturating_add(self.fence_lease_ms))
    }
}

pub(crate) fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// What a store holds of its place: the membership and where it is kept.
#[derive(Debug)]
pub(crate) struct Place {
    file: PathBuf,
    /// Held shared by a write from its check to its prepare (or log); taken whole by a change
    /// and by a fence, which so wait out the writes under way.
    state: RwLock<Membership>,
    /// Until when the replica is held ([`Store::hold`]), in nanoseconds past [`anchor`];
    /// [`UNHELD_NEVER`] for a store whose membership is not kept in etcd (always served).
    held_until: AtomicU64,
}

/// `Place::held_until` of a store nobody holds.
const UNHELD_NEVER: u64 = u64::MAX;

/// `Place::held_until` of a replica let go of (etcd names it no member).
const LET_GO: u64 = 1;

/// The instant the process's holds are counted from.
fn anchor() -> Instant {
    static ANCHOR: OnceLock<Instant> = OnceLock::new();
    *ANCHOR.get_or_init(Instant::now)
}

fn nanos_since_anchor(at: Instant) -> u64 {
    let since = at.saturating_duration_since(anchor());
    u64::try_from(since.as_nanos()).unwrap_or(UNHELD_NEVER - 1)
}

impl Place {
    /// The place kept in `home` (the repository's directory, or the store's). A writable store
    /// without one makes it: a member at epoch 0, with an id of its own.
    pub(crate) fn open(home: &Path, writable: bool) -> Result<Self> {
        let file = home.join(MEMBERSHIP_FILE);
        let bad = |reason: String| Error::Config {
            key: MEMBERSHIP_FILE.into(),
            reason: format!("{}: {reason}", file.display()),
        };
        let membership = match std::fs::read_to_string(&file) {
            Ok(text) => toml::from_str(&text).map_err(|e| bad(e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let m = Membership {
                    replica: if writable { fastrand::u64(1..) } else { 0 },
                    ..Membership::default()
                };
                if writable {
                    keep(&file, &m)?;
                }
                m
            }
            Err(source) => {
                return Err(nearrec_format::FormatError::Io { path: file, source }.into());
            }
        };
        Ok(Self {
            file,
            state: RwLock::new(membership),
            held_until: AtomicU64::new(UNHELD_NEVER),
        })
    }

    /// Refuses (`Unheld`) a replica that must be held and is not, now.
    pub(crate) fn check_held(&self, store: impl FnOnce() -> String) -> Result<()> {
        let until = self.held_until.load(Ordering::Acquire);
        if until == UNHELD_NEVER {
            return Ok(());
        }
        let now = nanos_since_anchor(Instant::now());
        if now < until {
            return Ok(());
        }
        let reason = if until == 0 {
            "it has not been held since its node started".to_owned()
        } else if until == LET_GO {
            "etcd names it no member of its shard".to_owned()
        } else {
            format!(
                "its hold ran out {} ms ago",
                Duration::from_nanos(now - until).as_millis()
            )
        };
        Err(Error::Unheld {
            store: store(),
            reason,
        })
    }

    /// Makes the replica served only while held, from now on, and not held yet.
    pub(crate) fn require_hold(&self) {
        let _ =
            self.held_until
                .compare_exchange(UNHELD_NEVER, 0, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Lets go of a replica that must be held (its node holds it in etcd) now: told by a router
    /// that it is no member, it serves nothing until a round of its node's hold finds it named
    /// again. A replica served without a hold is left as it is.
    pub(crate) fn let_go(&self) {
        let _ = self
            .held_until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |until| {
                (until != UNHELD_NEVER).then_some(LET_GO)
            });
    }

    /// Holds the replica until `until`; `None` lets go of it now (etcd names it no member).
    pub(crate) fn set_held(&self, until: Option<Instant>) {
        let until = until.map_or(LET_GO, |at| nanos_since_anchor(at).max(LET_GO + 1));
        self.held_until.store(until, Ordering::Release);
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Membership> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// `f` on the membership, kept durably when it answers `Ok`.
    pub(crate) fn change(
        &self,
        f: impl FnOnce(&mut Membership) -> Result<()>,
    ) -> Result<Membership> {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = state.clone();
        f(&mut next)?;
        keep(&self.file, &next)?;
        *state = next.clone();
        Ok(next)
    }
}

fn keep(path: &Path, m: &Membership) -> Result<()> {
    let text = toml::to_string(m).expect("a membership serializes");
    Ok(nearrec_format::replace_file(path, text.as_bytes())?)
}

/// [`Error::MembershipChanged`] from a replica at `m`.
pub(crate) fn changed(store: String, m: &Membership, reason: String) -> Error {
    Error::MembershipChanged {
        store,
        epoch: m.epoch,
        member: m.is_member(),
        reason,
    }
}
