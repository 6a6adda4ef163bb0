//! `kvlab bench decode`: prefill a context of N tokens, then decode M more (greedy, or the
//! engine's default sampling), and print prefill and decode throughput plus the KV cache bytes, and with
//! `--profile` where each phase's time went; with several `--kv` SPECs, one prefill and each
//! cache's decode side by side in alternating rounds, as ratios to the first. A thin face over
//! `kvlab_engine::lab::bench_decode`.

mod attention;
mod constrained;
mod conversations;
mod image;
mod load;
mod matmul;
mod memory;
pub(crate) mod memory_plot;
mod parallel;
mod persist;
mod stream;

use std::path::PathBuf;

use anyhow::{bail, Context};
use candle_core::DType;
use clap::{Args, Subcommand, ValueEnum};
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::WeightsChoice;
use kvlab_engine::hub::find_tokenizer;
use kvlab_engine::lab::GemmaTokenizer;
use kvlab_engine::lab::Model;
use kvlab_engine::lab::{
    bench_decode, bench_decode_compare, bench_prefill_each, BenchContext, DecodeBenchReport,
    DecodeBenchSpec, DecodeCompareReport, DecodeCompareRow, ProfileRow,
};
use kvlab_engine::lab::{check_golden, GoldenReport};
use kvlab_engine::lab::{preferred_dtype, select_device};
use kvlab_engine::LoadOptions;
use serde::Serialize;

/// Alice then Paradise Lost, one text: what the benchmarks' prompts and conversations are cut
/// from.
fn corpus() -> anyhow::Result<String> {
    let mut all = String::new();
    for asset in ["alice", "paradise-lost"] {
        let path = crate::asset_names::file(asset)?;
        all.push_str(
            &std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?,
        );
    }
    Ok(all)
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    /// What suits the device: f32 on CPU, f16 on Metal, bf16 on CUDA.
    Auto,
    F32,
    F16,
    Bf16,
}

