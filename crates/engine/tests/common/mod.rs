//! Shared helpers for the engine's integration tests: fixture paths and a tiny tokenizer
//! that covers the 512-entry vocabulary of the golden fixtures.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A golden fixture directory.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Characters with their own ids 4.. (so text round-trips through encode/decode).
const CHARS: &str = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'";

/// Writes a Gemma-shaped `tokenizer.json` with `vocab` entries into `dir`: the control
/// tokens at their real ids (0–3, 98, 100, 101, 105, 106), `\n` at 107, single characters
/// from 4 on, and one distinct CJK character for every other id, so every id decodes to
/// exactly one character.
pub fn write_tokenizer(dir: &Path, vocab: usize) -> PathBuf {
    let controls = [
        (0, "<pad>"),
        (1, "<eos>"),
        (2, "<bos>"),
        (3, "<unk>"),
        (98, "<|think|>"),
        (100, "<|channel>"),
        (101, "<channel|>"),
        (105, "<start_of_turn>"),
        (106, "<end_of_turn>"),
    ];
    let mut chars = CHARS.chars();
    let mut map = serde_json::Map::new();
    let mut added = Vec::new();
    for id in 0..vocab as u32 {
        let piece = if let Some((_, c)) = controls.iter().find(|(i, _)| *i == id) {
            added.push(
                serde_json::json!({"id": id, "content": c, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
            );
            (*c).to_owned()
        } else if id == 107 {
            "\n".to_owned()
        } else if let Some(c) = chars.next() {
            c.to_string()
        } else {
            char::from_u32(0x4E00 + id)
                .map(String::from)
                .unwrap_or_default()
        };
        map.insert(piece, id.into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": false, "ignore_merges": false, "vocab": map, "merges": []}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).expect("write tokenizer");
    path
}

/// `golden.safetensors` tensors of a fixture.
pub fn golden(name: &str) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(
        fixture(name).join("golden.safetensors"),
        &candle_core::Device::Cpu,
    )
    .expect("golden")
}

/// An integer tensor as u32 ids.
pub fn ids(t: &candle_core::Tensor) -> Vec<u32> {
    t.to_vec1::<i64>()
        .expect("ids")
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

/// Largest absolute element difference between two tensors of one shape.
pub fn max_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .expect("sub")
        .abs()
        .expect("abs")
        .max_all()
        .expect("max")
        .to_scalar::<f32>()
        .expect("scalar")
}
