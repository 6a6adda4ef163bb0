//! Gemma 4 (E2B, E4B, 31B, 26B-A4B): `<|turn>`/`<turn|>` turns, a thinking channel
//! `<|channel>thought\n…<channel|>` switched on by `<|think|>` in the system turn, and a stop
//! on `<|tool_response>` besides the end of the turn.

pub(crate) mod gguf;

use super::{Control, DecoderTraits, FamilyFacts};

/// Gemma 4's facts.
pub struct Gemma4;

const CONTROLS: &[(Control, &str)] = &[
    (Control::Pad, "<pad>"),
    (Control::Eos, "<eos>"),
    (Control::Bos, "<bos>"),
    (Control::Think, "<|think|>"),
    (Control::ChannelStart, "<|channel>"),
    (Control::ChannelEnd, "<channel|>"),
    (Control::TurnStart, "<|turn>"),
    (Control::TurnEnd, "<turn|>"),
    (Control::ToolCallStart, "<|tool_call>"),
    (Control::ToolCallEnd, "<tool_call|>"),
    (Control::Quote, "<|\"|>"),
    (Control::ToolResponse, "<|tool_response>"),
    (Control::Image, "<|image|>"),
];

impl FamilyFacts for Gemma4 {
    fn name(&self) -> &'static str {
        "gemma4"
    }
    fn display_name(&self) -> &'static str {
        "Gemma 4"
    }
    fn hf_model_types(&self) -> &'static [&'static str] {
        &["gemma4", "gemma4_text"]
    }
    fn controls(&self) -> &'static [(Control, &'static str)] {
        CONTROLS
    }
    fn end_of_turn(&self) -> &'static [&'static str] {
        &["<turn|>", "<|tool_response>"]
    }
    fn thinks(&self) -> bool {
        true
    }
    fn tool_calls(&self) -> bool {
        true
    }
    /// The E2B/E4B template as published on Jul 14, 2026 (the 26B-A4B/31B one adds an empty
    /// thought channel after the generation prompt when thinking is off).
    fn fallback_template(&self) -> &'static str {
        include_str!("chat_template.jinja")
    }
    fn rope_freq_factors(&self) -> bool {
        true
    }
    fn decoder(&self) -> DecoderTraits {
        DecoderTraits {
            last_layer_full: true,
            unit_attention_scale: true,
            v_norm: true,
            layer_scalar: true,
            norm_weight_offset: 0.0,
            extensions: true,
        }
    }
}
