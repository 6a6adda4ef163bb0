//! `kvlab bench persist`: what saving a conversation's KV cache buys. For each cache SPEC, a
//! real text's first `--ctx` tokens are read into the cache (timed: what reopening the
//! conversation costs without a saved cache), the cache is saved to a file and restored into
//! a fresh session (each timed), and the restored cache's next logits are checked against
//! the original's, bit for bit. Prints file bytes, save and restore times, and restore
//! against re-reading the prompt. The restore reads a file just written, so from the page
//! cache: a cold disk adds its read time (file bytes / disk speed).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::lab::weights_identity;
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::{Logits, Session};
use serde::Serialize;

use crate::bench::memory::{parse_contexts, tiled_tokens};
use crate::model_args::ModelArgs;
use crate::ppl_cmd::text_path;

/// `kvlab bench persist` options.
#[derive(Args, Debug)]
pub struct BenchPersistArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text read into the cache (a file, or an asset name such as `alice`); tiled if
    /// shorter.
    #[arg(long, default_value = "alice")]
    text: String,
    /// Tokens in the cache (`4k` = 4096).
    #[arg(long, default_value = "4k")]
    ctx: String,
    /// Cache SPECs, comma-separated.
    #[arg(long, default_value = "f16,tq4,tq3.5")]
    kv: String,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// Where the cache files go (default: the system's temp dir); they are removed after.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

/// One cache SPEC's row.
#[derive(Debug, Serialize)]
struct PersistRow {
    kv: String,
    tokens: usize,
    /// KV bytes held in memory.
    kv_bytes: u64,
    /// The saved file's size.
    file_bytes: u64,
    /// Seconds to read the prompt into the cache (what a reopened conversation without a
    /// saved cache pays).
    reread_secs: f64,
    save_secs: f64,
    restore_secs: f64,
    /// `reread_secs / restore_secs`.
    restore_speedup: f64,
    /// The restored cache's next logits equal the original's, bit for bit.
    bit_identical: bool,
}

pub fn run(args: BenchPersistArgs) -> anyhow::Result<()> {
    let contexts = parse_contexts(&args.ctx)?;
    let &[ctx] = contexts.as_slice() else {
        bail!("--ctx takes one length");
    };
    let specs: Vec<String> = args
        .kv
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let weights = args.model.weights()?;
    let identity = weights_identity(&weights)?;
    let crate::model_args::OpenedModel { model, tokenizer } = args.model.open()?;
    let ids = tiled_tokens(&tokenizer, &text_path(&args.text)?, ctx.max(2))?;
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut rows = Vec::new();
    for spec in &specs {
        let parsed = CacheSpec::parse(spec).with_context(|| format!("--kv {spec}"))?;
        let policy = parsed.to_policy();
        let mut original = Session::new(&model, &policy)?;
        let t = Instant::now();
        for chunk in ids.chunks(args.chunk.max(1)) {
            original.forward(&model, chunk, Logits::Last)?;
        }
        let reread_secs = t.elapsed().as_secs_f64();
        let file = dir.join(format!(
            "kvlab-bench-persist-{}-{}.kvc",
            std::process::id(),
            rows.len()
        ));
        let t = Instant::now();
        let file_bytes = original.save_cache(&file, &identity)?;
        let save_secs = t.elapsed().as_secs_f64();
        let mut restored = Session::new(&model, &policy)?;
        let t = Instant::now();
        let restore = restored.restore_cache(&model, &file, &identity);
        let restore_secs = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&file);
        restore?;
        // One more token through both: the restore is only worth its time if it is exact.
        let next = [ids[1]];
        let a = original.forward(&model, &next, Logits::Last)?;
        let b = restored.forward(&model, &next, Logits::Last)?;
        let bits = |t: candle_core::Tensor| -> anyhow::Result<Vec<u32>> {
            Ok(t.to_vec1::<f32>()?.into_iter().map(f32::to_bits).collect())
        };
        let bit_identical = bits(a)? == bits(b)?;
        rows.push(PersistRow {
            kv: parsed.to_string(),
            tokens: ids.len(),
            kv_bytes: original.memory().total.0 as u64,
            file_bytes,
            reread_secs,
            save_secs,
            restore_secs,
            restore_speedup: reread_secs / restore_secs.max(1e-9),
            bit_identical,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    let f16_file = rows.iter().find(|r| r.kv == "f16").map(|r| r.file_bytes);
    println!(
        "{:<14} {:>7} {:>10} {:>10} {:>8} {:>9} {:>10} {:>11} {:>9} {:>6}",
        "cache",
        "tokens",
        "KV MiB",
        "file MiB",
        "vs f16",
        "save s",
        "restore s",
        "re-read s",
        "restore×",
        "exact"
    );
    for r in &rows {
        let vs = f16_file.map_or("–".to_string(), |f| {
            format!("{:.2}×", f as f64 / r.file_bytes as f64)
        });
        println!(
            "{:<14} {:>7} {:>10.2} {:>10.2} {:>8} {:>9.3} {:>10.3} {:>11.2} {:>9.0} {:>6}",
            r.kv,
            r.tokens,
            mib(r.kv_bytes),
            mib(r.file_bytes),
            vs,
            r.save_secs,
            r.restore_secs,
            r.reread_secs,
            r.restore_speedup,
            if r.bit_identical { "yes" } else { "NO" }
        );
    }
    if rows.iter().any(|r| !r.bit_identical) {
        bail!("a restored cache's logits differ from the original's");
    }
    Ok(())
}
