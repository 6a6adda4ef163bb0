//! `kvlab bench decode`: prefill a context of N tokens, then greedy-decode M more, and print
//! prefill and decode throughput plus the KV cache bytes. A thin face over
//! `kvlab_engine::model::bench`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use kvlab_engine::device::{preferred_dtype, select_device, DeviceChoice};
use kvlab_engine::model::bench::{bench_decode, DecodeBenchSpec};
use kvlab_engine::{KvPrecision, LoadOptions, Model, PrecisionPolicy};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum KvArg {
    F32,
    F16,
    Bf16,
}

#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    Auto,
    Cpu,
    Metal,
    Cuda,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// KV bytes, peak memory and speed per context and cache SPEC (one process each).
    Memory(crate::bench_memory_cmd::BenchMemoryArgs),
    /// One configuration of `bench memory`, in this process (used by `bench memory`).
    #[command(hide = true)]
    MemoryRun(crate::bench_memory_cmd::MemoryRunArgs),
    /// Time of one decode-step attention call per context and cache SPEC.
    Attention(crate::bench_attention_cmd::BenchAttentionArgs),
    /// Prefill `--ctx` tokens, then decode `--decode` tokens greedily; report tok/s.
    Decode {
        /// A model file/directory, or an asset name (e.g. `gemma3-270m`).
        #[arg(long, default_value = "gemma3-270m")]
        model: String,
        /// Context length to prefill.
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// Tokens to decode after the prefill.
        #[arg(long, default_value_t = 64)]
        decode: usize,
        /// Prefill chunk size.
        #[arg(long, default_value_t = 512)]
        chunk: usize,
        /// KV cache storage precision.
        #[arg(long, value_enum, default_value_t = KvArg::F16)]
        kv: KvArg,
        /// Device to run on.
        #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
        device: DeviceArg,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn model_path(spec: &str) -> anyhow::Result<PathBuf> {
    crate::asset_names::file(spec)
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Memory(a) => crate::bench_memory_cmd::run(a),
        BenchCommand::MemoryRun(a) => crate::bench_memory_cmd::run_one(a),
        BenchCommand::Attention(a) => crate::bench_attention_cmd::run(a),
        BenchCommand::Decode {
            model,
            ctx,
            decode,
            chunk,
            kv,
            device,
            json,
        } => {
            if ctx == 0 {
                bail!("--ctx must be at least 1");
            }
            let device = select_device(match device {
                DeviceArg::Auto => DeviceChoice::Auto,
                DeviceArg::Cpu => DeviceChoice::Cpu,
                DeviceArg::Metal => DeviceChoice::Metal,
                DeviceArg::Cuda => DeviceChoice::Cuda(0),
            })?;
            let opts = LoadOptions {
                dtype: preferred_dtype(&device),
                device,
            };
            let path = model_path(&model)?;
            let t0 = std::time::Instant::now();
            let m =
                Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
            let load_secs = t0.elapsed().as_secs_f64();
            let precision = match kv {
                KvArg::F32 => KvPrecision::F32,
                KvArg::F16 => KvPrecision::F16,
                KvArg::Bf16 => KvPrecision::BF16,
            };
            let spec = DecodeBenchSpec {
                ctx,
                decode,
                prefill_chunk: chunk,
                policy: PrecisionPolicy::uniform(precision),
            };
            let r = bench_decode(&m, &spec)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("model   {} (loaded in {load_secs:.1}s)", path.display());
                println!(
                    "prefill {} tokens in {:.2}s: {:.1} tok/s",
                    r.prefill_tokens,
                    r.prefill_secs,
                    r.prefill_tok_per_s()
                );
                println!(
                    "decode  {} tokens in {:.2}s: {:.1} tok/s",
                    r.decode_tokens,
                    r.decode_secs,
                    r.decode_tok_per_s()
                );
                println!(
                    "kv      {} cache: {:.2} MiB used, {:.2} MiB allocated",
                    precision,
                    r.memory.total.0 as f64 / 1048576.0,
                    r.memory.total.1 as f64 / 1048576.0
                );
            }
            Ok(())
        }
    }
}
