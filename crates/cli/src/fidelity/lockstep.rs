//! `kvlab ppl --kv SPEC --reference SPEC`: the text's tokens run through a reference and a
//! test cache in lockstep (teacher forcing), reporting both perplexities, mean KL(ref ‖ test)
//! and top-1 agreement per position (engine: `kvlab_engine::lab::compare_many_from`).

use std::time::Instant;

use anyhow::Context;
use kvlab_engine::lab::lockstep_batches;
use kvlab_engine::lab::Model;
use kvlab_engine::lab::{compare_many_from, FidelityReport, PositionFidelity};
use kvlab_engine::lab::{CacheSpec, PrecisionPolicy};
use kvlab_engine::MemoryBudget;
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
    /// Each window's own mean KL, in order: how far one window's figure moves from
    /// another's, the noise a pooled mean carries (tokens within a window are not
    /// independent: a perturbation early in it shifts every later position).
    pub window_mean_klds: Vec<f64>,
    /// Standard error of `mean_kld` from the spread of the window means (0 for one window).
    pub kld_stderr: f64,
    /// Largest per-position KL.
    pub max_kld: f64,
    /// Fraction of positions whose most likely next token agrees.
    pub top1_agreement: f64,
    /// Largest logit difference over all positions.
    pub max_logit_error: f32,
    /// Positions scored.
    pub tokens_scored: usize,
    /// Tokens per window.
    pub ctx: usize,
    /// Windows run (consecutive, each starting with <bos>).
    pub windows: usize,
    /// First position scored in each window.
    pub score_from: usize,
    /// The test SPEC (canonical).
    pub kv: String,
    /// The reference SPEC (canonical).
    pub reference: String,
    /// Wall time (shared by the caches measured together in lockstep).
    pub seconds: f64,
}

/// The token windows to compare, and the first position scored in each.
pub struct Windows<'a> {
    pub windows: &'a [Vec<u32>],
    pub score_from: usize,
}

/// Cuts `all` (`<bos>` + the text's tokens) into consecutive windows of `ctx` tokens, each
/// starting with `<bos>`, as llama.cpp's perplexity tool cuts its chunks.
pub fn cut_windows(all: &[u32], ctx: usize) -> Vec<Vec<u32>> {
    all.chunks_exact(ctx.max(1))
        .map(|w| {
            let mut w = w.to_vec();
            w[0] = all[0];
            w
        })
        .collect()
}

/// Runs the comparison: the summary, and every scored position's KL divergence.
pub fn measure(
    model: &Model,
    cut: &Windows<'_>,
    test: &CacheSpec,
    refr: &CacheSpec,
    chunk: usize,
    quiet: bool,
) -> anyhow::Result<(FidelityOut, Vec<f64>)> {
    let test = Labelled {
        label: test.to_string(),
        policy: test.to_policy(),
    };
    measure_policy(model, cut, &test, refr, chunk, quiet)
}

/// A cache policy with the name it is reported under (a SPEC, or e.g. `layer 3: tq3`).
pub struct Labelled {
    pub label: String,
    pub policy: PrecisionPolicy,
}

/// [`measure`] for any per-layer policy, not only one a SPEC string can name.
pub fn measure_policy(
    model: &Model,
    cut: &Windows<'_>,
    test: &Labelled,
    refr: &CacheSpec,
    chunk: usize,
    quiet: bool,
) -> anyhow::Result<(FidelityOut, Vec<f64>)> {
    let mut all = measure_many(model, cut, std::slice::from_ref(test), refr, chunk, quiet)?;
    Ok(all.remove(0))
}

