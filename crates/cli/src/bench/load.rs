//! `kvlab bench load`: what loading a checkpoint costs and what it then holds. For each
//! `--weights` choice, a fresh process (this binary re-executed with the hidden
//! `bench load-run`, so peaks are its own) loads the model and reports load time, peak RSS
//! during the load, resident bytes after it, the held-bytes formula from the headers, and
//! prefill / decode tok/s at each context. The parent prints the figures and whether they
//! meet the targets (resident within 10% of the formula, or of the file size for a GGUF;
//! load peak at most resident + 1 GiB; Q4_K resident below 4 GiB). It prints, never fails
//! on a target: speed and memory belong to benchmarks, not to tests.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::WeightsChoice;
use kvlab_engine::host::{peak_rss_bytes, release_free_memory, RssProbe};
use kvlab_engine::lab::inspect;
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::{bench_decode, BenchContext, DecodeBenchSpec};
use serde::{Deserialize, Serialize};

use crate::bench::memory::{model_flags, parse_contexts};
use crate::model_args::ModelArgs;

const GIB: f64 = (1u64 << 30) as f64;

/// `kvlab bench load` options.
#[derive(Args, Debug)]
pub struct BenchLoadArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The choices to load a safetensors checkpoint with, comma-separated (one process each;
    /// a GGUF file is loaded once, as stored, and this list is ignored).
    #[arg(long, default_value = "q4_k,q8_0")]
    choices: String,
    /// Contexts to prefill after the load, comma-separated (`4k` = 4096).
    #[arg(long, default_value = "512,4k")]
    contexts: String,
    /// Tokens decoded after each prefill.
    #[arg(long, default_value_t = 16)]
    decode: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// KV cache SPEC for the speed runs.
    #[arg(long, default_value = "f16")]
    kv: String,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

/// One load, in the current process (`bench load-run`, hidden).
#[derive(Args, Debug)]
pub struct LoadRunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long)]
    contexts: String,
    #[arg(long)]
    decode: usize,
    #[arg(long)]
    chunk: usize,
    #[arg(long)]
    kv: String,
}

/// Speed at one context.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpeedRow {
    pub context: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

/// One row of `kvlab bench load --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadRow {
    /// `q4_k`, `q8_0`, … or `gguf` (as stored).
    pub weights: String,
    /// Bytes of the checkpoint's files on disk.
    pub file_bytes: u64,
    /// Seconds from the start of the load to a usable model.
    pub load_secs: f64,
    /// Resident memory before the load (the binary and runtime).
    pub rss_before_load_bytes: u64,
    /// Peak resident memory of the process up to the end of the load (`VmHWM`; the largest
    /// sample where the platform has none).
    pub peak_rss_load_bytes: u64,
    /// Resident memory right after the load.
    pub rss_after_load_bytes: u64,
    /// The weights the model says it holds.
    pub held_bytes: u64,
    /// The byte formula from the headers alone (what the app's pre-load estimate shows).
    pub formula_bytes: u64,
    pub speed: Vec<SpeedRow>,
}

impl LoadRow {
    /// Resident bytes the load added.
    fn resident(&self) -> u64 {
        self.rss_after_load_bytes
            .saturating_sub(self.rss_before_load_bytes)
    }
}

/// Bytes of `path`: the file, or every file in the folder (one level, as checkpoints are).
fn file_bytes(path: &Path) -> u64 {
    if path.is_file() {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    }
    std::fs::read_dir(path).map_or(0, |dir| {
        dir.flatten()
            .filter(|e| {
                e.path()
                    .extension()
                    .is_some_and(|x| x == "safetensors" || x == "gguf")
            })
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    })
}

fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "gguf")
}

