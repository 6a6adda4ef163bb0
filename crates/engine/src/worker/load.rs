//! Loading a model on the engine thread: resolved, admitted against memory, its weights
//! and tokenizer read, with progress events; the previous model kept on failure.

use std::sync::Arc;

use super::error::LoadError;
use super::{lock, CancelToken, EventSink, LoadRequest};
use crate::budget::Plan;
use crate::card::inspect;
use crate::checkpoint::source::ModelSource;
use crate::contract::ModelCard;
use crate::contract::{Event, LoadPhase};
use crate::kv::PrecisionPolicy;
use crate::models::common::Model;
use crate::tokenizer::GemmaTokenizer;

use super::run::{Loaded, Worker};

impl Worker {
    pub(super) fn load(
        &mut self,
        request: LoadRequest,
        policy: PrecisionPolicy,
        sink: &mut EventSink,
        cancel: &CancelToken,
    ) -> Result<ModelCard, LoadError> {
        sink(loading(LoadPhase::Resolving));
        let resolved = request.source.resolve(
            request.tokenizer.as_deref(),
            &mut |e| sink(e),
            cancel.flag(),
        )?;
        sink(loading(LoadPhase::Weights));
        let inspection = inspect(&resolved.weights, &request.options).map_err(LoadError::Model)?;
        self.admit_load(&inspection, &request, &policy, &resolved.name)?;
        let model = Model::from_checkpoint(&inspection.checkpoint).map_err(LoadError::Model)?;
        let mut card = inspection.card;
        card.name = resolved.name.clone();
        card.weights_bytes = model.weights_bytes() as u64;
        card.weights_measured = true;
        sink(loading(LoadPhase::Tokenizer));
        let (tokenizer, warnings) = GemmaTokenizer::for_checkpoint(
            &resolved.tokenizer,
            &inspection.checkpoint,
            &resolved.name,
        )?;
        // The checkpoint's headers go now; the model holds its weights.
        drop(inspection.checkpoint);
        let vision = load_vision(&resolved.weights, &request, &tokenizer, &mut card);
        // The tower's weights are the model's too: the card, the status and the timeline
        // count what is held.
        card.weights_bytes += vision
            .as_ref()
            .map_or(0, |v| v.tower.weights_bytes() as u64);
        // What loaded decides: a template that cannot be used leaves a base model.
        card.has_chat_template = Some(tokenizer.template().is_some());
        card.supports_thinking = tokenizer.supports_thinking();
        card.warnings.extend(warnings);
        // Only now does the previous model go: a failed load loses nothing. Its
        // conversations' caches go to their files first, each its own.
        self.save_all(true);
        self.pool.clear();
        self.policy = policy;
        self.loaded = Some(Loaded {
            weights: resolved.weights.clone(),
            config: Arc::new(model.config().clone()),
            model,
            tokenizer: Arc::new(tokenizer),
            card: card.clone(),
            vision,
        });
        Ok(card)
    }

    /// Refuses a load whose weights and KV cache (at the request's context) would not fit the
    /// memory available, before a weight is read.
    pub(super) fn admit_load(
        &self,
        inspection: &crate::card::Inspection,
        request: &LoadRequest,
        policy: &PrecisionPolicy,
        name: &str,
    ) -> Result<(), LoadError> {
        let max = inspection.card.max_context;
        let context = if max > 0 {
            request.context.min(max)
        } else {
            request.context
        };
        let fit = Plan {
            allocated: false,
            config: inspection.checkpoint.config(),
            weights_bytes: inspection.card.weights_bytes,
            held_kv_bytes: 0,
            context,
            policy,
            rewind_margin: self.rewind_margin(),
        }
        .fit(&lock(&self.shared.budget))
        .map_err(LoadError::Model)?;
        if fit.fits {
            return Ok(());
        }
        let mut message = fit.message(&format!("load {name}"));
        if self.loaded.is_some() {
            message.push_str(" (the model loaded now stays loaded)");
        }
        Err(LoadError::OutOfMemory(message))
    }
}

/// The model's vision tower, when it has one: a safetensors checkpoint's own, or the
/// mmproj GGUF the request names or that lies beside a GGUF model (`mmproj*.gguf`). A tower
/// that cannot be used leaves a text model and a warning on the card.
fn load_vision(
    weights: &std::path::Path,
    request: &LoadRequest,
    tokenizer: &GemmaTokenizer,
    card: &mut ModelCard,
) -> Option<super::run::Vision> {
    use crate::checkpoint::weights::WeightsChoice;
    use crate::models::vision::preprocess::Processor;
    use crate::models::vision::VisionTower;
    // The tower stays dense, as llama.cpp's mmproj files are (f16/f32): it is a small part
    // of the model, and a q8_0 one moved the tiny random fixture's logits by 4.9.
    let mut options = request.options.clone();
    if matches!(options.weights, WeightsChoice::Q4K | WeightsChoice::Q8_0) {
        options.weights = if options.device.is_cpu() {
            WeightsChoice::F32
        } else {
            WeightsChoice::Bf16
        };
    }
    let gguf = weights
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let found = if !gguf {
        VisionTower::from_safetensors(weights, &options)
            .map(|t| t.map(|t| (t, "the checkpoint".to_string())))
    } else {
        let path = request.mmproj.clone().or_else(|| mmproj_beside(weights));
        match path {
            Some(p) => {
                VisionTower::from_mmproj(&p, &options).map(|t| Some((t, p.display().to_string())))
            }
            None => Ok(None),
        }
    };
    let (tower, source) = match found {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(e) => {
            card.warnings
                .push(format!("the vision tower was not loaded: {e}"));
            return None;
        }
    };
    let tokens = tower.tokens().or_else(|| {
        let id = |t: &str| tokenizer.piece_id(t);
        Some(crate::models::vision::config::ImageTokens {
            begin: id("<|image>")?,
            soft: tokenizer.control_id(crate::models::Control::Image)?,
            end: id("<image|>")?,
        })
    });
    let Some(tokens) = tokens else {
        card.warnings
            .push("the vision tower was not loaded: the vocabulary has no image tokens".into());
        return None;
    };
    let processor = match Processor::new(tower.config(), tower.soft_token_budget()) {
        Ok(p) => p,
        Err(e) => {
            card.warnings
                .push(format!("the vision tower was not loaded: {e}"));
            return None;
        }
    };
    card.vision = Some(crate::contract::VisionCard {
        source,
        weights_bytes: tower.weights_bytes() as u64,
        max_soft_tokens: processor.max_soft_tokens,
    });
    Some(super::run::Vision {
        tower,
        facts: crate::images::ImageFacts { tokens, processor },
    })
}

/// The mmproj GGUF beside a GGUF model: the one file named `mmproj*.gguf` in its folder.
fn mmproj_beside(model: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = model.parent()?;
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.to_ascii_lowercase().starts_with("mmproj") && n.ends_with(".gguf")
            })
        })
        .collect();
    found.sort();
    (found.len() == 1).then(|| found.remove(0))
}

fn loading(phase: LoadPhase) -> Event {
    Event::Loading {
        phase,
        done: None,
        total: None,
    }
}

/// What a status bar shows for a model being loaded.
pub(super) fn source_label(source: &ModelSource) -> String {
    if let ModelSource::Local { path } = source {
        return path.display().to_string();
    }
    if let ModelSource::Hub { repo, .. } = source {
        return repo.clone();
    }
    format!("{source:?}")
}
