//! The tokenizer built from the Gemma 3 270M GGUF's own vocabulary against the
//! `gemma-tokenizer` asset (Hugging Face's tokenizer.json for the same vocabulary): the same
//! model (vocabulary, 514,906 merges in rank order, options) and pipeline, the same ids on all
//! of Alice and all of Paradise Lost, and decoding back to the same text. Needs the offline
//! assets (see `kvlab_assets::require_or_skip`).

use std::time::Instant;

use candle_core::quantized::gguf_file;
use kvlab_assets::require_asset;
use kvlab_engine::contract::Family;
use kvlab_engine::lab::GemmaTokenizer;

fn json(tok: &GemmaTokenizer) -> serde_json::Value {
    let text = tok.inner().to_string(false).expect("serialize");
    serde_json::from_str(&text).expect("parse")
}

#[test]
fn the_gguf_vocabulary_builds_the_asset_tokenizer() {
    let (Some(gguf), Some(asset)) = (
        require_asset!("gemma3-270m"),
        require_asset!("gemma-tokenizer"),
    ) else {
        return;
    };
    // What the model-load path pays: reading the GGUF header, then building the tokenizer.
    let started = Instant::now();
    let file = std::fs::File::open(&gguf).expect("open");
    let content = gguf_file::Content::read(&mut std::io::BufReader::new(file)).expect("header");
    let read = started.elapsed();
    let inner = kvlab_engine::lab::build_gguf_tokenizer(&content, &gguf).expect("build");
    let total = started.elapsed();
    let built = GemmaTokenizer::from_tokenizer(inner, Family::Gemma3).expect("wrap");
    let started = Instant::now();
    let reference = GemmaTokenizer::from_file(&asset, Family::Gemma3).expect("asset tokenizer");
    println!(
        "GGUF tokenizer: header read {read:.2?}, built {:.2?}, total {total:.2?} \
         (tokenizer.json load: {:.2?})",
        total - read,
        started.elapsed()
    );
    let (ours, theirs) = (json(&built), json(&reference));
    // The BPE model whole: vocabulary, the merge list in rank order, unk, byte fallback.
    assert_eq!(
        ours["model"]["merges"].as_array().map(Vec::len),
        Some(514_906)
    );
    assert!(ours["model"] == theirs["model"], "BPE models differ");
    for part in ["normalizer", "pre_tokenizer", "post_processor", "decoder"] {
        assert_eq!(ours[part], theirs[part], "{part}");
    }
    // Added tokens: the same pieces at the same ids, matched on raw text. The asset also has
    // <image_soft_token> (262144), past the GGUF's 262,144-row embedding, and flags a few
    // pieces "special" differently, which only matters to decoding with specials skipped.
    let added = |v: &serde_json::Value| -> Vec<(u64, String, bool)> {
        v["added_tokens"]
            .as_array()
            .expect("added tokens")
            .iter()
            .filter(|t| t["id"].as_u64().is_some_and(|id| id < 262_144))
            .map(|t| {
                (
                    t["id"].as_u64().unwrap_or(u64::MAX),
                    t["content"].as_str().unwrap_or_default().to_owned(),
                    t["normalized"].as_bool().unwrap_or(true),
                )
            })
            .collect()
    };
    let ours_added = added(&ours);
    assert_eq!(ours_added.len(), 6414);
    assert_eq!(ours_added, added(&theirs));
    assert_eq!(built.vocab_size(), 262_144);
    assert_eq!(
        built.encode("The capital of France is", true).unwrap(),
        [2, 818, 5279, 529, 7001, 563]
    );
}

#[test]
fn alice_and_paradise_lost_tokenize_identically_and_round_trip() {
    let (Some(gguf), Some(asset), Some(alice), Some(paradise)) = (
        require_asset!("gemma3-270m"),
        require_asset!("gemma-tokenizer"),
        require_asset!("alice"),
        require_asset!("paradise-lost"),
    ) else {
        return;
    };
    let built = GemmaTokenizer::from_file(&gguf, Family::Gemma3).expect("tokenizer from GGUF");
    let reference = GemmaTokenizer::from_file(&asset, Family::Gemma3).expect("asset tokenizer");
    for (name, path, at_least) in [
        ("alice", alice, 35_000),
        ("paradise-lost", paradise, 120_000),
    ] {
        let text = std::fs::read_to_string(&path).expect("text");
        let ids = built.encode(&text, false).expect("encode");
        let expected = reference.encode(&text, false).expect("encode");
        println!("{name}: {} tokens, {} bytes", ids.len(), text.len());
        assert!(ids.len() >= at_least, "{name}: {} tokens", ids.len());
        if let Some(i) = ids.iter().zip(&expected).position(|(a, b)| a != b) {
            panic!(
                "{name}: first difference at token {i}: {:?} vs {:?}",
                &ids[i..(i + 5).min(ids.len())],
                &expected[i..(i + 5).min(expected.len())]
            );
        }
        assert_eq!(ids.len(), expected.len(), "{name}");
        let back = built.decode(&ids, false).expect("decode");
        assert!(back == text, "{name}: decoding does not give the text back");
        assert!(back == reference.decode(&expected, false).expect("decode"));
    }
}
