//! Many conversations under one memory budget, on the tiny golden fixture: interleaved
//! conversations answer as they would alone; a demoted one answers as one switched to the
//! demotion preset; a spilled one comes back from disk as it was; a generating one is never
//! touched; one client's cache leaves another's alone; rows once coded are never reused as
//! exact; a quit saves each conversation's own cache. Then the hostile rows: a budget below
//! one conversation, a spill with no disk, a corrupt spill file, many clients at once, and a
//! client that leaves mid-prefill.

use crate::common;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{
    CacheOrigin, ConversationChoice, ConversationId, ConversationInfo, DoneReason, ErrorCode,
    Event, GenStats, MarkerKind, Tier,
};
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::PrecisionPolicy;
use kvlab_engine::GenerateRequest;
use kvlab_engine::MemoryBudget;
use kvlab_engine::{Engine, EngineHandle, ModelSource};
use kvlab_engine::{LoadRequest, PoolSettings};

/// The rewind margin these engines keep (small, so sliding layers stay small).
const MARGIN: usize = 16;

struct Lab {
    engine: EngineHandle,
    _dir: tempfile::TempDir,
    spill: PathBuf,
}

fn policy(spec: &str) -> PrecisionPolicy {
    CacheSpec::parse(spec).expect("spec").to_policy()
}

/// An engine on tiny_gemma3 whose new conversations hold `default`, with no memory limit but
/// the pool's (none until a test sets one) and a spill directory of its own.
fn lab(default: &str) -> Lab {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(dir.path(), 512);
    let engine = Engine::spawn().expect("spawn");
    engine.set_rewind_margin(MARGIN);
    engine.set_memory_budget(MemoryBudget::fixed(1 << 40, 0));
    let spill = dir.path().join("spill");
    engine.set_pool_settings(PoolSettings {
        spill_dir: Some(spill.clone()),
        ..PoolSettings::default()
    });
    engine
        .submit(LoadRequest {
            tokenizer: Some(tokenizer),
            cache: CacheSelection::Spec(default.into()),
            ..LoadRequest::new(ModelSource::Local {
                path: common::fixture("tiny_gemma3").join("model.safetensors"),
            })
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    Lab {
        engine,
        _dir: dir,
        spill,
    }
}

fn id(name: &str) -> ConversationId {
    ConversationId::new(name).expect("id")
}

fn turn_request(conversation: &str, ids: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens,
        conversation: Some(ConversationChoice::Id {
            id: id(conversation),
        }),
        ..GenerateRequest::new(Prompt::Ids { ids: ids.to_vec() })
    }
}

/// A turn's generated ids and stats, or its error.
fn turn(
    engine: &EngineHandle,
    request: GenerateRequest,
) -> Result<(Vec<u32>, GenStats), (ErrorCode, String)> {
    let ticket = engine.submit(request).map_err(|e| (e.code, e.message))?;
    let mut stats = None;
    for ev in ticket.events() {
        match ev {
            Event::Stats(s) => stats = Some(s),
            Event::Done { token_ids, .. } => return Ok((token_ids, stats.expect("stats"))),
            Event::Error { code, message } => return Err((code, message)),
            _ => {}
        }
    }
    panic!("the turn never ended")
}

fn ok_turn(
    engine: &EngineHandle,
    conversation: &str,
    ids: &[u32],
    max_tokens: usize,
) -> (Vec<u32>, GenStats) {
    turn(engine, turn_request(conversation, ids, max_tokens)).expect("turn")
}

fn info(engine: &EngineHandle, conversation: &str) -> ConversationInfo {
    engine
        .status()
        .conversations
        .into_iter()
        .find(|c| c.id.as_str() == conversation)
        .expect("the conversation")
}

/// Prompts of the golden fixture: distinct openings of 12 tokens.
fn prompt(n: u32) -> Vec<u32> {
    let golden = common::ids(&common::golden("tiny_gemma3")["greedy_ids"]);
    let mut p = golden[..12].to_vec();
    p[1] = 10 + n;
    p
}

/// The next turn of a conversation: its prompt, its answer and three more tokens.
fn next(prompt: &[u32], answer: &[u32]) -> Vec<u32> {
    let mut p = prompt.to_vec();
    p.extend(answer);
    p.extend([40, 41, 42]);
    p
}

fn hostile(line: String) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("HOSTILE {line}\n").as_bytes());
}

