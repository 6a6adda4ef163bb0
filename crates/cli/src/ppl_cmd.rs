//! `kvlab ppl`: perplexity of a text under a model and a KV cache precision, with chunked
//! prefill through the cache (so a compressed cache is measured exactly as it is used).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::lab::GemmaTokenizer;
use kvlab_engine::lab::{next_token_logprobs, normalize_text, Perplexity};
use kvlab_engine::lab::{Model, PrecisionPolicy};
use serde::Serialize;

use crate::model_args::{kv_policy, ModelArgs};

#[derive(Args, Debug)]
#[command(
    about = "Perplexity of a text",
    long_about = "Perplexity of a text. The text is tokenized as <bos> followed by the whole \
file (CRLF line endings turned into LF, leading whitespace removed); the first --ctx tokens T0..T(ctx-1) are run through the model in chunks, and tokens \
T1..T(ctx-1) are scored, each given all tokens before it (ctx-1 tokens scored; <bos> itself \
is never scored). ppl = exp(mean negative log-likelihood)."
)]
pub struct PplArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file (or an asset name such as `alice`).
    #[arg(long)]
    text: String,
    /// Tokens of context to run (including <bos>).
    #[arg(long, default_value_t = 256)]
    ctx: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 128)]
    chunk: usize,
    /// KV cache SPEC: f16, bf16, f32, or a TurboQuant spec such as tq4.
    #[arg(long, default_value = "f16")]
    kv: String,
    /// Compare against this reference cache SPEC (e.g. f16): both caches run the same
    /// tokens in lockstep; reports ppl, ppl_reference, mean_kld, top1_agreement.
    #[arg(long)]
    reference: Option<String>,
    /// With --reference: run this many consecutive windows of --ctx tokens (each starting
    /// with <bos>, as llama.cpp's perplexity tool cuts its chunks) and pool their positions.
    #[arg(long, default_value_t = 1, requires = "reference")]
    windows: usize,
    /// With --reference: score only positions from this one on in each window (llama.cpp
    /// scores from ctx/2).
    #[arg(long, default_value_t = 0, requires = "reference")]
    score_from: usize,
    /// Print a JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What `kvlab ppl` reports.
#[derive(Debug, Serialize)]
pub struct PplReport {
    /// Perplexity.
    pub ppl: f64,
    /// Mean negative log-likelihood (nats).
    pub nll: f64,
    /// Tokens scored (`ctx − 1`).
    pub tokens_scored: usize,
    /// Tokens run.
    pub ctx: usize,
    /// The cache SPEC.
    pub kv: String,
    /// KV cache bytes at the end.
    pub kv_bytes: usize,
    /// Wall time of the scoring run.
    pub seconds: f64,
}

/// The text file: a path, or the path of an asset with that name.
pub fn text_path(text: &str) -> anyhow::Result<PathBuf> {
    crate::asset_names::file(text)
}

/// The first `ctx` tokens of `<bos>` + the text of `path`.
pub fn text_tokens(
    tokenizer: &GemmaTokenizer,
    path: &Path,
    ctx: usize,
) -> anyhow::Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut ids = tokenizer.encode(&normalize_text(&text), true)?;
    if ids.len() < ctx {
        bail!(
            "{} has only {} tokens, fewer than --ctx {ctx}",
            path.display(),
            ids.len()
        );
    }
    ids.truncate(ctx);
    Ok(ids)
}

/// Scores `ids` through a fresh cache of `policy`: the reusable core of `kvlab ppl`.
pub fn score(
    model: &Model,
    policy: &PrecisionPolicy,
    ids: &[u32],
    chunk: usize,
) -> anyhow::Result<(Perplexity, usize, Vec<f32>)> {
    let mut cache = model.new_cache(policy)?;
    let lp = next_token_logprobs(model, &mut cache, ids, chunk, &mut |_| {})?;
    Ok((Perplexity::from_logprobs(&lp), cache.memory().total.0, lp))
}

pub fn run(args: PplArgs) -> anyhow::Result<()> {
    if args.ctx < 2 {
        bail!("--ctx must be at least 2 (one token to condition on, one to score)");
    }
    let policy = kv_policy(&args.kv)?;
    let crate::model_args::OpenedModel { model, tokenizer } = args.model.open()?;
    if let Some(reference) = &args.reference {
        if args.windows == 0 || args.score_from + 1 >= args.ctx {
            bail!("--windows must be at least 1 and --score-from below --ctx − 1");
        }
        let all = text_tokens(&tokenizer, &text_path(&args.text)?, args.ctx * args.windows)?;
        let windows = crate::fidelity::lockstep::cut_windows(&all, args.ctx);
        let cut = crate::fidelity::lockstep::Windows {
            windows: &windows,
            score_from: args.score_from,
        };
        return crate::fidelity::lockstep::run(
            &model, cut, &args.kv, reference, args.chunk, args.json,
        );
    }
    let ids = text_tokens(&tokenizer, &text_path(&args.text)?, args.ctx)?;
    let t0 = Instant::now();
    let (p, kv_bytes, _) = score(&model, &policy, &ids, args.chunk)?;
    let report = PplReport {
        ppl: p.ppl,
        nll: p.nll,
        tokens_scored: p.tokens_scored,
        ctx: ids.len(),
        kv: args.kv.clone(),
        kv_bytes,
        seconds: t0.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "ppl {:.3} (nll {:.4}) over {} tokens, ctx {}, kv {} ({:.2} MiB), {:.1}s",
            report.ppl,
            report.nll,
            report.tokens_scored,
            report.ctx,
            report.kv,
            report.kv_bytes as f64 / 1048576.0,
            report.seconds
        );
    }
    Ok(())
}
