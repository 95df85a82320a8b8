//! What a scrape of `/metrics` reads at that moment, beside the families calls update
//! (`crate::metrics`): requests in flight; refusals by reason (`unauthenticated`,
//! `permission_denied`, `wrong_shard`, `request_shape`, `principal_calls`,
//! `principal_connections`, `slow_request`, `overloaded`, `deadline_exceeded`, `unsent_bytes`);
//! connections open, and those closed by reason (`refused`, `timed_out`, `accept_error`); and
//! per store the directory and repository version it serves, its lookups per tier, DRAM hit
//! ratio, device reads, bytes read, reads refused as corrupted, what its scrub checked and
//! found, version, rows waiting in the delta, and the engine's own stage percentiles (`route`,
//! `io_wait`, `pool`, `end_to_end`); per delta feed of a store, the last file it applied, its
//! lag and when. Per-tier lookups, reads and stages are the SSD tier's; a DRAM-resident store
//! reports zeros for them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::node::Shared;
use crate::process::Process;

/// The registry a node's `/metrics` encodes: the process under the names every exporter
/// gives it (`process_*`), the rest under `nearrec_`.
pub fn registry(shared: Arc<Shared>) -> Registry {
    let mut root = Registry::default();
    root.register_collector(Box::new(ProcessCollector));
    let r = root.sub_registry_with_prefix("nearrec");
    let m = shared.metrics.clone();
    r.register("requests", "Calls by method and gRPC status", m.requests);
    r.register(
        "request_seconds",
        "Call latency by stage: queue (waiting for an engine slot), engine and within it route, \
         io, pool, infer; total (handler start to answer), then send (answer ready to its last \
         frame written)",
        m.seconds,
    );
    r.register(
        "received_bytes",
        "Request message bytes by method",
        m.received,
    );
    r.register("sent_bytes", "Answer message bytes by method", m.sent);
    r.register(
        "table_lookups",
        "Lookup calls answered, per table they named",
        m.table_lookups,
    );
    r.register(
        "table_rows",
        "Ids those calls looked up, per table",
        m.table_rows,
    );
    r.register(
        "batch_requests",
        "Requests per engine batch of coalesced small lookups",
        m.batch_requests,
    );
    r.register_collector(Box::new(NodeCollector(shared)));
    root
}

/// The process, read at each scrape ([`Process`]).
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(p) = Process::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes,
            ),
            ("process_open_fds", "Open file descriptors", p.open_fds),
            (
                "process_max_fds",
                "The most file descriptors the process may open",
                p.max_fds,
            ),
            ("process_threads", "Threads of the process", p.threads),
            (
                "process_start_time_seconds",
                "When the process started, in seconds since the epoch",
                p.start_time_seconds,
            ),
        ] {
            gauge(&mut encoder, name, help, value)?;
        }
        Ok(())
    }
}

