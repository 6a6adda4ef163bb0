//! The engine thread on the tiny golden fixtures: streaming greedy generation equals the
//! reference ids, cancel stops within one token, reset clears, a second turn prefills only
//! its new tokens, an oversize prompt and a corrupt model are clean coded errors, and the
//! engine stays usable after each.

use crate::common;

// HOSTILE lines go to the stderr handle itself, which libtest does not capture, so
// scripts/hostile.sh finds them in an ordinary `cargo test` log.
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::Family;
use kvlab_engine::contract::Message;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{ConversationId, DoneReason, ErrorCode, Event, GenStats};
use kvlab_engine::lab::GemmaTokenizer;
use kvlab_engine::lab::{KvPrecision, PrecisionPolicy};
use kvlab_engine::GenerateRequest;
use kvlab_engine::LoadRequest;
use kvlab_engine::{Engine, EngineHandle, ModelSource};

const FIXTURES: [(&str, Family); 4] = [
    ("tiny_gemma3", Family::Gemma3),
    ("tiny_e", Family::Gemma4),
    ("tiny_dense", Family::Gemma4),
    ("tiny_moe", Family::Gemma4),
];

struct Setup {
    engine: EngineHandle,
    tokenizer: PathBuf,
    _dir: tempfile::TempDir,
}

fn load_request(name: &str, tokenizer: &Path) -> LoadRequest {
    LoadRequest {
        tokenizer: Some(tokenizer.to_path_buf()),
        // f32: the golden ids come from an f32 reference.
        cache: CacheSelection::Spec("f32".into()),
        ..LoadRequest::new(ModelSource::Local {
            path: common::fixture(name).join("model.safetensors"),
        })
    }
}

fn setup(name: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(dir.path(), 512);
    let engine = Engine::spawn().expect("spawn");
    let card = engine
        .submit(load_request(name, &tokenizer))
        .and_then(|t| t.wait(|_| true))
        .expect("load fixture");
    assert_eq!(card.vocab_size, 512);
    Setup {
        engine,
        tokenizer,
        _dir: dir,
    }
}

fn greedy(prompt: Prompt, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens,
        ..GenerateRequest::new(prompt)
    }
}

/// Everything one generation sent, in order.
struct Run {
    events: Vec<Event>,
}