#[test]
fn interleaved_conversations_answer_exactly_as_they_do_alone() {
    for default in ["f32", "f16"] {
        let alone = lab(default);
        let (a_ids, _) = ok_turn(&alone.engine, "a", &prompt(1), 24);
        let (b_ids, _) = ok_turn(&alone.engine, "b", &prompt(2), 24);
        // Both at once: the engine steps them in turn.
        let both = lab(default);
        let ta = both
            .engine
            .submit(turn_request("a", &prompt(1), 24))
            .expect("a");
        let tb = both
            .engine
            .submit(turn_request("b", &prompt(2), 24))
            .expect("b");
        let (mut a_first_done, mut b_tokens_before_a_done) = (false, 0);
        let (mut got_a, mut got_b) = (None, None);
        while got_a.is_none() || got_b.is_none() {
            if got_a.is_none() {
                match ta.recv_timeout(Duration::from_secs(30)).expect("a event") {
                    Event::Done { token_ids, .. } => {
                        got_a = Some(token_ids);
                        a_first_done = got_b.is_none();
                    }
                    Event::Error { message, .. } => panic!("{message}"),
                    _ => {}
                }
            }
            if got_b.is_none() {
                match tb.recv_timeout(Duration::from_secs(30)).expect("b event") {
                    Event::Token { .. } if got_a.is_none() => b_tokens_before_a_done += 1,
                    Event::Done { token_ids, .. } => got_b = Some(token_ids),
                    Event::Error { message, .. } => panic!("{message}"),
                    _ => {}
                }
            }
        }
        assert_eq!(got_a.as_deref(), Some(a_ids.as_slice()), "{default}: a");
        assert_eq!(got_b.as_deref(), Some(b_ids.as_slice()), "{default}: b");
        // B streamed while A was still running: neither waited for the other to finish.
        assert!(
            a_first_done && b_tokens_before_a_done > 0,
            "{default}: b streamed {b_tokens_before_a_done} tokens before a finished"
        );
    }
}

#[test]
fn a_demoted_conversation_answers_as_one_switched_to_the_preset() {
    let preset = "k4v3+qw@all";
    // The pool demotes A to make room for B.
    let pooled = lab("f32");
    let mut settings = pooled.engine.pool_settings();
    settings.demote_to = policy(preset);
    pooled.engine.set_pool_settings(settings.clone());
    let (a1, _) = ok_turn(&pooled.engine, "a", &prompt(1), 8);
    let a_bytes = info(&pooled.engine, "a").bytes;
    // The budget counts allocated bytes: room for A as allocated and B's admission, less one.
    let a_allocated = info(&pooled.engine, "a").allocated;
    let cfg =
        kvlab_engine::lab::load_hf_config(&common::fixture("tiny_gemma3").join("config.json"))
            .expect("config");
    let b_needs = kvlab_engine::lab::estimate_kv_allocated(&cfg, &policy("f32"), 12 + 8, MARGIN)
        .expect("estimate");
    settings.kv_budget = Some(a_allocated + b_needs - 1);
    pooled.engine.set_pool_settings(settings);
    let (b1, _) = ok_turn(&pooled.engine, "b", &prompt(2), 8);
    let a = info(&pooled.engine, "a");
    assert_eq!((a.tier, a.spec.as_str()), (Tier::Demoted, preset));
    let (markers, _) = pooled.engine.markers_since(0);
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert_eq!(markers[0].kind, MarkerKind::Demote);
    assert_eq!(markers[0].conversation, Some(id("a")));
    assert_eq!(markers[0].kv_before.used, a_bytes);
    assert!(markers[0].kv_after.used < a_bytes / 3, "{:?}", markers[0]);
    let peak = pooled.engine.status().kv.total_allocated;
    assert!(peak < a_allocated + b_needs, "{peak} over the budget");
    let (a2, st) = ok_turn(&pooled.engine, "a", &next(&prompt(1), &a1), 8);
    assert_eq!(st.cache_origin, CacheOrigin::Demoted);
    assert_eq!(st.reused_tokens, 12 + 7);

    // The same conversation switched to the preset by its owner at the same point.
    let switched = lab("f32");
    let (a1_again, _) = ok_turn(&switched.engine, "a", &prompt(1), 8);
    assert_eq!(a1_again, a1);
    switched
        .engine
        .switch_cache(&id("a"), &CacheSelection::Spec(preset.into()))
        .expect("switch");
    let (a2_switched, _) = ok_turn(&switched.engine, "a", &next(&prompt(1), &a1), 8);
    assert_eq!(a2, a2_switched);
    // And B, beside it, answered as it does alone.
    let (b_alone, _) = ok_turn(&switched.engine, "b", &prompt(2), 8);
    assert_eq!(b1, b_alone);
}

