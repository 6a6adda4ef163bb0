//! How every model-taking command opens its model, written once: `--model`, `--tokenizer`,
//! `--device` and `--weights` ([`ModelArgs`]), resolved to local files, loaded with the
//! loader's warnings printed, with the tokenizer the engine itself would build (the file's
//! own template and stops). One `--device` parser ([`parse_device`]) for every command.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::contract::DeviceChoice;
use kvlab_engine::contract::WeightsChoice;
use kvlab_engine::hub::ResolvedModel;
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::Checkpoint;
use kvlab_engine::lab::GemmaTokenizer;
use kvlab_engine::lab::{preferred_dtype, select_device};
use kvlab_engine::lab::{Model, PrecisionPolicy};
use kvlab_engine::{LoadOptions, ModelSource};

/// The loader's warnings, one `warning: …` line each on stderr.
pub fn print_warnings(warnings: &[String]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// Options shared by the commands that load a model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A model file or directory, a Hugging Face repo (`owner/name[@rev]`), or an asset
    /// name (`gemma3-270m`, also `asset:gemma3-270m`).
    #[arg(long, default_value = kvlab_assets::DEFAULT_MODEL)]
    pub model: String,
    /// The tokenizer.json to use (default: beside the model; for a GGUF file without one,
    /// the vocabulary inside the file).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Device: cpu, auto, metal, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// How a safetensors checkpoint's matrices are held, quantized while loading: q4_k,
    /// q8_0, f16, bf16 or f32 (default: q8_0 on the CPU, bf16 on a GPU). GGUF files keep
    /// their own types.
    #[arg(long)]
    pub weights: Option<WeightsChoice>,
    /// The vision tower's mmproj GGUF for a GGUF model (default: the one `mmproj*.gguf`
    /// beside it; a safetensors checkpoint carries its own).
    #[arg(long)]
    pub mmproj: Option<PathBuf>,
}

impl ModelArgs {
    /// Device and dtype for the load.
    pub fn load_options(&self) -> anyhow::Result<LoadOptions> {
        let device = select_device(parse_device(&self.device)?)?;
        Ok(LoadOptions {
            dtype: preferred_dtype(&device),
            weights: self
                .weights
                .unwrap_or_else(|| WeightsChoice::default_for(&device)),
            device,
        })
    }

    /// Loads the model at `weights` with these options and prints the loader's warnings
    /// (assumptions made, keys ignored) on stderr, as every model-taking command does.
    pub fn load(&self, weights: &Path) -> anyhow::Result<Model> {
        let model = Model::load(weights, &self.load_options()?)
            .with_context(|| format!("loading {}", weights.display()))?;
        print_warnings(&model.config().warnings);
        Ok(model)
    }

    /// Loads the model on `engine`'s thread with the cache `policy` for `context` tokens,
    /// showing the load's byte progress on stderr; prints the card's warnings.
    pub fn load_into(
        &self,
        engine: &kvlab_engine::EngineHandle,
        policy: PrecisionPolicy,
        context: usize,
    ) -> anyhow::Result<kvlab_engine::contract::ModelCard> {
        let request = kvlab_engine::LoadRequest {
            source: self.source()?,
            tokenizer: self.tokenizer.clone(),
            options: self.load_options()?,
            cache: kvlab_engine::contract::CacheSelection::Spec(policy.spec_string()),
            context,
            mmproj: self.mmproj.clone(),
        };
        let card = engine
            .submit(request)
            .and_then(|ticket| {
                ticket.wait(|ev| {
                    if let kvlab_engine::contract::Event::Loading {
                        phase,
                        done: Some(d),
                        total: Some(t),
                    } = ev
                    {
                        eprint!("\r{phase:?} {d}/{t} bytes");
                    }
                    true
                })
            })
            .with_context(|| format!("loading {}", self.model))?;
        print_warnings(&card.warnings);
        Ok(card)
    }

    /// The model source, asset names resolved to their files.
    pub fn source(&self) -> anyhow::Result<ModelSource> {
        crate::asset_names::model_source(&self.model)
    }

    /// The model's local files: Hub repositories downloaded, the tokenizer found (or
    /// `--tokenizer`).
    pub fn resolve(&self) -> anyhow::Result<ResolvedModel> {
        let never = AtomicBool::new(false);
        self.source()?
            .resolve(self.tokenizer.as_deref(), &mut |_| {}, &never)
            .with_context(|| format!("locating {}", self.model))
    }

