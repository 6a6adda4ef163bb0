//! The engine thread's services for the desktop app, on the tiny golden fixtures: side-by-side
//! comparison of two cache policies (both panes stream the reference ids, fidelity is exact
//! for equal policies and the chat session is untouched), token counting on the shared
//! tokenizer, memory snapshots, marked cache switches, conversations as plain text for
//! checkpoints without a chat template, and the rewind margin that lets an answer be
//! regenerated without prefilling again.

use crate::common;

use std::path::{Path, PathBuf};

use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::CompareFidelity;
use kvlab_engine::contract::Family;
use kvlab_engine::contract::FitTarget;
use kvlab_engine::contract::Message;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{ConversationId, DoneReason, ErrorCode, Event, GenStats};
use kvlab_engine::host::RssProbe;
use kvlab_engine::lab::plain_transcript;
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::GemmaTokenizer;
use kvlab_engine::lab::PrecisionPolicy;
use kvlab_engine::CompareRequest;
use kvlab_engine::GenerateRequest;
use kvlab_engine::LoadRequest;
use kvlab_engine::{Engine, EngineHandle, ModelSource};

fn policy(spec: &str) -> PrecisionPolicy {
    CacheSpec::parse(spec).expect("spec").to_policy()
}

fn load(engine: &EngineHandle, model: &Path, tokenizer: &Path) {
    let request = LoadRequest {
        tokenizer: Some(tokenizer.to_path_buf()),
        cache: CacheSelection::Spec("f32".into()),
        ..LoadRequest::new(ModelSource::Local {
            path: model.to_path_buf(),
        })
    };
    engine
        .submit(request)
        .and_then(|t| t.wait(|_| true))
        .expect("load fixture");
}

struct Setup {
    engine: EngineHandle,
    tokenizer: PathBuf,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(dir.path(), 512);
    let engine = Engine::spawn().expect("spawn");
    load(
        &engine,
        &common::fixture("tiny_gemma3").join("model.safetensors"),
        &tokenizer,
    );
    Setup {
        engine,
        tokenizer,
        _dir: dir,
    }
}

fn golden_ids() -> Vec<u32> {
    common::ids(&common::golden("tiny_gemma3")["greedy_ids"])
}

/// Everything one comparison sent, until `finished` or `error`.
fn compare(engine: &EngineHandle, policies: [PrecisionPolicy; 2], ids: &[u32]) -> Vec<Event> {
    compare_sweeping(engine, policies, ids, Vec::new())
}

/// [`compare`] with a sweep of `sweep` after the panes.
fn compare_sweeping(
    engine: &EngineHandle,
    policies: [PrecisionPolicy; 2],
    ids: &[u32],
    sweep: Vec<CacheSpec>,
) -> Vec<Event> {
    compare_fitting(engine, policies, ids, sweep, None)
}

/// [`compare_sweeping`] with a cache fitted to `fit` after the sweep.
fn compare_fitting(
    engine: &EngineHandle,
    policies: [PrecisionPolicy; 2],
    ids: &[u32],
    sweep: Vec<CacheSpec>,
    fit: Option<FitTarget>,
) -> Vec<Event> {
    let request = CompareRequest {
        prompt: Prompt::Ids { ids: ids.to_vec() },
        sampling: SamplingParams::greedy(),
        max_tokens: 20,
        caches: policies.map(|p| CacheSelection::Spec(p.spec_string())),
        prefill_chunk: 5,
        sweep: sweep
            .iter()
            .map(|s| CacheSelection::Spec(s.to_string()))
            .collect(),
        constraint: None,
        fit,
    };
    let rx = match engine.submit(request) {
        Ok(rx) => rx,
        // Refused as submitted: the one error, as an event.
        Err(e) => {
            return vec![Event::Error {
                code: e.code,
                message: e.message,
            }]
        }
    };
    let mut events = Vec::new();
    for ev in rx.events() {
        let end = matches!(ev, Event::Finished { .. } | Event::Error { .. });
        events.push(ev);
        if end {
            break;
        }
    }
    events
}

