//! `nearrec-server`: the storage node as a standalone binary, for hosts without Python
//! (`nearrec serve` is the same server). Its flags are the node config's ([`FLAGS`]), each an
//! override of `--config`'s file.

use std::io::Write;
use std::path::PathBuf;

use clap::{Arg, ArgAction, Command};
use nearrec::StoreConfig;
use nearrec_server::{FLAGS, FlagKind, Listeners, NodeConfig, Stores, listening, run};

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("nearrec-server: {message}");
    std::process::exit(2)
}

/// The command: the stores, `--config`, `--store-config`, and a flag per entry of [`FLAGS`].
fn command() -> Command {
    let mut cmd = Command::new("nearrec-server")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Serves nearrec stores over gRPC (nearrec.v1.Node, grpc.health.v1, reflection)")
        .arg(
            Arg::new("stores")
                .value_name("STORE[=NAME]")
                .num_args(0..)
                .help(
                    "stores to serve, each PATH or PATH=NAME (the name defaults to the \
                       directory's); given, they replace the config's",
                ),
        )
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help(
                    "the node's config (TOML: its settings, the stores' under [store]); \
                       flags override it",
                ),
        )
        .arg(
            Arg::new("store-config")
                .long("store-config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help(
                    "a store config (TOML, as `nearrec --config`) every store is opened \
                       with, in place of the node config's [store]",
                ),
        );
    for f in FLAGS {
        let mut arg = Arg::new(f.name).long(f.name).help(f.help);
        arg = match f.kind {
            FlagKind::Switch => arg.action(ArgAction::SetTrue),
            _ => arg.value_name(f.metavar),
        };
        let default = f.default_shown();
        if !default.is_empty() {
            arg = arg.help(format!("{} [default: {default}]", f.help));
        }
        cmd = cmd.arg(arg);
    }
    cmd
}

fn main() {
    let args = command().get_matches();
    let mut config = match args.get_one::<PathBuf>("config") {
        Some(p) => NodeConfig::from_file(p).unwrap_or_else(|e| fail(e)),
        None => NodeConfig::default(),
    };
    if let Some(p) = args.get_one::<PathBuf>("store-config") {
        config.store = StoreConfig::from_file(p).unwrap_or_else(|e| fail(e));
    }
    if let Some(stores) = args.get_many::<String>("stores") {
        config.stores = stores.cloned().collect();
    }
    let mut overrides = Vec::new();
    for f in FLAGS {
        let given = match f.kind {
            FlagKind::Switch => args.get_flag(f.name).then(String::new),
            _ => args.get_one::<String>(f.name).cloned(),
        };
        if let Some(given) = given {
            overrides.push((f.key, f.value(&given).unwrap_or_else(|e| fail(e))));
        }
    }
    let config = config
        .with_overrides(&overrides)
        .unwrap_or_else(|e| fail(e));
    let ready = |listeners: &Listeners, stores: &Stores| {
        println!("nearrec-server {}", listening(listeners, stores));
        let _ = std::io::stdout().flush();
    };
    if let Err(e) = run(config, ready) {
        fail(e);
    }
}
