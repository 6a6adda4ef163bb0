//! Images through the engine, on the tiny vision fixtures (fixtures/vision: E-style and
//! 31B-style, random weights) with a Gemma 4 vocabulary that has the image tokens
//! (fixtures/vision/tokenizer.json, see make_tokenizer.py) and the published Jul 14
//! template: an added image costs in tokens and KV bytes what the turn then
//! holds; the answer is the model's own over the image's soft tokens (the same through the
//! engine as through the model alone, whatever the prefill chunk); a cache that held
//! another image in the same places is never reused for this one; what cannot be read, or
//! a model without a tower, is refused with `bad_image`, leaving nothing behind.

use crate::common;

use std::io::Cursor;

use kvlab_engine::contract::{
    CacheSelection, ConversationChoice, ConversationId, DoneReason, ErrorCode, Event, ImageInfo,
    ImageLimits, ImageProcessor, Message, Prompt, SamplingParams,
};
use kvlab_engine::lab::{KvPrecision, Logits, Model, PrecisionPolicy, SoftSpan, VisionTower};
use kvlab_engine::{Engine, EngineHandle, GenerateRequest, LoadOptions, LoadRequest, ModelSource};
use serde_json::{json, Value};

/// A fixture model (`style`: "e" or "dense") in a temporary folder, with a longer context
/// than its 256 (random weights do not mind the positions) and the template beside it.
fn model_dir(style: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = common::fixture(&format!("vision/{style}"));
    for file in ["model.safetensors", "preprocessor_config.json"] {
        std::fs::copy(src.join(file), dir.path().join(file)).expect("copy");
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("config json");
    config["text_config"]["max_position_embeddings"] = json!(2048);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    std::fs::copy(
        common::fixture("templates").join("g4_e2b_jul14.jinja"),
        dir.path().join("chat_template.jinja"),
    )
    .expect("template");
    std::fs::copy(
        common::fixture("vision").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .expect("tokenizer");
    dir
}

fn load(dir: &std::path::Path) -> EngineHandle {
    let engine = Engine::spawn().expect("spawn");
    engine
        .submit(LoadRequest {
            tokenizer: Some(dir.join("tokenizer.json")),
            cache: CacheSelection::Spec("f32".into()),
            ..LoadRequest::new(ModelSource::Local {
                path: dir.join("model.safetensors"),
            })
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    engine
}

/// A PNG of `w × h` whose pixels follow `seed`.
fn png(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let v = x.wrapping_mul(31 + seed) ^ y.wrapping_mul(17 + 3 * seed);
        image::Rgb([(v % 251) as u8, (v / 7 % 253) as u8, (v / 13 % 241) as u8])
    });
    let mut out = Vec::new();
    img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .expect("png");
    out
}

fn ask(conversation: &str, text: &str, images: Vec<String>, chunk: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: 6,
        prefill_chunk: chunk,
        conversation: Some(ConversationChoice::Id {
            id: ConversationId::new(conversation).expect("id"),
        }),
        ..GenerateRequest::new(Prompt::Conversation {
            messages: vec![Message {
                images,
                ..Message::user(text)
            }],
            thinking: false,
            tools: Vec::new(),
        })
    }
}

/// What a turn ended with: its tokens and stats, or its error.
#[derive(Debug)]
struct Answer {
    ids: Vec<u32>,
    prompt_tokens: usize,
    reused: usize,
    kv_bytes: usize,
}

fn run(engine: &EngineHandle, req: GenerateRequest) -> Result<Answer, (ErrorCode, String)> {
    let ticket = engine.submit(req).map_err(|e| (e.code, e.message))?;
    let mut stats = None;
    for ev in ticket.events() {
        match ev {
            Event::Stats(s) => stats = Some(s),
            Event::Done {
                reason, token_ids, ..
            } => {
                assert_ne!(reason, DoneReason::Cancelled);
                let s = stats.ok_or((ErrorCode::Internal, "no stats".into()))?;
                return Ok(Answer {
                    ids: token_ids,
                    prompt_tokens: s.prompt_tokens,
                    reused: s.reused_tokens,
                    kv_bytes: s.kv_bytes,
                });
            }
            Event::Error { code, message } => return Err((code, message)),
            _ => {}
        }
    }
    Err((ErrorCode::Internal, "no end".into()))
}

/// A `HOSTILE <fault> -> <outcome>` row for scripts/hostile.sh, past the test harness's
/// capture of `eprintln!`.
fn hostile(row: &str) {
    use std::io::Write;
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("HOSTILE {row}\n").as_bytes());
}

fn add(engine: &EngineHandle, bytes: &[u8]) -> ImageInfo {
    engine
        .add_image(bytes, ImageLimits::default())
        .expect("image added")
}