impl Run {
    fn text(&self) -> String {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Token { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
    fn done(&self) -> (DoneReason, Vec<u32>) {
        match self.events.last() {
            Some(Event::Done { reason, token_ids }) => (*reason, token_ids.clone()),
            other => panic!("run did not end with done: {other:?}"),
        }
    }
    fn stats(&self) -> GenStats {
        self.events
            .iter()
            .find_map(|e| match e {
                Event::Stats(s) => Some(s.clone()),
                _ => None,
            })
            .expect("stats event")
    }
    fn error(&self) -> (ErrorCode, String) {
        match self.events.as_slice() {
            [Event::Error { code, message }] => (*code, message.clone()),
            other => panic!("expected exactly one error event, got {other:?}"),
        }
    }
}

/// The default conversation's policy, as the engine reports it.
fn policy_of_default(engine: &EngineHandle) -> String {
    common::default_conversation(engine).spec
}

/// A request run to its end; one refused when submitted is one error event.
fn run(engine: &EngineHandle, req: GenerateRequest) -> Run {
    let rx = match engine.submit(req) {
        Ok(rx) => rx,
        Err(e) => {
            return Run {
                events: vec![e.to_event()],
            }
        }
    };
    let mut events = Vec::new();
    for ev in rx.events() {
        let end = matches!(ev, Event::Done { .. } | Event::Error { .. });
        events.push(ev);
        if end {
            break;
        }
    }
    Run { events }
}

#[test]
fn streaming_greedy_generation_equals_the_reference_ids() {
    for (name, family) in FIXTURES {
        let s = setup(name);
        let g = common::golden(name);
        let expect = common::ids(&g["greedy_ids"]);
        let r = run(
            &s.engine,
            greedy(
                Prompt::Ids {
                    ids: expect[..12].to_vec(),
                },
                20,
            ),
        );
        let (reason, ids) = r.done();
        assert_eq!(ids, expect[12..], "{name}: greedy ids differ");
        assert_eq!(reason, DoneReason::Length);
        // The streamed deltas add up to the decoded ids.
        let tok = GemmaTokenizer::from_file(&s.tokenizer, family).expect("tokenizer");
        assert_eq!(r.text(), tok.decode(&ids, true).expect("decode"), "{name}");
        let st = r.stats();
        assert_eq!(
            (st.prompt_tokens, st.prefill_tokens, st.generated_tokens),
            (12, 12, 20)
        );
        // The last sampled token is not run through the model.
        assert_eq!(st.context_tokens, 12 + 19);
        assert_eq!(s.engine.status().context_tokens, 31);
        assert!(st.kv_bytes > 0 && st.kv_bytes <= st.kv_bytes_allocated);
        s.engine.shutdown();
    }
}

#[test]
fn cancel_stops_within_one_token() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink_events = Arc::clone(&events);
    let (done_tx, done_rx) = mpsc::channel();
    // Runs on the engine thread: refusing the 3rd token's event (the client is gone) cancels
    // exactly "after the 3rd token".
    let _ticket = s
        .engine
        .submit_with(
            greedy(
                Prompt::Ids {
                    ids: expect[..12].to_vec(),
                },
                20,
            ),
            move |ev| {
                let mut evs = sink_events.lock().expect("lock");
                let tokens = evs
                    .iter()
                    .filter(|e| matches!(e, Event::Token { .. }))
                    .count();
                let keep = !(matches!(ev, Event::Token { .. }) && tokens + 1 == 3);
                let end = matches!(ev, Event::Done { .. } | Event::Error { .. });
                evs.push(ev);
                if end {
                    let _ = done_tx.send(());
                }
                keep
            },
        )
        .expect("send");
    done_rx.recv().expect("done");
    let r = Run {
        events: events.lock().expect("lock").clone(),
    };
    let (reason, ids) = r.done();
    assert_eq!(reason, DoneReason::Cancelled);
    assert_eq!(ids, expect[12..15]);
    assert_eq!(r.stats().generated_tokens, 3);
}

#[test]
fn reset_clears_the_context() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let prompt = Prompt::Ids {
        ids: expect[..12].to_vec(),
    };
    let first = run(&s.engine, greedy(prompt.clone(), 5));
    assert_eq!(s.engine.status().context_tokens, 16);
    s.engine
        .forget(&ConversationId::default_id(), false)
        .expect("reset");
    let st = s.engine.status();
    assert_eq!((st.context_tokens, st.kv.total_used), (0, 0));
    let again = run(&s.engine, greedy(prompt, 5));
    assert_eq!(again.stats().reused_tokens, 0);
    assert_eq!(again.stats().prefill_tokens, 12);
    assert_eq!(again.done(), first.done());
}

#[test]
fn a_second_turn_prefills_only_its_new_tokens() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let p1 = expect[..12].to_vec();
    let t1 = run(&s.engine, greedy(Prompt::Ids { ids: p1.clone() }, 5));
    let (_, g1) = t1.done();
    // Turn 2 = turn 1 + its answer + three new tokens.
    let mut p2 = p1.clone();
    p2.extend(&g1);
    p2.extend([40, 41, 42]);
    let st = run(&s.engine, greedy(Prompt::Ids { ids: p2.clone() }, 5)).stats();
    // The cache held p1 and the first four answer tokens (the fifth was never run).
    assert_eq!(st.reused_tokens, 12 + 4);
    assert_eq!(st.prefill_tokens, p2.len() - 16);
    assert_eq!(st.prefill_tokens, 4);

    // The same through the chat template: the second turn reuses the first prompt and the
    // answer, and prefills only the rest.
    s.engine
        .forget(&ConversationId::default_id(), false)
        .expect("reset");
    let user1 = Message::user("hello there");
    let chat1 = Prompt::Chat {
        system: None,
        messages: vec![user1.clone()],
        thinking: false,
        tools: Vec::new(),
    };
    let r1 = run(&s.engine, greedy(chat1, 6));
    let p1_len = r1.stats().prompt_tokens;
    let chat2 = Prompt::Chat {
        system: None,
        messages: vec![user1, Message::model(r1.text()), Message::user("and more")],
        thinking: false,
        tools: Vec::new(),
    };
    let st2 = run(&s.engine, greedy(chat2, 4)).stats();
    assert!(
        st2.reused_tokens > p1_len,
        "{st2:?} vs first prompt {p1_len}"
    );
    assert_eq!(st2.prefill_tokens, st2.prompt_tokens - st2.reused_tokens);
    assert!(st2.prefill_tokens < st2.prompt_tokens - p1_len);
}

