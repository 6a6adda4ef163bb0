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

/// A minimal Gemma 3 GGUF with a vocabulary (one layer, hidden 32, 64 tokens) that declares
/// `blocks` layers.
pub fn write_tiny_gguf(path: &Path, blocks: u32) {
    write_tiny_gguf_as(path, "gemma3", blocks);
}

/// [`write_tiny_gguf`] with its metadata under architecture `arch` (`general.architecture`
/// and the `{arch}.*` keys): one layer, 2 heads, 1 kv head, head_dim 16.
pub fn write_tiny_gguf_as(path: &Path, arch: &str, blocks: u32) {
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{DType, Device, Tensor};
    let dev = Device::Cpu;
    let (h, v, ff, hd) = (32usize, 64usize, 64usize, 16usize);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut add = |name: &str, dims: &[usize]| {
        let t = Tensor::ones(dims, DType::F32, &dev).expect("ones");
        let q = QTensor::quantize(&t, GgmlDType::F32).expect("q");
        tensors.push((name.to_string(), q));
    };
    add("token_embd.weight", &[v, h]);
    add("output_norm.weight", &[h]);
    for (n, d) in [
        ("attn_norm.weight", vec![h]),
        ("attn_q.weight", vec![2 * hd, h]),
        ("attn_k.weight", vec![hd, h]),
        ("attn_v.weight", vec![hd, h]),
        ("attn_output.weight", vec![h, 2 * hd]),
        ("attn_q_norm.weight", vec![hd]),
        ("attn_k_norm.weight", vec![hd]),
        ("post_attention_norm.weight", vec![h]),
        ("ffn_norm.weight", vec![h]),
        ("ffn_gate.weight", vec![ff, h]),
        ("ffn_up.weight", vec![ff, h]),
        ("ffn_down.weight", vec![h, ff]),
        ("post_ffw_norm.weight", vec![h]),
    ] {
        add(&format!("blk.0.{n}"), &d);
    }
    let pieces: Vec<Value> = (0..v).map(|i| Value::String(format!("t{i}"))).collect();
    let md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), Value::U32(blocks)),
        (format!("{arch}.embedding_length"), Value::U32(h as u32)),
        (format!("{arch}.feed_forward_length"), Value::U32(ff as u32)),
        (format!("{arch}.attention.head_count"), Value::U32(2)),
        (format!("{arch}.attention.head_count_kv"), Value::U32(1)),
        (
            format!("{arch}.attention.key_length"),
            Value::U32(hd as u32),
        ),
        (format!("{arch}.attention.sliding_window"), Value::U32(4)),
        (format!("{arch}.context_length"), Value::U32(128)),
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(pieces)),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(vec![Value::F32(0.0); v]),
        ),
    ];
    let mut f = std::fs::File::create(path).expect("create");
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &md_refs, &t_refs).expect("write gguf");
}

/// The default conversation as the engine reports it.
pub fn default_conversation(
    engine: &kvlab_engine::EngineHandle,
) -> kvlab_engine::contract::ConversationInfo {
    let id = kvlab_engine::contract::ConversationId::default_id();
    engine
        .status()
        .conversations
        .into_iter()
        .find(|c| c.id == id)
        .expect("the default conversation")
}

/// Serves HTTP on a free local port, each connection on its own thread through `answer`;
/// returns the endpoint URL (`http://127.0.0.1:PORT`). The listener lives as long as the
/// test process.
pub fn serve_http(answer: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let url = format!("http://{}", listener.local_addr().expect("local address"));
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let answer = std::sync::Arc::clone(&answer);
            std::thread::spawn(move || answer(conn));
        }
    });
    url
}
