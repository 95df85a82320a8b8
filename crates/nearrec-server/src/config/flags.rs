//! The node's flags (`FLAGS`): the one list both `nearrec serve` and `nearrec-server` build their
//! flags from, each an override of a key of the node's file.

use super::*;

/// What a flag takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    /// Present or not (`true` when given).
    Switch,
    Int,
    /// Seconds and other fractions.
    Float,
    /// An address, a path, a size such as `4GiB`.
    Text,
    /// Values separated by commas (the flag given again adds to them in Python's command).
    List,
}

/// One flag of `nearrec serve` and `nearrec-server`: `--NAME VALUE` sets the config's `key`.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    pub key: &'static str,
    pub kind: FlagKind,
    pub metavar: &'static str,
    pub help: &'static str,
}

impl Flag {
    /// The flag's value as the config holds it.
    pub fn value(&self, given: &str) -> Result<toml::Value, String> {
        let bad = |what: &str| format!("--{} takes {what}, not {given:?}", self.name);
        Ok(match self.kind {
            FlagKind::Switch => toml::Value::Boolean(true),
            FlagKind::Int => toml::Value::Integer(given.parse().map_err(|_| bad("an integer"))?),
            FlagKind::Float => toml::Value::Float(given.parse().map_err(|_| bad("a number"))?),
            FlagKind::Text => toml::Value::String(given.to_owned()),
            FlagKind::List => toml::Value::Array(
                (given.split(','))
                    .filter(|v| !v.is_empty())
                    .map(|v| toml::Value::String(v.to_owned()))
                    .collect(),
            ),
        })
    }

    /// The default value, as the help shows it (empty for none).
    pub fn default_shown(&self) -> String {
        let table = toml::Table::try_from(NodeConfig::default()).expect("a TOML table");
        let mut at = Some(&toml::Value::Table(table));
        for part in self.key.split('.') {
            at = at.and_then(|v| v.get(part));
        }
        match at {
            Some(toml::Value::String(s)) => s.clone(),
            Some(toml::Value::Boolean(_)) | None => String::new(),
            Some(v) => v.to_string(),
        }
    }
}