#[test]
fn an_oversize_prompt_is_a_clean_error_and_loses_nothing() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let p1 = expect[..12].to_vec();
    run(&s.engine, greedy(Prompt::Ids { ids: p1.clone() }, 3));
    let before = s.engine.status().context_tokens;
    // The fixture's context is 256 tokens.
    let long: Vec<u32> = (0..300).map(|i| 10 + (i % 400)).collect();
    let (code, message) = run(&s.engine, greedy(Prompt::Ids { ids: long }, 3)).error();
    assert_eq!(code, ErrorCode::ContextOverflow);
    assert!(
        message.contains("300") && message.contains("256"),
        "{message}"
    );
    assert_eq!(s.engine.status().context_tokens, before);
    // The cached conversation is still there.
    let st = run(&s.engine, greedy(Prompt::Ids { ids: p1 }, 3)).stats();
    assert_eq!(st.reused_tokens, 11);
}

#[test]
fn bad_models_are_coded_errors_and_the_engine_stays_usable() {
    let s = setup("tiny_gemma3");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        common::fixture("tiny_gemma3").join("config.json"),
        dir.path().join("config.json"),
    )
    .expect("copy config");
    let corrupt = dir.path().join("model.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}").expect("write");
    let bad = LoadRequest {
        tokenizer: Some(s.tokenizer.clone()),
        ..LoadRequest::new(ModelSource::Local { path: corrupt })
    };
    let err = s
        .engine
        .submit(bad)
        .and_then(|t| t.wait(|_| true))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::BadModelFile, "{err}");

    let missing = LoadRequest::new(ModelSource::Local {
        path: dir.path().join("absent.gguf"),
    });
    let err = s
        .engine
        .submit(missing)
        .and_then(|t| t.wait(|_| true))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::ModelNotFound, "{err}");

    // The model loaded before is still there and still answers.
    assert_eq!(
        s.engine.status().model.map(|c| c.name),
        Some("tiny_gemma3".to_owned())
    );
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let r = run(
        &s.engine,
        greedy(
            Prompt::Ids {
                ids: expect[..12].to_vec(),
            },
            4,
        ),
    );
    assert_eq!(r.done().1, expect[12..16]);

    s.engine.unload().expect("unload");
    let (code, _) = run(&s.engine, greedy(Prompt::Text { text: "hi".into() }, 2)).error();
    assert_eq!(code, ErrorCode::NoModel);
    // And a fresh load works again.
    s.engine
        .submit(load_request("tiny_gemma3", &s.tokenizer))
        .and_then(|t| t.wait(|_| true))
        .expect("reload");
}

