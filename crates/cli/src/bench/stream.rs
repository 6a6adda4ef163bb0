//! `kvlab bench stream`: the machine's memory bandwidth as STREAM's copy kernel measures it
//! (`a[i] = b[i]` over arrays far larger than the caches, on the compute threads, bytes read
//! plus bytes written per second, best of several passes), the yardstick `scripts/bench.sh`
//! divides a decode's weight traffic by, and the instruction set the kernels run (figures
//! from an AVX2 machine and an AVX-512 one do not compare).

use std::time::Instant;

use clap::Args;
use serde::Serialize;

/// `kvlab bench stream` options.
#[derive(Args, Debug)]
pub struct BenchStreamArgs {
    /// MiB per array (two arrays are held).
    #[arg(long, default_value_t = 512)]
    mib: usize,
    /// Passes; the fastest counts.
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Print a JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct StreamReport {
    threads: usize,
    /// The kernel family this CPU runs ([`kvlab_turboquant::Backend`]): `avx512`, `avx2`,
    /// `neon` or `portable`.
    kernels: &'static str,
    bytes_per_array: usize,
    /// Bytes read plus bytes written per second, fastest pass.
    copy_bytes_per_sec: f64,
}

pub fn run(args: BenchStreamArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.mib > 0 && args.passes > 0,
        "--mib and --passes must be positive"
    );
    let threads = kvlab_engine::host::compute_threads().unwrap_or(1).max(1);
    let n = args.mib * (1 << 20) / 4;
    // Written once before timing, so every page is resident.
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let chunk = n.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..args.passes {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    // The copy must not be optimized away: read a value back.
    anyhow::ensure!(dst[n - 1] == src[n - 1], "the copy did not happen");
    let report = StreamReport {
        threads,
        kernels: kvlab_turboquant::Backend::detect().name(),
        bytes_per_array: n * 4,
        copy_bytes_per_sec: 2.0 * (n * 4) as f64 / best,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "stream copy: {:.1} GB/s ({} threads, {} MiB arrays, best of {}); kernels: {}",
            report.copy_bytes_per_sec / 1e9,
            threads,
            args.mib,
            args.passes,
            report.kernels
        );
    }
    Ok(())
}