#[derive(Clone, Copy, ValueEnum)]
enum SamplingArg {
    /// The most likely token (what the golden checks and llama-bench's figures compare with).
    Greedy,
    /// The engine's default sampling (temperature 1, top-k 64, top-p 0.95, seed 0): the
    /// full sampler's cost (the app sends the same top-k and top-p at its own temperature).
    Default,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// KV bytes, peak memory and speed per context and cache SPEC (one process each).
    Memory(crate::bench::memory::BenchMemoryArgs),
    /// One configuration of `bench memory`, in this process (used by `bench memory`).
    #[command(hide = true)]
    MemoryRun(crate::bench::memory::MemoryRunArgs),
    /// Load time, peak and resident memory against the byte formula, and prefill / decode
    /// speed, per `--choices` weights choice (one process each).
    Load(crate::bench::load::BenchLoadArgs),
    /// What one image costs: the processor's and the tower's time, its soft tokens, and
    /// their KV bytes under every preset.
    Image(crate::bench::image::BenchImageArgs),
    /// One configuration of `bench load`, in this process (used by `bench load`).
    #[command(hide = true)]
    LoadRun(crate::bench::load::LoadRunArgs),
    /// Time of one decode-step attention call per context and cache SPEC.
    Attention(crate::bench::attention::BenchAttentionArgs),
    /// Saving and restoring a KV cache per SPEC: file bytes, save and restore time, and
    /// restore against re-reading the prompt.
    Persist(crate::bench::persist::BenchPersistArgs),
    /// Many conversations taking turns under a KV budget of two f16 ones: where each turn's
    /// cache came from, its time to first token and the bytes held, against llama-server's
    /// f16 oldest-first policy in the same run.
    Conversations(crate::bench::conversations::BenchConversationsArgs),
    /// Clients streaming at once (1, 2, 4, 8 by default), each in its own conversation and
    /// all in one forward pass per step: the aggregate decode rate, each client's
    /// inter-token latency and time to first token; the compare view's panes against a
    /// lone chat; with `--prefill-load`, the streams while another client prefills.
    Parallel(crate::bench::parallel::BenchParallelArgs),
    /// What constrained decoding (JSON schemas, any object) costs a token: each grammar's
    /// decode rate against a free answer's, in alternating rounds.
    Constrained(crate::bench::constrained::BenchConstrainedArgs),
    /// The quantized CPU matmul kernels against candle's, per weight type and shape.
    Matmul(crate::bench::matmul::BenchMatmulArgs),
    /// Memory bandwidth as STREAM's copy measures it, on the compute threads.
    Stream(crate::bench::stream::BenchStreamArgs),
    /// Prefill `--ctx` tokens, then decode `--decode` tokens; report tok/s (and with
    /// `--profile`, the time per kind of operation).
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
        /// Prefill the first `--ctx` tokens of this text (a file or an asset name such as
        /// `paradise-lost`) instead of deterministic filler tokens: real keys and values.
        #[arg(long)]
        text: Option<String>,
        /// Prefill chunk size.
        #[arg(long, default_value_t = 512)]
        chunk: usize,
        /// KV cache SPEC (`f16`, `f32`, `tq4`, `k4v3@all`, …; see the README; `presets` for
        /// every preset of the app's menu). Several, comma-separated (`f16,tq4@all`): one
        /// prefill in the first, then each cache's decode from the same depth in `--rounds`
        /// alternating rounds (the cache switched as the app switches it), with each one's
        /// speed as a ratio to the first's. Separated by `;` instead, each may give layers
        /// formats of their own (`f16;tq3+qw@all,17=f16`).
        #[arg(long, default_value = "f16")]
        kv: String,
        /// Rounds of a several-SPEC comparison; each cache's best round is reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// With several SPECs, also time each cache's own prefill of the context (a fresh
        /// cache each, `--rounds` alternating rounds), as a ratio to the first's.
        #[arg(long)]
        prefill_each: bool,
        /// Device: cpu, auto, metal, cuda or cuda:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Activation dtype (`auto`: what suits the device).
        #[arg(long, value_enum, default_value_t = DtypeArg::Auto)]
        dtype: DtypeArg,
        /// How a safetensors checkpoint's matrices are held: q4_k, q8_0, f16, bf16 or f32
        /// (default: the device's, q8_0 on the CPU; with `--golden`, dense in `--dtype`, as
        /// the reference logits were computed). GGUF files keep their own types.
        #[arg(long)]
        weights: Option<WeightsChoice>,
        /// Also check the model's logits against a golden file (`input_ids`, `logits_full`,
        /// optional `chunk_sizes` + `logits_incremental`, as in the engine's tiny fixtures),
        /// with this device, dtype and cache; fails when they differ by more than
        /// `--golden-tol`.
        #[arg(long)]
        golden: Option<PathBuf>,
        /// Largest |logit − golden| accepted by `--golden`.
        #[arg(long, default_value_t = 1e-3)]
        golden_tol: f32,
        /// How decoded tokens are picked.
        #[arg(long, value_enum, default_value_t = SamplingArg::Greedy)]
        sampling: SamplingArg,
        /// Also print where each phase's time went, per kind of operation (matmuls by weight
        /// type, attention, norms, vocabulary projection, sampling, …), per token.
        #[arg(long)]
        profile: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `kvlab bench decode --json`: the engine's report, what it ran on, and the golden check.
#[derive(Serialize)]
struct DecodeJson<'a> {
    #[serde(flatten)]
    report: &'a DecodeBenchReport,
    /// Weight bytes a decode step reads (`Model::streamed_bytes_per_token`).
    weights_bytes_per_token: usize,
    device: String,
    dtype: String,
    kv: String,
    golden: Option<&'a GoldenReport>,
}

