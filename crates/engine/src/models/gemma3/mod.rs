//! Gemma 3: `<start_of_turn>`/`<end_of_turn>` turns, the system prompt folded into the first
//! user turn, roles alternating, no thinking channel.

pub(crate) mod gguf;

use super::{Control, DecoderTraits, FamilyFacts};

/// Gemma 3's facts.
pub struct Gemma3;

const CONTROLS: &[(Control, &str)] = &[
    (Control::Pad, "<pad>"),
    (Control::Eos, "<eos>"),
    (Control::Bos, "<bos>"),
    (Control::TurnStart, "<start_of_turn>"),
    (Control::TurnEnd, "<end_of_turn>"),
];

impl FamilyFacts for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }
    fn display_name(&self) -> &'static str {
        "Gemma 3"
    }
    fn hf_model_types(&self) -> &'static [&'static str] {
        &["gemma3", "gemma3_text"]
    }
    fn controls(&self) -> &'static [(Control, &'static str)] {
        CONTROLS
    }
    fn end_of_turn(&self) -> &'static [&'static str] {
        &["<end_of_turn>"]
    }
    fn thinks(&self) -> bool {
        false
    }
    fn tool_calls(&self) -> bool {
        false
    }
    /// The Gemma 3 instruct template (transformers' conversion script).
    fn fallback_template(&self) -> &'static str {
        include_str!("chat_template.jinja")
    }
    fn rope_freq_factors(&self) -> bool {
        false
    }
    fn decoder(&self) -> DecoderTraits {
        DecoderTraits {
            last_layer_full: false,
            unit_attention_scale: false,
            v_norm: false,
            layer_scalar: false,
            norm_weight_offset: 1.0,
            extensions: false,
        }
    }
}
