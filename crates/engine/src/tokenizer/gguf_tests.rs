//! The GGUF vocabulary builder on tiny GGUF files written here: merges follow the scores,
//! user-defined pieces get their `▁` back, bytes fall back, text round-trips, and a file
//! whose vocabulary disagrees with its embedding matrix is refused with a clear error.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::gguf::{self, GgufVocab, TokenType};
use super::{Family, GemmaTokenizer, TokenizerError};

/// (piece as the GGUF stores it, score, llama.cpp token type).
fn pieces() -> Vec<(String, f32, i32)> {
    let mut v: Vec<(String, f32, i32)> = vec![
        ("<pad>".into(), -1000.0, 3),
        ("<eos>".into(), -1000.0, 3),
        ("<bos>".into(), -1000.0, 3),
        ("<unk>".into(), -1000.0, 3),
        ("\n".into(), -1000.0, 4),
        // llama.cpp writes user-defined pieces with real spaces; the model has "▁▁".
        ("  ".into(), -1000.0, 4),
    ];
    for b in 0..=255u32 {
        v.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
        ("ll", -5.0),
        ("or", -8.0),
        ("ld", -9.0),
        ("he", -10.0),
        ("▁w", -12.0),
        ("llo", -20.0),
        ("▁wor", -25.0),
        ("hello", -30.0),
        ("▁world", -35.0),
        // "abc": both merges apply; the higher-scored piece ("bc") must win.
        ("ab", -40.0),
        ("bc", -39.0),
    ] {
        v.push((piece.into(), score, 1));
    }
    v
}

fn id(piece: &str) -> u32 {
    pieces()
        .iter()
        .position(|(p, _, _)| p == piece)
        .unwrap_or_else(|| panic!("no piece {piece:?}")) as u32
}

/// Writes a GGUF with the vocabulary above (changed by `edit`) and an embedding of `rows`
/// rows.
fn write_gguf(dir: &Path, rows: usize, edit: impl FnOnce(&mut Vec<(String, Value)>)) -> PathBuf {
    let p = pieces();
    let mut md: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String("gemma3".into()),
        ),
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(p.iter().map(|(s, _, _)| Value::String(s.clone())).collect()),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(p.iter().map(|(_, s, _)| Value::F32(*s)).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(p.iter().map(|(_, _, t)| Value::I32(*t)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.unknown_token_id".into(), Value::U32(3)),
        ("tokenizer.ggml.padding_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)),
        ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false)),
    ];
    edit(&mut md);
    let embd = QTensor::quantize(
        &Tensor::zeros((rows, 4), DType::F32, &Device::Cpu).unwrap(),
        GgmlDType::F32,
    )
    .unwrap();
    let path = dir.join("tiny.gguf");
    let mut file = std::fs::File::create(&path).unwrap();
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &md_refs, &[("token_embd.weight", &embd)]).unwrap();
    path
}

/// A change to the metadata before it is written.
type Edit = dyn FnOnce(&mut Vec<(String, Value)>);

fn tiny() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(dir.path(), pieces().len(), |_| {});
    (dir, path)
}

fn set(md: &mut [(String, Value)], key: &str, value: Value) {
    if let Some(slot) = md.iter_mut().find(|(k, _)| k == key) {
        slot.1 = value;
    }
}

#[test]
fn merges_follow_the_scores_and_text_round_trips() {
    let (_dir, path) = tiny();
    assert!(gguf::is_gguf(&path));
    let tok = GemmaTokenizer::from_file(&path, Family::Gemma3).unwrap();
    assert_eq!(tok.vocab_size(), pieces().len());
    let ids = tok.encode("hello world", false).unwrap();
    assert_eq!(ids, [id("hello"), id("▁world")]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "hello world");
    // "bc" outscores "ab", so it is merged first and "ab" can no longer form.
    assert_eq!(tok.encode("abc", false).unwrap(), [id("a"), id("bc")]);
    // <bos> first when asked for, by the wrapper and by the tokenizer's own post-processor.
    assert_eq!(tok.encode("he", true).unwrap(), [2, id("he")]);
    assert_eq!(
        tok.inner().encode("he", true).unwrap().get_ids(),
        [2, id("he")]
    );
}

