//! A tokenizer built from a GGUF file's own vocabulary (`tokenizer.ggml.*`), for GGUF files
//! that ship without a `tokenizer.json` (nearly all of them). A SentencePiece-style (`llama`)
//! vocabulary, Gemma's among them, becomes the pipeline Hugging Face's converter writes for
//! it: BPE with byte fallback over merges derived from the piece scores, the `" "` → `"▁"`
//! normalizer, control and user-defined pieces as added tokens, and the `▁` / byte-fallback /
//! fuse decoder. On Gemma 3 270M this reproduces the `gemma-tokenizer` asset's vocabulary and
//! merge list exactly (tests/it/tokenizer_gguf_real.rs). candle's `TokenizerFromGguf` builds
//! byte-level (GPT-2) BPE, which would mangle a byte-fallback vocabulary: it is not used.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use super::TokenizerError;

/// SentencePiece's word-start mark: a space inside pieces.
const SPACE_MARK: &str = "▁";

/// The embedding matrix whose rows the vocabulary must match.
const EMBEDDING: &str = "token_embd.weight";

/// What `tokenizer.ggml.token_type` says a piece is (llama.cpp's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// An ordinary piece (also llama.cpp's 0, "undefined").
    Normal,
    /// The unknown-token piece.
    Unknown,
    /// A control token (`<bos>`, `<start_of_turn>`, `<unusedN>` …): never produced from text
    /// by merges, matched whole.
    Control,
    /// A user-defined piece (`\n`, runs of spaces, HTML tags in Gemma): matched whole.
    UserDefined,
    /// A reserved, unused piece.
    Unused,
    /// A byte-fallback piece `<0xNN>`.
    Byte,
}

impl TokenType {
    fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 | 1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// Whether the piece is matched whole in raw text (an added token) rather than built by
    /// merges.
    fn is_added(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
    }
}

/// The vocabulary a GGUF file carries, as its metadata states it.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `llama` for SentencePiece-style vocabularies.
    pub model: String,
    /// The pieces, by id.
    pub tokens: Vec<String>,
    /// Piece scores (merge priority), by id.
    pub scores: Option<Vec<f32>>,
    /// Piece types, by id.
    pub types: Option<Vec<TokenType>>,
    /// Explicit merges (`"left right"`), when the file has them.
    pub merges: Option<Vec<String>>,
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Unknown-piece id.
    pub unk: Option<u32>,
    /// Padding id.
    pub pad: Option<u32>,
    /// Whether encoding with special tokens starts with `<bos>` (llama.cpp's default: yes).
    pub add_bos: bool,
    /// Whether text gets a leading `▁` (SentencePiece's dummy prefix; Gemma: no).
    pub add_space_prefix: bool,
}

fn int(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

fn array<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<Option<&'a [Value]>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(_) => Err(format!("`{key}` is not an array")),
    }
}