#[test]
fn a_spilled_conversation_comes_back_from_disk_as_it_was() {
    let pooled = lab("f32");
    let mut settings = pooled.engine.pool_settings();
    // Demotion would not shrink it: spilling is what frees it.
    settings.demote_to = policy("f32");
    pooled.engine.set_pool_settings(settings.clone());
    let (a1, _) = ok_turn(&pooled.engine, "a", &prompt(1), 8);
    let a_bytes = info(&pooled.engine, "a").allocated;
    settings.kv_budget = Some(a_bytes + a_bytes / 2);
    pooled.engine.set_pool_settings(settings);
    ok_turn(&pooled.engine, "b", &prompt(2), 8);
    let a = info(&pooled.engine, "a");
    assert_eq!((a.tier, a.bytes, a.tokens), (Tier::OnDisk, 0, 12 + 7));
    assert!(a.disk_bytes > 0);
    assert!(pooled.spill.join("a.kvc").exists());
    let (a2, st) = ok_turn(&pooled.engine, "a", &next(&prompt(1), &a1), 8);
    assert_eq!(st.cache_origin, CacheOrigin::Restored);
    assert_eq!(st.reused_tokens, 12 + 7);
    let kinds: Vec<MarkerKind> = pooled
        .engine
        .markers_since(0)
        .0
        .iter()
        .map(|m| m.kind)
        .collect();
    assert!(
        kinds.contains(&MarkerKind::Spill) && kinds.contains(&MarkerKind::Restore),
        "{kinds:?}"
    );
    // Exactly what the unbroken conversation answers, and the same bytes held.
    let unbroken = lab("f32");
    ok_turn(&unbroken.engine, "a", &prompt(1), 8);
    let (a2_unbroken, _) = ok_turn(&unbroken.engine, "a", &next(&prompt(1), &a1), 8);
    assert_eq!(a2, a2_unbroken);
    assert_eq!(
        info(&pooled.engine, "a").bytes,
        info(&unbroken.engine, "a").bytes
    );
}