#[test]
fn an_image_costs_what_was_shown_and_the_answer_is_the_models_own() {
    let dir = model_dir("e");
    let engine = load(dir.path());
    let card = engine.status().model.expect("card");
    let vision = card.vision.clone().expect("the checkpoint's tower");
    // The checkpoint's processor budget (preprocessor_config.json), not Gemma 4's default.
    assert_eq!(vision.max_soft_tokens, 70);
    let bytes = png(90, 60, 1);
    let info = add(&engine, &bytes);
    assert_eq!(info.tokens, info.soft_tokens + 2);
    assert_eq!((info.width, info.height), (90, 60));
    assert!(info.soft_tokens > 0 && info.soft_tokens <= 70, "{info:?}");

    // The same question with and without the image: the image adds its tokens, and the KV
    // bytes the estimate gave before sending.
    let plain = run(&engine, ask("plain", "What is it?", vec![], 512)).expect("plain");
    let shown = engine
        .document_fits(
            Some(&ConversationId::new("plain").expect("id")),
            &[info.tokens],
            0,
        )
        .expect("fits");
    let with = run(
        &engine,
        ask("with", "What is it?", vec![info.id.clone()], 512),
    )
    .expect("with");
    assert_eq!(with.prompt_tokens, plain.prompt_tokens + info.tokens);
    // The conversation says how much of it is images (the timeline shows the share).
    let held = |id: &str| {
        engine
            .status()
            .conversations
            .into_iter()
            .find(|c| c.id.to_string() == id)
            .map(|c| c.image_tokens)
    };
    assert_eq!(held("with"), Some(info.soft_tokens));
    assert_eq!(held("plain"), Some(0));
    let f32_cost = shown[0]
        .costs
        .iter()
        .find(|c| c.spec == "f32")
        .expect("an f32 preset")
        .bytes;
    assert_eq!(
        (with.kv_bytes - plain.kv_bytes) as u64,
        f32_cost,
        "the bytes shown before sending are the bytes held after"
    );

    // The answer is the model's own: the first token is the argmax of the model alone over
    // the same ids with the tower's soft tokens in the image's places.
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("model");
    // The tower's weights count as the model's: on the card and in the status the timeline
    // draws.
    assert_eq!(
        card.weights_bytes,
        model.weights_bytes() as u64 + vision.weights_bytes
    );
    assert_eq!(engine.status().weights_bytes, card.weights_bytes);
    let tower = VisionTower::from_safetensors(dir.path(), &LoadOptions::default())
        .expect("tower")
        .expect("has one");
    let processor =
        ImageProcessor::new(tower.config(), tower.soft_token_budget()).expect("processor");
    let soft = tower
        .encode(
            &processor
                .process(&bytes, ImageLimits::default())
                .expect("patches"),
        )
        .expect("encode")
        .soft_tokens;
    let tokenizer = engine.tokenizer().expect("tokenizer");
    let text = tokenizer
        .render(
            &[Message {
                images: vec![info.id.clone()],
                ..Message::user("What is it?")
            }],
            kvlab_engine::contract::ChatOptions {
                thinking: false,
                add_generation_prompt: true,
            },
        )
        .expect("render");
    let at = text.iter().position(|&i| i == 501).expect("marker");
    let mut ids = text[..at].to_vec();
    ids.push(500);
    ids.extend(std::iter::repeat_n(501, info.soft_tokens));
    ids.push(502);
    ids.extend_from_slice(&text[at + 1..]);
    assert_eq!(ids.len(), with.prompt_tokens);
    let mut cache = model
        .new_cache(&PrecisionPolicy::uniform(KvPrecision::F32))
        .expect("cache");
    let logits = model
        .forward_with(
            &ids,
            &[SoftSpan {
                at: at + 1,
                rows: soft,
            }],
            &mut cache,
            Logits::Last,
        )
        .expect("forward");
    let first = logits
        .argmax(0)
        .expect("argmax")
        .to_scalar::<u32>()
        .expect("id");
    assert_eq!(
        with.ids[0], first,
        "the engine's first token is the model's"
    );
}