#[test]
fn cache_switches_apply_between_tokens_and_other_jobs_are_refused() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let handle = s.engine.clone();
    let (switch_tx, switch_rx) = mpsc::channel();
    let (reset_tx, reset_rx) = mpsc::channel();
    let mut tokens = 0;
    let mut asked = Some((switch_tx, reset_tx));
    let (events_tx, events_rx) = mpsc::channel();
    let _ticket = s
        .engine
        .submit_with(
            greedy(
                Prompt::Ids {
                    ids: expect[..12].to_vec(),
                },
                20,
            ),
            move |ev| {
                if matches!(ev, Event::Token { .. }) {
                    tokens += 1;
                    if let Some((switch_tx, reset_tx)) = asked.take_if(|_| tokens == 2) {
                        // From another thread, as a front end asks: the engine answers between
                        // two tokens of this very generation.
                        let handle = handle.clone();
                        std::thread::spawn(move || {
                            let id = ConversationId::default_id();
                            let _ = switch_tx.send(
                                handle.switch_cache(&id, &CacheSelection::Spec("f16".into())),
                            );
                            let _ = reset_tx.send(handle.forget(&id, false));
                        });
                    }
                }
                events_tx.send(ev).is_ok()
            },
        )
        .expect("send");
    let mut events = Vec::new();
    for ev in events_rx {
        let end = matches!(ev, Event::Done { .. } | Event::Error { .. });
        events.push(ev);
        if end {
            break;
        }
    }
    let r = Run { events };
    let (reason, ids) = r.done();
    assert_eq!((reason, ids.len()), (DoneReason::Length, 20));
    let marker = switch_rx.recv().expect("switch reply").expect("switched");
    assert_eq!(marker.to, "f16");
    // Switched between two tokens after the 2nd streamed one (12 prompt tokens plus those
    // generated by then were converted), and it went on to 20 tokens.
    assert!((13..31).contains(&marker.tokens), "{}", marker.tokens);
    let refused = reset_rx.recv().expect("reset reply").unwrap_err();
    assert_eq!(refused.code, ErrorCode::Busy);
    assert_eq!(policy_of_default(&s.engine), "f16");
    // The refused reset really did nothing.
    assert_eq!(s.engine.status().context_tokens, 31);
}

#[test]
fn the_handle_cancels_a_running_generation() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let (tx, rx) = mpsc::channel();
    let _ticket = s
        .engine
        .submit_with(
            greedy(
                Prompt::Ids {
                    ids: expect[..12].to_vec(),
                },
                200,
            ),
            // A slow consumer: 200 tokens would take a second, the cancel arrives long before.
            move |ev| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                tx.send(ev).is_ok()
            },
        )
        .expect("send");
    let mut events = Vec::new();
    for ev in rx {
        if matches!(ev, Event::Token { .. }) && s.engine.status().model.is_some() {
            // Busy while generating, and status answers without waiting for it.
            assert!(s.engine.status().busy);
            s.engine.cancel(Some(&ConversationId::default_id()));
        }
        let end = matches!(ev, Event::Done { .. } | Event::Error { .. });
        events.push(ev);
        if end {
            break;
        }
    }
    let (reason, ids) = Run { events }.done();
    assert_eq!(reason, DoneReason::Cancelled);
    assert!(ids.len() < 200, "{}", ids.len());
    assert!(!s.engine.status().busy);
}

/// The rewind margin the memory tests set on their engine before loading.
const MARGIN: usize = 16;

/// The KV bytes the engine's cache holds at `tokens` tokens of tiny_gemma3 in f32, with a
/// rewind margin of [`MARGIN`].
fn kv_at(tokens: usize) -> u64 {
    let f32 = PrecisionPolicy::uniform(KvPrecision::F32);
    kvlab_engine::lab::estimate_kv_bytes(&tiny_config(), &f32, tokens, MARGIN).expect("estimate")
}

/// What an f32 cache of the tiny Gemma 3 grown to `tokens` tokens allocates, at most: what
/// the pool admits against its budget.
fn kv_allocated_at(tokens: usize) -> u64 {
    let f32 = PrecisionPolicy::uniform(KvPrecision::F32);
    kvlab_engine::lab::estimate_kv_allocated(&tiny_config(), &f32, tokens, MARGIN)
        .expect("estimate")
}

fn tiny_config() -> kvlab_engine::lab::ModelConfig {
    kvlab_engine::lab::load_hf_config(&common::fixture("tiny_gemma3").join("config.json"))
        .expect("config")
}

