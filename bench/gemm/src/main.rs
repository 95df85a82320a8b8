//! GFLOP/s of `y += x·Wᵀ` (`x`: m × k, `W`: n × k as `nn.Linear` stores it) for each way the
//! engine could multiply (`matrixmultiply`, `gemm`, `faer`; `gemm.t`: `gemm` from a copy of W
//! held transposed, k × n; `cols2t`: the output columns halved between two threads), on a
//! two-thread pool; one JSON object per shape on stdout, each a median of nine timings of 100
//! products.

use std::time::Instant;

#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: every use below writes disjoint column blocks, or only from one call.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// `(k, n)` of the layers; the batch `m` is the program's arguments (64 if none).
const LAYERS: [(usize, usize); 12] = [
    (1376, 1024), // Wide & Deep's first layer
    (1888, 1024), // MT-WnD's first layer
    (2560, 1024), // RMC3's bottom MLP
    (1024, 512),
    (1024, 256),
    (512, 256),
    (352, 512), // RMC3's top MLP
    (2112, 128), // RMC2's top MLP
    (288, 256), // RMC1's top MLP
    (256, 256),
    (256, 128),
    (128, 256),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let mut batches: Vec<usize> =
        std::env::args().skip(1).map(|a| a.parse().expect("a batch size")).collect();
    if batches.is_empty() {
        batches.push(64);
    }
    let shapes = batches.iter().flat_map(|&m| LAYERS.iter().map(move |&(k, n)| (m, k, n)));
    for (m, k, n) in shapes {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.1).collect();
        // W stored transposed, `k × n` row-major
        let wt: Vec<f32> = (0..k * n).map(|j| w[(j % n) * k + j / n]).collect();
        let wtp = wt.as_ptr() as usize;
        let mut y = vec![0f32; m * n];
        let (xp, wp, yp) = (x.as_ptr() as usize, w.as_ptr() as usize, Out(y.as_mut_ptr()));
        // y[r0 .. r0 + mr, c0 .. c0 + nc] += x[r0 .., :] · W[c0 .., :]ᵀ
        let mm = move |r0: usize, mr: usize, c0: usize, nc: usize| {
            let yp = yp;
            // SAFETY: in bounds of x, W and y for the blocks the callers pass.
            unsafe {
                matrixmultiply::sgemm(
                    mr, k, nc, 1.0,
                    (xp as *const f32).add(r0 * k), k as isize, 1,
                    (wp as *const f32).add(c0 * k), 1, k as isize,
                    1.0, yp.0.add(r0 * n + c0), n as isize, 1,
                )
            }
        };
        let gemm = move |c0: usize, nc: usize, par: gemm::Parallelism| {
            let yp = yp;
            // SAFETY: as above.
            unsafe {
                gemm::gemm(
                    m, nc, k, yp.0.add(c0), 1, n as isize, true,
                    xp as *const f32, 1, k as isize,
                    (wp as *const f32).add(c0 * k), k as isize, 1,
                    1.0, 1.0, false, false, false, par,
                )
            }
        };
        // the same product from the transposed copy of W
        let gemm_t = move |c0: usize, nc: usize| {
            let yp = yp;
            // SAFETY: as above; Wᵀ's element (i, o) is wt[i·n + o].
            unsafe {
                gemm::gemm(
                    m, nc, k, yp.0.add(c0), 1, n as isize, true,
                    xp as *const f32, 1, k as isize,
                    (wtp as *const f32).add(c0), 1, n as isize,
                    1.0, 1.0, false, false, false, gemm::Parallelism::None,
                )
            }
        };
        // faer's product on the same buffers: y (m × n) += x (m × k) · Wᵀ (k × n)
        let faer = move |par: faer::Parallelism| {
            let yp = yp;
            // SAFETY: as above; the three views cover exactly x, W and y.
            unsafe {
                let y = faer::mat::from_raw_parts_mut::<f32>(yp.0, m, n, n as isize, 1);
                let x = faer::mat::from_raw_parts::<f32>(xp as *const f32, m, k, k as isize, 1);
                let wt = faer::mat::from_raw_parts::<f32>(wp as *const f32, k, n, 1, k as isize);
                faer::linalg::matmul::matmul(y, x, wt, Some(1.0), 1.0, par);
            }
        };
        let time = |f: &dyn Fn()| {
            f();
            median((0..9).map(|_| {
                let t = Instant::now();
                (0..100).for_each(|_| f());
                t.elapsed().as_secs_f64() / 100.0
            }).collect())
        };
        let gflops = |s: f64| 2.0 * (m * k * n) as f64 / s / 1e9;
        let half = n / 2;
        let results = [
            ("matrixmultiply.1t", time(&|| mm(0, m, 0, n))),
            ("matrixmultiply.rows2t", time(&|| pool.install(|| {
                rayon::join(|| mm(0, m / 2, 0, n), || mm(m / 2, m - m / 2, 0, n));
            }))),
            ("gemm.1t", time(&|| gemm(0, n, gemm::Parallelism::None))),
            ("gemm.2t", time(&|| pool.install(|| gemm(0, n, gemm::Parallelism::Rayon(2))))),
            ("faer.1t", time(&|| faer(faer::Parallelism::None))),
            ("faer.2t", time(&|| pool.install(|| faer(faer::Parallelism::Rayon(2))))),
            ("gemm.cols2t", time(&|| pool.install(|| {
                rayon::join(|| gemm(0, half, gemm::Parallelism::None),
                            || gemm(half, n - half, gemm::Parallelism::None));
            }))),
            ("gemm.t.1t", time(&|| gemm_t(0, n))),
            ("gemm.t.cols2t", time(&|| pool.install(|| {
                rayon::join(|| gemm_t(0, half), || gemm_t(half, n - half));
            }))),
        ];
        let fields: Vec<String> =
            results.iter().map(|(name, s)| format!("\"{name}\": {:.1}", gflops(*s))).collect();
        println!("{{\"m\": {m}, \"k\": {k}, \"n\": {n}, {}}}", fields.join(", "));
    }
}