#[test]
fn a_generating_conversation_is_never_demoted_or_spilled() {
    let l = lab("f32");
    let mut settings = l.engine.pool_settings();
    settings.kv_budget = Some(1);
    // Room for A alone, grown to its whole turn.
    let cfg =
        kvlab_engine::lab::load_hf_config(&common::fixture("tiny_gemma3").join("config.json"))
            .expect("config");
    let a_needs = kvlab_engine::lab::estimate_kv_allocated(&cfg, &policy("f32"), 12 + 100, MARGIN)
        .expect("estimate");
    settings.kv_budget = Some(a_needs);
    l.engine.set_pool_settings(settings);
    let (tx, rx) = mpsc::channel();
    let a = l
        .engine
        .submit_with(turn_request("a", &prompt(1), 100), move |ev| {
            // A slow client: A is still running when B asks for room.
            std::thread::sleep(Duration::from_millis(2));
            tx.send(ev).is_ok()
        })
        .expect("a");
    // Wait for A's first token, then ask for B.
    loop {
        if matches!(rx.recv().expect("a event"), Event::Token { .. }) {
            break;
        }
    }
    // A's cache grows as it generates: the room it was admitted for is kept for it.
    let refused = turn(&l.engine, turn_request("b", &prompt(2), 8)).unwrap_err();
    assert_eq!(refused.0, ErrorCode::OutOfMemory, "{}", refused.1);
    assert!(
        refused.1.contains("none left to demote or spill"),
        "{}",
        refused.1
    );
    let a_info = info(&l.engine, "a");
    assert_eq!(
        (a_info.tier, a_info.spec.as_str(), a_info.busy),
        (Tier::Held, "f32", true)
    );
    let mut reason = None;
    for ev in rx {
        if let Event::Done {
            reason: r,
            token_ids,
        } = ev
        {
            assert_eq!(token_ids.len(), 100);
            reason = Some(r);
            break;
        }
    }
    assert_eq!(reason, Some(DoneReason::Length));
    drop(a);
}

#[test]
fn a_turboquant_cache_holds_its_first_tokens_as_f16_until_it_calibrates() {
    // The tiny model (a 256-token context) waits for 16 rows; a 12-token prompt and one
    // more token stay below.
    let (tq, f16) = (lab("tq4@all"), lab("f16"));
    let (a1, _) = ok_turn(&tq.engine, "a", &prompt(1), 2);
    ok_turn(&f16.engine, "a", &prompt(1), 2);
    let (a, b) = (info(&tq.engine, "a"), info(&f16.engine, "a"));
    assert!(a.tokens < 16 && a.calibrating && !b.calibrating, "{a:?}");
    assert_eq!((a.bytes, a.spec.as_str()), (b.bytes, "tq4@all"));
    // Past 16 tokens it has calibrated and codes them all: fewer bytes than f16's.
    ok_turn(&tq.engine, "a", &next(&prompt(1), &a1), 8);
    let a = info(&tq.engine, "a");
    assert!(a.tokens >= 16 && !a.calibrating, "{a:?}");
    let with_f16 = lab("f16");
    ok_turn(&with_f16.engine, "a", &prompt(1), 2);
    ok_turn(&with_f16.engine, "a", &next(&prompt(1), &a1), 8);
    let b = info(&with_f16.engine, "a");
    assert_eq!(b.tokens, a.tokens);
    assert!(a.bytes < b.bytes, "{a:?} {b:?}");
}

#[test]
fn one_clients_cache_leaves_anothers_precision_and_answers_alone() {
    let l = lab("f16");
    let (a1, _) = ok_turn(&l.engine, "a", &prompt(1), 8);
    // B asks for a 1-bit cache of its own.
    let (_, st) = turn(
        &l.engine,
        GenerateRequest {
            cache: Some(CacheSelection::Spec("tq1@all".into())),
            ..turn_request("b", &prompt(1), 8)
        },
    )
    .expect("b");
    assert_eq!(st.cache_spec, "tq1@all");
    assert_eq!(info(&l.engine, "a").spec, "f16");
    let (a2, st) = ok_turn(&l.engine, "a", &next(&prompt(1), &a1), 8);
    assert_eq!(
        (st.cache_origin, st.cache_spec.as_str()),
        (CacheOrigin::Held, "f16")
    );
    // Exactly what A answers with no other client.
    let alone = lab("f16");
    ok_turn(&alone.engine, "a", &prompt(1), 8);
    let (a2_alone, _) = ok_turn(&alone.engine, "a", &next(&prompt(1), &a1), 8);
    assert_eq!(a2, a2_alone);
}

