//! The facade end to end, with no Python: build a store, keep a model with it, trace it, plan a
//! DRAM budget from the trace, open the store from a TOML config that names the plan, serve the
//! trace's batches pipelined, and run the model next to the embeddings.
//!
//! ```text
//! cargo run -p nearrec --example serve --release -- [DIR]    # DIR: a temporary directory
//! ```
//!
//! Every pipelined result is checked against a plain `StoreApi::lookup` of the same batch; a
//! mismatch exits non-zero, so CI (`make test`) runs this as a test of the facade too.

use nearrec::format::{DType, StoreOptions, StoreWriter, TableSpec, UniformInit};
use nearrec::model::{ModelConfig, OwnedWeight};
use nearrec::plan::{
    DEFAULT_STEPS, Generator, Ids, PlanTable, TableData, TraceFile, Variant, table_seed,
    write_trace,
};
use nearrec::prelude::*;
use nearrec::{AsBatch, OwnedBatch, Pooled, Store, StoreConfig, StoreReader};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const TABLES: usize = 4;
const ROWS: u64 = 20_000;
/// Each table's row width; DLRM's bottom MLP ends at the same width.
const DIM: usize = 16;
/// Dense features per sample (Criteo's 13).
const DENSE: usize = 13;
const BAGS: u64 = 2_048;
const BATCH: u64 = 128;
const POOLING: u32 = 20;
const SEED: u64 = 7;

