//! `kvlab bench memory`: for each context length and cache SPEC, prefill a real text (tiled
//! when shorter than the context) then decode greedily, each configuration in a fresh
//! process (this binary re-executed with the hidden `bench memory-run`) so its peak resident
//! memory is its own. Reports KV bytes by kind, peak RSS, prefill and decode tok/s.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvlab_engine::contract::SwitchEvent;
use kvlab_engine::host::{peak_rss_bytes, release_free_memory, reset_peak_rss, RssProbe};
use kvlab_engine::lab::switch_precision;
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::GemmaTokenizer;
use kvlab_engine::lab::Logits;
use serde::{Deserialize, Serialize};

use crate::model_args::ModelArgs;
use crate::ppl_cmd::text_path;

/// `kvlab bench memory` options.
#[derive(Args, Debug)]
pub struct BenchMemoryArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to prefill (a file, or an asset name such as `alice`); tiled if shorter.
    #[arg(long, default_value = "alice")]
    text: String,
    /// Context lengths, comma-separated (`2k` = 2048).
    #[arg(long, default_value = "4k,8k,16k,24k,32k")]
    contexts: String,
    /// Cache SPECs, comma-separated.
    #[arg(long, default_value = "f16,tq4,tq3.5,tq3")]
    kv: String,
    /// Tokens decoded after the prefill.
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
    /// Contexts from this length on are filled with synthetic K/V instead of a real
    /// prefill (KV bytes, layouts and decode attention cost are those of a real context;
    /// prefill tok/s is then not measured, reported as 0). Default: never.
    #[arg(long)]
    synthetic_from: Option<usize>,
    /// After each f16 run, also time a live switch of its whole cache to this SPEC.
    #[arg(long)]
    switch_to: Option<String>,
    /// Also draw the figures into this file: PNG, or SVG for a `.svg` name (labels use a
    /// system TrueType font; `KVLAB_PLOT_FONT` picks one).
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// One configuration, run in the current process (`bench memory-run`, hidden).
#[derive(Args, Debug)]
pub struct MemoryRunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long)]
    text: String,
    #[arg(long)]
    context: usize,
    #[arg(long)]
    kv: String,
    #[arg(long)]
    decode: usize,
    #[arg(long)]
    chunk: usize,
    #[arg(long)]
    switch_to: Option<String>,
    #[arg(long)]
    synthetic: bool,
}

/// One row of `kvlab bench memory --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryRow {
    /// Context tokens prefilled (`<bos>` included).
    pub context: usize,
    /// The cache SPEC.
    pub kv: String,
    /// KV bytes holding live tokens after the run, all layers.
    pub kv_bytes: u64,
    /// … of full-attention layers.
    pub kv_bytes_full: u64,
    /// … of sliding-window layers.
    pub kv_bytes_sliding: u64,
    /// KV bytes reserved.
    pub kv_bytes_allocated: u64,
    /// Peak resident memory of the process from the end of the model load to the end of
    /// the decode (the load's own transients, equal for every cache, excluded; Linux
    /// `clear_refs`, elsewhere the whole process).
    pub peak_rss_bytes: u64,
    /// Peak resident memory of the whole process, model load included.
    pub peak_rss_process_bytes: u64,
    /// Resident memory after loading the model, before any token.
    pub rss_after_load_bytes: u64,
    /// The model's weights as held.
    pub weights_bytes: u64,
    /// Prefill throughput.
    pub prefill_tok_s: f64,
    /// Decode throughput.
    pub decode_tok_s: f64,
    /// Tokens decoded.
    pub decode_tokens: usize,
    /// `kv_bytes` of the f16 run at the same context minus this one's (when f16 ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_saved_vs_f16: Option<i64>,
    /// Peak RSS of the f16 run minus this one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_saved_vs_f16: Option<i64>,
    /// This decode tok/s over the f16 run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_speedup_vs_f16: Option<f64>,
    /// The context was filled with synthetic K/V (no prefill measured).
    #[serde(default)]
    pub synthetic: bool,
    /// The live switch timed after the run (`--switch-to`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<SwitchEvent>,
}

/// `2k` → 2048, `1500` → 1500.
pub fn parse_contexts(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .map(|p| {
            let p = p.trim().to_ascii_lowercase();
            let (num, mul) = match p.strip_suffix('k') {
                Some(n) => (n, 1024),
                None => (p.as_str(), 1),
            };
            match num.parse::<usize>() {
                Ok(n) if n * mul >= 2 => Ok(n * mul),
                _ => bail!("bad context `{p}` (want e.g. 2k, 4096; at least 2)"),
            }
        })
        .collect()
}

pub fn model_flags(m: &ModelArgs) -> Vec<String> {
    let mut v = vec![
        "--model".into(),
        m.model.clone(),
        "--device".into(),
        m.device.clone(),
    ];
    if let Some(t) = &m.tokenizer {
        v.push("--tokenizer".into());
        v.push(t.display().to_string());
    }
    if let Some(w) = m.weights {
        v.push("--weights".into());
        v.push(w.to_string());
    }
    v
}