#[test]
fn rows_once_coded_are_read_again_for_a_dense_cache() {
    let l = lab("f32");
    let (a1, _) = ok_turn(&l.engine, "a", &prompt(1), 8);
    l.engine
        .switch_cache(&id("a"), &CacheSelection::Spec("tq4@all".into()))
        .expect("to tq4");
    l.engine
        .switch_cache(&id("a"), &CacheSelection::Spec("f32".into()))
        .expect("back to f32");
    let p2 = next(&prompt(1), &a1);
    let (a2, st) = ok_turn(&l.engine, "a", &p2, 8);
    assert_eq!(
        (st.cache_origin, st.reused_tokens, st.prefill_tokens),
        (CacheOrigin::Reread, 0, p2.len())
    );
    // What a conversation never coded answers.
    let (fresh, _) = ok_turn(&l.engine, "c", &p2, 8);
    assert_eq!(a2, fresh);
    // A request that names f32 for a coded conversation reads it again too.
    l.engine
        .switch_cache(&id("c"), &CacheSelection::Spec("tq4@all".into()))
        .expect("c to tq4");
    let (_, st) = turn(
        &l.engine,
        GenerateRequest {
            cache: Some(CacheSelection::Spec("f32".into())),
            ..turn_request("c", &next(&p2, &fresh), 4)
        },
    )
    .expect("c");
    assert_eq!(
        (st.cache_origin, st.reused_tokens),
        (CacheOrigin::Reread, 0)
    );
}

#[test]
fn a_quit_saves_each_conversation_its_own_cache() {
    let l = lab("f16");
    let (a1, _) = ok_turn(&l.engine, "s-a", &prompt(1), 8);
    let (b1, _) = ok_turn(&l.engine, "api:b", &prompt(2), 5);
    let saved = l.engine.save_all().expect("save all");
    assert_eq!(saved.len(), 2);
    for (conversation, p, answer) in [("s-a", prompt(1), a1), ("api:b", prompt(2), b1)] {
        // A namespaced (server client's) conversation is filed in its namespace's folder.
        let file = match conversation.split_once(':') {
            Some((ns, _)) => l
                .spill
                .join(ns)
                .join(conversation.replace(':', "%3A") + ".kvc"),
            None => l.spill.join(conversation.to_owned() + ".kvc"),
        };
        let header = kvlab_engine::lab::peek_cache_file(&file).expect("header");
        let mut want = p.clone();
        want.extend(&answer[..answer.len() - 1]);
        assert_eq!(header.tokens, want, "{conversation}");
    }
    // In memory still: a save is not a spill.
    assert_eq!(info(&l.engine, "s-a").tier, Tier::Held);
}

#[test]
fn hostile_a_pool_budget_below_one_conversation_is_refused_and_nothing_is_lost() {
    let l = lab("f32");
    let (a1, _) = ok_turn(&l.engine, "a", &prompt(1), 8);
    let mut settings = l.engine.pool_settings();
    settings.kv_budget = Some(64);
    l.engine.set_pool_settings(settings.clone());
    let err = turn(&l.engine, turn_request("b", &prompt(2), 8)).unwrap_err();
    hostile(format!(
        "pool KV budget smaller than one conversation -> {}",
        err.0
    ));
    assert_eq!(err.0, ErrorCode::OutOfMemory, "{}", err.1);
    // Planned, then refused whole: nothing was taken from A for a request that could not
    // run anyway.
    assert_eq!(info(&l.engine, "a").tier, Tier::Held);
    assert!(l.engine.markers_since(0).0.is_empty());
    settings.kv_budget = None;
    l.engine.set_pool_settings(settings);
    let (_, st) = ok_turn(&l.engine, "a", &next(&prompt(1), &a1), 4);
    assert_eq!(
        (st.cache_origin, st.reused_tokens),
        (CacheOrigin::Held, 12 + 7)
    );
}

