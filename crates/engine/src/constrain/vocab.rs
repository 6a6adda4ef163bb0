//! The grammar engine's view of a model's vocabulary: every token id's bytes, with control
//! tokens marked special (a grammar never writes them as text, and names them by id), built
//! once per loaded tokenizer and kept beside it.
//!
//! A byte-level vocabulary's bytes come from llguidance's own reader of a `tokenizer.json`;
//! a SentencePiece one's (Gemma's) are read piece by piece: `▁` is a space, `<0xNN>` its
//! byte. Built on the first constrained request's submitting thread (about a second for
//! Gemma's 262k tokens, most of it llguidance's trie and token slices), never the engine's.

use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::ParserFactory;

use super::{limits, ConstrainError};
use crate::models::Control;
use crate::tokenizer::GemmaTokenizer;

/// The grammar engine for `tokenizer`'s vocabulary (built on first use, then shared).
pub(crate) fn factory(tokenizer: &GemmaTokenizer) -> Result<Arc<ParserFactory>, ConstrainError> {
    tokenizer
        .grammar
        .get_or_init(|| build(tokenizer).map(Arc::new))
        .clone()
}

fn build(tokenizer: &GemmaTokenizer) -> Result<ParserFactory, ConstrainError> {
    let refused =
        |e: String| ConstrainError::Refused(format!("this vocabulary cannot be constrained: {e}"));
    let vocab = tokenizer.vocab_size();
    let mut words = token_bytes(tokenizer.inner(), vocab);
    // Control tokens are special whatever the file marks them (Gemma 4 GGUFs keep some
    // "user-defined"): a grammar's text never matches them.
    for (text, id) in tokenizer.specials() {
        if let Some(w) = words.get_mut(*id as usize) {
            *w = [&[TokTrie::SPECIAL_TOKEN_MARKER][..], text.as_bytes()].concat();
        }
    }
    // A grammar that is done allows only the end of the turn (a stop id).
    let eos = tokenizer
        .control_id(Control::TurnEnd)
        .or_else(|| tokenizer.control_id(Control::Eos))
        .or_else(|| tokenizer.stop_ids().first().copied())
        .ok_or_else(|| refused("it has no end-of-turn token".into()))?;
    let info = TokRxInfo {
        vocab_size: vocab as u32,
        tok_eos: eos,
        tok_bos: tokenizer.control_id(Control::Bos),
        tok_pad: tokenizer.control_id(Control::Pad),
        tok_unk: None,
        tok_end_of_turn: tokenizer.control_id(Control::TurnEnd),
    };
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| refused(e.to_string()))?;
    factory.quiet();
    *factory.limits_mut() = limits();
    Ok(factory)
}

/// Each id's bytes (empty for an id the tokenizer does not know).
fn token_bytes(inner: &tokenizers::Tokenizer, vocab: usize) -> Vec<Vec<u8>> {
    let from_json = serde_json::to_value(inner)
        .ok()
        .and_then(|json| llguidance::token_bytes_from_tokenizer_json(&json).ok());
    let mut words = match from_json {
        Some(w) => w,
        None => (0..vocab as u32)
            .map(|id| {
                inner
                    .id_to_token(id)
                    .map(|p| piece_bytes(&p))
                    .unwrap_or_default()
            })
            .collect(),
    };
    words.resize(vocab, Vec::new());
    words
}

/// A SentencePiece-style piece's bytes.
fn piece_bytes(piece: &str) -> Vec<u8> {
    if piece.len() == 6 && piece.starts_with("<0x") && piece.ends_with('>') {
        if let Ok(b) = u8::from_str_radix(&piece[3..5], 16) {
            return vec![b];
        }
    }
    piece.replace('▁', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Family;

    /// Gemma's 262k pieces read directly are the bytes llguidance's own reader of the
    /// tokenizer's JSON gives, id for id (controls aside: both mark them special here).
    #[test]
    fn gemma_pieces_read_directly_are_llguidances_bytes() {
        let Some(path) = kvlab_assets::require_asset!("gemma-tokenizer") else {
            return;
        };
        let tok = GemmaTokenizer::from_file(&path, Family::Gemma3).expect("tokenizer");
        let vocab = tok.vocab_size();
        let direct = token_bytes(tok.inner(), vocab);
        let json = serde_json::to_value(tok.inner()).expect("json");
        let mut reference = llguidance::token_bytes_from_tokenizer_json(&json).expect("read");
        reference.resize(vocab, Vec::new());
        let specials: std::collections::HashSet<u32> =
            tok.specials().iter().map(|(_, id)| *id).collect();
        let differ: Vec<usize> = (0..vocab)
            .filter(|&id| !specials.contains(&(id as u32)) && direct[id] != reference[id])
            .collect();
        assert!(
            differ.is_empty(),
            "{} ids differ, first {:?}",
            differ.len(),
            &differ[..differ.len().min(5)]
        );
        assert_eq!(vocab, 262_145);
    }
}
