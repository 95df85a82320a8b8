//! The SSD tier's CPU time per device read (issue 21, item 4): the engine as shipped, its DRAM
//! tiers off, on a zero-latency device — the table files held in memory (`nearrec_io::MemDevice`,
//! the same `BlockDevice` path the disk takes) — or on the disk itself, with the process's CPU
//! time (user + system, every thread) over the device reads it issued.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use nearrec_engine::{Bags, Batch, Engine, EngineConfig, Indices, TableLookup, Tier};
use nearrec_format::StoreReader;
use nearrec_io::MemDevice;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

/// Seconds of CPU this process has used, all threads: (user, system).
fn cpu_seconds() -> (f64, f64) {
    // SAFETY: getrusage fills the struct it is given
    let usage = unsafe {
        let mut u = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (secs(usage.ru_utime), secs(usage.ru_stime))
}

/// Serves uniform random batches (`batch` bags of `pooling` rows per table) from `store`'s SSD
/// tier for `seconds`, on `device` ("memory": the files in memory; "disk": the files, direct
/// I/O), pooling on `threads` workers, with or without checking reads (`verify`). Returns the
/// device reads, lookups, batches, CPU seconds (user, system and both) and wall seconds, and the stages' sums (route, I/O
/// wait, pooling).
#[pyfunction]
#[pyo3(signature = (store, batch, pooling, seconds, device = "memory", threads = 1, verify = true, seed = 11))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_cost(
    py: Python<'_>,
    store: PathBuf,
    batch: usize,
    pooling: usize,
    seconds: f64,
    device: &str,
    threads: usize,
    verify: bool,
    seed: u64,
) -> PyResult<HashMap<&'static str, f64>> {
    let err = |e: nearrec_engine::EngineError| PyOSError::new_err(e.to_string());
    let reader = StoreReader::open(&store).map_err(|e| PyOSError::new_err(e.to_string()))?;
    let config = EngineConfig {
        threads,
        verify_reads: verify,
        tier: Tier::Ssd,
        dram_budget_bytes: None,
        ..EngineConfig::default()
    };
    let engine = match device {
        "memory" => {
            let files = reader
                .tables()
                .iter()
                .map(|t| std::fs::read(store.join(&t.file)))
                .collect::<std::io::Result<Vec<_>>>()?;
            Engine::with_device(&reader, config, Box::new(MemDevice::new(files, 512)))
                .map_err(err)?
        }
        "disk" => Engine::from_reader(&reader, config, None).map_err(err)?,
        other => return Err(PyValueError::new_err(format!("no device {other:?}"))),
    };
    let tables: Vec<(String, u64)> = reader
        .tables()
        .iter()
        .map(|t| (t.name.clone(), t.rows))
        .collect();
    // a few distinct batches of uniform rows
    let mut next = uniform_rows(seed);
    let ids: Vec<Vec<Vec<i64>>> = (0..4)
        .map(|_| {
            tables
                .iter()
                .map(|&(_, rows)| (0..batch * pooling).map(|_| next(rows)).collect())
                .collect()
        })
        .collect();
    let offsets: Vec<i64> = (0..batch).map(|b| (b * pooling) as i64).collect();
    py.detach(|| {
        let reqs: Vec<Batch<'_>> = ids
            .iter()
            .map(|per_table| {
                Batch::new(
                    tables
                        .iter()
                        .zip(per_table)
                        .map(|((name, _), ix)| {
                            TableLookup::new(
                                name,
                                Indices::I64(ix),
                                Bags::Offsets {
                                    offsets: Indices::I64(&offsets),
                                    include_last_offset: false,
                                },
                            )
                        })
                        .collect(),
                )
            })
            .collect();
        let prepared = reqs
            .iter()
            .map(|r| engine.prepare(r))
            .collect::<nearrec_engine::Result<Vec<_>>>()
            .map_err(err)?;
        let mut out = vec![0f32; prepared[0].batch() * prepared[0].width()];
        // one untimed batch of each: pools and rings started
        for (r, p) in reqs.iter().zip(&prepared) {
            engine.execute(r, p, &mut out).map_err(err)?;
        }
        let stats = engine.io_stats().expect("the SSD tier");
        let reads0 = stats.device_reads.load(Relaxed);
        let (mut route, mut io_wait, mut pool) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let (cpu0, start) = (cpu_seconds(), Instant::now());
        let mut batches = 0usize;
        while batches < 4 || start.elapsed().as_secs_f64() < seconds {
            let k = batches % reqs.len();
            let st = engine
                .execute(&reqs[k], &prepared[k], &mut out)
                .map_err(err)?;
            route += st.route;
            io_wait += st.io_wait;
            pool += st.pool;
            batches += 1;
        }
        let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds());
        let (user, system) = (cpu.0 - cpu0.0, cpu.1 - cpu0.1);
        let reads = (stats.device_reads.load(Relaxed) - reads0) as f64;
        Ok(HashMap::from([
            ("reads", reads),
            ("lookups", (batches * batch * pooling * tables.len()) as f64),
            ("batches", batches as f64),
            ("cpu_s", user + system),
            ("user_s", user),
            ("system_s", system),
            ("wall_s", wall),
            ("route_s", route.as_secs_f64()),
            ("io_wait_s", io_wait.as_secs_f64()),
            ("pool_s", pool.as_secs_f64()),
        ]))
    })
}

/// Row ids drawn uniformly below the bound each call passes, reproducibly from `seed`
/// (xorshift: no dependency for a bench's ids).
pub(crate) fn uniform_rows(seed: u64) -> impl FnMut(u64) -> i64 {
    let mut state = seed | 1;
    move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n) as i64
    }
}