#[test]
fn hostile_a_spill_with_no_room_on_disk_drops_the_cache_and_every_turn_goes_on() {
    let l = lab("f32");
    let mut settings = l.engine.pool_settings();
    settings.demote_to = policy("f32");
    // The spill directory is a file: nothing can be written there.
    let blocked = l._dir.path().join("not-a-directory");
    std::fs::write(&blocked, b"x").expect("file");
    settings.spill_dir = Some(blocked);
    l.engine.set_pool_settings(settings.clone());
    let (a1, _) = ok_turn(&l.engine, "a", &prompt(1), 8);
    let a_bytes = info(&l.engine, "a").allocated;
    settings.kv_budget = Some(a_bytes + a_bytes / 2);
    l.engine.set_pool_settings(settings);
    ok_turn(&l.engine, "b", &prompt(2), 8);
    let a = info(&l.engine, "a");
    hostile(format!(
        "no room on disk for a spill -> {}",
        match a.tier {
            Tier::Dropped => "dropped_and_read_again",
            _ => "kept",
        }
    ));
    assert_eq!(a.tier, Tier::Dropped);
    let (_, st) = ok_turn(&l.engine, "a", &next(&prompt(1), &a1), 4);
    assert_eq!(
        (st.cache_origin, st.reused_tokens),
        (CacheOrigin::Dropped, 0)
    );
}

#[test]
fn hostile_a_corrupt_spill_file_is_read_again_with_a_warning() {
    let l = lab("f32");
    let mut settings = l.engine.pool_settings();
    settings.demote_to = policy("f32");
    l.engine.set_pool_settings(settings.clone());
    let (a1, _) = ok_turn(&l.engine, "a", &prompt(1), 8);
    let a_bytes = info(&l.engine, "a").allocated;
    settings.kv_budget = Some(a_bytes + a_bytes / 2);
    l.engine.set_pool_settings(settings.clone());
    ok_turn(&l.engine, "b", &prompt(2), 8);
    assert_eq!(info(&l.engine, "a").tier, Tier::OnDisk);
    // Flip bytes in the middle of the file: a section's checksum fails.
    let file = l.spill.join("a.kvc");
    let mut bytes = std::fs::read(&file).expect("read");
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5A;
    }
    std::fs::write(&file, bytes).expect("write");
    settings.kv_budget = None;
    l.engine.set_pool_settings(settings);
    let (a2, st) = ok_turn(&l.engine, "a", &next(&prompt(1), &a1), 4);
    hostile(format!(
        "corrupt spill file -> {}",
        match st.cache_origin {
            CacheOrigin::Dropped => "read_again",
            _ => "used",
        }
    ));
    assert_eq!(
        (st.cache_origin, st.reused_tokens),
        (CacheOrigin::Dropped, 0)
    );
    assert!(
        l.spill.join("a.kvc.corrupt").exists(),
        "set aside, never deleted"
    );
    let unbroken = lab("f32");
    ok_turn(&unbroken.engine, "a", &prompt(1), 8);
    let (a2_unbroken, _) = ok_turn(&unbroken.engine, "a", &next(&prompt(1), &a1), 4);
    assert_eq!(a2, a2_unbroken);
}

