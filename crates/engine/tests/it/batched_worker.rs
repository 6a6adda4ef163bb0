//! The engine thread steps every running request in one forward pass: several streams each
//! get the answer they get alone while sharing steps; one that ends, leaves or is cancelled
//! leaves the others going, as do switches and forgets of idle conversations between steps;
//! a prefill chunk shares a step with the decodes; `parallel` 1 runs one stream per step.

use crate::common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::StepCounters;
use kvlab_engine::contract::{ConversationChoice, ConversationId, DoneReason, Event};
use kvlab_engine::GenerateRequest;
use kvlab_engine::{Engine, EngineHandle, ModelSource};
use kvlab_engine::{LoadRequest, PoolSettings};

struct Setup {
    engine: EngineHandle,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(dir.path(), 512);
    let engine = Engine::spawn().expect("spawn");
    engine
        .submit(LoadRequest {
            tokenizer: Some(tokenizer),
            cache: CacheSelection::Spec("f32".into()),
            ..LoadRequest::new(ModelSource::Local {
                path: common::fixture("tiny_gemma3").join("model.safetensors"),
            })
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    Setup { engine, _dir: dir }
}

fn prompt(i: usize, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|j| 3 + (j * 17 + i as u32 * 41) % 500)
        .collect()
}

fn request(id: &str, ids: Vec<u32>, max_tokens: usize, cache: Option<&str>) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens,
        conversation: Some(ConversationChoice::Id {
            id: ConversationId::new(id).expect("id"),
        }),
        cache: cache.map(|c| kvlab_engine::contract::CacheSelection::Spec(c.into())),
        ..GenerateRequest::new(Prompt::Ids { ids })
    }
}

/// The ids a request generates and how it ended.
fn answer(engine: &EngineHandle, req: GenerateRequest) -> (DoneReason, Vec<u32>) {
    let ticket = engine.submit(req).expect("submit");
    for ev in ticket.events() {
        match ev {
            Event::Done { reason, token_ids } => return (reason, token_ids),
            Event::Error { code, message } => panic!("[{code}] {message}"),
            _ => {}
        }
    }
    panic!("no done")
}

fn forget(engine: &EngineHandle, ids: &[&str]) {
    for id in ids {
        let _ = engine.forget(&ConversationId::new(*id).expect("id"), true);
    }
}

fn delta(a: StepCounters, b: StepCounters) -> (u64, u64, u64, u64) {
    (
        b.steps - a.steps,
        b.sequences - a.sequences,
        b.tokens - a.tokens,
        b.prefill_beside_decodes - a.prefill_beside_decodes,
    )
}

/// Requests submitted while the engine is held inside the first one's first token, so all
/// start together when it is released; returns each one's (reason, ids) in order.
fn together(
    engine: &EngineHandle,
    first: GenerateRequest,
    rest: Vec<GenerateRequest>,
    cancel_after: Option<(usize, usize)>,
) -> Vec<(DoneReason, Vec<u32>)> {
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let mut held = Some((started_tx, release_rx));
    let (done_tx, done_rx) = mpsc::channel();
    let tx0 = done_tx.clone();
    let _first = engine
        .submit_with(first, move |ev| {
            if let (Event::Token { .. }, Some((started, release))) = (&ev, held.take()) {
                started.send(()).expect("test listening");
                release.recv().expect("released");
            }
            if let Event::Done { reason, token_ids } = ev {
                let _ = tx0.send((0, reason, token_ids));
            }
            true
        })
        .expect("first");
    started_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the first request started");
    let mut tickets = Vec::new();
    for (k, req) in rest.into_iter().enumerate() {
        let tx = done_tx.clone();
        let mut seen = 0;
        let cancel_at = cancel_after
            .filter(|(who, _)| *who == k + 1)
            .map(|(_, n)| n);
        tickets.push(
            engine
                .submit_with(req, move |ev| match ev {
                    Event::Token { .. } => {
                        seen += 1;
                        // A client that leaves: its sink says stop.
                        cancel_at.is_none_or(|n| seen < n)
                    }
                    Event::Done { reason, token_ids } => {
                        let _ = tx.send((k + 1, reason, token_ids));
                        true
                    }
                    Event::Error { code, message } => panic!("[{code}] {message}"),
                    _ => true,
                })
                .expect("submit"),
        );
    }
    release_tx.send(()).expect("release");
    let n = tickets.len() + 1;
    let mut out = vec![None; n];
    let deadline = Instant::now() + Duration::from_secs(120);
    while out.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (k, reason, ids) = done_rx.recv_timeout(left).expect("every request ended");
        out[k] = Some((reason, ids));
    }
    drop(tickets);
    out.into_iter().map(|o| o.expect("ended")).collect()
}