#[test]
fn hostile_load_larger_than_memory_is_refused_with_what_would_fit() {
    use kvlab_engine::contract::format_bytes;
    use kvlab_engine::contract::CacheSelection;
    use kvlab_engine::MemoryBudget;
    let s = setup("tiny_gemma3");
    let path = common::fixture("tiny_e").join("model.safetensors");
    let f32 = CacheSelection::Spec("f32".into());
    // What the load needs, from the card's estimate with no limit at all.
    let unlimited = MemoryBudget::fixed(u64::MAX, 0);
    s.engine.set_memory_budget(unlimited);
    let opts = kvlab_engine::LoadOptions::default();
    let need = s
        .engine
        .estimate(&path, &opts, 200, &f32)
        .expect("estimate");
    assert!(need.fit.fits);
    // One byte short of it, 64 KiB kept free: refused before a weight is read.
    let margin = 64 << 10;
    let available = need.total_bytes + margin - 1;
    s.engine
        .set_memory_budget(MemoryBudget::fixed(available, margin));
    let request = |spec: &str| LoadRequest {
        tokenizer: Some(s.tokenizer.clone()),
        cache: CacheSelection::Spec(spec.into()),
        context: 200,
        ..LoadRequest::new(ModelSource::Local { path: path.clone() })
    };
    let err = s
        .engine
        .submit(request("f32"))
        .and_then(|t| t.wait(|_| true))
        .unwrap_err();
    let _ = std::io::stderr().lock().write_all(
        format!(
            "{}\n",
            format_args!("HOSTILE model load larger than memory -> {}", err.code)
        )
        .as_bytes(),
    );
    assert_eq!(err.code, ErrorCode::OutOfMemory, "{err}");
    for want in [
        format_bytes(need.total_bytes),
        format_bytes(available),
        format_bytes(margin),
        "200 tokens".into(),
        "k8v4+qw@all".into(),
        "tokens fits".into(),
        "the model loaded now stays loaded".into(),
    ] {
        assert!(err.message.contains(&want), "{want}: {}", err.message);
    }
    // The estimate the panel shows says the same before any load.
    let shown = s
        .engine
        .estimate(&path, &opts, 200, &f32)
        .expect("estimate");
    assert!(!shown.fit.fits);
    let tq = shown
        .fit
        .turboquant
        .clone()
        .expect("a TurboQuant cache fits");
    let shorter = shown.fit.max_context.expect("a shorter context fits");
    assert!(tq.needed_bytes <= available - margin && shorter < 200);
    // Nothing was lost: the loaded model still answers.
    assert_eq!(
        s.engine.status().model.map(|c| c.name),
        Some("tiny_gemma3".into())
    );
    // What it offered really fits: the TurboQuant load passes the same budget.
    s.engine
        .submit(request(&tq.spec))
        .and_then(|t| t.wait(|_| true))
        .expect("the offered cache loads");
}

