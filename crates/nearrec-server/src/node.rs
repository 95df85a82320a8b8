//! What every call of one node shares: its stores, admission, settings, ACL and counters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use arc_swap::ArcSwapOption;
use nearrec_wire::arrays::Spare;

use crate::acl::Acl;
use crate::admission::Admission;
use crate::audit::Audit;
use crate::coalesce::Coalescer;
use crate::config::NodeConfig;
use crate::conns::ConnStats;
use crate::limits::Quotas;
use crate::metrics::Metrics;
use crate::stores::Stores;

/// What every call of one node shares.
#[derive(Debug)]
pub struct Shared {
    pub stores: Stores,
    pub admission: Arc<Admission>,
    /// Each store's gatherer of small lookups.
    pub coalescers: BTreeMap<String, Coalescer>,
    pub config: NodeConfig,
    /// Who may do what; `None`: every call is allowed. Replaced whole on a reload.
    pub acl: ArcSwapOption<Acl>,
    /// Calls refused for their token (`UNAUTHENTICATED`) and for their grants
    /// (`PERMISSION_DENIED`).
    pub unauthenticated: AtomicU64,
    pub denied: AtomicU64,
    /// Calls a router meant for a shard the store they name is not (`nearrec-shard`).
    pub wrong_shard: AtomicU64,
    /// Each principal's calls open and connections held (`crate::limits`).
    pub quotas: Arc<Quotas>,
    /// Requests refused for their shape (`max_*_per_request`).
    pub misshapen: AtomicU64,
    /// Unary calls whose request did not arrive whole within `request_timeout`.
    pub slow: Arc<AtomicU64>,
    /// What calls did, for `/metrics`.
    pub metrics: Metrics,
    /// What the node's connections did.
    pub conns: Arc<ConnStats>,
    /// Calls answered, to sample the access log by.
    pub calls: AtomicU64,
    /// Whether the node takes new requests (`/readyz`): from when it serves, its stores open
    /// and warmed, until its drain begins.
    pub ready: Arc<AtomicBool>,
    /// The audit log, when the node keeps one (`audit_log`).
    pub audit: Option<Audit>,
    /// Lookups' arrays kept between requests, at most [`SPARE_BYTES`]: what a request's ids
    /// were decoded into and its answer pooled into, taken again by the next one.
    pub spare: Arc<Spare>,
}

/// The most memory a node keeps in [`Shared::spare`]: a few dozen requests' arrays at the
/// benchmark's shape (40 KiB of ids, 64 KiB pooled), a fixed sliver beside a store's budget.
pub const SPARE_BYTES: usize = 16 << 20;

impl Shared {
    pub fn new(stores: Stores, config: NodeConfig, acl: Option<Acl>) -> Self {
        let (unsent, _) = config.unsent_budgets();
        let admission = Arc::new(Admission::new(
            config.max_in_flight,
            config.max_queued,
            unsent,
            config.cpu_turns,
        ));
        let metrics = Metrics::default();
        let coalescers = stores
            .iter()
            .map(|(name, store)| {
                let c = Coalescer::new(
                    store.clone(),
                    admission.clone(),
                    metrics.clone(),
                    config.coalesce_bags,
                    config.coalesce_window,
                );
                (name.to_owned(), c)
            })
            .collect();
        let quotas = Quotas::new(
            config.max_calls_per_principal,
            config.max_connections_per_principal,
        );
        Self {
            admission,
            coalescers,
            stores,
            config,
            acl: ArcSwapOption::from_pointee(acl),
            unauthenticated: AtomicU64::new(0),
            wrong_shard: AtomicU64::new(0),
            quotas,
            misshapen: AtomicU64::new(0),
            slow: Arc::default(),
            denied: AtomicU64::new(0),
            metrics,
            conns: Arc::default(),
            calls: AtomicU64::new(0),
            ready: Arc::default(),
            audit: None,
            spare: Arc::new(Spare::new(SPARE_BYTES)),
        }
    }

    /// The same, keeping `audit`'s log.
    pub fn with_audit(self, audit: Option<Audit>) -> Self {
        Self { audit, ..self }
    }
}
