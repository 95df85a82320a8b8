//! Threads and locks that survive `fork()` (pooling threads in the engine, read threads here).
//!
//! A forked child has only the thread that called fork. Two things break there:
//!
//! - a rayon pool inherited from the parent would wait forever for workers that do not exist
//!   (PyTorch DataLoader workers fork). A [`Workers`] pool is therefore tagged with the pid that
//!   built it and rebuilt on first use in a new process;
//! - a lock another thread held at the moment of the fork stays held in the child forever (a
//!   row-cache shard, the counters). Every engine call that takes locks runs inside the
//!   [`fork_gate`]; a `pthread_atfork` handler closes the gate before `fork()`, waits for the
//!   calls inside to finish, and opens it again in both processes after. No lock is held across
//!   a fork, so none is held in the child.
//!
//! Pools are shared by every store of a process ([`Workers::shared`]): one pool per thread count,
//! not one per open store (2,000 stores × cores threads would exhaust a host).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, OnceLock, PoisonError};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{IoError, Result};

#[derive(Debug)]
pub struct Workers {
    /// What the threads do (`"pool"`, `"read"`): their names, and which pools may be shared.
    role: &'static str,
    threads: usize,
    pool: Mutex<Option<(u32, Arc<ThreadPool>)>>,
}

impl Workers {
    /// A pool of its own (tests, tools); stores use [`Workers::shared`].
    pub fn new(role: &'static str, threads: usize) -> Self {
        Self {
            role,
            threads: threads.max(1),
            pool: Mutex::new(None),
        }
    }

    /// The process's pool of `threads` threads for `role`, shared with every other caller that
    /// asks for the same. Its threads start on first use.
    pub fn shared(role: &'static str, threads: usize) -> Arc<Workers> {
        type Pools = HashMap<(&'static str, usize), Arc<Workers>>;
        static POOLS: OnceLock<Mutex<Pools>> = OnceLock::new();
        let _inside = fork_gate();
        let mut pools = POOLS
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        pools
            .entry((role, threads.max(1)))
            .or_insert_with(|| Arc::new(Workers::new(role, threads)))
            .clone()
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The pool for this process, built on first use (and again after a fork). Fails with
    /// [`IoError::Threads`] when the threads cannot be started (a process or cgroup limit).
    pub fn get(&self) -> Result<Arc<ThreadPool>> {
        let _inside = fork_gate();
        let pid = std::process::id();
        let mut slot = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.as_ref() {
            Some((owner, pool)) if *owner == pid => Ok(pool.clone()),
            stale => {
                if let Some((_, old)) = stale {
                    // Its threads belong to the parent process; dropping it here would try to
                    // signal them. Leak the handle instead (once per fork).
                    std::mem::forget(old.clone());
                }
                let pool = ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name({
                        let role = self.role;
                        move |i| format!("nearrec-{role}-{i}")
                    })
                    // A pool thread works only for a call that is inside the gate already (a
                    // fork waits for that call), so it never waits at the gate itself.
                    .start_handler(|_| DEPTH.set(1))
                    .build()
                    .map_err(|e| IoError::Threads {
                        threads: self.threads,
                        reason: e.to_string(),
                    })?;
                let pool = Arc::new(pool);
                *slot = Some((pid, pool.clone()));
                Ok(pool)
            }
        }
    }
}

/// Calls inside the gate (threads, not nesting depth).
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Set from a fork's `prepare` until after it: new calls wait.
static FORKING: AtomicBool = AtomicBool::new(false);
/// Taken only while a fork is in progress: waits for the gate to empty or to open again. The
/// forking thread holds it across `fork()`, so no other thread holds it in the child.
static GATE: Mutex<()> = Mutex::new(());
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// How deep this thread is inside the gate (calls nest: a lookup inside `read_rows`).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The gate's lock, held by the forking thread from `prepare` until after the fork.
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// Proof that the calling thread is inside the fork gate: no `fork()` of this process starts
/// until it is dropped. Calls nest freely.
#[derive(Debug)]
#[must_use = "the gate is left when the guard drops"]
pub struct ForkGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Enters the fork gate (waiting while a fork is in progress). Hold the guard for the whole of a
/// call that takes locks; never across a wait for something the forking thread might hold.
///
/// On the path of every lookup, so it takes no lock unless a fork is under way: two atomic
/// operations in, one out. The `SeqCst` order of `INSIDE` and `FORKING` is what makes it sound:
/// a call that saw no fork is counted before the fork reads the count.
pub fn fork_gate() -> ForkGuard {
    static HANDLERS: Once = Once::new();
    HANDLERS.call_once(|| {
        // SAFETY: the handlers are plain `extern "C"` functions that live for the process.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        debug_assert_eq!(rc, 0, "pthread_atfork");
    });
    let depth = DEPTH.get();
    if depth == 0 {
        loop {
            INSIDE.fetch_add(1, SeqCst);
            if !FORKING.load(SeqCst) {
                break;
            }
            // a fork is waiting for the gate to empty: step back out, and wait for it to end
            leave();
            let mut held = lock_gate();
            while FORKING.load(SeqCst) {
                held = CHANGED.wait(held).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }
    DEPTH.set(depth + 1);
    ForkGuard {
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for ForkGuard {
    fn drop(&mut self) {
        let depth = DEPTH.get() - 1;
        DEPTH.set(depth);
        if depth == 0 {
            leave();
        }
    }
}

/// Counts a call out of the gate, waking a fork that waits for the last one.
fn leave() {
    if INSIDE.fetch_sub(1, SeqCst) == 1 && FORKING.load(SeqCst) {
        let _held = lock_gate();
        CHANGED.notify_all();
    }
}

fn lock_gate() -> MutexGuard<'static, ()> {
    GATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Before `fork()`: close the gate and wait until no call is inside; keep the gate's lock.
extern "C" fn prepare() {
    if DEPTH.get() > 0 {
        // fork() from inside a call (a progress callback forking?): waiting would wait for
        // ourselves. Go ahead; the child will not see this thread's calls finish.
        return;
    }
    let mut held = lock_gate();
    FORKING.store(true, SeqCst);
    while INSIDE.load(SeqCst) > 0 {
        held = CHANGED.wait(held).unwrap_or_else(PoisonError::into_inner);
    }
    HELD.with_borrow_mut(|h| *h = Some(held));
}

/// After `fork()` in the parent: open the gate for the calls that waited.
extern "C" fn parent() {
    if let Some(held) = HELD.with_borrow_mut(Option::take) {
        FORKING.store(false, SeqCst);
        drop(held);
        CHANGED.notify_all();
    }
}

/// After `fork()` in the child: only this thread exists, and nothing is inside.
extern "C" fn child() {
    if let Some(held) = HELD.with_borrow_mut(Option::take) {
        FORKING.store(false, SeqCst);
        INSIDE.store(0, SeqCst);
        drop(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_shared_per_thread_count() {
        let a = Workers::shared("test", 3);
        let b = Workers::shared("test", 3);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &Workers::shared("test", 2)));
        assert!(!Arc::ptr_eq(&a, &Workers::shared("other", 3)));
        assert_eq!(a.get().unwrap().current_num_threads(), 3);
    }

    #[test]
    fn the_gate_nests_and_is_left_on_drop() {
        {
            let _a = fork_gate();
            let _b = fork_gate();
            assert_eq!(DEPTH.get(), 2);
        }
        assert_eq!(DEPTH.get(), 0);
    }
}