#[test]
fn another_image_in_the_same_places_is_read_again_and_chunks_never_cut_an_image() {
    // The 31B shape: its images attend both ways, so a chunk that cut one would change
    // the answer.
    let dir = model_dir("dense");
    let engine = load(dir.path());
    let a = add(&engine, &png(64, 64, 1));
    let b = add(&engine, &png(64, 64, 2));
    assert_eq!(a.tokens, b.tokens, "the same places");
    assert_ne!(a.id, b.id);
    let fresh = run(&engine, ask("a", "Describe.", vec![a.id.clone()], 512)).expect("a");
    // Small chunks: the image still runs whole, so the answer is the same.
    for chunk in [1, 7, 16] {
        let small = run(
            &engine,
            ask(&format!("a{chunk}"), "Describe.", vec![a.id.clone()], chunk),
        )
        .expect("small chunks");
        assert_eq!(small.ids, fresh.ids, "chunk {chunk}");
    }
    // A conversation that held image b, asked again with image a in its places: the
    // cache's ids agree past the image, its rows do not, and they are not reused.
    let held_b = run(&engine, ask("swap", "Describe.", vec![b.id.clone()], 512)).expect("b");
    assert_eq!(held_b.prompt_tokens, fresh.prompt_tokens);
    let swapped = run(&engine, ask("swap", "Describe.", vec![a.id.clone()], 512)).expect("a");
    assert!(
        swapped.reused < fresh.prompt_tokens - a.tokens,
        "reused {} tokens of a prompt of {}",
        swapped.reused,
        swapped.prompt_tokens
    );
    assert_eq!(
        swapped.ids, fresh.ids,
        "image a's answer, not image b's rows"
    );
    // The same image again in the same conversation: everything but the last token reused.
    let again = run(&engine, ask("swap", "Describe.", vec![a.id.clone()], 512)).expect("again");
    assert_eq!(again.reused, again.prompt_tokens - 1);
    assert_eq!(again.ids, fresh.ids);
}

#[test]
fn hostile_images_and_models_without_a_tower_are_refused_and_leave_nothing() {
    let dir = model_dir("e");
    let engine = load(dir.path());
    let mut truncated = png(64, 64, 3);
    truncated.truncate(truncated.len() / 2);
    for _ in 0..20 {
        for (what, bytes) in [
            ("truncated", truncated.clone()),
            ("not an image", b"hello, world".to_vec()),
            ("empty", Vec::new()),
        ] {
            let err = engine
                .add_image(&bytes, ImageLimits::default())
                .expect_err(what);
            assert_eq!(err.code, ErrorCode::BadImage, "{what}: {}", err.message);
        }
        // An id never added.
        let err = run(&engine, ask("ghost", "Hi", vec!["0".repeat(32)], 512)).expect_err("unknown");
        assert_eq!(err.0, ErrorCode::BadImage, "{}", err.1);
    }
    let names: Vec<String> = engine
        .status()
        .conversations
        .iter()
        .map(|c| c.id.to_string())
        .collect();
    assert!(!names.iter().any(|n| n == "ghost"), "{names:?}");
    hostile("an image that cannot be read or was never added -> bad_image");

    // A text model (no tower) refuses images when they are added and when they are named.
    let text = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(text.path(), 512);
    let plain = Engine::spawn().expect("spawn");
    plain
        .submit(LoadRequest {
            tokenizer: Some(tokenizer),
            ..LoadRequest::new(ModelSource::Local {
                path: common::fixture("tiny_gemma3").join("model.safetensors"),
            })
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    assert!(plain.status().model.expect("card").vision.is_none());
    for _ in 0..20 {
        let err = plain
            .add_image(&png(32, 32, 1), ImageLimits::default())
            .expect_err("no tower");
        assert_eq!(err.code, ErrorCode::BadImage);
        assert!(err.message.contains("reads no images"), "{}", err.message);
        let err = run(&plain, ask("t", "Hi", vec!["0".repeat(32)], 512)).expect_err("no tower");
        assert_eq!(err.0, ErrorCode::BadImage, "{}", err.1);
    }
    hostile("an image for a model without a vision tower -> bad_image");
}

#[test]
fn a_queued_turn_keeps_its_images_when_other_clients_fill_the_store() {
    let dir = model_dir("e");
    let engine = load(dir.path());
    // One stream at a time: the image turn waits behind a long answer.
    engine.set_pool_settings(kvlab_engine::PoolSettings {
        parallel: 1,
        ..engine.pool_settings()
    });
    let mine = add(&engine, &png(40, 30, 7));
    let long = GenerateRequest {
        max_tokens: 1500,
        ..ask("long", "Tell me everything.", vec![], 512)
    };
    let busy = engine.submit(long).expect("the long answer");
    let waiting = engine
        .submit(ask("mine", "What is it?", vec![mine.id.clone()], 512))
        .expect("queued");
    // Meanwhile others add more images than the store keeps: mine leaves the store.
    for k in 0..70 {
        add(&engine, &png(16, 16, 100 + k));
    }
    assert_eq!(engine.status().queued, 1, "the image turn still waits");
    let again = engine
        .submit(ask("other", "Hi", vec![mine.id.clone()], 512))
        .map(|_| ())
        .expect_err("a new request naming it finds it gone");
    assert_eq!(again.code, ErrorCode::BadImage);
    // The queued turn took its image when it was rendered: it still runs.
    let mut ended = None;
    for ev in waiting.events() {
        match ev {
            Event::Done { reason, .. } => {
                ended = Some(Ok(reason));
                break;
            }
            Event::Error { code, message } => {
                ended = Some(Err((code, message)));
                break;
            }
            _ => {}
        }
    }
    assert!(matches!(ended, Some(Ok(_))), "{ended:?}");
    drop(busy);
}