/// [`measure_policy`] for several caches at once: each window runs through the reference once
/// and through every test cache in lockstep (engine: `compare_many_from`), in groups whose
/// caches fit in the memory available now. Results come in `tests`' order; each one's
/// `seconds` is its group's wall time.
pub fn measure_many(
    model: &Model,
    cut: &Windows<'_>,
    tests: &[Labelled],
    refr: &CacheSpec,
    chunk: usize,
    quiet: bool,
) -> anyhow::Result<Vec<(FidelityOut, Vec<f64>)>> {
    let reference = refr.to_policy();
    let policies: Vec<PrecisionPolicy> = tests.iter().map(|t| t.policy.clone()).collect();
    let budget = MemoryBudget::from_env();
    let room = budget.available().saturating_sub(budget.margin());
    let ctx = cut.windows.first().map_or(0, Vec::len);
    let groups = lockstep_batches(model, &reference, &policies, ctx, room)?;
    let mut out = Vec::with_capacity(tests.len());
    for group in groups {
        let t0 = Instant::now();
        let label = match group.len() {
            1 => tests[group.start].label.clone(),
            n => format!("{n} caches"),
        };
        let mut positions = vec![Vec::new(); group.len()];
        let mut window_means = vec![Vec::new(); group.len()];
        for (w, ids) in cut.windows.iter().enumerate() {
            let reports = compare_many_from(
                model,
                ids,
                &reference,
                &policies[group.clone()],
                chunk,
                cut.score_from,
                &mut |done, total| {
                    if !quiet {
                        eprint!(
                            "\r{label} window {}/{}: {done}/{total} tokens",
                            w + 1,
                            cut.windows.len()
                        );
                    }
                    true
                },
            )?;
            for ((p, m), r) in positions.iter_mut().zip(&mut window_means).zip(reports) {
                m.push(r.mean_kld);
                p.extend(r.positions);
            }
        }
        if !quiet {
            eprintln!();
        }
        let seconds = t0.elapsed().as_secs_f64();
        for ((test, positions), means) in tests[group].iter().zip(positions).zip(window_means) {
            out.push(summarize(test, positions, means, cut, refr, seconds));
        }
    }
    Ok(out)
}

/// One cache's figures from its scored positions (pooled over the windows).
fn summarize(
    test: &Labelled,
    positions: Vec<PositionFidelity>,
    window_mean_klds: Vec<f64>,
    cut: &Windows<'_>,
    refr: &CacheSpec,
    seconds: f64,
) -> (FidelityOut, Vec<f64>) {
    let klds: Vec<f64> = positions.iter().map(|p| p.kld).collect();
    let r = FidelityReport::from_positions(positions);
    let out = FidelityOut {
        ppl: r.ppl,
        ppl_reference: r.ppl_reference,
        mean_kld: r.mean_kld,
        kld_stderr: stderr_of_mean(&window_mean_klds),
        window_mean_klds,
        max_kld: r.max_kld,
        top1_agreement: r.top1_agreement,
        max_logit_error: r.max_logit_error,
        tokens_scored: r.tokens_scored,
        ctx: cut.windows.first().map_or(0, Vec::len),
        windows: cut.windows.len(),
        score_from: cut.score_from,
        kv: test.label.clone(),
        reference: refr.to_string(),
        seconds,
    };
    (out, klds)
}

/// The standard error of the mean of `xs` (sample standard deviation over √n), 0 for fewer
/// than two.
pub fn stderr_of_mean(xs: &[f64]) -> f64 {
    let n = xs.len();
    if n < 2 {
        return 0.0;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (var / n as f64).sqrt()
}

/// Runs the comparison and prints it (JSON with `json`, else one line).
pub fn run(
    model: &Model,
    cut: Windows<'_>,
    kv: &str,
    reference: &str,
    chunk: usize,
    json: bool,
) -> anyhow::Result<()> {
    let test = CacheSpec::parse(kv).with_context(|| format!("bad --kv `{kv}`"))?;
    let refr =
        CacheSpec::parse(reference).with_context(|| format!("bad --reference `{reference}`"))?;
    let (out, _) = measure(model, &cut, &test, &refr, chunk, json)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "kv {} vs {}: ppl {:.3} (reference {:.3}), mean KLD {:.5} ± {:.5} (windows), top-1 agreement {:.2}%, max logit error {:.3}, {} tokens, {:.1}s",
            out.kv,
            out.reference,
            out.ppl,
            out.ppl_reference,
            out.mean_kld,
            out.kld_stderr,
            100.0 * out.top1_agreement,
            out.max_logit_error,
            out.tokens_scored,
            out.seconds
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_spread_gives_the_standard_error_of_the_pooled_mean() {
        // Sample sd of 1..4 is √(5/3); over √4.
        let se = stderr_of_mean(&[1.0, 2.0, 3.0, 4.0]);
        assert!((se - (5.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-12, "{se}");
        assert!(stderr_of_mean(&[0.2, 0.2, 0.2]) < 1e-15);
        assert_eq!(stderr_of_mean(&[0.3]), 0.0);
        assert_eq!(stderr_of_mean(&[]), 0.0);
    }

    #[test]
    fn windows_start_with_bos_and_drop_the_remainder() {
        let all: Vec<u32> = (0..10).collect();
        let w = cut_windows(&all, 4);
        assert_eq!(w, vec![vec![0, 1, 2, 3], vec![0, 5, 6, 7]]);
    }
}
