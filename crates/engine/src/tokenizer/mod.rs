//! Gemma tokenizer: a `tokenizers::Tokenizer` loaded from `tokenizer.json` or built from a
//! GGUF file's own vocabulary ([`gguf`]), plus the control tokens of a model family, which are
//! emitted and decoded by id (a Gemma 3 tokenizer.json does not know Gemma 4's control
//! strings, and user text must never turn into control ids).

pub mod gguf;
#[cfg(test)]
mod gguf_tests;

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Why tokenization or decoding failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot load tokenizer from {path}: {reason}")]
    Load { path: String, reason: String },
    /// The GGUF's vocabulary cannot be the model's: every id must have an embedding row.
    #[error(
        "{path}: the GGUF vocabulary has {tokens} tokens but its embedding matrix \
         (token_embd.weight) has {rows} rows; the file is inconsistent"
    )]
    VocabMismatch {
        path: String,
        tokens: usize,
        rows: usize,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("token id {0} is outside the vocabulary")]
    UnknownId(u32),
}

fn tk_err(e: tokenizers::Error) -> TokenizerError {
    TokenizerError::Tokenizer(e.to_string())
}

/// A Gemma model family: decides the control tokens and the chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Gemma3,
    Gemma4,
}

/// Control tokens with a fixed meaning in Gemma chats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    Pad,
    Eos,
    Bos,
    /// Opens a turn (`<|turn>` / `<start_of_turn>`).
    TurnStart,
    /// Closes a turn (`<turn|>` / `<end_of_turn>`).
    TurnEnd,
    /// Opens a channel such as the thinking channel (Gemma 4 only).
    ChannelStart,
    /// Closes a channel (Gemma 4 only).
    ChannelEnd,
    /// Switches thinking on in the system turn (Gemma 4 only).
    Think,
}

const GEMMA3_CONTROLS: &[(Control, &str, u32)] = &[
    (Control::Pad, "<pad>", 0),
    (Control::Eos, "<eos>", 1),
    (Control::Bos, "<bos>", 2),
    (Control::TurnStart, "<start_of_turn>", 105),
    (Control::TurnEnd, "<end_of_turn>", 106),
];

const GEMMA4_CONTROLS: &[(Control, &str, u32)] = &[
    (Control::Pad, "<pad>", 0),
    (Control::Eos, "<eos>", 1),
    (Control::Bos, "<bos>", 2),
    (Control::Think, "<|think|>", 98),
    (Control::ChannelStart, "<|channel>", 100),
    (Control::ChannelEnd, "<channel|>", 101),
    (Control::TurnStart, "<|turn>", 105),
    (Control::TurnEnd, "<turn|>", 106),
];

impl Family {
    /// (control, text, id) for every control token of the family.
    pub fn controls(self) -> &'static [(Control, &'static str, u32)] {
        match self {
            Family::Gemma3 => GEMMA3_CONTROLS,
            Family::Gemma4 => GEMMA4_CONTROLS,
        }
    }

    /// Id of `control`, if the family has it.
    pub fn id(self, control: Control) -> Option<u32> {
        self.controls()
            .iter()
            .find(|(c, _, _)| *c == control)
            .map(|(_, _, id)| *id)
    }

    /// Text of `control`, if the family has it.
    pub fn text(self, control: Control) -> Option<&'static str> {
        self.controls()
            .iter()
            .find(|(c, _, _)| *c == control)
            .map(|(_, text, _)| *text)
    }

    /// The control token with id `id`, if any.
    pub fn control_of(self, id: u32) -> Option<(Control, &'static str)> {
        self.controls()
            .iter()
            .find(|(_, _, i)| *i == id)
            .map(|(c, text, _)| (*c, *text))
    }

    /// Ids that end a generated turn: `<eos>` and the end-of-turn token.
    pub fn stop_ids(self) -> [u32; 2] {
        [1, 106]
    }

    /// Whether the family has a thinking channel.
    pub fn supports_thinking(self) -> bool {
        self == Family::Gemma4
    }
}

/// Text or a control token: what chat templates render to before tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Control(Control),
    Text(String),
}

/// A Gemma tokenizer for one model family.
pub struct GemmaTokenizer {
    inner: tokenizers::Tokenizer,
    family: Family,
    /// Cached: `tokenizers` recounts added tokens on every call.
    vocab_size: usize,
}

