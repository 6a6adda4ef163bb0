//! `kvlab fidelity sweep`: what each KV cache costs and loses, on llama.cpp's perplexity
//! protocol (consecutive windows of `--ctx` tokens, each from `<bos>`, the second halves
//! scored against an f16 cache in lockstep). Per cache: bits per coordinate as held (its
//! bytes against an f32 cache's at the same context, so norms, offsets and any exact tokens
//! count), mean and 99th-percentile KL divergence, top-1 agreement and perplexity; `--plot`
//! draws KL divergence against bits, with any peer figures from `--peer` beside them.

mod fit;
pub(crate) mod lockstep;
mod plot;

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kvlab_engine::contract::SweepPoint;
use kvlab_engine::lab::Model;
use kvlab_engine::lab::{bits_per_coordinate, quantile};
use kvlab_engine::lab::{CacheSpec, KvPrecision};
use serde::{Deserialize, Serialize};

use crate::fidelity::lockstep::{cut_windows, measure_many, Labelled, Windows};
use crate::model_args::ModelArgs;
use crate::ppl_cmd::{text_path, text_tokens};

/// `kvlab fidelity` subcommands.
#[derive(Args, Debug)]
pub struct FidelityArgs {
    #[command(subcommand)]
    command: FidelityCommand,
}

#[derive(Subcommand, Debug)]
enum FidelityCommand {
    /// KL divergence, top-1 agreement and perplexity against bits per coordinate, per cache.
    Sweep(SweepArgs),
    /// Each layer's sensitivity: the KL divergence when only that layer's cache is coded.
    Layers(LayersArgs),
    /// A cache fitted to a budget: per-layer key and value widths chosen by each side's
    /// measured sensitivity, then measured on text it did not fit on.
    Fit(fit::FitArgs),
    /// The text exactly as the sweep and `kvlab ppl` score it (line endings and leading
    /// whitespace normalized), to stdout: what another program measured beside us must read.
    Text(TextArgs),
}

#[derive(Args, Debug)]
pub struct TextArgs {
    /// The text (a file, or an asset name such as `alice`).
    #[arg(long, default_value = "alice")]
    text: String,
}

/// The measuring protocol both subcommands share: llama.cpp's perplexity windows on a text,
/// scored against a reference cache.
#[derive(Args, Debug)]
pub struct ProtocolArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text (a file, or an asset name such as `alice`).
    #[arg(long, default_value = "alice")]
    text: String,
    /// Tokens per window.
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
    /// Consecutive windows, pooled.
    #[arg(long, default_value_t = 4)]
    windows: usize,
    /// The reference cache.
    #[arg(long, default_value = "f16")]
    reference: String,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
}

/// What [`ProtocolArgs::open`] gives: the model, its token windows and the reference.
struct Opened {
    model: Model,
    tokenizer: kvlab_engine::lab::GemmaTokenizer,
    windows: Vec<Vec<u32>>,
    reference: CacheSpec,
}

impl Opened {
    /// The windows, each scored from its middle (llama.cpp's protocol).
    fn cut(&self) -> Windows<'_> {
        Windows {
            windows: &self.windows,
            score_from: self.windows.first().map_or(0, |w| w.len() / 2),
        }
    }
}

impl ProtocolArgs {
    /// Validates the protocol, loads the model and cuts the text into windows.
    fn open(&self) -> anyhow::Result<Opened> {
        if self.windows == 0 || self.ctx < 4 {
            bail!("--windows must be at least 1 and --ctx at least 4");
        }
        let reference = CacheSpec::parse(&self.reference)
            .with_context(|| format!("--reference {}", self.reference))?;
        let crate::model_args::OpenedModel { model, tokenizer } = self.model.open()?;
        let all = text_tokens(&tokenizer, &text_path(&self.text)?, self.ctx * self.windows)?;
        Ok(Opened {
            model,
            tokenizer,
            windows: cut_windows(&all, self.ctx),
            reference,
        })
    }

    /// The model as given on the command line.
    fn model_name(&self) -> String {
        self.model.model.clone()
    }
}

