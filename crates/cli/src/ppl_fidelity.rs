//! `kvlab ppl --kv SPEC --reference SPEC`: the text's tokens run through a reference and a
//! test cache in lockstep (teacher forcing), reporting both perplexities, mean KL(ref ‖ test)
//! and top-1 agreement per position (engine: `kvlab_engine::fidelity`).

use std::time::Instant;

use anyhow::Context;
use kvlab_engine::fidelity::compare_caches;
use kvlab_engine::kv::CacheSpec;
use kvlab_engine::Model;
use serde::Serialize;

/// What `kvlab ppl --reference` prints.
#[derive(Debug, Serialize)]
pub struct FidelityOut {
    /// Perplexity under the test cache (`--kv`).
    pub ppl: f64,
    /// Perplexity under the reference cache.
    pub ppl_reference: f64,
    /// Mean KL(reference ‖ test) per position, nats.
    pub mean_kld: f64,
    /// Largest per-position KL.
    pub max_kld: f64,
    /// Fraction of positions whose most likely next token agrees.
    pub top1_agreement: f64,
    /// Largest logit difference over all positions.
    pub max_logit_error: f32,
    /// Positions scored.
    pub tokens_scored: usize,
    /// Tokens run.
    pub ctx: usize,
    /// The test SPEC (canonical).
    pub kv: String,
    /// The reference SPEC (canonical).
    pub reference: String,
    /// Wall time.
    pub seconds: f64,
}

/// Runs the comparison and prints it (JSON with `json`, else one line).
pub fn run(
    model: &Model,
    ids: &[u32],
    kv: &str,
    reference: &str,
    chunk: usize,
    json: bool,
) -> anyhow::Result<()> {
    let test = CacheSpec::parse(kv).with_context(|| format!("bad --kv `{kv}`"))?;
    let refr =
        CacheSpec::parse(reference).with_context(|| format!("bad --reference `{reference}`"))?;
    let t0 = Instant::now();
    let r = compare_caches(
        model,
        ids,
        &refr.to_policy(),
        &test.to_policy(),
        chunk,
        &mut |done, total| {
            if !json {
                eprint!("\r{done}/{total} tokens");
            }
        },
    )?;
    if !json {
        eprintln!();
    }
    let out = FidelityOut {
        ppl: r.ppl,
        ppl_reference: r.ppl_reference,
        mean_kld: r.mean_kld,
        max_kld: r.max_kld,
        top1_agreement: r.top1_agreement,
        max_logit_error: r.max_logit_error,
        tokens_scored: r.tokens_scored,
        ctx: ids.len(),
        kv: test.to_string(),
        reference: refr.to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "kv {} vs {}: ppl {:.3} (reference {:.3}), mean KLD {:.5}, top-1 agreement {:.2}%, max logit error {:.3}, {} tokens, {:.1}s",
            out.kv,
            out.reference,
            out.ppl,
            out.ppl_reference,
            out.mean_kld,
            100.0 * out.top1_agreement,
            out.max_logit_error,
            out.tokens_scored,
            out.seconds
        );
    }
    Ok(())
}