fn main() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = match std::env::args().nth(1) {
        Some(d) => std::fs::create_dir_all(&d).map(|()| d.into())?,
        None => tmp.path().to_owned(),
    };
    let store_path = dir.join("store");

    // 1. The store: four fp32 tables of seeded random rows (DeepRecInfra's U(±√(1/rows))),
    //    streamed to a temporary directory and renamed into place by commit.
    let options = StoreOptions {
        overwrite: true,
        ..StoreOptions::default()
    };
    let mut writer = StoreWriter::create(&store_path, options)?;
    for t in 0..TABLES {
        let spec = TableSpec::new(format!("t{t}"), ROWS, DIM as u32, DType::Fp32);
        let mut table = writer.table(spec)?;
        let init = UniformInit::new(SEED, t as u64, ROWS);
        table.write_with(ROWS, |row, out| init.fill(row, out))?;
        writer.finish_table(table)?;
    }
    writer.commit()?;

    // 2. The model kept with it: a DLRM ("rmc1", cat interaction) whose layer names follow
    //    nn.Sequential's numbering (ReLUs take the odd numbers), as nearrec.models.save writes.
    let layers = [
        ("bottom", vec![DENSE, 64, DIM]),
        ("top", vec![(TABLES + 1) * DIM, 64, 1]),
    ];
    let mut weights: Vec<OwnedWeight> = Vec::new();
    for (prefix, sizes) in &layers {
        for (j, io) in sizes.windows(2).enumerate() {
            let (inputs, outputs) = (io[0], io[1]);
            // nn.Linear's init: U(±1/√inputs) for weights and biases alike
            let init = UniformInit::new(SEED, 100 + weights.len() as u64, inputs as u64);
            let mut w = vec![0f32; outputs * inputs];
            for (row, out) in w.chunks_mut(inputs).enumerate() {
                init.fill(row as u64, out);
            }
            let mut b = vec![0f32; outputs];
            init.fill(outputs as u64, &mut b); // the bias: one more "row"
            weights.push((
                format!("{prefix}.{}.weight", 2 * j),
                vec![outputs, inputs],
                w,
            ));
            weights.push((format!("{prefix}.{}.bias", 2 * j), vec![outputs], b));
        }
    }
    let tensors = nearrec::model::tensors(&weights);
    let model = ModelConfig {
        model: "rmc1".into(),
        variant: "deeprecsys".into(),
        interaction: "cat".into(),
        tasks: 1,
        tables: Some((0..TABLES).map(|t| format!("t{t}")).collect()),
        features: None,
        pooling: None,
        sequence: false,
        graph: None,
    };
    nearrec::model::save(&store_path, &model, &tensors)?;

    // 3. A trace: each table's ids from a different generator (skewed to uniform), written as a
    //    .nrtrace file (what `nearrec trace` writes and the planner reads).
    let generators = [
        Generator::Zipf { alpha: 1.2 },
        Generator::Zipf { alpha: 0.9 },
        Generator::StackDistance {
            k: 0.5, // RecSSD's locality knob: higher, less reuse
            variant: Variant::Continuous,
            ids: Ids::Full,
        },
        Generator::Uniform,
    ];
    let specs: Vec<nearrec::plan::TableSpec> = generators
        .into_iter()
        .enumerate()
        .map(|(t, generator)| nearrec::plan::TableSpec {
            name: format!("t{t}"),
            rows: ROWS,
            pooling: POOLING,
            generator,
        })
        .collect();
    let traced = specs
        .iter()
        .enumerate()
        .map(|(t, spec)| spec.generate(BAGS, table_seed(SEED, t)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let data: Vec<TableData<'_>> = specs
        .iter()
        .zip(&traced)
        .map(|(s, t)| TableData::generated(s, t))
        .collect();
    let trace_path = dir.join("serve.nrtrace");
    write_trace(&trace_path, BATCH as u32, SEED, &data, true)?;
    let trace = TraceFile::open(&trace_path)?;

    // 4. A plan: a quarter of the tables' bytes in DRAM, split by the trace between whole
    //    tables, pinned hot rows and row caches.
    let tables: Vec<PlanTable> = StoreReader::open(&store_path)?
        .tables()
        .iter()
        .map(PlanTable::from)
        .collect();
    let budget = tables.iter().map(|t| t.data_bytes).sum::<u64>() / 4;
    let plan = nearrec::plan::plan_trace_file(&tables, &trace, budget, DEFAULT_STEPS)?;
    let plan_path = dir.join("serve.plan.toml");
    plan.save(&plan_path)?;
    println!("{}", plan.text());

    // 5. The store from a TOML config (a file's text; `nearrec --config` reads the same keys).
    //    The plan's path goes in a literal string ('...'), which TOML takes verbatim.
    let toml = format!(
        "tier = \"ssd\"\ndram_budget = {budget}\nplan = '{}'\n",
        plan_path.display()
    );
    let store = Store::open(&store_path, &StoreConfig::from_toml(&toml)?)?;
    println!(
        "opened {} on {:?}, config:\n{toml}",
        store.path().display(),
        store.tier()
    );

    // 6. Serve the trace's batches: a stream keeps two in flight (batch i + 1 reads while the
    //    caller has batch i), submit returns at once, lookup_split cuts one batch in four.
    let batches: Vec<OwnedBatch> = OwnedBatch::trace_batches(&trace, BATCH)?.collect();
    for (i, pooled) in store.stream(batches.clone(), 2).enumerate() {
        same(&store, &batches[i], &pooled?, &format!("stream, batch {i}"))?;
    }
    let pending: Vec<_> = batches[..4]
        .iter()
        .map(|b| store.submit(b.clone()))
        .collect();
    for (b, p) in batches.iter().zip(pending) {
        same(&store, b, &p.wait()?, "submit")?;
    }
    let split = store.lookup_split(&batches[0].as_batch(), BATCH as usize / 4)?;
    same(&store, &batches[0], &split, "lookup_split")?;
    println!(
        "{} batches of {BATCH} bags served and checked",
        batches.len()
    );

    // 7. The model next to the embeddings: only its outputs come back.
    let dense: Vec<f32> = (0..BATCH as usize * DENSE)
        .map(|i| (i % 17) as f32 / 17.0)
        .collect();
    let inferred = store.infer(&dense, &batches[1].as_batch())?;
    println!(
        "infer: outputs [{}, {}], first {:?}",
        inferred.batch,
        inferred.width,
        &inferred.outputs[..4]
    );

    // The SSD tier's counters (the checks' own lookups count too).
    let stats = store.stats()?;
    let get = |k: &str| stats.get(k).unwrap_or(f64::NAN);
    println!(
        "dram hit ratio {:.3} (the plan expected {:.3}), device reads {}, device {}",
        get("dram_hit_ratio"),
        plan.expected_hit_ratio(),
        get("device_reads"),
        stats.device,
    );
    Ok(())
}

/// `got` against a plain lookup of `batch`: equal to rounding (rows are pooled as their reads
/// land, so the order of a bag's additions, and its last bits, may differ).
fn same(store: &Store, batch: &OwnedBatch, got: &Pooled, how: &str) -> Result<()> {
    let want = store.lookup(&batch.as_batch())?;
    if got.batch != want.0.batch || got.tables != want.0.tables {
        return Err(format!("{how}: shape {:?} vs {:?}", got.tables, want.0.tables).into());
    }
    let at = got.values.iter().zip(&want.0.values).position(|(x, y)| {
        (x - y).abs() > 1e-5 * (1.0 + y.abs()) // fp32 sums of POOLING rows
    });
    match at {
        Some(i) => Err(format!(
            "{how}: value {i} is {} not {}",
            got.values[i], want.0.values[i]
        )
        .into()),
        None => Ok(()),
    }
}