fn pane_done(events: &[Event], pane: usize) -> (DoneReason, Vec<u32>) {
    events
        .iter()
        .find_map(|e| match e {
            Event::Pane { pane: p, event } if *p == pane => match &**event {
                Event::Done { reason, token_ids } => Some((*reason, token_ids.clone())),
                _ => None,
            },
            _ => None,
        })
        .expect("pane done")
}

fn pane_stats(events: &[Event], pane: usize) -> GenStats {
    events
        .iter()
        .find_map(|e| match e {
            Event::Pane { pane: p, event } if *p == pane => match &**event {
                Event::Stats(s) => Some(s.clone()),
                _ => None,
            },
            _ => None,
        })
        .expect("pane stats")
}

fn fidelity(events: &[Event]) -> CompareFidelity {
    match events.last() {
        Some(Event::Finished { fidelity: Some(f) }) => f.clone(),
        other => panic!("comparison did not finish with fidelity: {other:?}"),
    }
}

#[test]
fn both_panes_stream_in_lockstep_and_equal_policies_score_exactly() {
    let s = setup();
    let expect = golden_ids();
    let events = compare(&s.engine, [policy("f32"), policy("f32")], &expect[..12]);
    for pane in 0..2 {
        assert_eq!(
            pane_done(&events, pane),
            (DoneReason::Length, expect[12..32].to_vec()),
            "pane {pane}"
        );
        let st = pane_stats(&events, pane);
        assert_eq!((st.prompt_tokens, st.generated_tokens), (12, 20));
        assert_eq!(st.context_tokens, 31);
    }
    // Lockstep: the first text of pane 1 comes before the last text of pane 0.
    let text_at = |pane: usize| {
        events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Pane { pane: p, event } if *p == pane && matches!(**event, Event::Token { .. })))
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    let (a, b) = (text_at(0), text_at(1));
    assert!(b[0] < *a.last().expect("pane 0 text"), "{a:?} {b:?}");
    let f = fidelity(&events);
    // The reference's own tokens, prompt included: 12 + 20 ids score 31 positions.
    assert_eq!(f.tokens_scored, 31);
    assert!(f.mean_kld < 1e-6 && f.max_kld < 1e-6, "{f:?}");
    assert_eq!(f.top1_agreement, 1.0);
    assert!((f.ppl - f.ppl_reference).abs() < 1e-6 * f.ppl);
    assert_eq!(f.kv_bytes[0], f.kv_bytes[1]);
    // The chat session was not touched.
    assert_eq!(s.engine.status().context_tokens, 0);
    s.engine.shutdown();
}

#[test]
fn a_quantized_pane_holds_fewer_bytes_and_scores_a_real_divergence() {
    let s = setup();
    let expect = golden_ids();
    let events = compare(&s.engine, [policy("f32"), policy("tq2@all")], &expect[..12]);
    assert_eq!(pane_done(&events, 0).1, expect[12..32]);
    let f = fidelity(&events);
    assert!(f.mean_kld > 0.0 && f.max_kld >= f.mean_kld, "{f:?}");
    assert!((0.0..=1.0).contains(&f.top1_agreement));
    // f32 holds 4 B per coordinate, 2-bit codes a little over 2 bits; on a context this
    // short each head's f32 centering offsets still weigh (see kv::spec).
    assert!(f.kv_bytes[1] * 6 < f.kv_bytes[0], "{:?}", f.kv_bytes);
    assert_eq!(f.kv_bytes[0] as usize, pane_stats(&events, 0).kv_bytes);
    s.engine.shutdown();
}

