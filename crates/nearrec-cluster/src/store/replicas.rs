//! `replicas.toml`: the file in a sharded store's directory that names each shard's nodes and
//! how to reach them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nearrec::Error;
use nearrec_client::ClientOptions;

use super::{Endpoint, ShardedOptions};
use crate::catch_up;
use crate::etcd::EtcdOptions;
use crate::shard::Hedge;

/// The file in a sharded store's directory that names each shard's nodes.
pub const REPLICAS_FILE: &str = "replicas.toml";

/// What `replicas.toml` holds: each shard's nodes and how to reach them.
///
/// ```toml
/// shards = [["10.0.0.1:7070/s", "10.0.0.2:7070/s"], ["10.0.0.3:7070/s"]]
/// timeout = 5.0          # each call's deadline, seconds (default 30)
/// hedge = "p95"          # "pNN", a delay in seconds, or "off"
/// token_file = "/etc/nearrec/shards.token"   # the nodes' bearer token, if they ask for one
/// tls_ca = "/etc/nearrec/ca.pem"             # the CA their certificates chain to (TLS)
/// catch_up_every = 2.0   # seconds between background catch-ups of stale replicas (0: off)
/// etcd = ["10.0.0.5:2379", "10.0.0.6:2379", "10.0.0.7:2379"]   # membership kept in etcd
/// etcd_prefix = "/nearrec/dlrm"   # its keys' prefix (default /nearrec/<plan id>)
/// etcd_hold = 2.0        # seconds a replica is held per renewal of its lease (a new record's)
/// ```
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicasFile {
    pub shards: Vec<Vec<String>>,
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    #[serde(default = "default_hedge")]
    pub hedge: toml::Value,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    #[serde(default = "default_catch_up_every")]
    pub catch_up_every: f64,
    #[serde(default)]
    pub etcd: Vec<String>,
    #[serde(default)]
    pub etcd_prefix: Option<String>,
    #[serde(default = "default_hold")]
    pub etcd_hold: f64,
}

fn default_hold() -> f64 {
    crate::etcd::DEFAULT_HOLD.as_secs_f64()
}

fn default_catch_up_every() -> f64 {
    catch_up::EVERY.as_secs_f64()
}

fn default_timeout() -> f64 {
    30.0
}

fn default_hedge() -> toml::Value {
    toml::Value::String("p95".into())
}

impl ReplicasFile {
    /// The file in `dir`, read and checked; its options as a router's.
    pub fn read(dir: &Path) -> nearrec::Result<(Vec<Vec<Endpoint>>, ShardedOptions)> {
        let path = dir.join(REPLICAS_FILE);
        let bad = |reason: String| Error::Config {
            key: String::new(),
            reason: format!("{}: {reason}", path.display()),
        };
        let text =
            std::fs::read_to_string(&path).map_err(|e| nearrec::format::FormatError::Io {
                path: path.clone(),
                source: e,
            })?;
        let file: ReplicasFile = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if !(file.catch_up_every >= 0.0 && file.catch_up_every.is_finite()) {
            return Err(bad(format!(
                "catch_up_every must be seconds ≥ 0 (0: off), not {}",
                file.catch_up_every
            )));
        }
        if !(file.timeout > 0.0 && file.timeout.is_finite()) {
            return Err(bad(format!(
                "timeout must be seconds > 0, not {}",
                file.timeout
            )));
        }
        let hedge = match &file.hedge {
            toml::Value::String(s) => Hedge::named(s),
            toml::Value::Float(s) => Hedge::after(*s),
            toml::Value::Integer(s) => Hedge::after(*s as f64),
            v => Err(format!("hedge {v} is not \"off\", \"pNN\" or seconds")),
        }
        .map_err(bad)?;
        let mut client = ClientOptions {
            timeout: Some(Duration::from_secs_f64(file.timeout)),
            ..ClientOptions::default()
        };
        if let Some(p) = &file.token_file {
            let token = std::fs::read_to_string(p)
                .map_err(|e| bad(format!("token_file {}: {e}", p.display())))?;
            client.token = Some(token.trim().to_owned());
        }
        if let Some(p) = &file.tls_ca {
            let ca = std::fs::read(p).map_err(|e| bad(format!("tls_ca {}: {e}", p.display())))?;
            client.tls = Some(nearrec_client::ClientTls {
                ca: Some(ca),
                domain: None,
                identity: None,
            });
        }
        let endpoints = (file.shards.iter())
            .map(|s| s.iter().map(|a| Endpoint::parse(a)).collect())
            .collect();
        let catch_up_every =
            (file.catch_up_every > 0.0).then(|| Duration::from_secs_f64(file.catch_up_every));
        if !(file.etcd_hold >= 0.1 && file.etcd_hold.is_finite()) {
            return Err(bad(format!(
                "etcd_hold must be seconds ≥ 0.1, not {}",
                file.etcd_hold
            )));
        }
        let etcd = (!file.etcd.is_empty()).then(|| EtcdOptions {
            prefix: file.etcd_prefix.clone(),
            hold: Duration::from_secs_f64(file.etcd_hold),
            ..EtcdOptions::new(file.etcd.clone())
        });
        let options = ShardedOptions {
            client,
            hedge,
            catch_up_every,
            etcd,
        };
        Ok((endpoints, options))
    }
}
