//! `kvlab fidelity fit --bits B | --bytes SIZE`: a cache fitted to a budget (engine:
//! `kvlab_engine::lab::fit_*`). Each layer side's sensitivity is measured on calibration text
//! (llama.cpp's protocol, one side of one layer at a time at the probe width, in lockstep
//! against f16), the widths that minimise the predicted loss within the budget are chosen,
//! and the chosen cache is measured, beside any `--against` caches, on text it did not fit
//! on. `--save` keeps it as a named preset in a JSON file.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::lab::{bits_per_coordinate, fit_allocate, fit_probes};
use kvlab_engine::lab::{CacheSpec, FitBudget, Fitted, Sensitivity, PROBE_BITS};
use serde::{Deserialize, Serialize};

use crate::fidelity::lockstep::{cut_windows, measure_many, Labelled, Windows};
use crate::fidelity::ProtocolArgs;
use crate::ppl_cmd::{text_path, text_tokens};

/// `kvlab fidelity fit` options. The protocol's `--text` and `--windows` are the held-out
/// measurement; `--calibration` and `--calibration-windows` what the fit measures on.
#[derive(Args, Debug)]
pub struct FitArgs {
    #[command(flatten)]
    protocol: ProtocolArgs,
    /// The budget in bits per coordinate as held (bytes against an f32 cache's, × 32).
    #[arg(long, conflicts_with = "bytes", required_unless_present = "bytes")]
    bits: Option<f64>,
    /// The budget in bytes of the whole cache at `--ctx` tokens (`48M`, `1.5G`).
    #[arg(long, value_parser = crate::serve_cmd::parse_size)]
    bytes: Option<u64>,
    /// The text the sensitivities are measured on (an asset name or a file); never the
    /// held-out `--text`.
    #[arg(long, default_value = "paradise-lost")]
    calibration: String,
    /// Windows of calibration text.
    #[arg(long, default_value_t = 1)]
    calibration_windows: usize,
    /// Tokens per calibration window (default `--ctx`): the probes are 2 per layer and one
    /// more, each a forward pass over every window, so a shorter window fits faster; the
    /// budget is still counted at `--ctx`.
    #[arg(long)]
    calibration_ctx: Option<usize>,
    /// The TurboQuant rotation seed of every fitted side.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Caches measured beside the fitted one on the held-out text (repeat the flag; each a
    /// SPEC, per-layer ones too).
    #[arg(long)]
    against: Vec<String>,
    /// Write the measured sensitivities to this JSON file (to fit other budgets from them
    /// with `--probes`).
    #[arg(long)]
    probes_out: Option<PathBuf>,
    /// Fit from sensitivities a previous run wrote (`--probes-out`) instead of measuring
    /// them again: on the same model, context and calibration text.
    #[arg(long, conflicts_with = "probes_out")]
    probes: Option<PathBuf>,
    /// Keep the fitted cache as a named preset in this JSON file (added, or replacing one of
    /// the same name).
    #[arg(long)]
    save: Option<PathBuf>,
    /// The preset's name.
    #[arg(long, default_value = "fitted")]
    name: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// A fitted cache kept by `--save`: what it is, what it costs and what it lost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FittedPreset {
    pub name: String,
    pub spec: String,
    /// The model file it was fitted on.
    pub model: String,
    pub ctx: usize,
    pub bits_per_coordinate: f64,
    pub bytes: u64,
    pub predicted_kld: f64,
    /// Mean KLD on the held-out text.
    pub measured_kld: f64,
    pub top1_agreement: f64,
    pub calibration: String,
    pub held_out: String,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct FitOut {
    sensitivity: Sensitivity,
    fitted: Fitted,
    measured: Vec<Measured>,
    seconds_probing: f64,
    seconds_measuring: f64,
}

#[derive(Debug, Serialize)]
struct Measured {
    kv: String,
    bits_per_coordinate: f64,
    mean_kld: f64,
    kld_stderr: f64,
    top1_agreement: f64,
}

pub fn fit(args: FitArgs) -> anyhow::Result<()> {
    let budget = match (args.bits, args.bytes) {
        (Some(b), None) if b.is_finite() && b > 0.0 => FitBudget::Bits(b),
        (None, Some(b)) if b > 0 => FitBudget::Bytes(b),
        _ => bail!("give one budget: --bits B (above 0) or --bytes SIZE"),
    };
    if args.calibration_windows == 0 {
        bail!("--calibration-windows must be at least 1");
    }
    if text_path(&args.calibration)? == text_path(&args.protocol.text)? {
        bail!("--calibration and --text are the same text: the fit must be measured on text it did not fit on");
    }
    let against: Vec<CacheSpec> = args
        .against
        .iter()
        .map(|s| CacheSpec::parse(s).with_context(|| format!("--against {s}")))
        .collect::<anyhow::Result<_>>()?;
    let opened = args.protocol.open()?;
    let model = &opened.model;
    let ctx = args.protocol.ctx;
    let quiet = args.json;

    // 1. Each side of each layer alone at the probe width, on the calibration text.
    let t0 = Instant::now();
    let sensitivity = match &args.probes {
        Some(path) => {
            let s: Sensitivity = serde_json::from_slice(
                &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
            )
            .with_context(|| format!("{}: not sensitivities of `--probes-out`", path.display()))?;
            let owners: Vec<usize> = model
                .config()
                .cache_owning_layers()
                .map(|l| l.index)
                .collect();
            if s.layers.iter().map(|l| l.layer).collect::<Vec<_>>() != owners {
                bail!("{}: measured on a model of other layers", path.display());
            }
            s
        }
        None => probe(&args, &opened, quiet)?,
    };
    if let Some(path) = &args.probes_out {
        std::fs::write(path, serde_json::to_string_pretty(&sensitivity)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let seconds_probing = t0.elapsed().as_secs_f64();

    // 2. The widths.
    let fitted = fit_allocate(model.config(), &sensitivity, budget, ctx, args.seed)?;
    if !quiet {
        print_sensitivity(&sensitivity);
        println!(
            "fitted in {seconds_probing:.0} s: {} ({:.2} bits per coordinate, {} bytes at {ctx} tokens), predicted mean KLD {:.4}",
            fitted.spec, fitted.bits_per_coordinate, fitted.bytes, fitted.predicted_kld
        );
        eprintln!(
            "measuring it on {} ({} windows of {ctx})",
            args.protocol.text, args.protocol.windows
        );
    }

    // 3. Measured on held-out text, beside the caches it is to beat.
    let t1 = Instant::now();
    let mut tests = vec![Labelled {
        label: fitted.spec.clone(),
        policy: fitted.policy.clone(),
    }];
    tests.extend(against.iter().map(|s| Labelled {
        label: s.to_string(),
        policy: s.to_policy(),
    }));
    let cut = opened.cut();
    let measured: Vec<Measured> = measure_many(
        model,
        &cut,
        &tests,
        &opened.reference,
        args.protocol.chunk,
        quiet,
    )?
    .into_iter()
    .zip(&tests)
    .map(|((out, _), t)| {
        Ok(Measured {
            kv: t.label.clone(),
            bits_per_coordinate: bits_per_coordinate(model, &t.policy, ctx)?,
            mean_kld: out.mean_kld,
            kld_stderr: out.kld_stderr,
            top1_agreement: out.top1_agreement,
        })
    })
    .collect::<anyhow::Result<_>>()?;
    let seconds_measuring = t1.elapsed().as_secs_f64();

    if let Some(path) = &args.save {
        let first = &measured[0];
        save(
            path,
            FittedPreset {
                name: args.name.clone(),
                spec: fitted.spec.clone(),
                model: args.protocol.model_name(),
                ctx,
                bits_per_coordinate: fitted.bits_per_coordinate,
                bytes: fitted.bytes,
                predicted_kld: fitted.predicted_kld,
                measured_kld: first.mean_kld,
                top1_agreement: first.top1_agreement,
                calibration: args.calibration.clone(),
                held_out: args.protocol.text.clone(),
            },
        )?;
    }
    if args.json {
        let out = FitOut {
            sensitivity,
            fitted,
            measured,
            seconds_probing,
            seconds_measuring,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "on {} ({} windows of {ctx}, second halves scored against {}), {seconds_measuring:.0} s:",
        args.protocol.text, args.protocol.windows, opened.reference
    );
    let width = measured
        .iter()
        .map(|m| m.kv.len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!(
        "{:<width$} {:>6} {:>10} {:>9} {:>7}",
        "cache", "bits", "mean KLD", "± windows", "top-1"
    );
    for m in &measured {
        println!(
            "{:<width$} {:>6.2} {:>10.5} {:>9.5} {:>6.2}%",
            m.kv,
            m.bits_per_coordinate,
            m.mean_kld,
            m.kld_stderr,
            100.0 * m.top1_agreement
        );
    }
    if let Some(path) = &args.save {
        println!("saved as `{}` in {}", args.name, path.display());
    }
    Ok(())
}

/// Measures every side of every layer alone at the probe width on the calibration text.
fn probe(args: &FitArgs, opened: &super::Opened, quiet: bool) -> anyhow::Result<Sensitivity> {
    let model = &opened.model;
    let ctx = args.calibration_ctx.unwrap_or(args.protocol.ctx);
    if ctx < 4 {
        bail!("--calibration-ctx must be at least 4");
    }
    let calibration = text_tokens(
        &opened.tokenizer,
        &text_path(&args.calibration)?,
        ctx * args.calibration_windows,
    )?;
    let cal_windows = cut_windows(&calibration, ctx);
    let cal = Windows {
        windows: &cal_windows,
        score_from: ctx / 2,
    };
    let probes = fit_probes(model.config(), args.seed)?;
    if !quiet {
        eprintln!(
            "probing {} sides of {} layers at {} bits on {} ({} window(s) of {ctx})",
            probes.len(),
            probes.len() / 2,
            PROBE_BITS.value(),
            args.calibration,
            args.calibration_windows
        );
    }
    let tests: Vec<Labelled> = probes
        .iter()
        .map(|p| Labelled {
            label: p.label.clone(),
            policy: p.policy.clone(),
        })
        .collect();
    let klds: Vec<f64> = measure_many(
        model,
        &cal,
        &tests,
        &opened.reference,
        args.protocol.chunk,
        quiet,
    )?
    .into_iter()
    .map(|(out, _)| out.mean_kld)
    .collect();
    Ok(Sensitivity::from_probes(model.config(), &probes, &klds)?)
}

fn print_sensitivity(s: &Sensitivity) {
    println!(
        "each side alone at {} bits, every other layer f16, mean KLD:",
        PROBE_BITS.value()
    );
    println!(
        "{:>5} {:<8} {:>10} {:>10}",
        "layer", "kind", "keys", "values"
    );
    for l in &s.layers {
        println!(
            "{:>5} {:<8} {:>10.5} {:>10.5}",
            l.layer,
            format!("{:?}", l.kind).to_lowercase(),
            l.keys_kld,
            l.values_kld
        );
    }
}

/// Adds `preset` to the JSON array in `path` (created when missing), replacing one of the same
/// name; written whole to a temporary file first, then renamed over the old one.
fn save(path: &std::path::Path, preset: FittedPreset) -> anyhow::Result<()> {
    let mut all: Vec<FittedPreset> = match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: not a JSON array of fitted caches", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    all.retain(|p| p.name != preset.name);
    all.push(preset);
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(name: &str, spec: &str) -> FittedPreset {
        FittedPreset {
            name: name.into(),
            spec: spec.into(),
            model: "m".into(),
            ctx: 2048,
            bits_per_coordinate: 3.5,
            bytes: 1,
            predicted_kld: 0.1,
            measured_kld: 0.1,
            top1_agreement: 0.8,
            calibration: "paradise-lost".into(),
            held_out: "alice".into(),
        }
    }

    #[test]
    fn saved_presets_are_added_and_replaced_by_name() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("fitted.json");
        save(&path, preset("a", "tq3"))?;
        save(&path, preset("b", "tq4"))?;
        save(&path, preset("a", "k4v3"))?;
        let all: Vec<FittedPreset> = serde_json::from_slice(&std::fs::read(&path)?)?;
        let names: Vec<(&str, &str)> = all
            .iter()
            .map(|p| (p.name.as_str(), p.spec.as_str()))
            .collect();
        assert_eq!(names, [("b", "tq4"), ("a", "k4v3")]);
        // A file that is not ours is refused, not overwritten.
        std::fs::write(&path, "{not json")?;
        assert!(save(&path, preset("c", "tq3")).is_err());
        assert_eq!(std::fs::read_to_string(&path)?, "{not json");
        Ok(())
    }
}