/// The node's and its stores' state, read at each scrape.
#[derive(Debug)]
pub struct NodeCollector(Arc<Shared>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabel {
    store: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreFeed {
    store: String,
    feed: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StorePath {
    store: String,
    path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreTier {
    store: String,
    tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreStage {
    store: String,
    stage: &'static str,
    quantile: &'static str,
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Build {
    version: &'static str,
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        {
            let one = ConstGauge::new(1.0f64);
            let mut f = encoder.encode_descriptor(
                "build_info",
                "1, labelled with the node's version",
                None,
                one.metric_type(),
            )?;
            one.encode(f.encode_family(&Build {
                version: env!("CARGO_PKG_VERSION"),
            })?)?;
        }
        gauge(
            &mut encoder,
            "in_flight",
            "Calls running or waiting for an engine slot",
            s.admission.in_flight() as f64,
        )?;
        {
            let refused = [
                ("unauthenticated", s.unauthenticated.load(Ordering::Relaxed)),
                ("permission_denied", s.denied.load(Ordering::Relaxed)),
                ("wrong_shard", s.wrong_shard.load(Ordering::Relaxed)),
                ("request_shape", s.misshapen.load(Ordering::Relaxed)),
                (
                    "principal_calls",
                    s.quotas.refused_calls.load(Ordering::Relaxed),
                ),
                (
                    "principal_connections",
                    s.quotas.refused_connections.load(Ordering::Relaxed),
                ),
                ("slow_request", s.slow.load(Ordering::Relaxed)),
                ("overloaded", s.admission.overloaded.load(Ordering::Relaxed)),
                (
                    "deadline_exceeded",
                    s.admission.expired.load(Ordering::Relaxed),
                ),
                (
                    "unsent_bytes",
                    s.admission.unsent_full.load(Ordering::Relaxed),
                ),
            ];
            let c = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(
                "refused",
                "Calls refused before the engine: no or unknown token, no grant, another shard \
                 than the router meant, past a request's limits or a principal's share, a \
                 request that did not arrive in time, a full queue, a passed deadline, no room \
                 for the answer among those not yet read",
                None,
                c.metric_type(),
            )?;
            for (reason, n) in refused {
                ConstCounter::new(n).encode(family.encode_family(&Reason { reason })?)?;
            }
        }
        if let Some(audit) = &s.audit {
            let c = ConstCounter::new(audit.failed.load(Ordering::Relaxed));
            let family = encoder.encode_descriptor(
                "audit_lines_failed",
                "Audit log lines that could not be written (--audit-log)",
                None,
                c.metric_type(),
            )?;
            c.encode(family)?;
        }
        gauge(
            &mut encoder,
            "connections",
            "Connections open",
            s.conns.open.load(Ordering::Relaxed) as f64,
        )?;
        {
            let closed = [
                ("refused", s.conns.refused.load(Ordering::Relaxed)),
                ("timed_out", s.conns.timed_out.load(Ordering::Relaxed)),
                (
                    "accept_error",
                    s.conns.accept_errors.load(Ordering::Relaxed),
                ),
            ];
            let c = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(
                "connections_closed",
                "Connections the node closed or failed to accept: over --max-connections, silent \
                 past the handshake or idle timeout, accept errors (descriptors run out)",
                None,
                c.metric_type(),
            )?;
            for (reason, n) in closed {
                ConstCounter::new(n).encode(family.encode_family(&Reason { reason })?)?;
            }
        }
        let mut stores = Vec::new();
        let mut served = Vec::new();
        for name in s.stores.names() {
            let (_, store) = s.stores.get(name, |_| true).map_err(|_| std::fmt::Error)?;
            // a store that cannot tell (a remote one, unreachable) is left out of this scrape
            if let Ok(stats) = store.stats() {
                stores.push((name.to_owned(), Some(stats)));
            }
            if let Ok(info) = store.info() {
                served.push((name.to_owned(), info));
            }
        }
        {
            let mut f = encoder.encode_descriptor(
                "store_served_version",
                "A store served from a repository of versions: the version served now (0: not \
                 from a repository)",
                None,
                ConstGauge::new(0.0f64).metric_type(),
            )?;
            for (store, info) in &served {
                let v = info.served_version.unwrap_or(0) as f64;
                ConstGauge::new(v).encode(f.encode_family(&StoreLabel {
                    store: store.clone(),
                })?)?;
            }
            let mut f = encoder.encode_descriptor(
                "store_info",
                "1 for each store, labelled with the directory it serves now",
                None,
                ConstGauge::new(0.0f64).metric_type(),
            )?;
            for (store, info) in &served {
                let labels = StorePath {
                    store: store.clone(),
                    path: info.path.clone(),
                };
                ConstGauge::new(1.0).encode(f.encode_family(&labels)?)?;
            }
        }
        let value = |stats: &Option<nearrec::Stats>, k: &str| stats.as_ref().and_then(|s| s.get(k));
        {
            let mut f = encoder.encode_descriptor(
                "lookups",
                "Ids looked up, by the tier that served them",
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for (store, stats) in &stores {
                for (tier, key) in [
                    ("resident", "lookups_resident"),
                    ("hot", "lookups_hot"),
                    ("cache", "lookups_cache"),
                    ("ssd", "lookups_ssd"),
                ] {
                    let n = value(stats, key).unwrap_or(0.0) as u64;
                    ConstCounter::new(n).encode(f.encode_family(&StoreTier {
                        store: store.clone(),
                        tier,
                    })?)?;
                }
            }
        }
        for (metric, help, key, counter) in [
            (
                "dram_hit_ratio",
                "Share of lookups the DRAM tiers served",
                "dram_hit_ratio",
                false,
            ),
            (
                "device_reads",
                "Block reads issued to the device",
                "device_reads",
                true,
            ),
            (
                "device_read_bytes",
                "Bytes read from the device",
                "bytes_read",
                true,
            ),
            (
                "corrupt_reads",
                "Reads refused because a sector did not match its checksum (StoreCorrupted)",
                "corrupt_reads",
                true,
            ),
            (
                "scrub_bytes",
                "Bytes the store's background scrub read and checked (store config scrub_rate)",
                "scrub_bytes",
                true,
            ),
            (
                "scrub_passes",
                "Passes the store's background scrub finished over every table",
                "scrub_passes",
                true,
            ),
            (
                "scrub_damaged",
                "Damaged tables the store's background scrub found, every pass counted",
                "scrub_damaged",
                true,
            ),
            (
                "scrub_last_damaged",
                "Damaged tables the store's last finished scrub pass found",
                "scrub_last_damaged",
                false,
            ),
        ] {
            let mut f = if counter {
                encoder.encode_descriptor(
                    metric,
                    help,
                    None,
                    ConstCounter::new(0u64).metric_type(),
                )?
            } else {
                encoder.encode_descriptor(
                    metric,
                    help,
                    None,
                    ConstGauge::new(0.0f64).metric_type(),
                )?
            };
            for (store, stats) in &stores {
                let v = value(stats, key).unwrap_or(0.0);
                let labels = StoreLabel {
                    store: store.clone(),
                };
                if counter {
                    ConstCounter::new(v as u64).encode(f.encode_family(&labels)?)?;
                } else {
                    ConstGauge::new(v).encode(f.encode_family(&labels)?)?;
                }
            }
        }
        for (metric, help, key) in [
            (
                "store_version",
                "The store's version: its last applied write",
                None,
            ),
            (
                "delta_rows",
                "Written rows waiting for a compaction",
                Some("delta_rows"),
            ),
            (
                "delta_bytes",
                "Bytes of written rows waiting for a compaction",
                Some("delta_bytes"),
            ),
            (
                "delta_budget_bytes",
                "The most bytes of written rows a writable store holds before writes wait (0: \
                 read-only)",
                Some("delta_budget"),
            ),
            (
                "log_bytes",
                "Bytes of the write-ahead log kept on disk",
                Some("log_bytes"),
            ),
            (
                "compaction_running",
                "1 while a compaction runs",
                Some("compacting"),
            ),
            (
                "cluster_stale_replicas",
                "A sharded store: the replicas left out of their shards (missed writes), caught \
                 up in the background",
                Some("cluster_stale_replicas"),
            ),
        ] {
            let mut f = encoder.encode_descriptor(
                metric,
                help,
                None,
                ConstGauge::new(0.0f64).metric_type(),
            )?;
            for (store, stats) in &stores {
                let v = value(stats, key.unwrap_or("version")).unwrap_or(0.0);
                ConstGauge::new(v).encode(f.encode_family(&StoreLabel {
                    store: store.clone(),
                })?)?;
            }
        }
        for (metric, help, key) in [
            (
                "compactions",
                "Compactions run (a read-only store: followed)",
                "compactions",
            ),
            (
                "compaction_bytes",
                "Bytes compactions wrote",
                "compaction_bytes",
            ),
            (
                "compaction_errors",
                "Background compactions that failed (the rows stay in the delta)",
                "compaction_errors",
            ),
            (
                "wal_tail_dropped",
                "Bad records at the end of a writable store's log that its open dropped \
                 (wal_recovery = \"tolerate_torn_tail\"; the log names each)",
                "wal_tail_dropped",
            ),
        ] {
            let mut f = encoder.encode_descriptor(
                metric,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for (store, stats) in &stores {
                let n = value(stats, key).unwrap_or(0.0) as u64;
                ConstCounter::new(n).encode(f.encode_family(&StoreLabel {
                    store: store.clone(),
                })?)?;
            }
        }
        {
            let mut f = encoder.encode_descriptor(
                "engine_stage_seconds",
                "The SSD tier's stage latencies as the engine measures them: route, io_wait, \
                 pool, end_to_end",
                None,
                ConstGauge::new(0.0f64).metric_type(),
            )?;
            for (store, stats) in &stores {
                for stage in ["route", "io_wait", "pool", "end_to_end"] {
                    for (quantile, suffix) in [("0.5", "p50_us"), ("0.99", "p99_us")] {
                        if let Some(us) = value(stats, &format!("{stage}_{suffix}")) {
                            let labels = StoreStage {
                                store: store.clone(),
                                stage,
                                quantile,
                            };
                            ConstGauge::new(us * 1e-6).encode(f.encode_family(&labels)?)?;
                        }
                    }
                }
            }
        }
        feeds(&mut encoder, s)?;
        Ok(())
    }
}

/// What a feed's gauge reads of its cursor (`None`: nothing to report).
type CursorValue = fn(&nearrec::FeedCursor) -> Option<f64>;

/// Each store's delta feeds (`Writes::feed_status`): the last file applied, how long after the
/// producer wrote it, and when.
fn feeds(encoder: &mut DescriptorEncoder, s: &Shared) -> std::fmt::Result {
    let mut cursors = Vec::new();
    for name in s.stores.names() {
        let Ok((_, store)) = s.stores.get(name, |_| true) else {
            continue;
        };
        // a store that cannot tell (read-only elsewhere, a router without feeds) is left out
        if let Some(Ok(feeds)) = store.writes().map(|w| w.feed_status()) {
            cursors.extend(
                feeds
                    .into_iter()
                    .map(|(feed, c)| (name.to_owned(), feed, c)),
            );
        }
    }
    let families: [(&str, &str, CursorValue); 3] = [
        (
            "feed_applied_sequence",
            "The sequence of the last delta file a feed applied to the store",
            |c| Some(c.sequence as f64),
        ),
        (
            "feed_lag_seconds",
            "From the producer writing a feed's last applied delta file (its wall time) to the \
             store logging its rows",
            |c| {
                c.wall_time_ms
                    .map(|w| c.applied_ms.saturating_sub(w) as f64 / 1000.0)
            },
        ),
        (
            "feed_applied_timestamp_seconds",
            "When the store logged a feed's last applied delta file, in seconds since the epoch",
            |c| Some(c.applied_ms as f64 / 1000.0),
        ),
    ];
    for (metric, help, value) in families {
        let mut f =
            encoder.encode_descriptor(metric, help, None, ConstGauge::new(0.0f64).metric_type())?;
        for (store, feed, c) in &cursors {
            if let Some(v) = value(c) {
                let labels = StoreFeed {
                    store: store.clone(),
                    feed: feed.clone(),
                };
                ConstGauge::new(v).encode(f.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}
