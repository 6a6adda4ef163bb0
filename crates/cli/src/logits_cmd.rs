//! `kvlab logits`: all-position logits of a token-id file under a chunk schedule, written as
//! safetensors, for parity checks against reference implementations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use kvlab_engine::lab::{chunked_logits, ChunkSchedule};

use crate::model_args::{kv_policy, ModelArgs};
use kvlab_engine::contract::WeightsChoice;

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A .safetensors file with an integer tensor `input_ids` ([T] or [1, T], i64 or i32).
    #[arg(long)]
    input_ids: PathBuf,
    /// Chunk sizes: the first once, then the rest cycling (default: one chunk).
    #[arg(long)]
    schedule: Option<String>,
    /// KV cache SPEC.
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Output .safetensors file; gets the f32 tensor `logits` [T, vocab].
    #[arg(long)]
    out: PathBuf,
    /// An image whose soft tokens fill the image's places in `input_ids` (the one run of
    /// as many identical ids as the image makes soft tokens), by the checkpoint's vision
    /// tower (a GGUF model takes it from --mmproj). Runs the ids as one chunk.
    #[arg(long, conflicts_with = "schedule")]
    image: Option<PathBuf>,
}

/// The soft tokens of `image` by the model's tower, and where in `ids` they go.
fn image_soft_tokens(
    model_args: &ModelArgs,
    weights: &Path,
    ids: &[u32],
    image: &Path,
) -> anyhow::Result<kvlab_engine::lab::SoftSpan> {
    use kvlab_engine::contract::ImageProcessor;
    use kvlab_engine::lab::VisionTower;
    let opts = model_args.load_options()?;
    let tower = match &model_args.mmproj {
        Some(mmproj) => VisionTower::from_mmproj(mmproj, &opts)?,
        None => VisionTower::from_safetensors(weights, &opts)?.with_context(|| {
            format!(
                "{} has no vision tower (a GGUF model names its mmproj with --mmproj)",
                weights.display()
            )
        })?,
    };
    let bytes = std::fs::read(image).with_context(|| format!("reading {}", image.display()))?;
    let patches = ImageProcessor::new(tower.config(), tower.soft_token_budget())?
        .process(&bytes, kvlab_engine::contract::ImageLimits::default())?;
    let n = patches.soft_tokens;
    // The image's places: a run of exactly n identical ids.
    let mut at = None;
    let mut start = 0;
    for i in 1..=ids.len() {
        if i == ids.len() || ids[i] != ids[start] {
            if i - start == n {
                if at.is_some() {
                    bail!("input_ids has more than one run of {n} identical ids for the image");
                }
                at = Some(start);
            }
            start = i;
        }
    }
    let at = at.with_context(|| {
        format!("input_ids has no run of {n} identical ids for the image's {n} soft tokens")
    })?;
    let rows = tower.encode(&patches)?.soft_tokens;
    eprintln!(
        "image {}: {n} soft tokens at position {at}",
        image.display()
    );
    Ok(kvlab_engine::lab::SoftSpan { at, rows })
}

/// Reads `input_ids` from a safetensors file as u32 ids.
pub fn read_input_ids(path: &Path) -> anyhow::Result<Vec<u32>> {
    let tensors = candle_core::safetensors::load(path, &Device::Cpu)
        .with_context(|| format!("reading {}", path.display()))?;
    let t = tensors
        .get("input_ids")
        .with_context(|| format!("{} has no tensor `input_ids`", path.display()))?;
    let t = match t.dims() {
        [_] => t.clone(),
        [1, _] => t.squeeze(0)?,
        d => bail!("input_ids has shape {d:?}; expected [T] or [1, T]"),
    };
    let wide: Vec<i64> = match t.dtype() {
        DType::I64 => t.to_vec1::<i64>()?,
        DType::I32 => t.to_vec1::<i32>()?.into_iter().map(i64::from).collect(),
        DType::U32 => t.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
        other => bail!("input_ids is {other:?}; expected an integer tensor (i64 or i32)"),
    };
    wide.into_iter()
        .map(|x| u32::try_from(x).with_context(|| format!("token id {x} is negative or too large")))
        .collect()
}

pub fn run(args: LogitsArgs) -> anyhow::Result<()> {
    let ids = read_input_ids(&args.input_ids)?;
    if ids.is_empty() {
        bail!("input_ids is empty");
    }
    let schedule = match &args.schedule {
        Some(s) => ChunkSchedule::parse(s)?,
        None => ChunkSchedule::uniform(ids.len()),
    };
    let weights = args.model.weights()?;
    // Logits are for comparing with a reference: dense weights unless `--weights` says
    // otherwise (the device default would quantize a safetensors checkpoint).
    let mut model_args = args.model.clone();
    model_args.weights.get_or_insert(WeightsChoice::F32);
    let model = model_args.load(&weights)?;
    let mut cache = model.new_cache(&kv_policy(&args.kv)?)?;
    let logits = match &args.image {
        Some(image) => {
            let span = image_soft_tokens(&model_args, &weights, &ids, image)?;
            model.forward_with(&ids, &[span], &mut cache, kvlab_engine::lab::Logits::All)?
        }
        None => chunked_logits(&model, &mut cache, &ids, &schedule)?,
    }
    .to_dtype(DType::F32)?
    .to_device(&Device::Cpu)?;
    let map: HashMap<String, Tensor> = HashMap::from([("logits".to_owned(), logits)]);
    candle_core::safetensors::save(&map, &args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote logits [{}, {}] to {} (chunks {:?})",
        ids.len(),
        model.config().vocab_size,
        args.out.display(),
        schedule.chunks(ids.len())
    );
    Ok(())
}