pub fn run(args: BenchMemoryArgs) -> anyhow::Result<()> {
    let contexts = parse_contexts(&args.contexts)?;
    let specs: Vec<String> = args
        .kv
        .split(',')
        .map(|s| {
            CacheSpec::parse(s)
                .map(|c| c.to_string())
                .with_context(|| format!("bad --kv entry `{s}`"))
        })
        .collect::<anyhow::Result<_>>()?;
    let text = text_path(&args.text)?;
    let exe = std::env::current_exe().context("locating the kvlab binary")?;
    let total = (contexts.len() * specs.len()) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut rows: Vec<MemoryRow> = Vec::new();
    let mut failed = 0usize;
    for &context in &contexts {
        for spec in &specs {
            bar.set_message(format!("context {context}, kv {spec}"));
            let mut cmd = Command::new(&exe);
            cmd.args(["bench", "memory-run"])
                .args(model_flags(&args.model))
                .args(["--text", &text.display().to_string()])
                .args(["--context", &context.to_string(), "--kv", spec])
                .args(["--decode", &args.decode.to_string()])
                .args(["--chunk", &args.chunk.to_string()]);
            if args.synthetic_from.is_some_and(|n| context >= n) {
                cmd.arg("--synthetic");
            }
            if let (Some(to), "f16") = (&args.switch_to, spec.as_str()) {
                cmd.args(["--switch-to", to]);
            }
            let out = cmd.output().context("running a benchmark process")?;
            if !out.status.success() {
                // Keep the other configurations' figures; say what failed.
                let err = String::from_utf8_lossy(&out.stderr);
                let first = err.lines().next().unwrap_or("").to_string();
                bar.println(format!("context {context}, kv {spec} failed: {first}"));
                eprintln!("context {context}, kv {spec} failed: {first}");
                failed += 1;
                bar.inc(1);
                continue;
            }
            let row: MemoryRow = serde_json::from_slice(&out.stdout)
                .context("reading a benchmark process's report")?;
            bar.println(format!(
                "context {:>6} kv {:<10} KV {:>8.2} MiB  peak RSS {:>8.2} MiB  prefill {:>7.1} tok/s  decode {:>6.2} tok/s",
                row.context,
                row.kv,
                row.kv_bytes as f64 / 1048576.0,
                row.peak_rss_bytes as f64 / 1048576.0,
                row.prefill_tok_s,
                row.decode_tok_s
            ));
            rows.push(row);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    compare_to_f16(&mut rows);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in &rows {
            println!(
                "context {:>6} kv {:<10} KV {:>8.2} MiB (full {:.2}, sliding {:.2})  peak RSS {:>8.2} MiB  prefill {:>7.1} tok/s  decode {:>6.2} tok/s{}",
                r.context,
                r.kv,
                r.kv_bytes as f64 / 1048576.0,
                r.kv_bytes_full as f64 / 1048576.0,
                r.kv_bytes_sliding as f64 / 1048576.0,
                r.peak_rss_bytes as f64 / 1048576.0,
                r.prefill_tok_s,
                r.decode_tok_s,
                match (r.kv_saved_vs_f16, r.peak_rss_saved_vs_f16, r.decode_speedup_vs_f16) {
                    (Some(k), Some(p), Some(s)) => format!(
                        "  vs f16: KV −{:.2} MiB, peak −{:.2} MiB, decode ×{s:.2}",
                        k as f64 / 1048576.0,
                        p as f64 / 1048576.0
                    ),
                    _ => String::new(),
                }
            );
            if let Some(sw) = &r.switch {
                println!(
                    "  switch {} → {} of {} tokens in {:.0} ms: KV {:.2} → {:.2} MiB",
                    sw.from,
                    sw.to,
                    sw.tokens,
                    sw.duration_ms,
                    sw.kv_before.used as f64 / 1048576.0,
                    sw.kv_after.used as f64 / 1048576.0
                );
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} configuration(s) failed (see above)");
    }
    if let Some(p) = &args.plot {
        crate::bench::memory_plot::draw(&rows, p)?;
        eprintln!("plot written to {}", p.display());
    }
    Ok(())
}

/// Fills the `*_vs_f16` fields from the f16 row of the same context.
fn compare_to_f16(rows: &mut [MemoryRow]) {
    let base: Vec<(usize, u64, u64, f64)> = rows
        .iter()
        .filter(|r| r.kv == "f16")
        .map(|r| (r.context, r.kv_bytes, r.peak_rss_bytes, r.decode_tok_s))
        .collect();
    for r in rows.iter_mut().filter(|r| r.kv != "f16") {
        if let Some(&(_, kv, peak, dec)) = base.iter().find(|b| b.0 == r.context) {
            r.kv_saved_vs_f16 = Some(kv as i64 - r.kv_bytes as i64);
            r.peak_rss_saved_vs_f16 = Some(peak as i64 - r.peak_rss_bytes as i64);
            r.decode_speedup_vs_f16 = (dec > 0.0).then(|| r.decode_tok_s / dec);
        }
    }
}

/// `<bos>` + the text's tokens, the text repeated until `context` tokens.
pub fn tiled_tokens(
    tokenizer: &GemmaTokenizer,
    text: &std::path::Path,
    context: usize,
) -> anyhow::Result<Vec<u32>> {
    let body =
        std::fs::read_to_string(text).with_context(|| format!("reading {}", text.display()))?;
    let body = tokenizer.encode(body.replace("\r\n", "\n").trim_start(), false)?;
    if body.is_empty() {
        bail!("{} has no tokens", text.display());
    }
    let mut ids = tokenizer.encode("", true)?;
    while ids.len() < context {
        let need = context - ids.len();
        ids.extend_from_slice(&body[..need.min(body.len())]);
    }
    Ok(ids)
}

/// The hidden child: one configuration, one JSON object on stdout.
pub fn run_one(args: MemoryRunArgs) -> anyhow::Result<()> {
    let policy = CacheSpec::parse(&args.kv)?.to_policy();
    let crate::model_args::OpenedModel { model, tokenizer } = args.model.open()?;
    // The decoded tokens must fit in the model's positions too.
    let room = model
        .config()
        .max_position_embeddings
        .saturating_sub(args.decode);
    let ids = tiled_tokens(
        &tokenizer,
        std::path::Path::new(&args.text),
        args.context.min(room).max(2),
    )?;
    let mut probe = RssProbe::new();
    let peak_process_load = peak_rss_bytes();
    release_free_memory();
    reset_peak_rss();
    let rss_after_load = probe.rss_bytes();
    let mut peak_sampled = rss_after_load;

    let mut cache = model.new_cache(&policy)?;
    let t0 = Instant::now();
    let mut last = None;
    if args.synthetic {
        cache.fill_synthetic(ids.len(), 1)?;
    } else {
        for c in ids.chunks(args.chunk.max(1)) {
            last = Some(model.forward(c, &mut cache, Logits::Last)?);
            peak_sampled = peak_sampled.max(probe.rss_bytes());
        }
    }
    let prefill_secs = t0.elapsed().as_secs_f64();
    let mut next = match last {
        Some(l) => l.argmax(0)?.to_scalar::<u32>()?,
        None => ids[ids.len() - 1],
    };
    let t1 = Instant::now();
    for _ in 0..args.decode {
        let l = model.forward(&[next], &mut cache, Logits::Last)?;
        next = l.argmax(0)?.to_scalar::<u32>()?;
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    peak_sampled = peak_sampled.max(probe.rss_bytes());
    let mem = cache.memory();
    let peak = peak_rss_bytes().unwrap_or(peak_sampled);
    let peak_process = peak_process_load.map_or(peak, |p| p.max(peak));
    // Timed after the peak was read, so the switch does not count in this run's peak.
    let switch = match &args.switch_to {
        Some(to) => {
            let plan = cache.plan(&CacheSpec::parse(to)?.to_policy())?;
            let from = CacheSpec::parse(&args.kv)?.to_policy();
            Some(switch_precision(&mut cache, &from, &plan, &mut probe)?)
        }
        None => None,
    };
    let row = MemoryRow {
        context: ids.len(),
        kv: CacheSpec::parse(&args.kv)?.to_string(),
        kv_bytes: mem.total.0 as u64,
        kv_bytes_full: mem.full.0 as u64,
        kv_bytes_sliding: mem.sliding.0 as u64,
        kv_bytes_allocated: mem.total.1 as u64,
        peak_rss_bytes: peak,
        peak_rss_process_bytes: peak_process,
        rss_after_load_bytes: rss_after_load,
        weights_bytes: model.weights_bytes() as u64,
        prefill_tok_s: if args.synthetic {
            0.0
        } else {
            ids.len() as f64 / prefill_secs.max(1e-9)
        },
        decode_tok_s: args.decode as f64 / decode_secs.max(1e-9),
        decode_tokens: args.decode,
        kv_saved_vs_f16: None,
        peak_rss_saved_vs_f16: None,
        decode_speedup_vs_f16: None,
        switch,
        synthetic: args.synthetic,
    };
    println!("{}", serde_json::to_string(&row)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_parse_with_k_suffix() -> anyhow::Result<()> {
        assert_eq!(parse_contexts("2k, 4K,1500")?, vec![2048, 4096, 1500]);
        assert_eq!(parse_contexts("1k")?, vec![1024]);
        assert!(parse_contexts("2m").is_err());
        assert!(parse_contexts("1").is_err());
        assert!(parse_contexts("").is_err());
        Ok(())
    }
}
