//! Plans a DRAM budget for a store from a trace file, as `nearrec plan` does in Python:
//!
//! ```text
//! cargo run --release -p nearrec-plan --example plan -- STORE TRACE BUDGET [STEPS] [OUT.toml]
//! ```
//!
//! Prints the plan as JSON (every number in full, for comparing with `nearrec.plan.make_plan`)
//! and, with `OUT.toml`, saves it there. `plan load PLAN.toml` prints the placement a plan file
//! makes (what `nearrec.plan.load_plan` reads), as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use nearrec_format::StoreReader;
use nearrec_plan::{DEFAULT_STEPS, PlanTable, TraceFile, load_plan, parse_size, plan_trace_file};
use serde_json::json;

fn run(args: &[String]) -> Result<(), String> {
    if let [verb, file] = args
        && verb == "load"
    {
        let placement = load_plan(&PathBuf::from(file)).map_err(|e| e.to_string())?;
        println!(
            "{}",
            serde_json::to_string(&placement).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    let [store, trace, budget, rest @ ..] = args else {
        return Err("usage: plan STORE TRACE BUDGET [STEPS] [OUT.toml]".into());
    };
    let budget = parse_size(budget).map_err(|e| e.to_string())?;
    let steps = match rest.first() {
        Some(s) => s.parse().map_err(|e| format!("steps: {e}"))?,
        None => DEFAULT_STEPS,
    };
    let reader = StoreReader::open(store).map_err(|e| e.to_string())?;
    let tables: Vec<PlanTable> = reader.tables().iter().map(PlanTable::from).collect();
    let trace = TraceFile::open(&PathBuf::from(trace)).map_err(|e| e.to_string())?;
    let mut plan = plan_trace_file(&tables, &trace, budget, steps).map_err(|e| e.to_string())?;
    plan.store = store.clone();
    if let Some(out) = rest.get(1) {
        plan.save(&PathBuf::from(out)).map_err(|e| e.to_string())?;
    }
    let tables: Vec<_> = plan
        .tables
        .iter()
        .map(|t| {
            json!({
                "table": t.table, "rows": t.rows, "row_bytes": t.row_bytes,
                "table_bytes": t.table_bytes, "lookups": t.lookups,
                "working_set": t.working_set, "locality": t.locality,
                "kind": t.kind.name(), "resident": t.resident, "hot_rows": t.hot_rows,
                "cache_bytes": t.cache_bytes, "expected_hit_ratio": t.expected_hit_ratio,
                "bytes": t.bytes(),
                "curve": [t.curve.bytes, t.curve.hot, t.curve.lru],
            })
        })
        .collect();
    let out = json!({
        "budget": plan.budget, "bytes": plan.bytes(),
        "expected_hit_ratio": plan.expected_hit_ratio(), "trace": plan.trace,
        "store": plan.store, "tables": tables, "text": plan.text(),
    });
    println!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plan: {e}");
            ExitCode::FAILURE
        }
    }
}
