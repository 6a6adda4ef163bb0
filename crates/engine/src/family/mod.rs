//! The model families KV Lab runs, and every fact that differs between them: the control
//! tokens the engine reads and writes (by their text: ids come from the loaded vocabulary),
//! what ends a turn, the thinking channel's markers, the built-in chat template an instruct
//! checkpoint without one falls back to, and the names the checkpoint formats give the
//! architecture. Adding a family means a module here implementing [`FamilyFacts`], plus its
//! weight names in the loaders; nothing else matches on [`Family`].

mod gemma3;
mod gemma4;

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
    /// The published chat template, used only for an instruct checkpoint that ships none.
    fn fallback_template(&self) -> &'static str;
    /// Whether GGUF files of this family carry RoPE frequency factors (`rope_freqs.weight`)
    /// that say which pairs rotate (Gemma 4's proportional RoPE).
    fn rope_freq_factors(&self) -> bool;
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

#[cfg(test)]
mod tests {
    use super::*;

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