/// `key` as an array of `n` items converted by `f` (which names what it expected).
fn per_token<T>(
    md: &HashMap<String, Value>,
    key: &str,
    n: usize,
    f: impl Fn(&Value) -> Option<T>,
    expected: &str,
) -> Result<Option<Vec<T>>, String> {
    let Some(items) = array(md, key)? else {
        return Ok(None);
    };
    if items.len() != n {
        return Err(format!(
            "`{key}` has {} entries for {n} tokens",
            items.len()
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| f(v).ok_or_else(|| format!("`{key}`[{i}] is not {expected}")))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl GgufVocab {
    /// Reads the `tokenizer.ggml.*` keys; the reason is the error when they are missing or
    /// malformed.
    pub fn from_metadata(md: &HashMap<String, Value>) -> Result<Self, String> {
        let model =
            match md.get("tokenizer.ggml.model") {
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err("`tokenizer.ggml.model` is not a string".into()),
                None => return Err(
                    "the file has no vocabulary (`tokenizer.ggml.model`); pass a tokenizer.json"
                        .into(),
                ),
            };
        let tokens: Vec<String> = array(md, "tokenizer.ggml.tokens")?
            .ok_or("the file has no `tokenizer.ggml.tokens`; pass a tokenizer.json")?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(format!("`tokenizer.ggml.tokens`[{i}] is not a string")),
            })
            .collect::<Result<_, _>>()?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(format!("`tokenizer.ggml.tokens` has {n} entries"));
        }
        let scores = per_token(
            md,
            "tokenizer.ggml.scores",
            n,
            |v| match v {
                Value::F32(x) => Some(*x),
                Value::F64(x) => Some(*x as f32),
                _ => None,
            },
            "a number",
        )?;
        let types = per_token(
            md,
            "tokenizer.ggml.token_type",
            n,
            |v| int(v).and_then(TokenType::from_code),
            "a token type (0–6)",
        )?;
        let merges = match array(md, "tokenizer.ggml.merges")? {
            None => None,
            Some(items) => Some(
                items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s.clone()),
                        _ => Err("`tokenizer.ggml.merges` holds a non-string".to_owned()),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let id = |key: &str| -> Result<Option<u32>, String> {
            match md.get(key) {
                None => Ok(None),
                Some(v) => int(v)
                    .and_then(|x| u32::try_from(x).ok())
                    .filter(|&x| (x as usize) < n)
                    .map(Some)
                    .ok_or_else(|| format!("`{key}` is not a token id below {n}")),
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool, String> {
            match md.get(key) {
                None => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(v) => int(v)
                    .map(|x| x != 0)
                    .ok_or_else(|| format!("`{key}` is not a boolean")),
            }
        };
        Ok(GgufVocab {
            model,
            tokens,
            scores,
            types,
            merges,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token", true)?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix", true)?,
        })
    }

    /// The `tokenizers` tokenizer this vocabulary describes.
    pub fn build(&self) -> Result<Tokenizer, String> {
        match self.model.as_str() {
            "llama" => self.build_sentencepiece(),
            // Gemma 4's converter writes its tokenizer.json as `gemma4`: the same byte-fallback
            // BPE over `▁`-marked pieces, with the merges listed (llama.cpp requires them).
            "gemma4" if self.merges.is_some() => self.build_sentencepiece(),
            "gemma4" => Err("`tokenizer.ggml.model` is `gemma4` but the file has no \
                 `tokenizer.ggml.merges`; pass a tokenizer.json"
                .into()),
            other => Err(format!(
                "`tokenizer.ggml.model` is `{other}`; only SentencePiece-style (`llama`, \
                 `gemma4`) vocabularies, which Gemma GGUF files carry, are built here: pass a \
                 tokenizer.json"
            )),
        }
    }

    fn types(&self) -> Vec<TokenType> {
        self.types
            .clone()
            .unwrap_or_else(|| vec![TokenType::Normal; self.tokens.len()])
    }

    /// The pieces as the original SentencePiece model spells them: llama.cpp's converter
    /// writes user-defined pieces with real spaces where the model has `▁`.
    fn pieces(&self, types: &[TokenType]) -> Vec<String> {
        self.tokens
            .iter()
            .zip(types)
            .map(|(piece, ty)| match ty {
                TokenType::UserDefined => piece.replace(' ', SPACE_MARK),
                _ => piece.clone(),
            })
            .collect()
    }

    /// Merge priorities as SentencePiece scored the pieces: llama.cpp writes −1000 for control
    /// and user-defined pieces, which SentencePiece scores 0 (above every ordinary piece).
    fn scores(&self, types: &[TokenType]) -> Vec<f32> {
        let n = self.tokens.len();
        let raw = self.scores.clone().unwrap_or_else(|| vec![0.0; n]);
        raw.into_iter()
            .zip(types)
            .map(|(s, ty)| match ty {
                TokenType::Control | TokenType::UserDefined => 0.0,
                // + 0.0 turns −0.0 into 0.0: the two are one score, as in Python.
                _ if s.is_nan() => f32::NEG_INFINITY,
                _ => s + 0.0,
            })
            .collect()
    }

    fn build_sentencepiece(&self) -> Result<Tokenizer, String> {
        let types = self.types();
        let pieces = self.pieces(&types);
        let merges = match &self.merges {
            Some(list) => list
                .iter()
                .map(|m| {
                    // As llama.cpp splits them: at the first space after the first character,
                    // so a left part that is itself a space survives.
                    m.char_indices()
                        .skip(1)
                        .find(|(_, c)| *c == ' ')
                        .map(|(at, _)| (m[..at].to_owned(), m[at + 1..].to_owned()))
                        .ok_or_else(|| format!("merge `{m}` is not `left right`"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => derive_merges(&pieces, &self.scores(&types)),
        };
        let vocab: Vocab = pieces
            .iter()
            .enumerate()
            .map(|(id, p)| (p.clone(), id as u32))
            .collect();
        let mut bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .fuse_unk(true)
            .byte_fallback(types.contains(&TokenType::Byte));
        if let Some(unk) = self.unk.and_then(|id| pieces.get(id as usize)) {
            bpe = bpe.unk_token(unk.clone());
        }
        let bpe = bpe.build().map_err(|e| format!("BPE model: {e}"))?;
        let mut tok = Tokenizer::new(bpe);

        let replace = Replace::new(" ", SPACE_MARK).map_err(|e| e.to_string())?;
        let normalizer: NormalizerWrapper = if self.add_space_prefix {
            NormalizerSequence::new(vec![Prepend::new(SPACE_MARK.into()).into(), replace.into()])
                .into()
        } else {
            replace.into()
        };
        // The normalizer goes in before the added tokens: setting it later re-normalizes them.
        tok.with_normalizer(Some(normalizer))
            .map_err(|e| e.to_string())?;
        // A no-op after the normalizer (no spaces are left), kept so the pipeline is the one
        // Hugging Face's converter writes for Gemma.
        let split = Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::MergedWithPrevious,
            false,
        )
        .map_err(|e| e.to_string())?;
        tok.with_pre_tokenizer(Some(split));
        let mut decoders: Vec<DecoderWrapper> = vec![
            Replace::new(SPACE_MARK, " ")
                .map_err(|e| e.to_string())?
                .into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ];
        if self.add_space_prefix {
            decoders.push(Strip::new(' ', 1, 0).into());
        }
        tok.with_decoder(Some(DecoderSequence::new(decoders)));
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            tok.with_post_processor(Some(bos_template(&pieces[bos as usize], bos)?));
        }
        let added: Vec<AddedToken> = pieces
            .iter()
            .zip(&types)
            .filter(|(_, ty)| ty.is_added())
            .map(|(piece, ty)| {
                AddedToken::from(piece.clone(), *ty != TokenType::UserDefined).normalized(false)
            })
            .collect();
        tok.add_tokens(added)
            .map_err(|e| format!("added tokens: {e}"))?;
        Ok(tok)
    }
}

/// `<bos> $A` (and `<bos> $A <bos> $B` for pairs), as the converter writes it. Built from JSON
/// so any piece text works (the template string syntax splits on spaces and colons).
fn bos_template(piece: &str, id: u32) -> Result<TemplateProcessing, String> {
    let special =
        |type_id: u32| serde_json::json!({"SpecialToken": {"id": piece, "type_id": type_id}});
    let seq =
        |id: &str, type_id: u32| serde_json::json!({"Sequence": {"id": id, "type_id": type_id}});
    serde_json::from_value(serde_json::json!({
        "type": "TemplateProcessing",
        "single": [special(0), seq("A", 0)],
        "pair": [special(0), seq("A", 0), special(1), seq("B", 1)],
        "special_tokens": {piece: {"id": piece, "ids": [id], "tokens": [piece]}},
    }))
    .map_err(|e| format!("post-processor: {e}"))
}

/// BPE merges equivalent to SentencePiece's score-driven merging, in the order Hugging Face's
/// converter (`generate_merges`) lists them: every split `left + right` of a piece into two
/// pieces, ordered by the merged piece's score (higher first), then longer left part, then
/// longer right part (lengths in characters); ties keep vocabulary order and, within one
/// piece, (left id, right id) order. The order is the merge rank, so it must be exact.
fn derive_merges(pieces: &[String], scores: &[f32]) -> Vec<(String, String)> {
    // Later duplicates win, as in a Python dict built in id order.
    let ids: HashMap<&str, u32> = pieces
        .iter()
        .enumerate()
        .map(|(id, p)| (p.as_str(), id as u32))
        .collect();
    struct Candidate {
        score: f32,
        len_left: usize,
        len_right: usize,
        left: u32,
        right: u32,
    }
    let mut all = Vec::new();
    let mut local = Vec::new();
    for (piece, &score) in pieces.iter().zip(scores) {
        let chars = piece.chars().count();
        local.clear();
        for (len_left, (at, _)) in piece.char_indices().enumerate().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&left), Some(&right)) = (ids.get(l), ids.get(r)) {
                local.push(Candidate {
                    score,
                    len_left,
                    len_right: chars - len_left,
                    left,
                    right,
                });
            }
        }
        local.sort_by_key(|c| (c.left, c.right));
        all.append(&mut local);
    }
    // A stable sort: equal keys keep the order built above.
    all.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.len_left.cmp(&a.len_left))
            .then(b.len_right.cmp(&a.len_right))
    });
    all.into_iter()
        .map(|c| {
            (
                pieces[c.left as usize].clone(),
                pieces[c.right as usize].clone(),
            )
        })
        .collect()
}

