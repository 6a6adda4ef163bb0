//! `kvlab bench image`: what one image costs a model that reads it: the processor's time
//! (decode and resize), the tower's encode time (best and median of rounds) and its soft
//! tokens, and the KV bytes its places take under every preset of the checkpoint's text
//! config. Run it on the synthetic E2B tower (scripts/bench/make_synthetic_e2b_vision.py).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use kvlab_engine::contract::{presets, ImageLimits, ImageProcessor, REWIND_MARGIN};
use kvlab_engine::lab::{estimate_kv_bytes, load_hf_config, CacheSpec, VisionTower};
use kvlab_engine::LoadOptions;

#[derive(Args)]
pub struct BenchImageArgs {
    /// A checkpoint folder with a vision tower (config.json with `vision_config`).
    #[arg(long)]
    model: PathBuf,
    /// The image file.
    #[arg(long)]
    image: PathBuf,
    /// Soft tokens an image may take (70, 140, 280, 560, 1120; default: the checkpoint's).
    #[arg(long)]
    soft_tokens: Option<usize>,
    /// Encodes timed.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

pub fn run(args: BenchImageArgs) -> anyhow::Result<()> {
    let opts = LoadOptions::default();
    let started = Instant::now();
    let tower = VisionTower::from_safetensors(&args.model, &opts)?
        .with_context(|| format!("{} has no vision_config", args.model.display()))?;
    let load_s = started.elapsed().as_secs_f64();
    let cfg = tower.config();
    let budget = args.soft_tokens.unwrap_or(tower.soft_token_budget());
    let processor = ImageProcessor::new(cfg, budget)?;
    let bytes =
        std::fs::read(&args.image).with_context(|| format!("reading {}", args.image.display()))?;
    let started = Instant::now();
    let patches = processor.process(&bytes, ImageLimits::default())?;
    let process_s = started.elapsed().as_secs_f64();
    let mut times = Vec::new();
    for _ in 0..args.rounds.max(1) {
        let started = Instant::now();
        let encoded = tower.encode(&patches)?;
        times.push(started.elapsed().as_secs_f64());
        anyhow::ensure!(encoded.soft_tokens.dim(0)? == patches.soft_tokens);
    }
    times.sort_by(f64::total_cmp);
    let tokens = patches.soft_tokens + 2;
    println!(
        "tower: {} layers, hidden {}, patch {}, pooling {} ({:.0} MB of weights, loaded in {load_s:.1} s)",
        cfg.num_layers,
        cfg.hidden_size,
        cfg.patch_size,
        cfg.pooling_kernel_size,
        tower.weights_bytes() as f64 / 1e6
    );
    println!(
        "image: {}×{} read at {}×{}: {} patches, {} soft tokens ({tokens} prompt tokens with the markers)",
        patches.original.0,
        patches.original.1,
        patches.size.0,
        patches.size.1,
        patches.positions.len(),
        patches.soft_tokens
    );
    println!(
        "decode and resize {:.1} ms; encode best {:.3} s, median {:.3} s ({:.0} soft tokens/s)",
        process_s * 1e3,
        times[0],
        times[times.len() / 2],
        patches.soft_tokens as f64 / times[0]
    );
    let text = load_hf_config(&args.model.join("config.json"))?;
    // At a conversation's start TurboQuant layers still hold f16 rows until the calibration
    // rows have come; after 4,096 tokens of context the image's tokens are coded.
    const LATER: usize = 4096;
    println!(
        "KV bytes of the image's {tokens} tokens: {:>22} {:>26}",
        "opening a conversation", "after 4,096 tokens of it"
    );
    for p in presets() {
        let policy = CacheSpec::parse(&p.specs.all)?.to_policy();
        let at = |n| estimate_kv_bytes(&text, &policy, n, REWIND_MARGIN);
        let first = at(tokens)?;
        let later = at(LATER + tokens)?.saturating_sub(at(LATER)?);
        println!(
            "  {:<10} {:>12} bytes ({:>5.2} MiB) {:>12} bytes ({:>5.2} MiB)",
            p.label,
            first,
            first as f64 / 1048576.0,
            later,
            later as f64 / 1048576.0
        );
    }
    Ok(())
}