impl GemmaTokenizer {
    /// Loads `path`: a `tokenizer.json`, or a GGUF file whose own vocabulary
    /// (`tokenizer.ggml.*`) becomes the tokenizer (see [`gguf`]).
    pub fn from_file(path: &Path, family: Family) -> Result<Self, TokenizerError> {
        if gguf::is_gguf(path) {
            return Ok(Self::wrap(gguf::tokenizer_from_file(path)?, family));
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Self::wrap(inner, family))
    }

    /// Wraps a `tokenizers` tokenizer built elsewhere (e.g. [`gguf::build`]).
    pub fn from_tokenizer(inner: tokenizers::Tokenizer, family: Family) -> Self {
        Self::wrap(inner, family)
    }

    fn wrap(inner: tokenizers::Tokenizer, family: Family) -> Self {
        let vocab_size = inner.get_vocab_size(true);
        Self {
            inner,
            family,
            vocab_size,
        }
    }

    /// Loads a `tokenizer.json` held in memory.
    pub fn from_bytes(bytes: &[u8], family: Family) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError::Load {
            path: "<memory>".into(),
            reason: e.to_string(),
        })?;
        Ok(Self::wrap(inner, family))
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids of `text` as plain text, preceded by `<bos>` when `bos` is set. Control strings of
    /// the family inside `text` are not given control ids by this wrapper.
    pub fn encode(&self, text: &str, bos: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(tk_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if bos {
            ids.extend(self.family.id(Control::Bos));
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Ids of rendered segments: control tokens by id, text through the tokenizer.
    pub fn encode_segments(&self, segments: &[Segment]) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        for seg in segments {
            match seg {
                Segment::Control(c) => ids.extend(self.family.id(*c)),
                Segment::Text(t) if t.is_empty() => {}
                Segment::Text(t) => ids.extend(self.encode(t, false)?),
            }
        }
        Ok(ids)
    }

    /// Ids of a string in which the family's control strings (e.g. `<|turn>`) stand for
    /// their control tokens and everything else is text.
    pub fn encode_with_controls(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_segments(&split_controls(self.family, text))
    }

    /// Text of `ids`: control tokens appear as the family's strings (or are dropped when
    /// `skip_controls`), everything else is decoded by the tokenizer.
    pub fn decode(&self, ids: &[u32], skip_controls: bool) -> Result<String, TokenizerError> {
        let mut out = String::new();
        let mut run_start = 0;
        for (i, &id) in ids.iter().enumerate() {
            if let Some((_, text)) = self.family.control_of(id) {
                out.push_str(&self.decode_plain(&ids[run_start..i])?);
                if !skip_controls {
                    out.push_str(text);
                }
                run_start = i + 1;
            }
        }
        out.push_str(&self.decode_plain(&ids[run_start..])?);
        Ok(out)
    }

    /// The tokenizer's own decoding of ids that are not family controls.
    fn decode_plain(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        let size = self.vocab_size as u32;
        if let Some(&bad) = ids.iter().find(|&&id| id >= size) {
            return Err(TokenizerError::UnknownId(bad));
        }
        self.inner.decode(ids, false).map_err(tk_err)
    }

    /// The vocabulary piece of `id` (family control strings for control ids).
    pub fn piece(&self, id: u32) -> Option<String> {
        match self.family.control_of(id) {
            Some((_, text)) => Some(text.to_owned()),
            None => self.inner.id_to_token(id),
        }
    }
}

/// Splits `text` at the family's control strings.
pub fn split_controls(family: Family, text: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let next = family
            .controls()
            .iter()
            .filter_map(|(c, s, _)| rest.find(s).map(|at| (at, *c, s.len())))
            .min_by_key(|(at, _, len)| (*at, usize::MAX - len));
        match next {
            Some((at, control, len)) => {
                if at > 0 {
                    out.push(Segment::Text(rest[..at].to_owned()));
                }
                out.push(Segment::Control(control));
                rest = &rest[at + len..];
            }
            None => {
                if !rest.is_empty() {
                    out.push(Segment::Text(rest.to_owned()));
                }
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_tables_match_the_docs() {
        let g4 = Family::Gemma4;
        assert_eq!(g4.id(Control::TurnStart), Some(105));
        assert_eq!(g4.id(Control::TurnEnd), Some(106));
        assert_eq!(g4.id(Control::ChannelStart), Some(100));
        assert_eq!(g4.id(Control::ChannelEnd), Some(101));
        assert_eq!(g4.id(Control::Think), Some(98));
        assert_eq!(g4.id(Control::Bos), Some(2));
        assert_eq!(g4.id(Control::Eos), Some(1));
        assert_eq!(g4.text(Control::TurnStart), Some("<|turn>"));
        let g3 = Family::Gemma3;
        assert_eq!(g3.text(Control::TurnStart), Some("<start_of_turn>"));
        assert_eq!(g3.text(Control::TurnEnd), Some("<end_of_turn>"));
        assert_eq!(g3.id(Control::ChannelStart), None);
        assert_eq!(
            g3.control_of(106),
            Some((Control::TurnEnd, "<end_of_turn>"))
        );
        assert_eq!(g3.stop_ids(), [1, 106]);
        assert_eq!(g4.stop_ids(), [1, 106]);
    }

    #[test]
    fn split_controls_finds_every_marker() {
        let segs = split_controls(Family::Gemma4, "<bos><|turn>user\nhi<turn|>\n");
        assert_eq!(
            segs,
            [
                Segment::Control(Control::Bos),
                Segment::Control(Control::TurnStart),
                Segment::Text("user\nhi".into()),
                Segment::Control(Control::TurnEnd),
                Segment::Text("\n".into()),
            ]
        );
        // Gemma 3 does not treat Gemma 4 markers as controls.
        assert_eq!(
            split_controls(Family::Gemma3, "<|turn>"),
            [Segment::Text("<|turn>".into())]
        );
        assert_eq!(
            serde_json::to_string(&Family::Gemma4).unwrap(),
            "\"gemma4\""
        );
    }

    #[test]
    fn bad_tokenizer_json_is_an_error() {
        assert!(matches!(
            GemmaTokenizer::from_bytes(b"{not json", Family::Gemma3),
            Err(TokenizerError::Load { .. })
        ));
        assert!(matches!(
            GemmaTokenizer::from_file(Path::new("/nonexistent/tokenizer.json"), Family::Gemma3),
            Err(TokenizerError::Load { .. })
        ));
    }
}

/// A tiny Gemma-shaped tokenizer (single characters + byte fallback + the Gemma 3 added
/// tokens at their real ids) for unit tests that must not need the real 33 MB file.
#[cfg(test)]
pub(crate) fn tiny(family: Family) -> GemmaTokenizer {
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    let push = |piece: String, vocab: &mut serde_json::Map<String, serde_json::Value>| {
        let id = vocab.len();
        vocab.insert(piece, id.into());
    };
    for id in 0..110u32 {
        let piece = match id {
            0 => "<pad>".to_owned(),
            1 => "<eos>".to_owned(),
            2 => "<bos>".to_owned(),
            3 => "<unk>".to_owned(),
            105 => "<start_of_turn>".to_owned(),
            106 => "<end_of_turn>".to_owned(),
            107 => "\n".to_owned(),
            _ => format!("<unused{id}>"),
        };
        if matches!(id, 0..=3 | 105 | 106) {
            added.push(
                serde_json::json!({"id": id, "content": piece, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
            );
        }
        push(piece, &mut vocab);
    }
    for b in 0..=255u8 {
        push(format!("<0x{b:02X}>"), &mut vocab);
    }
    let chars = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'";
    for c in chars.chars() {
        push(c.to_string(), &mut vocab);
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": []}
    });
    match GemmaTokenizer::from_bytes(json.to_string().as_bytes(), family) {
        Ok(t) => t,
        Err(e) => panic!("tiny tokenizer: {e}"),
    }
}

#[cfg(test)]
mod tiny_tests {
    use super::*;

    #[test]
    fn tiny_tokenizer_round_trips_with_byte_fallback() {
        let t = tiny(Family::Gemma4);
        let ids = t.encode("naïve 🙂", true).unwrap();
        assert_eq!(ids[0], 2);
        // bos, "na", "ï" as two byte pieces, "ve▁", "🙂" as four.
        assert_eq!(ids.len(), 1 + 2 + 2 + 3 + 4);
        assert_eq!(t.decode(&ids, true).unwrap(), "naïve 🙂");
        assert_eq!(t.decode(&ids, false).unwrap(), "<bos>naïve 🙂");
        let ids = t.encode_with_controls("<|turn>hi<turn|>").unwrap();
        assert_eq!(ids.first(), Some(&105));
        assert_eq!(ids.last(), Some(&106));
        assert_eq!(t.decode(&ids, false).unwrap(), "<|turn>hi<turn|>");
        assert_eq!(t.piece(100).as_deref(), Some("<|channel>"));
        assert!(matches!(
            t.decode(&[5_000_000], false),
            Err(TokenizerError::UnknownId(5_000_000))
        ));
    }
}