fn model_path(spec: &str) -> anyhow::Result<PathBuf> {
    crate::asset_names::file(spec)
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Memory(a) => crate::bench::memory::run(a),
        BenchCommand::MemoryRun(a) => crate::bench::memory::run_one(a),
        BenchCommand::Load(a) => crate::bench::load::run(a),
        BenchCommand::Image(a) => crate::bench::image::run(a),
        BenchCommand::LoadRun(a) => crate::bench::load::run_one(a),
        BenchCommand::Attention(a) => crate::bench::attention::run(a),
        BenchCommand::Matmul(a) => crate::bench::matmul::run(a),
        BenchCommand::Stream(a) => crate::bench::stream::run(a),
        BenchCommand::Persist(a) => crate::bench::persist::run(a),
        BenchCommand::Conversations(a) => crate::bench::conversations::run(a),
        BenchCommand::Parallel(a) => crate::bench::parallel::run(a),
        BenchCommand::Constrained(a) => crate::bench::constrained::run(a),
        BenchCommand::Decode {
            model,
            ctx,
            decode,
            text,
            chunk,
            kv,
            rounds,
            prefill_each,
            device,
            dtype,
            weights,
            golden,
            golden_tol,
            sampling,
            profile,
            json,
        } => {
            if ctx == 0 {
                bail!("--ctx must be at least 1");
            }
            let caches = crate::model_args::kv_list(&kv)?;
            let (labels, policies): (Vec<String>, Vec<_>) = caches.into_iter().unzip();
            let cache_spec = labels.first().cloned().unwrap_or_default();
            let comparing = policies.len() > 1;
            if comparing && (profile || golden.is_some()) {
                bail!("--profile and --golden take one --kv SPEC, not a comparison");
            }
            if comparing && rounds == 0 {
                bail!("--rounds must be at least 1");
            }
            if prefill_each && !comparing {
                bail!("--prefill-each compares several --kv SPECs");
            }
            let device = select_device(crate::model_args::parse_device(&device)?)?;
            let dtype = match dtype {
                DtypeArg::Auto => preferred_dtype(&device),
                DtypeArg::F32 => DType::F32,
                DtypeArg::F16 => DType::F16,
                DtypeArg::Bf16 => DType::BF16,
            };
            // A golden check compares with the reference's dense logits: quantizing the
            // weights by default would only measure the quantization.
            let weights = weights.unwrap_or_else(|| match (&golden, dtype) {
                (Some(_), DType::BF16) => WeightsChoice::Bf16,
                (Some(_), DType::F16) => WeightsChoice::F16,
                (Some(_), _) => WeightsChoice::F32,
                (None, _) => WeightsChoice::default_for(&device),
            });
            let opts = LoadOptions {
                dtype,
                weights,
                device,
            };
            let path = model_path(&model)?;
            let t0 = std::time::Instant::now();
            let m =
                Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
            let load_secs = t0.elapsed().as_secs_f64();
            let context = match &text {
                Some(t) => {
                    let tokenizer = find_tokenizer(&path, None)?;
                    let tokenizer = GemmaTokenizer::from_file(&tokenizer, m.config().family)?;
                    BenchContext::Tokens(crate::ppl_cmd::text_tokens(
                        &tokenizer,
                        &crate::ppl_cmd::text_path(t)?,
                        ctx,
                    )?)
                }
                None => BenchContext::Filler(ctx),
            };
            let spec = DecodeBenchSpec {
                context,
                decode,
                prefill_chunk: chunk,
                policy: policies[0].clone(),
                sampling: match sampling {
                    SamplingArg::Greedy => SamplingParams::greedy(),
                    SamplingArg::Default => SamplingParams::default(),
                },
                profile,
            };
            if comparing {
                let prefills = if prefill_each {
                    Some(bench_prefill_each(&m, &spec, &policies, rounds)?)
                } else {
                    None
                };
                let r = bench_decode_compare(&m, &spec, &policies, rounds)?;
                return print_comparison(&r, prefills, &labels, &path, load_secs, json);
            }
            let r = bench_decode(&m, &spec)?;
            let golden = match &golden {
                Some(g) => Some(
                    check_golden(&m, &spec.policy, g)
                        .with_context(|| format!("golden check against {}", g.display()))?,
                ),
                None => None,
            };
            if json {
                let out = DecodeJson {
                    report: &r,
                    weights_bytes_per_token: m.streamed_bytes_per_token(),
                    device: format!("{:?}", m.device().location()),
                    dtype: format!("{:?}", m.dtype()).to_lowercase(),
                    kv: cache_spec.clone(),
                    golden: golden.as_ref(),
                };
                println!("{}", serde_json::to_string_pretty(&out)?);
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
                    cache_spec,
                    r.memory.total.0 as f64 / 1048576.0,
                    r.memory.total.1 as f64 / 1048576.0
                );
                for (phase, rows) in [
                    ("prefill", &r.prefill_profile),
                    ("decode", &r.decode_profile),
                ] {
                    if let Some(rows) = rows {
                        print_profile(phase, rows);
                    }
                }
                if let Some(g) = &golden {
                    println!(
                        "golden  {} positions: max |Δ| {:.3e} (one forward), {} (chunked), top-1 {:.1}%",
                        g.tokens,
                        g.full_max_abs_diff,
                        g.incremental_max_abs_diff
                            .map_or("none".to_string(), |d| format!("{d:.3e}")),
                        100.0 * g.top1_agreement
                    );
                }
            }
            if let Some(g) = &golden {
                // A NaN difference fails too.
                if g.max_abs_diff().is_nan() || g.max_abs_diff() > golden_tol {
                    bail!(
                        "logits differ from the golden ones by {:.3e} (> --golden-tol {golden_tol:e})",
                        g.max_abs_diff()
                    );
                }
            }
            Ok(())
        }
    }
}