#[test]
fn a_sweep_scores_each_cache_on_the_reference_tokens_with_its_bits() {
    let s = setup();
    let sweep = ["f32", "tq4@all", "tq2@all"].map(|x| CacheSpec::parse(x).expect("spec"));
    let events = compare_sweeping(
        &s.engine,
        [policy("f32"), policy("tq3@all")],
        &golden_ids()[..12],
        sweep.to_vec(),
    );
    let points: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::SweepPoint { point } => Some(point.clone()),
            _ => None,
        })
        .collect();
    // One point per cache, in order, between the panes and `finished`.
    let kvs: Vec<&str> = points.iter().map(|p| p.kv.as_str()).collect();
    assert_eq!(kvs, ["f32", "tq4@all", "tq2@all"]);
    let f = fidelity(&events);
    // The reference against itself: exactly nothing lost, at 32 bits.
    assert_eq!((points[0].mean_kld, points[0].top1_agreement), (0.0, 1.0));
    assert_eq!(points[0].bits_per_coordinate, 32.0);
    assert_eq!(points[0].ppl, points[0].ppl_reference);
    // Fewer bits, more loss; every point scored the same positions as the pane fidelity.
    assert!(points[1].bits_per_coordinate > points[2].bits_per_coordinate);
    assert!(points[2].mean_kld > points[1].mean_kld && points[1].mean_kld > 0.0);
    assert!(points.iter().all(|p| p.tokens_scored == f.tokens_scored));
    assert!(points[2].p99_kld >= points[2].mean_kld);
    // The tested pane and the three swept caches ran in one lockstep group: progress climbs
    // to the reference's tokens once, and every point comes after it.
    let scoring: Vec<(usize, usize)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Scoring { done, total } => Some((*done, *total)),
            _ => None,
        })
        .collect();
    let total = f.tokens_scored + 1;
    assert_eq!(scoring.last(), Some(&(total, total)), "{scoring:?}");
    assert!(scoring.windows(2).all(|w| w[0].0 < w[1].0));
    let last_progress = events
        .iter()
        .rposition(|e| matches!(e, Event::Scoring { .. }));
    let first_point = events
        .iter()
        .position(|e| matches!(e, Event::SweepPoint { .. }));
    assert!(
        last_progress < first_point,
        "{last_progress:?} {first_point:?}"
    );
}