#[test]
fn streams_share_steps_and_each_gets_the_answer_it_gets_alone() {
    let s = setup();
    let caches = [None, Some("f16"), Some("tq4@all"), Some("k4v3+qw@all")];
    let names = ["a", "b", "c", "d"];
    let alone: Vec<_> = (0..4)
        .map(|i| {
            answer(
                &s.engine,
                request(names[i], prompt(i, 6 + 3 * i), 40, caches[i]),
            )
        })
        .collect();
    forget(&s.engine, &names);
    for round in 0..3 {
        let before = s.engine.step_counters();
        let reqs: Vec<_> = (0..4)
            .map(|i| request(names[i], prompt(i, 6 + 3 * i), 40, caches[i]))
            .collect();
        let mut reqs = reqs.into_iter();
        let first = reqs.next().expect("first");
        let got = together(&s.engine, first, reqs.collect(), None);
        let (steps, sequences, _, _) = delta(before, s.engine.step_counters());
        assert_eq!(
            got, alone,
            "round {round}: batched answers differ from alone"
        );
        // 4 × 40 tokens in about 40 steps (plus the prefills'), not 160.
        assert!(sequences >= 4 * 39, "{sequences} sequences");
        assert!(
            steps <= 40 + 8,
            "round {round}: {steps} steps for {sequences} sequence-steps"
        );
        forget(&s.engine, &names);
    }
}

#[test]
fn one_that_ends_leaves_or_is_cancelled_leaves_the_others_going() {
    let s = setup();
    let alone_a = answer(&s.engine, request("a", prompt(0, 7), 48, None));
    let alone_b = answer(&s.engine, request("b", prompt(1, 9), 5, Some("tq4@all")));
    // An idle conversation to switch and another to forget between steps.
    answer(&s.engine, request("idle", prompt(5, 20), 3, None));
    answer(&s.engine, request("gone", prompt(6, 20), 3, None));
    forget(&s.engine, &["a", "b"]);
    for round in 0..5 {
        let engine = &s.engine;
        let reqs = vec![
            request("b", prompt(1, 9), 5, Some("tq4@all")),
            request("c", prompt(2, 11), 40, None),
            request("d", prompt(3, 8), 40, None),
        ];
        // "c" leaves after 3 tokens; "d" is cancelled by the handle mid-stream below.
        let handle = std::thread::scope(|scope| {
            let side = scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                engine.cancel(Some(&ConversationId::new("d").expect("id")));
                let idle = ConversationId::new("idle").expect("id");
                let spec = if round % 2 == 0 { "tq3@all" } else { "f32" };
                let switched = engine.switch_cache(&idle, &CacheSelection::Spec(spec.into()));
                let _ = engine.forget(&ConversationId::new("gone").expect("id"), true);
                switched.is_ok()
            });
            let got = together(
                engine,
                request("a", prompt(0, 7), 48, None),
                reqs,
                Some((2, 3)),
            );
            (got, side.join().expect("side"))
        });
        let (got, switched) = handle;
        assert!(
            switched,
            "round {round}: the idle conversation's switch was refused"
        );
        assert_eq!(got[0], alone_a, "round {round}: the long stream changed");
        assert_eq!(got[1], alone_b, "round {round}: the short one changed");
        assert_eq!(got[1].0, DoneReason::Length);
        assert_eq!(got[2].0, DoneReason::Cancelled, "round {round}: the leaver");
        assert!(got[2].1.len() <= 4, "the leaver ran on: {:?}", got[2].1);
        assert!(matches!(
            got[3].0,
            DoneReason::Cancelled | DoneReason::Length
        ));
        forget(&s.engine, &["a", "b", "c", "d"]);
        answer(&s.engine, request("gone", prompt(6, 20), 3, None));
    }
    assert_eq!(s.engine.status().running, 0);
}

#[test]
fn a_prefill_chunk_shares_a_step_with_the_decodes() {
    let s = setup();
    let long = prompt(4, 100);
    let alone_long = answer(&s.engine, request("long", long.clone(), 4, None));
    let alone_a = answer(&s.engine, request("a", prompt(0, 7), 60, None));
    forget(&s.engine, &["long", "a"]);
    let before = s.engine.step_counters();
    let got = together(
        &s.engine,
        request("a", prompt(0, 7), 60, None),
        vec![request("long", long, 4, None)],
        None,
    );
    let (_, _, tokens, beside) = delta(before, s.engine.step_counters());
    assert_eq!(got, vec![alone_a, alone_long]);
    // 100 prompt tokens beside "a"'s decodes, in chunks the steps' pace allows (at most 256).
    assert!(beside >= 1, "{tokens} tokens");
}

#[test]
fn parallel_one_runs_one_stream_per_step() {
    let s = setup();
    s.engine.set_pool_settings(PoolSettings {
        parallel: 1,
        ..s.engine.pool_settings()
    });
    let names = ["a", "b", "c"];
    let alone: Vec<_> = (0..3)
        .map(|i| answer(&s.engine, request(names[i], prompt(i, 5 + i), 12, None)))
        .collect();
    forget(&s.engine, &names);
    let before = s.engine.step_counters();
    let got = together(
        &s.engine,
        request("a", prompt(0, 5), 12, None),
        (1..3)
            .map(|i| request(names[i], prompt(i, 5 + i), 12, None))
            .collect(),
        None,
    );
    let (steps, sequences, _, beside) = delta(before, s.engine.step_counters());
    assert_eq!(got, alone);
    assert_eq!(steps, sequences, "a step ran more than one sequence");
    assert_eq!(beside, 0);
}