#[test]
fn hostile_sixteen_clients_at_once_are_all_served_and_a_client_leaving_mid_prefill_frees_its_place()
{
    let l = lab("f16");
    let tickets: Vec<_> = (0..16u32)
        .map(|i| {
            l.engine
                .submit(turn_request(&format!("c{i}"), &prompt(i), 4))
                .expect("queued")
        })
        .collect();
    let mut served = 0;
    for t in &tickets {
        for ev in t.events() {
            match ev {
                Event::Done { token_ids, .. } => {
                    assert_eq!(token_ids.len(), 4);
                    served += 1;
                    break;
                }
                Event::Error { code, message } => panic!("{code}: {message}"),
                _ => {}
            }
        }
    }
    hostile(format!(
        "16 clients at once -> {}",
        if served == 16 {
            "all_served"
        } else {
            "some_lost"
        }
    ));
    assert_eq!(served, 16);
    // A long prompt read in chunks of 4; its client leaves right away.
    let long: Vec<u32> = (0..200).map(|i| 10 + i % 300).collect();
    let leaving = l
        .engine
        .submit(GenerateRequest {
            prefill_chunk: 4,
            ..turn_request("gone", &long, 8)
        })
        .expect("queued");
    drop(leaving);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while l.engine.status().busy || l.engine.status().queued > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the leaving client was never let go"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let gone = l
        .engine
        .status()
        .conversations
        .into_iter()
        .find(|c| c.id.as_str() == "gone");
    let kept = gone.map_or(0, |c| c.tokens);
    hostile(format!(
        "client that leaves mid-prefill -> {}",
        if kept < long.len() {
            "cancelled"
        } else {
            "ran_on"
        }
    ));
    assert!(
        kept < long.len(),
        "read {kept} of {} prompt tokens for a client that left",
        long.len()
    );
    // Its conversation is consistent: the next turn answers as a fresh one would.
    let (ids, _) = ok_turn(&l.engine, "gone", &long, 4);
    let (fresh, _) = ok_turn(&l.engine, "fresh", &long, 4);
    assert_eq!(ids, fresh);
}

/// The engine is the one store of cache files: a save names and writes the file itself,
/// lists it with what its header says, keeps all of them within the disk budget (saying
/// whose went), and removes one on request while the conversation keeps its memory; a file
/// it did not write is never listed or removed. The app holds no list of its own.
#[test]
fn the_engine_is_the_one_store_of_cache_files() {
    let lab = lab("f16");
    let e = &lab.engine;
    ok_turn(e, "s-old", &prompt(1), 3);
    ok_turn(e, "s-new", &prompt(2), 3);
    std::fs::create_dir_all(&lab.spill).expect("spill dir");
    let planted = lab.spill.join("s-user.kvc");
    std::fs::write(&planted, vec![3u8; 1 << 16]).expect("plant");

    let old = e.save_cache(&id("s-old"), None).expect("save old");
    assert!(old.path.starts_with(&lab.spill), "{:?}", old.path);
    assert!(old.dropped.is_empty());
    let listed = e.saved_caches().expect("list");
    assert_eq!(listed.len(), 1, "only the file it wrote: {listed:?}");
    let (who, cache) = &listed[0];
    assert_eq!(who, &id("s-old"));
    assert_eq!(cache.tokens, info(e, "s-old").tokens);
    assert_eq!(cache.bytes, old.bytes);
    assert_eq!(cache.spec, "f16");
    assert_eq!(&old.saved_cache(), cache);
    // One conversation's file, its header alone read: ours is there, the planted one not.
    assert_eq!(
        e.saved_cache(&id("s-old")).expect("one").as_ref(),
        Some(cache)
    );
    assert_eq!(e.saved_cache(&id("s-user")).expect("not ours"), None);

    // A budget one file fits: the next save drops the older file, never the planted one.
    let mut settings = e.pool_settings();
    settings.disk_budget = old.bytes + old.bytes / 2;
    e.set_pool_settings(settings);
    std::thread::sleep(Duration::from_millis(20));
    let new = e.save_cache(&id("s-new"), None).expect("save new");
    assert_eq!(new.dropped, vec![id("s-old")]);
    let listed: Vec<_> = e
        .saved_caches()
        .expect("list")
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    assert_eq!(listed, vec![id("s-new")]);
    assert!(!old.path.exists() && planted.exists());

    // Removing a file keeps what the conversation holds; removing twice, or a file it did
    // not write, changes nothing.
    for _ in 0..3 {
        e.drop_saved_cache(&id("s-new")).expect("drop");
        e.drop_saved_cache(&id("s-user"))
            .expect("not ours: nothing");
    }
    assert!(e.saved_caches().expect("list").is_empty());
    assert_eq!(e.saved_cache(&id("s-new")).expect("dropped"), None);
    assert!(!new.path.exists() && planted.exists());
    hostile("saved cache the engine did not write, dropped 3x -> left_in_place".into());
    assert!(info(e, "s-new").tokens > 0, "its memory stays");
    ok_turn(e, "s-new", &prompt(3), 2);
}

