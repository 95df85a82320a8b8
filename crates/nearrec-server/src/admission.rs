//! Tail latency by design: a request waits for one of `max_in_flight` engine slots in a queue of
//! at most `max_queued`; past that it is refused at once (`RESOURCE_EXHAUSTED`), never queued
//! without bound. A request whose deadline (the client's `grpc-timeout`) passes while it waits
//! is dropped before it costs a device read (`DEADLINE_EXCEEDED`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// The node's admission: queue slots and engine slots, with what each refused.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    running: Arc<Semaphore>,
    max_in_flight: usize,
    max_queued: usize,
    /// Requests refused because the queue was full.
    pub overloaded: AtomicU64,
    /// Requests whose deadline passed before they reached the engine.
    pub expired: AtomicU64,
}

/// Held while a request runs: its queue slot and its engine slot.
#[derive(Debug)]
pub struct Permit {
    _slot: Slot,
    _run: OwnedSemaphorePermit,
}

/// A request's place in the node, held from its admission to its answer.
#[derive(Debug)]
pub struct Slot {
    _held: OwnedSemaphorePermit,
}

impl Admission {
    pub fn new(max_in_flight: usize, max_queued: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight + max_queued)),
            running: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            max_queued,
            overloaded: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Waits for an engine slot (until `deadline`), or refuses at once when the queue is full.
    pub async fn admit(&self, deadline: Option<Instant>) -> Result<Permit, Status> {
        let slot = self.enter()?;
        let run = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), self.engine())
                .await
                .map_err(|_| self.expire())?,
            None => self.engine().await,
        };
        Ok(Permit {
            _slot: slot,
            _run: run,
        })
    }

    /// A place in the node, or `RESOURCE_EXHAUSTED` at once when every one is taken.
    pub fn enter(&self) -> Result<Slot, Status> {
        match self.slots.clone().try_acquire_owned() {
            Ok(held) => Ok(Slot { _held: held }),
            Err(_) => {
                self.overloaded.fetch_add(1, Ordering::Relaxed);
                Err(Status::resource_exhausted(format!(
                    "the node is full: {} requests running and {} waiting; retry later",
                    self.max_in_flight, self.max_queued
                )))
            }
        }
    }

    /// One of the `max_in_flight` engine slots, once one is free.
    pub async fn engine(&self) -> OwnedSemaphorePermit {
        self.running
            .clone()
            .acquire_owned()
            .await
            .expect("the node never closes its semaphores")
    }

    /// Counts a request dropped at its deadline and answers it.
    pub fn expire(&self) -> Status {
        self.expired.fetch_add(1, Ordering::Relaxed);
        Status::deadline_exceeded("the request's deadline passed before the node could serve it")
    }

    /// Requests running or waiting now.
    pub fn in_flight(&self) -> usize {
        self.max_in_flight + self.max_queued - self.slots.available_permits()
    }
}

/// The deadline a request's `grpc-timeout` header sets, from `start` (the gRPC spec: at most 8
/// digits and a unit, `H` `M` `S` `m` `u` `n`). A malformed header is ignored, as grpc-go does.
pub fn deadline(metadata: &tonic::metadata::MetadataMap, start: Instant) -> Option<Instant> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let d = match unit {
        "H" => std::time::Duration::from_secs(n.checked_mul(3600)?),
        "M" => std::time::Duration::from_secs(n.checked_mul(60)?),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    };
    start.checked_add(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tonic::metadata::MetadataMap;

    fn with(v: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("grpc-timeout", v.parse().unwrap());
        m
    }

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        let t = Instant::now();
        assert_eq!(
            deadline(&with("250m"), t),
            Some(t + Duration::from_millis(250))
        );
        assert_eq!(deadline(&with("3S"), t), Some(t + Duration::from_secs(3)));
        assert_eq!(
            deadline(&with("1H"), t),
            Some(t + Duration::from_secs(3600))
        );
        assert_eq!(
            deadline(&with("99999999u"), t),
            Some(t + Duration::from_micros(99_999_999))
        );
        for bad in ["", "m", "123456789m", "12x", "-1m", "1.5S"] {
            let m = if bad.is_empty() {
                MetadataMap::new()
            } else {
                with(bad)
            };
            assert_eq!(deadline(&m, t), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_a_waiting_request_expires() {
        let a = Admission::new(1, 1);
        let running = a.admit(None).await.unwrap();
        // one waits (and expires at its deadline), the next finds the queue full
        let soon = Instant::now() + Duration::from_millis(30);
        let (waiting, refused) = tokio::join!(a.admit(Some(soon)), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            a.admit(None).await
        });
        assert_eq!(waiting.unwrap_err().code(), tonic::Code::DeadlineExceeded);
        assert_eq!(refused.unwrap_err().code(), tonic::Code::ResourceExhausted);
        assert_eq!(a.expired.load(Ordering::Relaxed), 1);
        assert_eq!(a.overloaded.load(Ordering::Relaxed), 1);
        assert_eq!(a.in_flight(), 1);
        drop(running);
        assert!(a.admit(None).await.is_ok());
    }
}