/// Whether `path` starts with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// The tokenizer of the GGUF file at `path` (its metadata is read; its tensors are not).
pub fn tokenizer_from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let load = |reason: String| TokenizerError::Load {
        path: path.display().to_string(),
        reason,
    };
    crate::checkpoint::weights::gguf_check::check_file(path)
        .map_err(|e| load(format!("not a readable GGUF file: {e}")))?;
    let file = std::fs::File::open(path).map_err(|e| load(e.to_string()))?;
    let content = Content::read(&mut std::io::BufReader::new(file))
        .map_err(|e| load(format!("not a readable GGUF file: {e}")))?;
    build(&content, path)
}

/// The tokenizer of a GGUF file whose header is `content` (`origin` names it in errors):
/// its vocabulary must have one token per row of the embedding matrix.
pub fn build(content: &Content, origin: &Path) -> Result<Tokenizer, TokenizerError> {
    let started = Instant::now();
    let path = origin.display().to_string();
    let vocab =
        GgufVocab::from_metadata(&content.metadata).map_err(|reason| TokenizerError::Load {
            path: path.clone(),
            reason,
        })?;
    if let Some(info) = content.tensor_infos.get(EMBEDDING) {
        let rows = info.shape.dims().first().copied().unwrap_or(0);
        if rows != vocab.tokens.len() {
            return Err(TokenizerError::VocabMismatch {
                path,
                tokens: vocab.tokens.len(),
                rows,
            });
        }
    }
    let tokenizer = vocab.build().map_err(|reason| TokenizerError::Load {
        path: path.clone(),
        reason,
    })?;
    tracing::debug!(
        "tokenizer built from the GGUF vocabulary of {path} ({} tokens) in {:.0?}",
        vocab.tokens.len(),
        started.elapsed()
    );
    Ok(tokenizer)
}
