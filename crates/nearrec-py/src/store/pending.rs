//! A submitted batch (`NativePending`) and a stream of batches kept `depth` ahead
//! (`NativeStream`).

use super::*;

/// A submitted batch (`nearrec.Pending` wraps it).
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativePending {
    state: Mutex<State>,
    /// Signalled whenever the state leaves `Busy`.
    settled: Condvar,
}

enum State {
    Waiting(Submitted),
    Done(PyResult<Py<PyArray2<f32>>>),
    /// Taken by a waiting thread.
    Busy,
}

impl NativePending {
    pub(super) fn new(p: Submitted) -> Self {
        Self {
            state: Mutex::new(State::Waiting(p)),
            settled: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leaves `Busy` for `state` and wakes every thread waiting on the handle.
    fn settle(&self, state: State) {
        *self.lock() = state;
        self.settled.notify_all();
    }
}

#[pymethods]
impl NativePending {
    fn done(&self) -> bool {
        match &*self.lock() {
            State::Waiting(p) => p.is_done(),
            State::Done(_) => true,
            State::Busy => false,
        }
    }

    /// The batch's output (or its error); `TimeoutError` when `timeout` seconds pass first.
    #[pyo3(signature = (timeout = None))]
    fn result<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let taken = {
            let mut s = self.lock();
            match std::mem::replace(&mut *s, State::Busy) {
                State::Done(r) => {
                    let out = r
                        .as_ref()
                        .map(|a| a.clone_ref(py))
                        .map_err(|e| e.clone_ref(py));
                    *s = State::Done(r);
                    return out.map(|a| a.into_bound(py));
                }
                State::Waiting(p) => Some(p),
                State::Busy => None,
            }
        };
        let Some(pending) = taken else {
            // another thread waits on it: wait until it has the answer (or gives the handle back)
            py.detach(|| {
                let mut state = self.lock();
                while matches!(*state, State::Busy) {
                    state = self.settled.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            });
            return self.result(py, timeout);
        };
        let waited = match timeout {
            None => detach(py, || Ok(pending.wait())),
            Some(t) => detach(py, || {
                pending.wait_timeout(Duration::from_secs_f64(t.max(0.0)))
            }),
        };
        let waited = match waited {
            Ok(w) => w,
            Err(e) => {
                // (a panic while waiting: the handle answers it from now on, no one hangs)
                self.settle(State::Done(Err(e.clone_ref(py))));
                return Err(e);
            }
        };
        let result = match waited {
            Ok(r) => r,
            Err(pending) => {
                self.settle(State::Waiting(pending));
                return Err(pyo3::exceptions::PyTimeoutError::new_err(
                    "the batch is not done yet",
                ));
            }
        };
        let result = result
            .map_err(|e| err(py, e))
            .and_then(|p| array(py, p).map(Bound::unbind));
        let out = result
            .as_ref()
            .map(|a| a.clone_ref(py).into_bound(py))
            .map_err(|e| e.clone_ref(py));
        self.settle(State::Done(result));
        out
    }
}

/// Batches in flight, results in order (`Store.lookup_stream`).
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeStream {
    pub(super) store: Arc<dyn StoreApi>,
    pub(super) batches: Py<pyo3::types::PyIterator>,
    pub(super) depth: usize,
    pub(super) out: nearrec::OutDtype,
    pub(super) window: Mutex<VecDeque<Submitted>>,
}

#[pymethods]
impl NativeStream {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        while window.len() < self.depth {
            match self.batches.bind(py).clone().next() {
                Some(item) => {
                    let held = HeldBatch::extract(&item?)?.with_out(self.out);
                    let pending = self.store.submit(Box::new(held)).map_err(|e| err(py, e))?;
                    window.push_back(pending);
                }
                None => break,
            }
        }
        let Some(front) = window.pop_front() else {
            return Ok(None);
        };
        drop(window);
        let pooled = run(py, || front.wait())?;
        array(py, pooled).map(Some)
    }
}