/// `kvlab bench decode --kv A,B,… --json`: the engine's comparison and the SPECs' names.
#[derive(Serialize)]
struct CompareJson<'a> {
    #[serde(flatten)]
    report: &'a DecodeCompareReport,
    kv: Vec<String>,
    /// Each cache's best decode tok/s over the first's.
    speed_vs_first: Vec<f64>,
    /// With `--prefill-each`: each cache's own prefill, seconds per round.
    prefill_each_secs: Option<Vec<Vec<f64>>>,
    /// With `--prefill-each`: each cache's best prefill tok/s over the first's.
    prefill_vs_first: Option<Vec<f64>>,
}

/// A several-SPEC comparison: one row per cache, its best round and the ratio to the first.
fn print_comparison(
    r: &DecodeCompareReport,
    prefills: Option<Vec<Vec<f64>>>,
    specs: &[String],
    path: &std::path::Path,
    load_secs: f64,
    json: bool,
) -> anyhow::Result<()> {
    let best: Vec<f64> = r
        .rows
        .iter()
        .map(|row| row.best_tok_per_s(r.decode_tokens))
        .collect();
    let ratios: Vec<f64> = best.iter().map(|b| b / best[0]).collect();
    // Each cache's best prefill (its fastest round) in tok/s.
    let tokens = r.prefill_tokens as f64;
    let best_prefill: Option<Vec<f64>> = prefills.as_ref().map(|p| {
        p.iter()
            .map(|secs| tokens / secs.iter().copied().fold(f64::INFINITY, f64::min).max(1e-9))
            .collect()
    });
    let prefill_ratios: Option<Vec<f64>> = best_prefill
        .as_ref()
        .map(|b| b.iter().map(|x| x / b[0]).collect());
    if json {
        let out = CompareJson {
            report: r,
            kv: specs.to_vec(),
            speed_vs_first: ratios,
            prefill_each_secs: prefills,
            prefill_vs_first: prefill_ratios,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("model   {} (loaded in {load_secs:.1}s)", path.display());
    if let (Some(p), Some(b), Some(ratio)) = (&prefills, &best_prefill, &prefill_ratios) {
        let rounds = p.first().map_or(0, Vec::len);
        println!(
            "prefill {} tokens into each cache, best of {rounds} alternating rounds:",
            r.prefill_tokens
        );
        for (((secs, spec), b), ratio) in p.iter().zip(specs).zip(b).zip(ratio) {
            let each: Vec<String> = secs.iter().map(|s| format!("{:.1}", tokens / s)).collect();
            println!(
                "  {:<12} {:>7.1} tok/s  ×{:.2}  (rounds: {})",
                spec.to_string(),
                b,
                ratio,
                each.join(" ")
            );
        }
    }
    println!(
        "prefill {} tokens in {:.2}s: {:.1} tok/s ({})",
        r.prefill_tokens,
        r.prefill_secs,
        r.prefill_tokens as f64 / r.prefill_secs.max(1e-9),
        specs[0]
    );
    let rounds = r.rows.first().map_or(0, |row| row.decode_secs.len());
    println!(
        "decode  {} tokens per run from that depth, best of {rounds} alternating rounds \
         (and the medians' ratio, which one disturbed round moves less):",
        r.decode_tokens
    );
    let rates = |row: &DecodeCompareRow| -> Vec<f64> {
        row.decode_secs
            .iter()
            .map(|s| r.decode_tokens as f64 / s.max(1e-9))
            .collect()
    };
    let first_median = r.rows.first().map_or(1.0, |row| median(&rates(row)));
    for ((row, spec), (b, ratio)) in r.rows.iter().zip(specs).zip(best.iter().zip(&ratios)) {
        let each = rates(row);
        let shown: Vec<String> = each.iter().map(|x| format!("{x:.1}")).collect();
        println!(
            "  {:<12} {:>7.2} tok/s  ×{:.2}  median ×{:.2}  KV {:>9.2} MiB  (rounds: {})",
            spec.to_string(),
            b,
            ratio,
            median(&each) / first_median.max(1e-9),
            row.memory.total.0 as f64 / 1048576.0,
            shown.join(" ")
        );
    }
    Ok(())
}

/// The middle value (the mean of the two middle ones for an even count); 0 for none.
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A phase's profile as a table: per token, largest first, `other` last.
fn print_profile(phase: &str, rows: &[ProfileRow]) {
    println!("{phase} profile (exclusive time per token):");
    println!(
        "  {:<24} {:>10} {:>8} {:>7}",
        "op", "ms/token", "calls", "share"
    );
    for r in rows {
        println!(
            "  {:<24} {:>10.3} {:>8.1} {:>6.1}%",
            r.op,
            r.ms_per_token,
            r.calls_per_token,
            100.0 * r.share
        );
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_is_the_middle_round_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[63.0, 51.7, 53.2]), 53.2);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert_eq!(median(&[]), 0.0);
    }
}
