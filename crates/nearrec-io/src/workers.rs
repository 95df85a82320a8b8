//! A worker pool that survives `fork()` (pooling threads in the engine, read threads here).
//!
//! A forked child has only the thread that called fork; a rayon pool inherited from the parent
//! would wait forever for workers that do not exist (PyTorch DataLoader workers fork). The pool is
//! therefore tagged with the pid that built it and rebuilt on first use in a new process.

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

#[derive(Debug)]
pub struct Workers {
    threads: usize,
    pool: Mutex<Option<(u32, Arc<ThreadPool>)>>,
}

impl Workers {
    pub fn new(threads: usize) -> Self {
        Self {
            threads,
            pool: Mutex::new(None),
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The pool for this process, built on first use (and again after a fork).
    pub fn get(&self) -> Arc<ThreadPool> {
        let pid = std::process::id();
        let mut slot = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some((owner, pool)) if *owner == pid => pool.clone(),
            stale => {
                if let Some((_, old)) = stale {
                    // Its threads belong to the parent process; dropping it here would try to
                    // signal them. Leak the handle instead (once per fork).
                    std::mem::forget(old.clone());
                }
                let pool = Arc::new(
                    ThreadPoolBuilder::new()
                        .num_threads(self.threads)
                        .thread_name(|i| format!("nearrec-pool-{i}"))
                        .build()
                        .expect("spawn pooling threads"),
                );
                *slot = Some((pid, pool.clone()));
                pool
            }
        }
    }
}