#[test]
fn a_fit_probes_every_side_then_scores_a_cache_within_its_budget() {
    let s = setup();
    let ids = &golden_ids()[..12];
    let estimate = |spec: &str, ctx: usize| -> u64 {
        let policy = kvlab_engine::lab::parse_policy(spec).expect("spec");
        kvlab_engine::lab::estimate_kv_bytes_at_once(&tiny_config(), &policy, ctx, 0)
            .expect("bytes")
    };
    // Between what 2 bits and 8 bits everywhere hold at 200 tokens.
    let budget = (estimate("tq2+qw+sink@all", 200) + estimate("tq8+qw+sink@all", 200)) / 2;
    let target = FitTarget {
        bytes: budget,
        ctx: 200,
    };
    let first = compare_fitting(
        &s.engine,
        [policy("f32"), policy("tq3@all")],
        ids,
        vec![CacheSpec::parse("tq4@all").expect("spec")],
        Some(target),
    );
    let fitted = first
        .iter()
        .find_map(|e| match e {
            Event::Fitted { fitted } => Some(fitted.clone()),
            _ => None,
        })
        .expect("a fitted event");
    // Within the budget, by the engine's byte formula of the SPEC it names.
    assert!(fitted.bytes <= budget, "{fitted:?} over {budget}");
    assert_eq!(estimate(&fitted.spec, 200), fitted.bytes, "{}", fitted.spec);
    assert_eq!(fitted.ctx, 200);
    assert!(fitted.predicted_kld > 0.0 && fitted.predicted_kld.is_finite());
    // The sweep's point, then the fitted cache's, scored on the same tokens; then finished.
    let kvs: Vec<String> = first
        .iter()
        .filter_map(|e| match e {
            Event::SweepPoint { point } => Some(point.kv.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(kvs, ["tq4@all".to_string(), fitted.spec.clone()]);
    assert!(matches!(
        first.last(),
        Some(Event::Finished { fidelity: Some(_) })
    ));
    // Deterministic: the same tokens fit the same cache.
    let again = compare_fitting(
        &s.engine,
        [policy("f32"), policy("tq3@all")],
        ids,
        Vec::new(),
        Some(target),
    );
    assert!(again
        .iter()
        .any(|e| matches!(e, Event::Fitted { fitted: f } if *f == fitted)));
    // A budget below 2 bits everywhere, or of nothing, is refused with a coded error before
    // a pane runs (no pane event), 20 times each, and the engine goes on.
    for (bytes, fault) in [
        (
            estimate("tq2+qw+sink@all", 200) / 2,
            "below 2 bits everywhere",
        ),
        (0, "of 0 bytes"),
    ] {
        for _ in 0..20 {
            let events = compare_fitting(
                &s.engine,
                [policy("f32"), policy("f32")],
                ids,
                Vec::new(),
                Some(FitTarget { bytes, ctx: 200 }),
            );
            assert!(
                matches!(
                    events.last(),
                    Some(Event::Error {
                        code: ErrorCode::InvalidRequest,
                        ..
                    })
                ),
                "{bytes}: {:?}",
                events.last()
            );
            assert!(
                !events.iter().any(|e| matches!(e, Event::Pane { .. })),
                "refused before a pane ran"
            );
            // To the stderr handle itself, which libtest does not capture (scripts/hostile.sh
            // tallies these rows).
            let _ = std::io::Write::write_all(
                &mut std::io::stderr().lock(),
                format!("HOSTILE compare fit {fault} -> invalid_request\n").as_bytes(),
            );
        }
    }
    let events = compare(&s.engine, [policy("f32"), policy("f32")], ids);
    assert!(matches!(
        events.last(),
        Some(Event::Finished { fidelity: Some(_) })
    ));
    s.engine.shutdown();
}

/// The tiny Gemma 3 fixture's config.
fn tiny_config() -> kvlab_engine::lab::ModelConfig {
    kvlab_engine::lab::load_hf_config(&common::fixture("tiny_gemma3").join("config.json"))
        .expect("config")
}

#[test]
fn compare_without_a_model_is_a_coded_error() {
    let engine = Engine::spawn().expect("spawn");
    let events = compare(&engine, [policy("f16"), policy("tq4")], &[2, 5, 6]);
    assert!(
        matches!(
            events.as_slice(),
            [Event::Error {
                code: ErrorCode::NoModel,
                ..
            }]
        ),
        "{events:?}"
    );
    assert_eq!(
        engine.count_tokens("abc").map_err(|e| e.code),
        Err(ErrorCode::NoModel)
    );
    engine.shutdown();
}

#[test]
fn tokens_are_counted_on_the_shared_tokenizer_and_memory_follows_the_cache() {
    let s = setup();
    let tok = GemmaTokenizer::from_file(&s.tokenizer, Family::Gemma3).expect("tokenizer");
    let text = "hello world, again";
    assert_eq!(
        s.engine.count_tokens(text).expect("count"),
        tok.encode(text, false).expect("encode").len()
    );
    assert!(s.engine.tokenizer().is_some());

    let expect = golden_ids();
    let rx = s
        .engine
        .submit(GenerateRequest {
            sampling: SamplingParams::greedy(),
            max_tokens: 6,
            ..GenerateRequest::new(Prompt::Ids {
                ids: expect[..12].to_vec(),
            })
        })
        .expect("send");
    for ev in rx.events() {
        if matches!(ev, Event::Done { .. } | Event::Error { .. }) {
            break;
        }
    }
    let status = s.engine.status();
    let sample =
        s.engine
            .memory_sample(7, &mut RssProbe::new(), Some(&ConversationId::default_id()));
    assert_eq!((sample.t_ms, sample.tokens_in_context), (7, 17));
    assert_eq!(sample.kv.total_used, status.kv.total_used);
    assert_eq!(
        sample.kv.by_kind.sliding.used + sample.kv.by_kind.full.used,
        sample.kv.total_used
    );
    assert_eq!(sample.kv.by_precision.keys().collect::<Vec<_>>(), ["f32"]);
    assert!(sample.weights_bytes > 0 && sample.rss_bytes > 0);

    // A marked switch: f32 → f16 halves the bytes, and the marker says so.
    let marker = s
        .engine
        .switch_cache(
            &kvlab_engine::contract::ConversationId::default_id(),
            &CacheSelection::Spec("f16".into()),
        )
        .expect("switch");
    assert_eq!(marker.tokens, 17);
    assert_eq!(marker.kv_after.used * 2, marker.kv_before.used);
    assert_eq!((marker.from.as_str(), marker.to.as_str()), ("f32", "f16"));
    assert!(marker.t_ms > 1_700_000_000_000, "{}", marker.t_ms);
    assert_eq!(s.engine.status().kv.total_used, marker.kv_after.used);
    assert_eq!(common::default_conversation(&s.engine).spec, "f16");
    s.engine.shutdown();
}

fn turn(engine: &EngineHandle, prompt: Prompt, max_tokens: usize) -> GenStats {
    let rx = engine
        .submit(GenerateRequest {
            sampling: SamplingParams::greedy(),
            max_tokens,
            ..GenerateRequest::new(prompt)
        })
        .expect("send");
    let mut stats = None;
    for ev in rx.events() {
        match ev {
            Event::Stats(s) => stats = Some(s),
            Event::Done { .. } => break,
            Event::Error { code, message } => panic!("{code}: {message}"),
            _ => {}
        }
    }
    stats.expect("stats")
}

#[test]
fn a_conversation_is_plain_text_for_a_checkpoint_without_a_chat_template() {
    let s = setup();
    let messages = vec![Message::system("be brief"), Message::user("hello there")];
    let conversation = || Prompt::Conversation {
        messages: messages.clone(),
        thinking: false,
        tools: Vec::new(),
    };
    // The same checkpoint with the Gemma 3 template beside it, then without one.
    let copy = |template: Option<&str>| {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in ["model.safetensors", "config.json"] {
            std::fs::copy(common::fixture("tiny_gemma3").join(f), dir.path().join(f))
                .expect("copy");
        }
        let config = match template {
            Some(t) => serde_json::json!({ "chat_template": t }).to_string(),
            None => "{}".to_owned(),
        };
        std::fs::write(dir.path().join("tokenizer_config.json"), config).expect("write");
        dir
    };
    let with = copy(Some(include_str!("../fixtures/templates/gemma3_it.jinja")));
    load(
        &s.engine,
        &with.path().join("model.safetensors"),
        &s.tokenizer,
    );
    assert_eq!(
        s.engine.status().model.and_then(|c| c.has_chat_template),
        Some(true)
    );
    let chat = turn(&s.engine, conversation(), 1);
    s.engine
        .forget(&kvlab_engine::contract::ConversationId::default_id(), false)
        .expect("reset");

    let dir = copy(None);
    load(
        &s.engine,
        &dir.path().join("model.safetensors"),
        &s.tokenizer,
    );
    assert_eq!(
        s.engine.status().model.and_then(|c| c.has_chat_template),
        Some(false)
    );
    let plain = turn(&s.engine, conversation(), 1);
    let tok = GemmaTokenizer::from_file(&s.tokenizer, Family::Gemma3).expect("tokenizer");
    let text = plain_transcript(&messages);
    assert_eq!(text, "be brief\n\nhello there");
    assert_eq!(
        plain.prompt_tokens,
        tok.encode(&text, true).expect("encode").len()
    );
    assert!(
        chat.prompt_tokens > plain.prompt_tokens,
        "{chat:?} {plain:?}"
    );
    s.engine.shutdown();
}

#[test]
fn a_rewind_margin_lets_an_answer_be_regenerated_without_prefilling_again() {
    let expect = golden_ids();
    let regenerate = |margin: Option<usize>| {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokenizer = common::write_tokenizer(dir.path(), 512);
        let engine = Engine::spawn().expect("spawn");
        if let Some(m) = margin {
            engine.set_rewind_margin(m);
        }
        load(
            &engine,
            &common::fixture("tiny_gemma3").join("model.safetensors"),
            &tokenizer,
        );
        let ids = || Prompt::Ids {
            ids: expect[..12].to_vec(),
        };
        // 12 + 20 tokens: far past the fixture's 8-token sliding window.
        turn(&engine, ids(), 20);
        let again = turn(&engine, ids(), 20);
        engine.shutdown();
        again.reused_tokens
    };
    // A margin of 16 cannot reach back 20 answer tokens past the window; the default
    // (kvlab_engine::contract::REWIND_MARGIN, 256, the one every front end gets) can.
    assert_eq!(regenerate(Some(16)), 0);
    assert_eq!(regenerate(Some(64)), 11);
    assert_eq!(regenerate(None), 11);
}