/// `kvlab fidelity layers` options.
#[derive(Args, Debug)]
pub struct LayersArgs {
    #[command(flatten)]
    protocol: ProtocolArgs,
    /// The cache put on one layer at a time (a TurboQuant SPEC; its scope is ignored), every
    /// other layer keeping the reference's (which must be dense).
    #[arg(long, default_value = "tq3")]
    kv: String,
    /// Print a JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

/// One layer's figures (the `fidelity layers --json` array's element).
#[derive(Debug, Clone, Serialize)]
pub struct LayerRow {
    pub layer: usize,
    pub kind: String,
    pub mean_kld: f64,
    pub p99_kld: f64,
    pub top1_agreement: f64,
}

/// `kvlab fidelity sweep` options.
#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    protocol: ProtocolArgs,
    /// Caches, comma-separated SPECs; `presets` stands for every preset of the cache menu
    /// on all layers. Separated by `;` instead, each may give layers formats of their own
    /// (`presets;tq3+qw@all,17=f16`).
    #[arg(long, default_value = "presets")]
    kv: String,
    /// Peer figures to draw and print beside ours: a JSON array of
    /// `{label, bits_per_coordinate, mean_kld}` (e.g. llama.cpp's quantized caches, measured
    /// on the same protocol).
    #[arg(long)]
    peer: Option<PathBuf>,
    /// Draw KL divergence (log scale) against bits per coordinate into this PNG (or SVG).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print a JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

/// One cache's row of `fidelity sweep`: the engine's point and how much its mean moves
/// between windows (the `--json` array's element).
#[derive(Debug, Clone, Serialize)]
struct SweptCache {
    #[serde(flatten)]
    point: SweepPoint,
    /// Standard error of `mean_kld` from the spread of the window means.
    kld_stderr: f64,
    /// Each window's mean KL divergence, in order.
    window_mean_klds: Vec<f64>,
}

/// A peer's point, from `--peer`.
#[derive(Debug, Clone, Deserialize)]
pub struct PeerPoint {
    pub label: String,
    pub bits_per_coordinate: f64,
    pub mean_kld: f64,
}

pub fn run(args: FidelityArgs) -> anyhow::Result<()> {
    match args.command {
        FidelityCommand::Sweep(a) => sweep(a),
        FidelityCommand::Layers(a) => layers(a),
        FidelityCommand::Fit(a) => fit::fit(a),
        FidelityCommand::Text(a) => {
            let path = crate::ppl_cmd::text_path(&a.text)?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            print!("{}", kvlab_engine::lab::normalize_text(&text));
            Ok(())
        }
    }
}

/// The per-layer sensitivity scan: `kv` on one cache-owning layer at a time.
fn layers(args: LayersArgs) -> anyhow::Result<()> {
    let test = CacheSpec::parse(&args.kv).with_context(|| format!("--kv {}", args.kv))?;
    let CacheSpec::Split { precision, .. } = test else {
        bail!("--kv must be a TurboQuant SPEC (e.g. tq3, k4v3)");
    };
    let opened = args.protocol.open()?;
    let (model, reference, cut) = (&opened.model, &opened.reference, opened.cut());
    let CacheSpec::Dense(_) = reference else {
        bail!("--reference must be a dense cache (f16, bf16, f32)");
    };
    let owners: Vec<(usize, String)> = model
        .config()
        .cache_owning_layers()
        .map(|l| (l.index, format!("{:?}", l.kind).to_lowercase()))
        .collect();
    let tests: Vec<Labelled> = owners
        .iter()
        .map(|(layer, _)| {
            let mut policy = reference.to_policy();
            policy
                .overrides
                .insert(*layer, KvPrecision::Split(precision));
            Labelled {
                label: format!("layer {layer} {precision}"),
                policy,
            }
        })
        .collect();
    let measured = measure_many(
        model,
        &cut,
        &tests,
        reference,
        args.protocol.chunk,
        args.json,
    )?;
    let rows: Vec<LayerRow> = owners
        .into_iter()
        .zip(measured)
        .map(|((layer, kind), (out, klds))| LayerRow {
            layer,
            kind,
            mean_kld: out.mean_kld,
            p99_kld: quantile(&klds, 0.99),
            top1_agreement: out.top1_agreement,
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{precision} on one layer at a time, {} windows of {} tokens, second halves scored against {reference}:",
        args.protocol.windows, args.protocol.ctx
    );
    println!(
        "{:>5} {:<8} {:>10} {:>10} {:>7}",
        "layer", "kind", "mean KLD", "p99 KLD", "top-1"
    );
    for r in &rows {
        println!(
            "{:>5} {:<8} {:>10.5} {:>10.4} {:>6.2}%",
            r.layer,
            r.kind,
            r.mean_kld,
            r.p99_kld,
            100.0 * r.top1_agreement
        );
    }
    let sum: f64 = rows.iter().map(|r| r.mean_kld).sum();
    println!("sum of the layers' KLD {sum:.5} (coding them all is not additive, but close)");
    Ok(())
}

/// The caches of a sweep's `--kv` ([`crate::model_args::kv_list`]), labelled by their SPECs.
fn sweep_tests(list: &str) -> anyhow::Result<Vec<Labelled>> {
    Ok(crate::model_args::kv_list(list)?
        .into_iter()
        .map(|(label, policy)| Labelled { label, policy })
        .collect())
}

fn sweep(args: SweepArgs) -> anyhow::Result<()> {
    let tests = sweep_tests(&args.kv)?;
    let peers: Vec<PeerPoint> = match &args.peer {
        Some(p) => serde_json::from_slice(
            &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| {
            format!(
                "{}: a JSON array of {{label, bits_per_coordinate, mean_kld}}",
                p.display()
            )
        })?,
        None => Vec::new(),
    };
    let opened = args.protocol.open()?;
    let (model, reference, cut) = (&opened.model, &opened.reference, opened.cut());
    let ProtocolArgs {
        ctx,
        windows,
        chunk,
        ..
    } = args.protocol;
    let measured = measure_many(model, &cut, &tests, reference, chunk, args.json)?;
    let mut rows = Vec::with_capacity(tests.len());
    for (test, (out, klds)) in tests.iter().zip(measured) {
        rows.push(SweptCache {
            point: SweepPoint {
                kv: test.label.clone(),
                bits_per_coordinate: bits_per_coordinate(model, &test.policy, ctx)?,
                mean_kld: out.mean_kld,
                p99_kld: quantile(&klds, 0.99),
                top1_agreement: out.top1_agreement,
                ppl: out.ppl,
                ppl_reference: out.ppl_reference,
                tokens_scored: out.tokens_scored,
            },
            kld_stderr: out.kld_stderr,
            window_mean_klds: out.window_mean_klds,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "{} windows of {} tokens, second halves scored against {}:",
            windows, ctx, reference
        );
        let width = rows
            .iter()
            .map(|r| r.point.kv.len())
            .chain(peers.iter().map(|p| p.label.len()))
            .max()
            .unwrap_or(5)
            .max(5);
        println!(
            "{:<width$} {:>6} {:>10} {:>9} {:>10} {:>7} {:>9}",
            "cache", "bits", "mean KLD", "± windows", "p99 KLD", "top-1", "ppl"
        );
        for SweptCache {
            point: r,
            kld_stderr,
            ..
        } in &rows
        {
            println!(
                "{:<width$} {:>6.2} {:>10.5} {:>9.5} {:>10.4} {:>6.2}% {:>9.3}",
                r.kv,
                r.bits_per_coordinate,
                r.mean_kld,
                kld_stderr,
                r.p99_kld,
                100.0 * r.top1_agreement,
                r.ppl
            );
        }
        if let Some(r) = rows.first() {
            println!("reference ppl {:.3}", r.point.ppl_reference);
        }
        if windows > 1 {
            println!(
                "± windows: the standard error of the mean from the spread of the {windows} \
                 windows' own means"
            );
        }
        if let Some(file) = &args.peer {
            println!("peers, from {}:", file.display());
        }
        for p in &peers {
            println!(
                "{:<width$} {:>6.2} {:>10.5}",
                p.label, p.bits_per_coordinate, p.mean_kld
            );
        }
    }
    if let Some(path) = &args.plot {
        let points: Vec<SweepPoint> = rows.iter().map(|r| r.point.clone()).collect();
        crate::fidelity::plot::draw(&points, &peers, path)?;
        if !args.json {
            println!("plot: {}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_takes_layers_of_their_own_after_semicolons() {
        let labels = |l: &str| -> Vec<String> {
            sweep_tests(l)
                .unwrap()
                .into_iter()
                .map(|t| t.label)
                .collect()
        };
        assert_eq!(labels("f16, tq4"), ["f16", "tq4"]);
        assert_eq!(
            labels("q4_0; tq3+qw@all,17=f16 ;"),
            ["q4_0", "tq3+qw@all,17=f16"]
        );
        assert!(labels("presets;f16").len() > 2);
        assert_eq!(
            labels("f16; fitted 3.5 : tq3+qw@all,17=f16"),
            ["f16", "fitted 3.5"]
        );
        assert!(sweep_tests("tq3,17=f16").is_err());
        assert!(sweep_tests(";").is_err());
    }

    #[test]
    fn peer_points_read_from_json() {
        let p: Vec<PeerPoint> = serde_json::from_str(
            r#"[{"label":"q4_0/q4_0","bits_per_coordinate":4.5,"mean_kld":0.104}]"#,
        )
        .unwrap();
        assert_eq!(p[0].bits_per_coordinate, 4.5);
    }
}