#[test]
fn hostile_switch_larger_than_memory_is_refused_before_converting() {
    use kvlab_engine::contract::format_bytes;
    use kvlab_engine::lab::CacheSpec;
    use kvlab_engine::MemoryBudget;
    let s = setup("tiny_gemma3");
    s.engine.set_rewind_margin(MARGIN);
    let tq4 = CacheSpec::parse("tq4@all").expect("spec").to_policy();
    s.engine
        .submit(LoadRequest {
            cache: CacheSelection::Spec(tq4.spec_string()),
            ..load_request("tiny_gemma3", &s.tokenizer)
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    run(
        &s.engine,
        greedy(
            Prompt::Ids {
                ids: expect[..12].to_vec(),
            },
            20,
        ),
    );
    let held = s.engine.status();
    assert_eq!(held.context_tokens, 31);
    // An f32 cache of 31 tokens is built beside the TurboQuant one: one byte short of the
    // room it allocates.
    let f32_bytes = kv_at(31);
    let f32_room = kv_allocated_at(31);
    let margin = 4096;
    s.engine
        .set_memory_budget(MemoryBudget::fixed(margin + f32_room - 1, margin));
    let err = s
        .engine
        .switch_cache(
            &ConversationId::default_id(),
            &CacheSelection::Spec("f32".into()),
        )
        .unwrap_err();
    let _ = std::io::stderr().lock().write_all(
        format!(
            "{}\n",
            format_args!("HOSTILE cache switch larger than memory -> {}", err.code)
        )
        .as_bytes(),
    );
    assert_eq!(err.code, ErrorCode::OutOfMemory, "{err}");
    for want in [
        "switch the KV cache to f32".to_string(),
        format_bytes(f32_bytes),
        "31 tokens".into(),
    ] {
        assert!(err.message.contains(&want), "{want}: {}", err.message);
    }
    // Nothing was converted: same policy, same bytes.
    let after = s.engine.status();
    assert_eq!(policy_of_default(&s.engine), tq4.spec_string());
    assert_eq!(after.kv, held.kv);
    assert_eq!(after.context_tokens, 31);
    // With the byte it lacked, the same switch goes through.
    s.engine
        .set_memory_budget(MemoryBudget::fixed(margin + f32_room, margin));
    let marker = s
        .engine
        .switch_cache(
            &ConversationId::default_id(),
            &CacheSelection::Spec("f32".into()),
        )
        .expect("switch fits");
    assert_eq!(marker.kv_after.used, f32_bytes);
}

#[test]
fn hostile_context_growth_beyond_memory_is_refused_and_the_session_kept() {
    use kvlab_engine::MemoryBudget;
    let s = setup("tiny_gemma3");
    // The margin is the session's from its load: set it, then load again.
    s.engine.set_rewind_margin(MARGIN);
    s.engine
        .submit(load_request("tiny_gemma3", &s.tokenizer))
        .and_then(|t| t.wait(|_| true))
        .expect("reload");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let first = run(
        &s.engine,
        greedy(
            Prompt::Ids {
                ids: expect[..12].to_vec(),
            },
            20,
        ),
    );
    let mut history = expect[..12].to_vec();
    history.extend(first.done().1);
    assert_eq!(s.engine.status().kv.total_used, kv_at(31));
    // Room for the conversation to grow to 52 tokens, not more: the budget counts what its
    // cache allocates (held tokens and a bounded spare).
    let held = s.engine.status().kv.total_allocated;
    let margin = 4096;
    s.engine.set_memory_budget(MemoryBudget::fixed(
        margin + kv_allocated_at(52) - held,
        margin,
    ));
    // The longest context whose room is that of 52 tokens: what the refusal offers.
    let offered = (52..132)
        .take_while(|&n| kv_allocated_at(n) <= kv_allocated_at(52))
        .last()
        .expect("52 fits");
    let (code, message) = run(
        &s.engine,
        greedy(
            Prompt::Ids {
                ids: history.clone(),
            },
            100,
        ),
    )
    .error();
    let _ = std::io::stderr().lock().write_all(
        format!(
            "{}\n",
            format_args!("HOSTILE context growth larger than memory -> {code}")
        )
        .as_bytes(),
    );
    assert_eq!(code, ErrorCode::OutOfMemory, "{message}");
    assert!(
        message.contains("132 tokens") && message.contains(&format!("up to {offered} tokens fits")),
        "{message}"
    );
    // Nothing was touched: the cache holds what it held.
    assert_eq!(s.engine.status().context_tokens, 31);
    // What it offered fits: 32 prompt tokens and the rest of the offer.
    let r = run(
        &s.engine,
        greedy(
            Prompt::Ids {
                ids: history.clone(),
            },
            offered - 32,
        ),
    );
    assert_eq!(r.done().1.len(), offered - 32);
    assert_eq!(r.stats().reused_tokens, 31);

    // A comparison's two fresh caches are checked too.
    let refused = s
        .engine
        .submit(kvlab_engine::CompareRequest {
            prompt: Prompt::Ids { ids: history },
            sampling: SamplingParams::greedy(),
            max_tokens: 200,
            caches: [
                kvlab_engine::contract::CacheSelection::Spec("f32".into()),
                kvlab_engine::contract::CacheSelection::Spec("f16".into()),
            ],
            prefill_chunk: 512,
            sweep: Vec::new(),
            constraint: None,
            fit: None,
        })
        .expect("send");
    let last = refused.events().last().expect("an answer");
    match last {
        kvlab_engine::contract::Event::Error { code, message } => {
            let _ = std::io::stderr().lock().write_all(
                format!(
                    "{}\n",
                    format_args!("HOSTILE comparison larger than memory -> {code}")
                )
                .as_bytes(),
            );
            assert_eq!(code, ErrorCode::OutOfMemory, "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn requests_wait_their_turn_in_order_and_a_full_queue_is_refused() {
    use kvlab_engine::contract::MAX_QUEUED;
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let prompt = || Prompt::Ids {
        ids: expect[..12].to_vec(),
    };
    // The first request holds the engine thread inside its first token's callback until
    // released, so everything sent meanwhile is waiting when it goes on. They all run in the
    // same (default) conversation, so they run one after another.
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut held = Some((started_tx, release_rx));
    let first_order = Arc::clone(&order);
    let _first = s
        .engine
        .submit_with(greedy(prompt(), 4), move |ev| {
            if let (Event::Token { .. }, Some((started, release))) = (&ev, held.take()) {
                started.send(()).expect("test listening");
                release.recv().expect("released");
            }
            if let Event::Done { token_ids, .. } = ev {
                first_order.lock().unwrap().push((usize::MAX, token_ids));
            }
            true
        })
        .expect("send");
    started_rx.recv().expect("the first request started");
    let mut tickets = Vec::new();
    for i in 0..MAX_QUEUED {
        let order = Arc::clone(&order);
        let ticket = s
            .engine
            .submit_with(greedy(prompt(), 4), move |ev| {
                if let Event::Done { token_ids, .. } = ev {
                    order.lock().unwrap().push((i, token_ids));
                }
                true
            })
            .expect("send");
        tickets.push(ticket);
    }
    assert_eq!(s.engine.status().queued, MAX_QUEUED);
    // One past the queue's size: refused the moment it arrives, with its own code, though
    // the engine thread is busy.
    let over = s.engine.submit(greedy(prompt(), 4)).err().expect("refused");
    assert_eq!(over.code, ErrorCode::QueueFull);
    // A queued request whose client left frees its place at once, and never runs.
    tickets[3].cancel();
    drop(tickets.remove(3));
    assert_eq!(s.engine.status().queued, MAX_QUEUED - 1);
    let late = s
        .engine
        .submit(greedy(prompt(), 4))
        .expect("a place was freed");
    drop(late);
    release_tx.send(()).expect("release");
    // Everything else ran after the first, in the order it was sent.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while order.lock().unwrap().len() < MAX_QUEUED {
        assert!(
            std::time::Instant::now() < deadline,
            "the queue never drained"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let order = order.lock().unwrap().clone();
    let ran: Vec<usize> = order
        .iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(i, _)| *i)
        .collect();
    let mut want = vec![usize::MAX];
    want.extend((0..MAX_QUEUED).filter(|&i| i != 3));
    assert_eq!(ran, want);
    for (i, ids) in &order {
        if *i == 3 {
            assert!(ids.is_empty(), "the cancelled request generated {ids:?}");
        } else if !ids.is_empty() {
            // Each queued answer is the one it would get alone.
            assert_eq!(ids, &expect[12..16], "request {i}");
        }
    }
    assert_eq!(s.engine.status().queued, 0);
    drop(tickets);
}

#[test]
fn a_request_whose_client_left_is_cancelled_and_the_engine_goes_on() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let (tx, rx) = mpsc::channel();
    let mut seen = 0;
    // The "client" reads three tokens, then is gone.
    let _ticket = s
        .engine
        .submit_with(
            greedy(
                Prompt::Ids {
                    ids: expect[..12].to_vec(),
                },
                expect.len() - 12,
            ),
            move |ev| {
                if matches!(ev, Event::Token { .. }) {
                    seen += 1;
                }
                if matches!(ev, Event::Done { .. }) {
                    let _ = tx.send(ev);
                }
                seen < 3
            },
        )
        .expect("send");
    let done = Run {
        events: vec![rx.recv().expect("done")],
    };
    let (reason, ids) = done.done();
    assert_eq!(reason, DoneReason::Cancelled);
    assert_eq!(ids, expect[12..15]);
    // The engine is free for the next request at once.
    let next = run(
        &s.engine,
        greedy(
            Prompt::Ids {
                ids: expect[..12].to_vec(),
            },
            2,
        ),
    );
    assert_eq!(next.done().1, expect[12..14]);
}

#[test]
fn hostile_panic_in_a_step_ends_that_request_and_the_engine_goes_on() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let prompt = || Prompt::Ids {
        ids: expect[..12].to_vec(),
    };
    run(&s.engine, greedy(prompt(), 3));
    // A request whose sink panics at its first token: the panic happens on the engine
    // thread, inside the step that sampled the token.
    let (tx, rx) = mpsc::channel();
    let mut panicked = false;
    let _ticket = s
        .engine
        .submit_with(
            GenerateRequest {
                conversation: Some(kvlab_engine::contract::ConversationChoice::Id {
                    id: ConversationId::new("victim").expect("id"),
                }),
                ..greedy(prompt(), 5)
            },
            move |ev| {
                if matches!(ev, Event::Token { .. }) && !panicked {
                    panicked = true;
                    panic!("injected: a sink that panics");
                }
                tx.send(ev).is_ok()
            },
        )
        .expect("submit");
    let ended = rx.recv().expect("an end");
    let Event::Error { code, message } = &ended else {
        panic!("expected an error, got {ended:?}")
    };
    assert_eq!(*code, ErrorCode::Internal);
    assert!(message.contains("injected"), "{message}");
    writeln!(
        std::io::stderr().lock(),
        "{}",
        format_args!("HOSTILE panic in a request's step on the engine thread -> {code}")
    )
    .ok();
    // The model is still loaded, the other conversation's cache kept, and the next
    // requests are served exactly.
    assert!(s.engine.status().model.is_some());
    let again = run(&s.engine, greedy(prompt(), 3));
    assert_eq!(again.done().1, expect[12..15]);
    assert_eq!(again.stats().reused_tokens, 11);
    let victim = run(
        &s.engine,
        GenerateRequest {
            conversation: Some(kvlab_engine::contract::ConversationChoice::Id {
                id: ConversationId::new("victim").expect("id"),
            }),
            ..greedy(prompt(), 3)
        },
    );
    assert_eq!(victim.done().1, expect[12..15]);
}

#[test]
fn a_requests_own_context_limit_refuses_a_longer_prompt_and_ends_its_answer() {
    let s = setup("tiny_gemma3");
    let expect = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let limited = |n: usize, max_tokens: usize, context: usize| GenerateRequest {
        context: Some(context),
        ..greedy(
            Prompt::Ids {
                ids: expect[..n].to_vec(),
            },
            max_tokens,
        )
    };
    let (code, message) = run(&s.engine, limited(12, 3, 10)).error();
    assert_eq!(code, ErrorCode::ContextOverflow);
    assert!(
        message.contains("12") && message.contains("10"),
        "{message}"
    );
    // 12 tokens of prompt in a context of 16: 4 answer tokens fill it and a fifth is
    // sampled from the last (never run), as at the end of the model's own context.
    let r = run(&s.engine, limited(12, 100, 16));
    let (reason, ids) = r.done();
    assert_eq!(reason, DoneReason::Length);
    assert_eq!(ids, expect[12..17]);
    // A limit past the model's own context is the model's.
    assert_eq!(limited(12, 1, 1 << 20).context_limit(256), 256);
}
