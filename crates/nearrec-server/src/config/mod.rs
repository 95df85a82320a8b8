//! How a node runs: what it serves, where it listens and the limits that keep its tail short
//! ([`NodeConfig`]) — one object for every way of starting a node, like the store's
//! `StoreConfig`: `nearrec serve --config node.toml` and `nearrec-server --config node.toml`
//! read it, their flags override its fields ([`FLAGS`], the one list both commands build their
//! flags from), Python's `nearrec serve` hands it to the node whole. The defaults live here and
//! nowhere else.
//!
//! It is serde: a TOML file holds its fields at the top level, the stores' own settings under
//! `[store]` (a `StoreConfig`), TLS under `[tls]`. A key it does not know is an error.
//!
//! ```toml
//! stores = ["/data/rmc1=rmc1"]
//! listen = "127.0.0.1:7070"
//! max_in_flight = 8
//! idle_timeout = 300.0          # seconds
//! [store]
//! tier = "ssd"
//! dram_budget = "4GiB"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nearrec::StoreConfig;
use serde::{Deserialize, Serialize};

mod flags;

pub use flags::{FLAGS, Flag, FlagKind};

/// A node's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// The stores to serve, each `PATH` or `PATH=NAME` (the name defaults to the directory's).
    pub stores: Vec<String>,
    /// Sharded stores to serve, each `DIR` or `DIR=NAME`: the directory of a cut (`nearrec
    /// shard`: its plan, `shards.json`) whose `replicas.toml` names each shard's nodes; the
    /// node serves it through the router (`nearrec_cluster`), so that a client needs one
    /// address. The name defaults to the plan's.
    pub shards: Vec<String>,
    /// etcd's client endpoints (`host:port`) where the shards whose replicas this node serves
    /// keep their membership (`docs/distributed.md`, "Membership in etcd"): each writable shard
    /// replica is held there by the node's lease, and serves only while held. Empty: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub etcd: Vec<String>,
    /// The prefix of the sharded stores' keys in etcd; `None`: `/nearrec/<plan id>`, as the
    /// routers' default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_prefix: Option<String>,
    /// How every store is opened (`[store]`).
    pub store: StoreConfig,
    /// Where the node listens: loopback unless asked otherwise.
    pub listen: SocketAddr,
    /// Listen on an address other than loopback without an ACL.
    pub insecure: bool,
    /// Engine calls running at once; more wait in the queue.
    pub max_in_flight: usize,
    /// Large DRAM-resident lookups and inferences running at once, taken in fair order between
    /// principals (`crate::fair`); 0: one per core the node may run on.
    pub cpu_turns: usize,
    /// DRAM-resident lookups of at most this many ids run on the async worker that decoded them;
    /// larger ones on a blocking thread with a CPU turn (`crate::stores::inline`).
    pub inline_lookups: usize,
    /// Requests waiting for an engine slot; past them a request is refused
    /// (`RESOURCE_EXHAUSTED`).
    pub max_queued: usize,
    /// The largest request or answer, in bytes.
    pub max_message_bytes: usize,
    /// Pooled lookups of fewer bags than this that read a device (not DRAM-resident) are
    /// coalesced with others on the same store into engine batches of up to this many bags
    /// (`crate::coalesce`); 0: never.
    pub coalesce_bags: usize,
    /// How long the first request of an engine batch waits for others to join it (besides the
    /// wait for an engine slot, during which they gather anyway); microseconds in a file.
    #[serde(rename = "coalesce_window_us", with = "micros")]
    pub coalesce_window: Duration,
    /// How long a drain (SIGTERM) waits for requests in flight before it stops anyway; seconds
    /// in a file.
    #[serde(with = "seconds")]
    pub drain_timeout: Duration,
    /// The ACL file (`crate::acl`); `None`: every call is allowed. Reloaded on SIGHUP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acl: Option<PathBuf>,
    /// Where `GET /metrics` (Prometheus text) is served; `None`: nowhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// TLS (rustls); `None`: plaintext.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
    /// Connections open at once; past them a new one is closed at once (`crate::conns`).
    pub max_connections: usize,
    /// How long a new connection has to send the HTTP/2 preface (or finish its TLS handshake);
    /// seconds in a file.
    #[serde(with = "seconds")]
    pub handshake_timeout: Duration,
    /// How long a connection may send nothing before it is closed (the node pings each at half
    /// of it, so a live client always answers in time); seconds in a file.
    #[serde(with = "seconds")]
    pub idle_timeout: Duration,
    /// Requests one connection may have open at once (HTTP/2 `MAX_CONCURRENT_STREAMS`).
    pub max_streams_per_connection: u32,
    /// Bytes of answers the node holds computed but not yet taken by their clients; past them
    /// a request is refused (`RESOURCE_EXHAUSTED`). At least `max_message_bytes`.
    pub max_unsent_bytes: usize,
    /// The same, for one connection.
    pub max_unsent_bytes_per_connection: usize,
    /// Tables one request may name; past them it is refused (`INVALID_ARGUMENT`,
    /// `crate::limits`).
    pub max_tables_per_request: usize,
    /// Bags one request may ask for, all its tables together.
    pub max_bags_per_request: usize,
    /// Indices one lookup may carry (rows, for a write), all its tables together.
    pub max_indices_per_request: usize,
    /// Calls one principal (without an ACL: one client address) may have open at once, a
    /// stream counted for as long as it is open; past them `RESOURCE_EXHAUSTED`.
    pub max_calls_per_principal: usize,
    /// Connections one principal (without an ACL: one client address) may call on.
    pub max_connections_per_principal: usize,
    /// How long a unary call's request has to arrive whole from its headers (a client that
    /// trickles it in is answered `DEADLINE_EXCEEDED`); seconds in a file.
    #[serde(with = "seconds")]
    pub request_timeout: Duration,
    /// The directory `Swap` may take every store from (`crate::swap`), besides the versions
    /// of a store's own repository; `None`: only those. Never another served store's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_root: Option<PathBuf>,
    /// A store's own swap root, by the name it is served under (`[swap_roots]`), in place of
    /// `swap_root` for that store: tenants staging their next stores apart reach only their own.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub swap_roots: BTreeMap<String, PathBuf>,
    /// How the node logs on stderr: `text` (colour only on a terminal) or `json` (one object a
    /// line, for a log shipper).
    pub log_format: LogFormat,
    /// One call in this many is logged as an access line (principal, call, store, tables,
    /// rows, status, latency; never a token); 0: none.
    pub access_log_every: u64,
    /// Every call that takes at least this many milliseconds is logged as a slow request (the
    /// access line's fields, at `warn`); 0: none.
    pub slow_request_ms: u64,
    /// The audit log (`crate::audit`): every call that changes what the node serves, and every
    /// refusal of a token or a grant, one JSON line each; `None`: none kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<PathBuf>,
    /// Refuse a call that changes what the node serves (`UNAVAILABLE`, nothing of it applied)
    /// when its audit line cannot be written: the line is written as attempted before the call
    /// runs. `false`: the log fails open, lost lines counted (`crate::audit`).
    pub audit_required: bool,
}

