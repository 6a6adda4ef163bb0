//! The model families KV Lab runs, and every fact that differs between them: the control
//! tokens the engine reads and writes (by their text: ids come from the loaded vocabulary),
//! what ends a turn, the thinking channel's markers, the built-in chat template an instruct
//! checkpoint without one falls back to, and the names the checkpoint formats give the
//! architecture, and how its GGUF files describe it (`<family>/gguf.rs`). Each family is a
//! folder here implementing [`FamilyFacts`]; the decoder they share is [`common`]. Adding a
//! family means a folder here, plus its `config.json` and weight names in the loaders.

pub mod common;
mod gemma3;
mod gemma4;
pub mod vision;

use crate::contract::Family;

/// Every family.
pub const FAMILIES: [Family; 2] = [Family::Gemma3, Family::Gemma4];

/// Control tokens with a fixed meaning in a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    Pad,
    Eos,
    Bos,
    /// Opens a turn (`<|turn>` / `<start_of_turn>`).
    TurnStart,
    /// Closes a turn (`<turn|>` / `<end_of_turn>`).
    TurnEnd,
    /// Opens a channel such as the thinking channel.
    ChannelStart,
    /// Closes a channel.
    ChannelEnd,
    /// Switches thinking on in the system turn.
    Think,
    /// Opens a tool call (`<|tool_call>`).
    ToolCallStart,
    /// Closes a tool call (`<tool_call|>`).
    ToolCallEnd,
    /// Quotes a string inside a tool call (`<|"|>`).
    Quote,
    /// Hands a turn over to the tools' answers after its calls (`<|tool_response>`).
    ToolResponse,
    /// Where the template puts an image (`<|image|>`, also each of its soft tokens' place).
    Image,
}

/// What a family knows about itself.
pub trait FamilyFacts: Sync {
    /// Lower-case name (`gemma4`), as GGUF files name the architecture.
    fn name(&self) -> &'static str;
    /// The name people write (`Gemma 4`), shown on the card.
    fn display_name(&self) -> &'static str;
    /// Hugging Face `model_type` values of the family.
    fn hf_model_types(&self) -> &'static [&'static str];
    /// The text of every control token the engine reads or writes.
    fn controls(&self) -> &'static [(Control, &'static str)];
    /// Texts of the tokens that end a generated turn, besides the file's end-of-sequence
    /// ids (Gemma 4's generation config also stops on `<|tool_response>`, where a tool call
    /// hands over).
    fn end_of_turn(&self) -> &'static [&'static str];
    /// Whether the family has a thinking channel (opened by [`Control::ChannelStart`] and
    /// the channel name, closed by [`Control::ChannelEnd`], switched on by
    /// [`Control::Think`]).
    fn thinks(&self) -> bool;
    /// Whether the family writes tool calls in a syntax the engine reads back
    /// ([`crate::chat::tools::parse_call`], between [`Control::ToolCallStart`] and
    /// [`Control::ToolCallEnd`]).
    fn tool_calls(&self) -> bool;
    /// The published chat template, used only for an instruct checkpoint that ships none.
    fn fallback_template(&self) -> &'static str;
    /// Whether GGUF files of this family carry RoPE frequency factors (`rope_freqs.weight`)
    /// that say which pairs rotate (Gemma 4's proportional RoPE).
    fn rope_freq_factors(&self) -> bool;
    /// How its decoder differs from the plain Gemma layer stack.
    fn decoder(&self) -> DecoderTraits;
}

/// How a family's decoder differs from the plain Gemma layer stack. The configuration
/// readers and resolver read these instead of asking which family it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderTraits {
    /// The last layer attends to the whole sequence whatever the config says
    /// (transformers forces it for Gemma 4).
    pub last_layer_full: bool,
    /// Attention logits are not scaled (scale 1: the query and key norms carry it) instead of
    /// 1/√`query_pre_attn_scalar`.
    pub unit_attention_scale: bool,
    /// Values are RMS-normalized (without weights) before they are cached.
    pub v_norm: bool,
    /// Each layer's output is multiplied by a learned scalar.
    pub layer_scalar: bool,
    /// What `config.json` checkpoints store RMSNorm weights offset by (Gemma 3 stores w − 1).
    pub norm_weight_offset: f64,
    /// Whether a config may switch on Gemma 4's extensions: per-layer inputs, a mixture of
    /// experts, wider full-layer heads, keys reused as values, KV shared across layers,
    /// double-wide MLPs on the sharing layers.
    pub extensions: bool,
}

