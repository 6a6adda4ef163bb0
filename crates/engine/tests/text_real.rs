//! Text pipeline against the real Gemma tokenizer (asset `gemma-tokenizer`): known ids,
//! templates tokenized like a whole-string encode, and exact streaming detokenization.
//! Needs the offline assets (see `kvlab_assets::require_or_skip`).

use kvlab_assets::require_asset;
use kvlab_engine::chat::{ChatOptions, ChatTemplate, Message};
use kvlab_engine::detok::Detokenizer;
use kvlab_engine::stream::{Delta, StreamSplitter};
use kvlab_engine::tokenizer::{Family, GemmaTokenizer};

fn tokenizer(family: Family) -> Option<GemmaTokenizer> {
    let path = require_asset!("gemma-tokenizer")?;
    Some(GemmaTokenizer::from_file(&path, family).expect("tokenizer loads"))
}

#[test]
fn known_prompt_ids() {
    let Some(tok) = tokenizer(Family::Gemma3) else {
        return;
    };
    assert_eq!(tok.vocab_size(), 262_145);
    assert_eq!(
        tok.encode("The capital of France is", true).unwrap(),
        [2, 818, 5279, 529, 7001, 563]
    );
    // The tokenizer's own post-processor agrees on the leading <bos>.
    let enc = tok
        .inner()
        .encode("The capital of France is", true)
        .unwrap();
    assert_eq!(enc.get_ids(), [2, 818, 5279, 529, 7001, 563]);
    assert_eq!(tok.piece(818).as_deref(), Some("The"));
    assert_eq!(tok.piece(5279).as_deref(), Some("▁capital"));
}

#[test]
fn gemma3_template_ids_equal_a_whole_string_encode() {
    let Some(tok) = tokenizer(Family::Gemma3) else {
        return;
    };
    let t = ChatTemplate::new(Family::Gemma3);
    let msgs = [
        Message::system("Answer in one word."),
        Message::user("What is the capital of France?"),
        Message::model("Paris."),
        Message::user("And of Japan? 東京?"),
    ];
    let ids = t.render_ids(&tok, &msgs, ChatOptions::default()).unwrap();
    let text = t.render_text(&msgs, ChatOptions::default()).unwrap();
    let whole = tok.inner().encode(text.as_str(), false).unwrap();
    assert_eq!(ids, whole.get_ids());
    assert_eq!(&ids[..3], [2, 105, 2364]); // <bos> <start_of_turn> "user"
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
}

#[test]
fn gemma4_template_ids_use_gemma4_control_ids() {
    let Some(tok) = tokenizer(Family::Gemma4) else {
        return;
    };
    let t = ChatTemplate::new(Family::Gemma4);
    let msgs = [Message::system("Be brief."), Message::user("Hi there")];
    let ids = t.render_ids(&tok, &msgs, ChatOptions::default()).unwrap();
    let text = t.render_text(&msgs, ChatOptions::default()).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let user = tok.encode("user\nHi there", false).unwrap();
    let mut expect = vec![2, 105];
    expect.extend(tok.encode("system\nBe brief.", false).unwrap());
    expect.extend([106]);
    expect.extend(tok.encode("\n", false).unwrap());
    expect.push(105);
    expect.extend(&user);
    expect.push(106);
    expect.extend(tok.encode("\n", false).unwrap());
    expect.push(105);
    expect.extend(tok.encode("model\n", false).unwrap());
    expect.push(100);
    expect.extend(tok.encode("thought\n", false).unwrap());
    expect.push(101);
    assert_eq!(ids, expect);
    let think = ChatOptions {
        thinking: true,
        add_generation_prompt: true,
    };
    let ids = t.render_ids(&tok, &msgs, think).unwrap();
    assert_eq!(ids[..2], [2, 105]);
    assert!(ids.contains(&98));
    assert!(!ids.contains(&100));
}

fn stream_text(tok: &GemmaTokenizer, ids: &[u32]) -> String {
    let mut d = Detokenizer::new();
    let mut out = String::new();
    for &id in ids {
        if let Some(s) = d.push(tok, id).unwrap() {
            assert!(!s.contains('\u{FFFD}'), "partial character emitted: {s:?}");
            out.push_str(&s);
        }
    }
    out.push_str(&d.finish(tok).unwrap().unwrap_or_default());
    out
}

#[test]
fn streaming_detokenization_is_exact() {
    let Some(tok) = tokenizer(Family::Gemma3) else {
        return;
    };
    for text in [
        "naïve café 東京 🙂",
        "  leading spaces, tabs\tand\nnewlines\n\n",
        "🙂🙂 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ᚠᛇᚻ ﷽ 👩‍👩‍👧‍👦",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(stream_text(&tok, &ids), text, "{ids:?}");
    }
    let Some(alice) = require_asset!("alice") else {
        return;
    };
    let text = std::fs::read_to_string(alice).unwrap();
    let text: String = text.chars().take(20_000).collect();
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(stream_text(&tok, &ids), text);
}

#[test]
fn splitter_separates_real_thinking_tokens() {
    let Some(tok) = tokenizer(Family::Gemma4) else {
        return;
    };
    let ids = tok
        .encode_with_controls(
            "<|channel>thought\nThe user wants 東京.<channel|>It is 東京 🙂<turn|>",
        )
        .unwrap();
    let mut s = StreamSplitter::new(Family::Gemma4);
    let (mut thinking, mut answer, mut stopped) = (String::new(), String::new(), false);
    for &id in &ids {
        let step = s.push(&tok, id).unwrap();
        for d in step.deltas {
            match d {
                Delta::Thinking(t) => thinking.push_str(&t),
                Delta::Answer(t) => answer.push_str(&t),
            }
        }
        stopped |= step.stop;
    }
    assert!(stopped);
    assert_eq!(thinking, "The user wants 東京.");
    assert_eq!(answer, "It is 東京 🙂");
}
