//! `kvlab bench matmul`: the engine's quantized CPU matmul kernels against candle's, per
//! weight type, shape and row count (a thin face over `kvlab_engine::lab::bench_matmul`).

use anyhow::{bail, Context};
use clap::Args;

/// `kvlab bench matmul` options (defaults: Gemma 4 E2B's MLP shapes).
#[derive(Args, Debug)]
pub struct BenchMatmulArgs {
    /// Weight types, comma-separated (q4_0, q5_0, q8_0, q4_k, q5_k, q6_k).
    #[arg(long, default_value = "q4_k,q6_k,q8_0")]
    types: String,
    /// Shapes `NxK` (output rows × weights per row), comma-separated.
    #[arg(long, default_value = "6144x1536,1536x6144")]
    shapes: String,
    /// Activation rows per product, comma-separated (1: decode; many: prefill).
    #[arg(long, default_value = "1,512")]
    rows: String,
    /// Minimum measuring time per configuration and implementation, seconds.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// One copy of each matrix, so one-row products run from the CPU caches: the kernels'
    /// compute ceiling (without it they cycle through 256 MiB of copies: memory bandwidth).
    #[arg(long)]
    cached: bool,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchMatmulArgs) -> anyhow::Result<()> {
    let types: Vec<&str> = args.types.split(',').map(str::trim).collect();
    let shapes = args
        .shapes
        .split(',')
        .map(|s| {
            let (n, k) = s
                .trim()
                .split_once('x')
                .with_context(|| format!("bad shape `{s}` (NxK)"))?;
            Ok((n.parse()?, k.parse()?))
        })
        .collect::<anyhow::Result<Vec<(usize, usize)>>>()?;
    let rows = args
        .rows
        .split(',')
        .map(|r| {
            r.trim()
                .parse::<usize>()
                .with_context(|| format!("bad row count `{r}`"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if rows.contains(&0) {
        bail!("row counts must be positive");
    }
    let report =
        kvlab_engine::lab::bench_matmul(&types, &shapes, &rows, args.seconds, args.cached)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "| type | shape | rows | ours ms | candle ms | candle / ours | ours GB/s | ours GMAC/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &report {
        println!(
            "| {} | {}x{} | {} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} |",
            r.format,
            r.n,
            r.k,
            r.m,
            r.ours_ms,
            r.candle_ms,
            r.candle_ms / r.ours_ms,
            r.ours_gb_s,
            r.ours_gmac_s
        );
    }
    if let Some(r) = report.first() {
        println!("kernels: {}", r.backend);
    }
    Ok(())
}