/// The node's log lines on stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people: `tracing`'s text, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// For machines: one JSON object per line (`timestamp`, `level`, `fields.message`, the
    /// event's other fields, `target`).
    Json,
}

/// The node's certificate and key (PEM), and the CA its clients' certificates must chain to
/// (`None`: clients present none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// tonic's server TLS settings, the files read and checked now.
    pub fn server_config(&self) -> Result<tonic::transport::ServerTlsConfig, String> {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let read = |p: &PathBuf, what: &str| {
            std::fs::read(p).map_err(|e| format!("cannot read the TLS {what} {}: {e}", p.display()))
        };
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
            read(&self.cert, "certificate")?,
            read(&self.key, "key")?,
        ));
        if let Some(ca) = &self.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read(ca, "client CA")?));
        }
        Ok(tls)
    }
}

impl NodeConfig {
    /// The config a TOML text holds (every key not given: its default), checked.
    pub fn from_toml(text: &str) -> nearrec::Result<Self> {
        let value: toml::Table = toml::from_str(text).map_err(|e| config_error("", e))?;
        Self::from_table(value)
    }

    /// [`NodeConfig::from_toml`] of the file at `path`. A store's config given where a node's
    /// is asked for is named as such.
    pub fn from_file(path: &Path) -> nearrec::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| nearrec::Error::Config {
            key: String::new(),
            reason: format!("{}: {e}", path.display()),
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            nearrec::Error::Config { key, reason } if StoreConfig::from_toml(&text).is_ok() => {
                nearrec::Error::Config {
                    key,
                    reason: format!(
                        "{reason}: {} is a store's config; give it as --store-config, or put \
                         it under [store] in the node's",
                        path.display()
                    ),
                }
            }
            e => e,
        })
    }

    fn from_table(table: toml::Table) -> nearrec::Result<Self> {
        let config: Self = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| config_error(&e.path().to_string(), e.inner()))?;
        config.validate()?;
        Ok(config)
    }

    /// The config as TOML (what `from_toml` reads back).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a node config serialises to TOML")
    }

    /// This config with `overrides` set — each a key of the file (dotted for a table's:
    /// `store.tier`, `tls.cert`) and its value — checked as a file's would be.
    pub fn with_overrides(&self, overrides: &[(&str, toml::Value)]) -> nearrec::Result<Self> {
        let mut table = toml::Table::try_from(self).expect("a node config is a TOML table");
        for (key, value) in overrides {
            let mut at = &mut table;
            let mut parts = key.split('.').peekable();
            while let Some(part) = parts.next() {
                if parts.peek().is_none() {
                    at.insert(part.to_owned(), value.clone());
                    break;
                }
                let next = at
                    .entry(part.to_owned())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                at = next.as_table_mut().ok_or_else(|| nearrec::Error::Config {
                    key: (*key).to_owned(),
                    reason: format!("{part} is not a table"),
                })?;
            }
        }
        Self::from_table(table)
    }

    /// Checks every field's range (and the stores' config); the error names the field.
    pub fn validate(&self) -> nearrec::Result<()> {
        let bad = |key: &str, reason: &str| {
            Err(nearrec::Error::Config {
                key: key.into(),
                reason: reason.into(),
            })
        };
        for (key, n) in [
            ("max_in_flight", self.max_in_flight),
            ("max_connections", self.max_connections),
            ("max_message_bytes", self.max_message_bytes),
            ("max_tables_per_request", self.max_tables_per_request),
            ("max_bags_per_request", self.max_bags_per_request),
            ("max_indices_per_request", self.max_indices_per_request),
            ("max_calls_per_principal", self.max_calls_per_principal),
            (
                "max_connections_per_principal",
                self.max_connections_per_principal,
            ),
            (
                "max_streams_per_connection",
                self.max_streams_per_connection as usize,
            ),
        ] {
            if n == 0 {
                return bad(key, "must be at least 1");
            }
        }
        for (key, d) in [
            ("handshake_timeout", self.handshake_timeout),
            ("idle_timeout", self.idle_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() {
                return bad(key, "must be a positive number of seconds");
            }
        }
        if self.audit_required && self.audit_log.is_none() {
            return bad(
                "audit_required",
                "needs an audit log to require (audit_log, --audit-log)",
            );
        }
        self.store.validate()
    }

    /// The stores [`NodeConfig::stores`] names, opened as [`NodeConfig::store`] says.
    pub fn open_stores(&self) -> Result<crate::Stores, String> {
        if self.stores.is_empty() && self.shards.is_empty() {
            return Err(
                "name at least one store to serve (STORE[=NAME], --shards DIR, or stores = \
                 [...] in the node's config)"
                    .into(),
            );
        }
        let mut stores = crate::Stores::open(&self.stores, &self.store)?;
        stores.open_sharded(&self.shards)?;
        if let Some(name) = (self.swap_roots.keys()).find(|n| !stores.names().any(|s| s == *n)) {
            return Err(format!(
                "swap_roots names the store {name:?}, which the node does not serve; it serves: {}",
                stores.names().collect::<Vec<_>>().join(", ")
            ));
        }
        Ok(stores)
    }

    /// The node's budget of unsent answer bytes and one connection's, each room for at least
    /// one answer of the largest size.
    pub fn unsent_budgets(&self) -> (usize, usize) {
        let at_least_one = |bytes: usize| bytes.max(self.max_message_bytes);
        (
            at_least_one(self.max_unsent_bytes),
            at_least_one(self.max_unsent_bytes_per_connection),
        )
    }

    /// What one request may carry ([`crate::limits`]).
    pub fn shape(&self) -> crate::limits::Shape {
        crate::limits::Shape {
            tables: self.max_tables_per_request,
            bags: self.max_bags_per_request,
            indices: self.max_indices_per_request,
        }
    }

    /// The connection limits ([`crate::conns`]).
    pub fn limits(&self) -> crate::conns::Limits {
        crate::conns::Limits {
            max_connections: self.max_connections.max(1),
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
            unsent_bytes_per_connection: self.unsent_budgets().1,
            tls: self.tls.is_some(),
        }
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            stores: Vec::new(),
            shards: Vec::new(),
            etcd: Vec::new(),
            etcd_prefix: None,
            store: StoreConfig::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            insecure: false,
            max_in_flight: 8,
            cpu_turns: 0,
            inline_lookups: crate::stores::INLINE_LOOKUPS,
            max_queued: 256,
            max_message_bytes: 64 << 20,
            // measured (`nearrec bench serve`, SSD tier, bench/results/serve.md): batches of up
            // to 256 bags gained 1.29×, 0.89×, 1.36× and 1.18× the uncoalesced node's
            // throughput for requests of 1, 4, 16 and 64 bags (up to 64 bags: 0.98–1.01×);
            // waiting 200 µs for company cost latency at moderate load: nothing waits
            coalesce_bags: 256,
            coalesce_window: Duration::ZERO,
            drain_timeout: Duration::from_secs(30),
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_streams_per_connection: 256,
            max_unsent_bytes: 1 << 30,
            max_unsent_bytes_per_connection: 256 << 20,
            // a request of max_message_bytes holds at most 8 Mi int64 indices; 4,096 bags is
            // 64 times the largest batch in the specs' models
            max_tables_per_request: 1024,
            max_bags_per_request: 1 << 20,
            max_indices_per_request: 8 << 20,
            // half the node's connections, and more calls than max_queued and max_in_flight
            // take: one principal cannot hold them all
            max_calls_per_principal: 512,
            max_connections_per_principal: 512,
            request_timeout: Duration::from_secs(30),
            acl: None,
            metrics_listen: None,
            tls: None,
            swap_root: None,
            swap_roots: BTreeMap::new(),
            log_format: LogFormat::Text,
            access_log_every: 0,
            slow_request_ms: 1000,
            audit_log: None,
            audit_required: false,
        }
    }
}