    /// The model's weights file or folder only (Hub repositories downloaded), for commands
    /// that need no tokenizer.
    pub fn weights(&self) -> anyhow::Result<PathBuf> {
        let never = AtomicBool::new(false);
        self.source()?
            .weights(&mut |_| {}, &never)
            .with_context(|| format!("locating {}", self.model))
    }

    /// Resolves, loads, and builds the tokenizer the engine would (the checkpoint's own
    /// template and stops), printing every warning.
    pub fn open(&self) -> anyhow::Result<OpenedModel> {
        let resolved = self.resolve()?;
        let checkpoint = Checkpoint::open(&resolved.weights, &self.load_options()?)
            .with_context(|| format!("opening {}", resolved.weights.display()))?;
        let model = Model::from_checkpoint(&checkpoint)
            .with_context(|| format!("loading {}", resolved.weights.display()))?;
        print_warnings(&model.config().warnings);
        let (tokenizer, warnings) =
            GemmaTokenizer::for_checkpoint(&resolved.tokenizer, &checkpoint, &resolved.name)?;
        print_warnings(&warnings);
        Ok(OpenedModel { model, tokenizer })
    }
}

/// A model opened by [`ModelArgs::open`].
pub struct OpenedModel {
    /// The loaded model.
    pub model: Model,
    /// Its tokenizer, as the engine builds it.
    pub tokenizer: GemmaTokenizer,
}

/// Parses `--device`: cpu, auto, metal, cuda or cuda:N.
pub fn parse_device(s: &str) -> anyhow::Result<DeviceChoice> {
    Ok(match s {
        "cpu" => DeviceChoice::Cpu,
        "auto" => DeviceChoice::Auto,
        "metal" => DeviceChoice::Metal,
        "cuda" => DeviceChoice::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => DeviceChoice::Cuda(i),
            _ => bail!("unknown --device `{other}` (cpu, auto, metal, cuda, cuda:N)"),
        },
    })
}

/// The SPECs a `--kv` list names, `presets` expanded to every preset of the app's menu
/// (`kvlab fidelity` and `kvlab bench decode`).
pub fn kv_specs(list: &str) -> anyhow::Result<Vec<CacheSpec>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "presets" {
            for p in kvlab_engine::contract::presets() {
                out.push(CacheSpec::parse(&p.specs.all)?);
            }
        } else {
            out.push(CacheSpec::parse(item).with_context(|| format!("bad --kv `{item}`"))?);
        }
    }
    if out.is_empty() {
        bail!("--kv names no cache");
    }
    Ok(out)
}

/// The caches of a `--kv` list, each with its canonical SPEC: comma-separated SPECs
/// (`presets` for every preset of the menu on all layers), or `;`-separated ones that may give
/// layers formats of their own (`presets;tq3+qw@all,17=f16`), each labelled `NAME:` if named.
pub fn kv_list(list: &str) -> anyhow::Result<Vec<(String, PrecisionPolicy)>> {
    if !list.contains(';') {
        return Ok(kv_specs(list)?
            .iter()
            .map(|s| (s.to_string(), s.to_policy()))
            .collect());
    }
    let mut out = Vec::new();
    for item in list.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "presets" {
            out.extend(kv_list(item)?);
        } else {
            // `NAME:SPEC` names a cache (a SPEC has no colon): a chart's label for a long
            // per-layer SPEC.
            let (name, spec) = match item.split_once(':') {
                Some((name, spec)) => (Some(name.trim()), spec.trim()),
                None => (None, item),
            };
            let policy = kv_policy(spec)?;
            let label = name.map_or_else(|| policy.spec_string(), str::to_string);
            out.push((label, policy));
        }
    }
    if out.is_empty() {
        bail!("--kv names no cache");
    }
    Ok(out)
}

/// Parses a `--kv` SPEC (`f16`, `bf16`, `f32`, `tq4`, …, or with layers of their own:
/// `tq3@all,0-1=q8_0`) into a cache policy.
pub fn kv_policy(spec: &str) -> anyhow::Result<PrecisionPolicy> {
    kvlab_engine::lab::parse_policy(spec).with_context(|| format!("bad --kv `{spec}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_expand_to_every_menu_preset() {
        let all = kv_specs("presets").unwrap();
        assert_eq!(all.len(), kvlab_engine::contract::presets().len());
        assert!(all.iter().any(|s| s.to_string() == "f16"));
        assert_eq!(kv_specs("f16, tq4").unwrap().len(), 2);
        assert!(kv_specs("tq9").is_err());
        assert!(kv_specs("").is_err());
    }
}