pub fn run(args: BenchLoadArgs) -> anyhow::Result<()> {
    parse_contexts(&args.contexts)?;
    CacheSpec::parse(&args.kv).with_context(|| format!("bad --kv `{}`", args.kv))?;
    let path = crate::asset_names::file(&args.model.model)?;
    let choices: Vec<Option<WeightsChoice>> = if is_gguf(&path) {
        vec![None]
    } else {
        args.choices
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<WeightsChoice>()
                    .map(Some)
                    .map_err(|e| anyhow::anyhow!("bad --choices entry `{s}`: {e}"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let exe = std::env::current_exe().context("locating the kvlab binary")?;
    let mut rows = Vec::new();
    for choice in choices {
        let mut model = args.model.clone();
        model.model = path.display().to_string();
        model.weights = choice;
        let label = choice.map_or("gguf".to_string(), |c| c.to_string());
        eprintln!("loading {} as {label} …", path.display());
        let out = Command::new(&exe)
            .args(["bench", "load-run"])
            .args(model_flags(&model))
            .args(["--contexts", &args.contexts, "--kv", &args.kv])
            .args(["--decode", &args.decode.to_string()])
            .args(["--chunk", &args.chunk.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("running a benchmark process")?;
        if !out.status.success() {
            eprintln!("{label}: the benchmark process failed");
            continue;
        }
        let row: LoadRow =
            serde_json::from_slice(&out.stdout).context("reading a benchmark process's report")?;
        if !args.json {
            print_row(&row, is_gguf(&path));
        }
        rows.push(row);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    if rows.is_empty() {
        bail!("no configuration ran");
    }
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn print_row(r: &LoadRow, gguf: bool) {
    let resident = r.resident() as f64;
    println!(
        "{}: load {:.1}s  peak RSS {:.2} GiB  resident {:.2} GiB (+{:.2} GiB process)  held {:.2} GiB  formula {:.2} GiB  files {:.2} GiB",
        r.weights,
        r.load_secs,
        r.peak_rss_load_bytes as f64 / GIB,
        resident / GIB,
        r.rss_before_load_bytes as f64 / GIB,
        r.held_bytes as f64 / GIB,
        r.formula_bytes as f64 / GIB,
        r.file_bytes as f64 / GIB,
    );
    for s in &r.speed {
        println!(
            "  context {:>6}: prefill {:>7.1} tok/s  decode {:>6.2} tok/s",
            s.context, s.prefill_tok_s, s.decode_tok_s
        );
    }
    let (reference, what) = if gguf {
        (r.file_bytes as f64, "file size")
    } else {
        (r.formula_bytes as f64, "formula")
    };
    let off = (resident - reference) / reference.max(1.0);
    println!(
        "  target resident within 10% of the {what}: {:+.1}% ({})",
        100.0 * off,
        verdict(off.abs() <= 0.10)
    );
    let over = r.peak_rss_load_bytes as f64 - r.rss_after_load_bytes as f64;
    println!(
        "  target load peak ≤ resident + 1 GiB: +{:.2} GiB ({})",
        over / GIB,
        verdict(over <= GIB)
    );
    if r.weights == "q4_k" {
        println!(
            "  target Q4_K resident < 4 GiB: {:.2} GiB ({})",
            resident / GIB,
            verdict(resident < 4.0 * GIB)
        );
    }
}

/// The hidden child: one load, one JSON object on stdout.
pub fn run_one(args: LoadRunArgs) -> anyhow::Result<()> {
    let contexts = parse_contexts(&args.contexts)?;
    let policy = CacheSpec::parse(&args.kv)?.to_policy();
    let weights = args.model.weights()?;
    let opts = args.model.load_options()?;
    let formula = inspect(&weights, &opts)
        .with_context(|| format!("reading {}", weights.display()))?
        .card
        .weights_bytes;
    let mut probe = RssProbe::new();
    release_free_memory();
    let before = probe.rss_bytes();
    let t0 = Instant::now();
    let model = args.model.load(&weights)?;
    let load_secs = t0.elapsed().as_secs_f64();
    let sampled = probe.rss_bytes();
    let peak = peak_rss_bytes().unwrap_or(sampled).max(sampled);
    release_free_memory();
    let after = probe.rss_bytes();
    let mut speed = Vec::new();
    let room = model.config().max_position_embeddings;
    for context in contexts {
        let r = bench_decode(
            &model,
            &DecodeBenchSpec {
                context: BenchContext::Filler(context.min(room.saturating_sub(args.decode)).max(1)),
                decode: args.decode,
                prefill_chunk: args.chunk.max(1),
                policy: policy.clone(),
                sampling: SamplingParams::greedy(),
                profile: false,
            },
        )?;
        speed.push(SpeedRow {
            context: r.prefill_tokens,
            prefill_tok_s: r.prefill_tok_per_s(),
            decode_tok_s: r.decode_tok_per_s(),
        });
    }
    let row = LoadRow {
        weights: if is_gguf(&weights) {
            "gguf".to_string()
        } else {
            opts.weights.to_string()
        },
        file_bytes: file_bytes(&weights),
        load_secs,
        rss_before_load_bytes: before,
        peak_rss_load_bytes: peak,
        rss_after_load_bytes: after,
        held_bytes: model.weights_bytes() as u64,
        formula_bytes: formula as u64,
        speed,
    };
    println!("{}", serde_json::to_string(&row)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_is_what_the_load_added() {
        let row = LoadRow {
            weights: "q8_0".into(),
            file_bytes: 0,
            load_secs: 0.0,
            rss_before_load_bytes: 100,
            peak_rss_load_bytes: 0,
            rss_after_load_bytes: 1100,
            held_bytes: 0,
            formula_bytes: 0,
            speed: vec![],
        };
        assert_eq!(row.resident(), 1000);
        assert!(is_gguf(Path::new("a/b.gguf")));
        assert!(!is_gguf(Path::new("a/b")));
    }
}