/// A cache selection that names no cache, at every entry point that takes one (a load, a
/// switch, the default for new conversations), is refused with `invalid_request` before any job
/// runs, twenty times over; the conversation keeps its cache and its policy, the default stays,
/// no conversation appears, and the next turn answers as before.
#[test]
fn hostile_a_bad_cache_selection_is_refused_at_every_entry_point_and_changes_nothing() {
    let lab = lab("tq4@all");
    let e = &lab.engine;
    let (a1, _) = ok_turn(e, "a", &prompt(1), 4);
    let before = info(e, "a");
    let bad = [
        "tq9",
        "q4_0+nocenter+sink@middle",
        "",
        "f16@all@all",
        "k4v",
        "tq4+seed=99999999999999999999999",
    ];
    for round in 0..20 {
        let spec = bad[round % bad.len()];
        let sel = CacheSelection::Spec(spec.into());
        let switch = e.switch_cache(&id("a"), &sel).expect_err("a bad switch");
        let default = e.set_default_cache(&sel).expect_err("a bad default");
        let load = e
            .submit(LoadRequest {
                cache: sel.clone(),
                ..LoadRequest::new(ModelSource::Local {
                    path: common::fixture("tiny_gemma3").join("model.safetensors"),
                })
            })
            .err()
            .expect("a bad load is refused at submit");
        for err in [&switch, &default, &load] {
            assert_eq!(
                err.code,
                ErrorCode::InvalidRequest,
                "{spec:?}: {}",
                err.message
            );
        }
    }
    for what in ["cache switch", "default cache", "model load"] {
        hostile(format!(
            "{what} to a SPEC that names no cache, 20x -> invalid_request"
        ));
    }
    let after = info(e, "a");
    assert_eq!((after.tokens, after.bytes), (before.tokens, before.bytes));
    assert_eq!(
        e.status().conversations.len(),
        1,
        "no conversation appeared"
    );
    // The default is still tq4@all: a new conversation holds it.
    ok_turn(e, "b", &prompt(2), 2);
    assert_eq!(info(e, "b").spec, info(e, "a").spec);
    let (a2, _) = ok_turn(e, "a", &next(&prompt(1), &a1), 4);
    assert_eq!(a2.len(), 4);
}

#[test]
fn a_per_layer_cache_lists_each_layers_format_and_bytes() {
    let lab = lab("f32");
    let engine = &lab.engine;
    let p = prompt(1);
    ok_turn(engine, "a", &p, 4);
    // A uniform cache: its SPEC says it all.
    assert!(info(engine, "a").layers.is_empty());
    // Layers of their own: each one's format, tokens and bytes, adding up to the whole.
    engine
        .switch_cache(&id("a"), &CacheSelection::Spec("f32,0=f16,2-3=bf16".into()))
        .expect("switch");
    let a = info(engine, "a");
    let formats: Vec<(usize, String)> = a
        .layers
        .iter()
        .map(|l| (l.layer, l.precision.clone()))
        .collect();
    let owners = a.layers.len();
    assert!(owners >= 4, "{formats:?}");
    assert_eq!(formats[0], (0, "f16".to_string()));
    assert_eq!(formats[1], (1, "f32".to_string()));
    assert_eq!(formats[2], (2, "bf16".to_string()));
    assert_eq!(formats[3], (3, "bf16".to_string()));
    assert!(a.layers.iter().all(|l| l.tokens == a.tokens));
    assert_eq!(
        a.layers.iter().map(|l| l.bytes.used).sum::<u64>(),
        a.bytes,
        "{formats:?}"
    );
    // Back to one format: the list goes.
    engine
        .switch_cache(&id("a"), &CacheSelection::Spec("f32".into()))
        .expect("switch back");
    assert!(info(engine, "a").layers.is_empty());
}