#[test]
fn user_defined_pieces_and_bytes_behave_like_the_sentencepiece_model() {
    let (_dir, path) = tiny();
    let tok = GemmaTokenizer::from_file(&path, Family::Gemma3).unwrap();
    // Two spaces are the user-defined piece 5 ("▁▁" in the model, "  " in the file), which
    // scores above every ordinary merge.
    let ids = tok.encode("hello  world", false).unwrap();
    assert_eq!(ids, [id("hello"), 5, id("w"), id("or"), id("ld")]);
    assert_eq!(tok.piece(5).as_deref(), Some("▁▁"));
    // "\n" is matched whole; "é" falls back to its two UTF-8 bytes.
    let ids = tok.encode("he\né", false).unwrap();
    assert_eq!(ids, [id("he"), 4, id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "he\né");
    let text = "hello world\n\n  abc ☃ done";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
}

#[test]
fn metadata_is_read_with_its_types_and_ids() {
    let (_dir, path) = tiny();
    let file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut std::io::BufReader::new(file)).unwrap();
    let vocab = GgufVocab::from_metadata(&content.metadata).unwrap();
    assert_eq!(vocab.model, "llama");
    assert_eq!(vocab.tokens.len(), pieces().len());
    assert_eq!(
        (vocab.bos, vocab.eos, vocab.unk, vocab.pad),
        (Some(2), Some(1), Some(3), Some(0))
    );
    assert!(vocab.add_bos && !vocab.add_space_prefix);
    let types = vocab.types.as_deref().unwrap();
    assert_eq!(
        (types[0], types[4], types[6], types[262]),
        (
            TokenType::Control,
            TokenType::UserDefined,
            TokenType::Byte,
            TokenType::Normal
        )
    );
}

#[test]
fn a_space_prefix_vocabulary_prepends_and_strips_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(dir.path(), pieces().len(), |md| {
        set(md, "tokenizer.ggml.add_space_prefix", Value::Bool(true))
    });
    let tok = GemmaTokenizer::from_file(&path, Family::Gemma3).unwrap();
    let ids = tok.encode("world", false).unwrap();
    assert_eq!(ids, [id("▁world")]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "world");
}

#[test]
fn explicit_merges_are_used_as_given() {
    let dir = tempfile::tempdir().unwrap();
    // Only "he" may merge: "hello" stays in pieces even though the vocabulary has it.
    let path = write_gguf(dir.path(), pieces().len(), |md| {
        md.push((
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![Value::String("h e".into())]),
        ))
    });
    let tok = GemmaTokenizer::from_file(&path, Family::Gemma3).unwrap();
    assert_eq!(
        tok.encode("hello", false).unwrap(),
        [id("he"), id("l"), id("l"), id("o")]
    );
}

#[test]
fn a_vocabulary_that_disagrees_with_the_embedding_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let n = pieces().len();
    let path = write_gguf(dir.path(), n + 7, |_| {});
    let err = GemmaTokenizer::from_file(&path, Family::Gemma3)
        .expect_err("a mismatched vocabulary must not load");
    match &err {
        TokenizerError::VocabMismatch { tokens, rows, .. } => {
            assert_eq!((*tokens, *rows), (n, n + 7))
        }
        other => panic!("unexpected {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("token_embd.weight") && text.contains(&format!("{}", n + 7)),
        "{text}"
    );
}

#[test]
fn missing_or_foreign_vocabularies_are_clear_load_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Box<Edit>, &str)> = vec![
        (
            Box::new(|md| md.retain(|(k, _)| !k.starts_with("tokenizer."))),
            "no vocabulary",
        ),
        (
            Box::new(|md| set(md, "tokenizer.ggml.model", Value::String("gpt2".into()))),
            "`gpt2`",
        ),
        (
            Box::new(|md| {
                set(
                    md,
                    "tokenizer.ggml.scores",
                    Value::Array(vec![Value::F32(0.0)]),
                )
            }),
            "`tokenizer.ggml.scores` has 1 entries",
        ),
        (
            Box::new(|md| set(md, "tokenizer.ggml.bos_token_id", Value::U32(1_000_000))),
            "`tokenizer.ggml.bos_token_id` is not a token id",
        ),
    ];
    for (edit, expected) in cases {
        let path = write_gguf(dir.path(), pieces().len(), edit);
        match GemmaTokenizer::from_file(&path, Family::Gemma3) {
            Err(TokenizerError::Load { reason, .. }) => {
                assert!(reason.contains(expected), "{reason}")
            }
            Err(other) => panic!("unexpected {other}"),
            Ok(_) => panic!("{expected}: loaded"),
        }
    }
    // A file that is not GGUF is read as tokenizer.json, and fails as one.
    let json = dir.path().join("tokenizer.json");
    std::fs::write(&json, b"GGU").unwrap();
    assert!(!gguf::is_gguf(&json));
    assert!(matches!(
        GemmaTokenizer::from_file(&json, Family::Gemma3),
        Err(TokenizerError::Load { .. })
    ));
}