/// Every flag of the node: `nearrec serve` (Python) and `nearrec-server` (clap) build theirs
/// from this list, so the two commands cannot drift. The store's own settings (`--tier`,
/// `--dram-budget`, ...) are the store commands' flags and set `store.*`.
pub const FLAGS: &[Flag] = &[
    flag(
        "shards",
        "shards",
        FlagKind::List,
        "DIR[=NAME]",
        "serve a sharded store (nearrec shard) through the router: its directory, whose replicas.toml names each shard's nodes (several: comma-separated; docs/distributed.md)",
    ),
    flag(
        "etcd",
        "etcd",
        FlagKind::List,
        "HOST:PORT",
        "etcd's endpoints, where the shards whose replicas this node serves keep their membership: each writable replica is held there by the node's lease and serves only while held (comma-separated; docs/distributed.md)",
    ),
    flag(
        "etcd-prefix",
        "etcd_prefix",
        FlagKind::Text,
        "PREFIX",
        "the prefix of the sharded stores' keys in etcd (default /nearrec/<plan id>)",
    ),
    flag(
        "listen",
        "listen",
        FlagKind::Text,
        "HOST:PORT",
        "address to listen on (port 0: a free one, printed once ready)",
    ),
    flag(
        "writable",
        "store.writable",
        FlagKind::Switch,
        "",
        "open the stores for writing (Write, Remove, CreateTable, DropTable)",
    ),
    flag(
        "warm",
        "store.warm",
        FlagKind::Text,
        "FILE",
        "fill the DRAM tiers before serving from a recorded trace (.nrtrace: the most requested rows first) or a kept hot set",
    ),
    flag(
        "hot-set-dir",
        "store.hot_set_dir",
        FlagKind::Text,
        "DIR",
        "keep each store's hot set here (NAME.hotset): written at the end of a drain, read at the next start to warm the DRAM tiers before the node is ready",
    ),
    flag(
        "acl",
        "acl",
        FlagKind::Text,
        "FILE",
        "who may read, write and administer which tables (TOML: principals, their tokens' SHA-256, their grants; reloaded on SIGHUP; docs/serving.md)",
    ),
    flag(
        "audit-log",
        "audit_log",
        FlagKind::Text,
        "FILE",
        "append one JSON line for every call that changes what the node serves (writes, transactions, tables, swaps, model updates, compactions) and every refused token or grant: who, from where, what, when, how it ended; never a token (docs/security.md)",
    ),
    flag(
        "audit-required",
        "audit_required",
        FlagKind::Switch,
        "",
        "refuse a change (UNAVAILABLE, nothing applied) whose audit line cannot be written: each is logged as attempted before it runs (default: the log fails open, lost lines counted)",
    ),
    flag(
        "metrics-listen",
        "metrics_listen",
        FlagKind::Text,
        "HOST:PORT",
        "serve Prometheus metrics (GET /metrics) here, apart from the gRPC address (port 0: a free one, printed once ready)",
    ),
    flag(
        "tls-cert",
        "tls.cert",
        FlagKind::Text,
        "PEM",
        "serve TLS with this certificate (with --tls-key)",
    ),
    flag(
        "tls-key",
        "tls.key",
        FlagKind::Text,
        "PEM",
        "the certificate's private key",
    ),
    flag(
        "tls-client-ca",
        "tls.client_ca",
        FlagKind::Text,
        "PEM",
        "ask clients for certificates chaining to this CA (mutual TLS)",
    ),
    flag(
        "swap-root",
        "swap_root",
        FlagKind::Text,
        "DIR",
        "the directory Swap may take stores from, besides the versions of a store's own repository (never another served store's; per store: [swap_roots] in the config file)",
    ),
    flag(
        "insecure",
        "insecure",
        FlagKind::Switch,
        "",
        "listen on an address other than loopback without an ACL",
    ),
    flag(
        "max-in-flight",
        "max_in_flight",
        FlagKind::Int,
        "N",
        "engine calls running at once",
    ),
    flag(
        "cpu-turns",
        "cpu_turns",
        FlagKind::Int,
        "N",
        "large DRAM-resident lookups (past --inline-lookups ids) and inferences running at once, in fair order between principals (0: one per core the node may run on)",
    ),
    flag(
        "inline-lookups",
        "inline_lookups",
        FlagKind::Int,
        "N",
        "DRAM-resident lookups of at most N ids run on the async worker that decoded them, larger ones on a blocking thread with a CPU turn",
    ),
    flag(
        "max-queued",
        "max_queued",
        FlagKind::Int,
        "N",
        "calls waiting for the engine; past them calls are refused (RESOURCE_EXHAUSTED)",
    ),
    flag(
        "max-message-bytes",
        "max_message_bytes",
        FlagKind::Int,
        "BYTES",
        "the largest request or answer",
    ),
    flag(
        "coalesce-bags",
        "coalesce_bags",
        FlagKind::Int,
        "N",
        "pooled lookups of fewer bags that read a device (not DRAM-resident) are coalesced with others into engine batches of up to this many bags (0: never; docs/serving.md)",
    ),
    flag(
        "coalesce-window-us",
        "coalesce_window_us",
        FlagKind::Int,
        "US",
        "microseconds the first request of a coalesced batch waits for others (besides waiting for an engine slot)",
    ),
    flag(
        "max-connections",
        "max_connections",
        FlagKind::Int,
        "N",
        "connections open at once; past them a new one is closed at once (lowered to fit the descriptor limit)",
    ),
    flag(
        "handshake-timeout",
        "handshake_timeout",
        FlagKind::Float,
        "SECONDS",
        "seconds a new connection has to send the HTTP/2 preface or finish its TLS handshake",
    ),
    flag(
        "idle-timeout",
        "idle_timeout",
        FlagKind::Float,
        "SECONDS",
        "seconds a connection may send nothing before it is closed; live clients answer the node's pings",
    ),
    flag(
        "max-streams-per-connection",
        "max_streams_per_connection",
        FlagKind::Int,
        "N",
        "requests one connection may have open at once (HTTP/2 MAX_CONCURRENT_STREAMS)",
    ),
    flag(
        "max-unsent-bytes",
        "max_unsent_bytes",
        FlagKind::Int,
        "BYTES",
        "bytes of answers computed but not yet read by their clients that the node holds; past them requests are refused",
    ),
    flag(
        "max-unsent-bytes-per-connection",
        "max_unsent_bytes_per_connection",
        FlagKind::Int,
        "BYTES",
        "the same, for one connection",
    ),
    flag(
        "max-tables-per-request",
        "max_tables_per_request",
        FlagKind::Int,
        "N",
        "tables one request may name; past them it is refused (INVALID_ARGUMENT)",
    ),
    flag(
        "max-bags-per-request",
        "max_bags_per_request",
        FlagKind::Int,
        "N",
        "bags one request may ask for, its tables together",
    ),
    flag(
        "max-indices-per-request",
        "max_indices_per_request",
        FlagKind::Int,
        "N",
        "indices one lookup (rows one write) may carry, its tables together",
    ),
    flag(
        "max-calls-per-principal",
        "max_calls_per_principal",
        FlagKind::Int,
        "N",
        "calls one principal (without an ACL: one client address) may have open at once, a stream for as long as it is open; past them RESOURCE_EXHAUSTED",
    ),
    flag(
        "max-connections-per-principal",
        "max_connections_per_principal",
        FlagKind::Int,
        "N",
        "connections one principal (without an ACL: one client address) may call on",
    ),
    flag(
        "request-timeout",
        "request_timeout",
        FlagKind::Float,
        "SECONDS",
        "seconds a unary call's request has to arrive whole; a client that trickles it in is answered DEADLINE_EXCEEDED",
    ),
    flag(
        "drain-timeout",
        "drain_timeout",
        FlagKind::Float,
        "SECONDS",
        "seconds SIGTERM waits for calls in flight",
    ),
    flag(
        "log-format",
        "log_format",
        FlagKind::Text,
        "text|json",
        "stderr's log lines: text (coloured only on a terminal) or json (one object a line)",
    ),
    flag(
        "access-log-every",
        "access_log_every",
        FlagKind::Int,
        "N",
        "log one call in N as an access line: principal, call, store, tables, rows, status, latency (0: none)",
    ),
    flag(
        "slow-request-ms",
        "slow_request_ms",
        FlagKind::Int,
        "MS",
        "log every call taking at least this many milliseconds as a slow request (0: none)",
    ),
];

const fn flag(
    name: &'static str,
    key: &'static str,
    kind: FlagKind,
    metavar: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        name,
        key,
        kind,
        metavar,
        help,
    }
}
