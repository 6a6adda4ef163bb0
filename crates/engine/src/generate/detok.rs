//! Incremental detokenization: turns a stream of token ids into text deltas whose
//! concatenation equals decoding all ids at once. A character split over several
//! byte-fallback tokens is held back until it is complete, so no delta ends mid-character.
//!
//! Why not `tokenizers`' own `DecodeStream`: it streams the same deltas, but it has no end of
//! stream, so the bytes of a character cut off by a stop or `max_tokens` are lost instead of
//! shown (as U+FFFD), and it borrows the tokenizer for the whole generation. The test
//! `decode_stream_agrees_but_loses_a_cut_character` keeps that comparison honest.

use crate::tokenizer::{GemmaTokenizer, TokenizerError};

const REPLACEMENT: char = '\u{FFFD}';

/// Streaming decoder state for one run of text tokens (no control tokens).
///
/// It decodes a small window `ids[prefix..]` and compares it with the already-emitted part
/// `ids[prefix..read]`, the classic scheme that also keeps leading spaces right for
/// tokenizers that strip them at the start of a decode.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `id` and returns the text it completes, if any.
    pub fn push(
        &mut self,
        tok: &GemmaTokenizer,
        id: u32,
    ) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let done = tok.decode(&self.ids[self.prefix..self.read], false)?;
        let all = tok.decode(&self.ids[self.prefix..], false)?;
        // A trailing U+FFFD means the last character's bytes are still arriving.
        if all.len() > done.len() && !all.ends_with(REPLACEMENT) {
            if let Some(delta) = all.get(done.len()..) {
                let delta = delta.to_owned();
                self.prefix = self.read;
                self.read = self.ids.len();
                self.compact();
                return Ok(Some(delta));
            }
        }
        Ok(None)
    }

    /// Text still held back (bytes that never formed a character, shown as U+FFFD); resets.
    pub fn finish(&mut self, tok: &GemmaTokenizer) -> Result<Option<String>, TokenizerError> {
        let done = tok.decode(&self.ids[self.prefix..self.read], false)?;
        let all = tok.decode(&self.ids[self.prefix..], false)?;
        self.reset();
        Ok(all
            .get(done.len()..)
            .filter(|d| !d.is_empty())
            .map(str::to_owned))
    }

    /// Whether ids are held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        self.read < self.ids.len()
    }

    pub fn reset(&mut self) {
        self.ids.clear();
        self.prefix = 0;
        self.read = 0;
    }

    /// Drops ids before the window so memory stays bounded in long generations.
    fn compact(&mut self) {
        if self.prefix > 64 {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Family;
    use crate::tokenizer::tiny;

    /// Pushes every id, collecting deltas; returns (deltas, held-back flags after each id).
    pub(crate) fn stream(tok: &GemmaTokenizer, ids: &[u32]) -> (Vec<String>, String) {
        let mut d = Detokenizer::new();
        let mut deltas = Vec::new();
        for &id in ids {
            if let Some(s) = d.push(tok, id).unwrap() {
                deltas.push(s);
            }
        }
        if let Some(s) = d.finish(tok).unwrap() {
            deltas.push(s);
        }
        let joined = deltas.concat();
        (deltas, joined)
    }

    #[test]
    fn multibyte_text_round_trips_token_by_token() {
        let tok = tiny(Family::Gemma3);
        let text = "naïve café 東京 🙂 ok";
        let ids = tok.encode(text, false).unwrap();
        assert!(
            ids.len() > text.chars().count(),
            "expected byte-fallback pieces"
        );
        let (deltas, joined) = stream(&tok, &ids);
        assert_eq!(joined, text);
        assert!(deltas.iter().all(|d| !d.contains(REPLACEMENT)));
        // Whole characters only: "🙂" arrives as one delta after its 4th byte.
        assert!(deltas.iter().any(|d| d == "🙂"), "{deltas:?}");
        assert!(deltas.iter().any(|d| d == "東"), "{deltas:?}");
    }

    #[test]
    fn held_back_bytes_wait_then_complete() {
        let tok = tiny(Family::Gemma3);
        let ids = tok.encode("é", false).unwrap();
        assert_eq!(ids.len(), 2);
        let mut d = Detokenizer::new();
        assert_eq!(d.push(&tok, ids[0]).unwrap(), None);
        assert!(d.has_pending());
        assert_eq!(d.push(&tok, ids[1]).unwrap().as_deref(), Some("é"));
        assert!(!d.has_pending());
    }

    #[test]
    fn an_incomplete_character_is_flushed_as_replacement_at_the_end() {
        let tok = tiny(Family::Gemma3);
        let ids = tok.encode("a🙂", false).unwrap();
        let (_, joined) = stream(&tok, &ids[..ids.len() - 1]);
        assert_eq!(joined, format!("a{REPLACEMENT}{REPLACEMENT}{REPLACEMENT}"));
    }

    #[test]
    fn long_streams_stay_exact_across_compaction() {
        let tok = tiny(Family::Gemma3);
        let text = "über straße 🙂 ".repeat(40);
        let ids = tok.encode(&text, false).unwrap();
        assert_eq!(stream(&tok, &ids).1, text);
    }

    #[test]
    fn decode_stream_agrees_but_loses_a_cut_character() {
        let tok = tiny(Family::Gemma3);
        let text = "naïve café 東京 🙂 ok";
        let ids = tok.encode(text, false).unwrap();
        let theirs = |ids: &[u32]| -> String {
            let mut stream = tok.inner().decode_stream(false);
            ids.iter()
                .filter_map(|&id| stream.step(id).unwrap())
                .collect()
        };
        // Same text on complete input...
        assert_eq!(theirs(&ids), stream(&tok, &ids).1);
        // ...but a character cut short at the end vanishes from theirs.
        let cut = tok.encode("a🙂", false).unwrap();
        let cut = &cut[..cut.len() - 1];
        assert_eq!(theirs(cut), "a");
        assert_eq!(
            stream(&tok, cut).1,
            format!("a{REPLACEMENT}{REPLACEMENT}{REPLACEMENT}")
        );
    }
}