fn config_error(key: &str, e: impl std::fmt::Display) -> nearrec::Error {
    nearrec::Error::Config {
        key: key.trim_start_matches('.').to_owned(),
        reason: e.to_string().trim_end().to_owned(),
    }
}

/// A duration as seconds (a float) in a file.
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs)
            .map_err(|_| serde::de::Error::custom(format!("{secs} is not a number of seconds ≥ 0")))
    }
}

/// A duration as whole microseconds in a file.
mod micros {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_micros() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_micros(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_survives_toml_and_every_flag_names_a_key() {
        // TLS's files go together: given, so that each flag of them changes one
        let config = NodeConfig {
            tls: Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: None,
            }),
            // --audit-required needs a log
            audit_log: Some("audit.jsonl".into()),
            swap_roots: [("s".to_owned(), PathBuf::from("/staging/s"))].into(),
            ..NodeConfig::default()
        };
        assert_eq!(NodeConfig::from_toml(&config.to_toml()).unwrap(), config);
        for f in FLAGS {
            let value = match f.kind {
                FlagKind::Switch => "",
                FlagKind::Int => "3",
                FlagKind::Float => "2.5",
                FlagKind::Text if f.key.contains("listen") => "127.0.0.1:9",
                FlagKind::Text if f.key == "log_format" => "json",
                FlagKind::Text => "/x",
                FlagKind::List => "/x=a,/y",
            };
            let with = config
                .with_overrides(&[(f.key, f.value(value).unwrap())])
                .unwrap_or_else(|e| panic!("--{}: {e}", f.name));
            assert_ne!(with, config, "--{} changed nothing", f.name);
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_naming_the_key() {
        let e = NodeConfig::from_toml("max_in_flite = 3").unwrap_err();
        assert!(e.to_string().contains("max_in_flite"), "{e}");
        let e = NodeConfig::from_toml("max_in_flight = 0").unwrap_err();
        assert!(e.to_string().starts_with("config: max_in_flight"), "{e}");
        let e = NodeConfig::from_toml("log_format = \"xml\"").unwrap_err();
        assert!(e.to_string().contains("log_format"), "{e}");
        let e = NodeConfig::from_toml("[store]\ntier = \"tape\"").unwrap_err();
        assert!(e.to_string().contains("store.tier"), "{e}");
        let e = NodeConfig::from_toml("audit_required = true").unwrap_err();
        assert!(e.to_string().contains("audit_required"), "{e}");
        let e = NodeConfig::from_toml("idle_timeout = -1.0").unwrap_err();
        assert!(e.to_string().contains("idle_timeout"), "{e}");
        let e = NodeConfig::default()
            .with_overrides(&[("listen", toml::Value::String("nowhere".into()))])
            .unwrap_err();
        assert!(e.to_string().contains("listen"), "{e}");
    }

    #[test]
    fn a_file_sets_what_it_names_and_flags_override_it() {
        let text = "stores = [\"/s=a\"]\nidle_timeout = 5.5\ncoalesce_window_us = 200\n\
                    [store]\ntier = \"ssd\"\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n";
        let config = NodeConfig::from_toml(text).unwrap();
        assert_eq!(config.stores, ["/s=a"]);
        assert_eq!(config.idle_timeout, Duration::from_secs_f64(5.5));
        assert_eq!(config.coalesce_window, Duration::from_micros(200));
        assert_eq!(config.store.tier, nearrec::Tier::Ssd);
        assert_eq!(config.tls.as_ref().unwrap().key, PathBuf::from("k.pem"));
        let over = config
            .with_overrides(&[
                ("idle_timeout", toml::Value::Float(1.0)),
                ("store.writable", toml::Value::Boolean(true)),
            ])
            .unwrap();
        assert_eq!(over.idle_timeout, Duration::from_secs(1));
        assert!(over.store.writable);
        assert_eq!(over.store.tier, nearrec::Tier::Ssd);
    }
}