impl Family {
    /// The family's facts.
    pub fn facts(self) -> &'static dyn FamilyFacts {
        match self {
            Family::Gemma3 => &gemma3::Gemma3,
            Family::Gemma4 => &gemma4::Gemma4,
        }
    }

    /// The family GGUF files name `arch` (`general.architecture`).
    pub fn from_gguf_arch(arch: &str) -> Option<Family> {
        FAMILIES.into_iter().find(|f| f.facts().name() == arch)
    }

    /// The family of a Hugging Face `model_type`.
    pub fn from_hf_model_type(model_type: &str) -> Option<Family> {
        FAMILIES
            .into_iter()
            .find(|f| f.facts().hf_model_types().contains(&model_type))
    }

    /// The text of `control`, if the family has it.
    pub fn text(self, control: Control) -> Option<&'static str> {
        self.facts()
            .controls()
            .iter()
            .find(|(c, _)| *c == control)
            .map(|(_, t)| *t)
    }

    /// Whether the family has a thinking channel.
    pub fn supports_thinking(self) -> bool {
        self.facts().thinks()
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.facts().name())
    }
}

/// Every architecture name the checkpoint formats may give a family the engine runs
/// (`gemma3, gemma3_text, …`), for messages.
pub(crate) fn supported_architectures() -> String {
    let mut names: Vec<&str> = FAMILIES
        .iter()
        .flat_map(|f| {
            std::iter::once(f.facts().name()).chain(f.facts().hf_model_types().iter().copied())
        })
        .collect();
    names.dedup();
    names.join(", ")
}

/// The configuration a GGUF file describes, read by its family's rules.
pub(crate) fn gguf_config(
    header: crate::checkpoint::config::gguf::GgufHeader<'_>,
) -> crate::error::Result<crate::checkpoint::config::resolve::RawConfig> {
    match header.family() {
        Family::Gemma3 => gemma3::gguf::raw_config(header),
        Family::Gemma4 => gemma4::gguf::raw_config(header),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_architecture_is_told_every_name_the_engine_reads() {
        let e = crate::error::EngineError::UnsupportedArchitecture("llama".into());
        assert_eq!(
            e.to_string(),
            "unsupported architecture `llama` (supported: gemma3, gemma3_text, gemma4, gemma4_text)"
        );
        // Gemma 3 checkpoints in config.json store norm weights less one; Gemma 4's do not.
        assert_eq!(Family::Gemma3.facts().decoder().norm_weight_offset, 1.0);
        assert!(Family::Gemma4.facts().decoder().extensions);
    }

    #[test]
    fn names_and_control_texts() {
        assert_eq!(Family::from_gguf_arch("gemma4"), Some(Family::Gemma4));
        assert_eq!(Family::from_gguf_arch("llama"), None);
        assert_eq!(
            Family::from_hf_model_type("gemma3_text"),
            Some(Family::Gemma3)
        );
        assert_eq!(Family::Gemma4.text(Control::TurnStart), Some("<|turn>"));
        assert_eq!(Family::Gemma4.text(Control::Think), Some("<|think|>"));
        assert_eq!(Family::Gemma3.text(Control::TurnEnd), Some("<end_of_turn>"));
        assert_eq!(Family::Gemma3.text(Control::ChannelStart), None);
        assert_eq!(
            Family::Gemma4.facts().end_of_turn(),
            ["<turn|>", "<|tool_response>"]
        );
        assert!(Family::Gemma4.supports_thinking() && !Family::Gemma3.supports_thinking());
        assert_eq!(
            serde_json::to_string(&Family::Gemma4).unwrap(),
            "\"gemma4\""
        );
        assert_eq!(Family::Gemma3.to_string(), "gemma3");
    }
}
