//! Generation under churn: while the engine thread generates on a tiny fixture, 200 random
//! actions land at random token boundaries: cache switches (every preset, at every scope),
//! stops, regenerations and continued turns, a second generation and a comparison sent while
//! busy, comparisons opened and closed between turns, document-cost and status queries.
//!
//! Afterwards the whole run is replayed on the test's own session of the same model, with the
//! same prompts and each switch converting the cache at the context length the engine
//! reported for it: at every step the replay's greedy pick from its logits must be the
//! engine's token, so a cache corrupted by a switch, a stop or a rewind shows as a diverging
//! token. Every job ends with exactly one terminal event and nothing after it, and the last
//! memory sample's bytes equal the engine's count and the replay's.

use crate::common;

// HOSTILE lines go to the stderr handle itself, which libtest does not capture, so
// scripts/hostile.sh finds them in an ordinary `cargo test` log.
use std::io::Write as _;
use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use kvlab_engine::contract::presets;
use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{DoneReason, ErrorCode, Event};
use kvlab_engine::host::RssProbe;
use kvlab_engine::lab::Sampler;
use kvlab_engine::lab::{KvPrecision, Logits, Model, PrecisionPolicy, Session};
use kvlab_engine::CompareRequest;
use kvlab_engine::GenerateRequest;
use kvlab_engine::{Engine, EngineHandle, LoadOptions, ModelSource};
use kvlab_engine::{LoadRequest, Submission, Ticket};

const FIXTURE: &str = "tiny_dense";
const ACTIONS: usize = 200;
/// The rewind margin of both the engine's session and the replay's (not the default, so a
/// replay that missed it would diverge in bytes).
const MARGIN: usize = 24;
/// A fixed stream of choices (SplitMix64), so a failure replays exactly.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every preset the model's heads can hold, at every scope, as policies (llama.cpp's types
/// need heads of whole 32-wide blocks; the fixture's are 16 wide, and the card offers only
/// what fits, `memory::token_costs`).
fn policies(path: &Path) -> Vec<PrecisionPolicy> {
    let model = Model::load(path, &LoadOptions::default()).expect("model");
    let fits: Vec<String> = kvlab_engine::lab::token_costs(model.config())
        .into_iter()
        .map(|c| c.spec)
        .collect();
    let mut out = Vec::new();
    for p in presets()
        .into_iter()
        .filter(|p| fits.contains(&p.specs.all))
    {
        for spec in [&p.specs.all, &p.specs.full, &p.specs.sliding] {
            let policy = CacheSelection::Spec(spec.clone()).policy().expect("policy");
            if !out.contains(&policy) {
                out.push(policy);
            }
        }
    }
    out
}

/// One generation as the engine ran it.
#[derive(Debug)]
struct Turn {
    prompt: Vec<u32>,
    ids: Vec<u32>,
    reason: DoneReason,
    /// The engine's context length once it ended.
    context: usize,
    /// Switches applied while it ran or right after it: (context length, policy).
    switches: Vec<(usize, PrecisionPolicy)>,
}

fn request(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens,
        ..GenerateRequest::new(Prompt::Ids {
            ids: prompt.to_vec(),
        })
    }
}

/// Waits for the next event of a generation (generous: the machine is shared); its end as
/// `Some((reason, ids))`. An error ends the test: nothing here should fail.
fn next(rx: &Ticket<GenerateRequest>) -> Option<(DoneReason, Vec<u32>)> {
    match rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the generation went silent")
    {
        Event::Done { reason, token_ids } => Some((reason, token_ids)),
        Event::Error { code, message } => panic!("the generation failed: {code} {message}"),
        _ => None,
    }
}

/// After a terminal event: nothing more arrives and the channel closes (the job is over).
fn assert_closed<R: Submission>(rx: &Ticket<R>, what: &str)
where
    R::Event: std::fmt::Debug,
{
    match rx.recv_timeout(Duration::from_secs(10)) {
        Err(RecvTimeoutError::Disconnected) => {}
        Ok(ev) => panic!("{what}: an event after the end: {ev:?}"),
        Err(RecvTimeoutError::Timeout) => panic!("{what}: the job never let go of its channel"),
    }
}

/// A comparison run to its end (or cancelled after `rounds` pane events).
fn compare(engine: &EngineHandle, prompt: &[u32], policies: [PrecisionPolicy; 2], rounds: usize) {
    let req = CompareRequest {
        prompt: Prompt::Ids {
            ids: prompt.to_vec(),
        },
        sampling: SamplingParams::greedy(),
        max_tokens: 12,
        caches: policies.map(|p| CacheSelection::Spec(p.spec_string())),
        prefill_chunk: 512,
        sweep: Vec::new(),
        constraint: None,
        fit: None,
    };
    let rx = engine.submit(req).expect("send compare");
    let cancel = rx.cancel_token();
    let mut seen = 0;
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("compare") {
            Event::Pane { .. } => {
                seen += 1;
                if seen == rounds {
                    cancel.cancel();
                }
            }
            Event::Finished { .. } => break,
            Event::Scoring { .. } => {}
            Event::SweepPoint { .. } => panic!("no sweep was asked for"),
            Event::Error { code, message } => panic!("compare failed: {code} {message}"),
            other => panic!("not a comparison's event: {other:?}"),
        }
    }
    assert_closed(&rx, "compare");
}

struct Tally {
    switches: usize,
    stops: usize,
    regenerations: usize,
    busy_refusals: usize,
    compares: usize,
    queries: usize,
}

#[test]
fn hostile_generation_under_churn_keeps_the_cache_and_every_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = common::write_tokenizer(dir.path(), 512);
    let path = common::fixture(FIXTURE).join("model.safetensors");
    let start = PrecisionPolicy::uniform(KvPrecision::F32);
    let engine = Engine::spawn().expect("spawn");
    engine.set_rewind_margin(MARGIN);
    engine
        .submit(LoadRequest {
            tokenizer: Some(tokenizer.clone()),
            cache: CacheSelection::Spec(start.spec_string()),
            ..LoadRequest::new(ModelSource::Local { path: path.clone() })
        })
        .and_then(|t| t.wait(|_| true))
        .expect("load");
    let policies = policies(&path);
    assert!(policies.len() >= 8, "{policies:?}");
    let mut dice = Dice(14);
    let mut tally = Tally {
        switches: 0,
        stops: 0,
        regenerations: 0,
        busy_refusals: 0,
        compares: 0,
        queries: 0,
    };
    let mut turns: Vec<Turn> = Vec::new();
    let mut prompt: Vec<u32> = vec![2, 9, 17, 33];
    let mut actions = 0;
    while actions < ACTIONS {
        // A turn: 8 to 40 tokens (the fixture has 256 positions).
        let max_tokens = 8 + dice.below(33);
        let rx = engine.submit(request(&prompt, max_tokens)).expect("send");
        let cancel = rx.cancel_token();
        let mut turn = Turn {
            prompt: prompt.clone(),
            ids: Vec::new(),
            reason: DoneReason::Length,
            context: 0,
            switches: Vec::new(),
        };
        let mut ended = false;
        while !ended {
            // Let 0–3 events pass, then act.
            for _ in 0..dice.below(4) {
                if let Some(end) = next(&rx) {
                    (turn.reason, turn.ids) = end;
                    ended = true;
                    break;
                }
            }
            if ended || actions >= ACTIONS {
                break;
            }
            actions += 1;
            match dice.below(10) {
                0..=3 => {
                    let policy = policies[dice.below(policies.len())].clone();
                    let ev = engine
                        .switch_cache(
                            &kvlab_engine::contract::ConversationId::default_id(),
                            &CacheSelection::Spec(policy.spec_string()),
                        )
                        .expect("switch");
                    assert_eq!(ev.to, policy.spec_string());
                    assert!(ev.kv_after.used > 0 || ev.tokens == 0, "{ev:?}");
                    turn.switches.push((ev.tokens, policy));
                    tally.switches += 1;
                }
                4 => {
                    cancel.cancel();
                    tally.stops += 1;
                }
                5 => {
                    // A second generation asking for no tokens is refused as invalid the
                    // moment it is submitted, leaving the conversation alone.
                    match engine.submit(request(&prompt, 0)) {
                        Err(e) => assert_eq!(e.code, ErrorCode::InvalidRequest, "{e}"),
                        Ok(_) => panic!("a request for no tokens was queued"),
                    }
                    tally.busy_refusals += 1;
                }
                6 => {
                    let req = CompareRequest {
                        prompt: Prompt::Ids { ids: vec![2, 5] },
                        sampling: SamplingParams::greedy(),
                        max_tokens: 4,
                        caches: [&start, &policies[1]]
                            .map(|p| CacheSelection::Spec(p.spec_string())),
                        prefill_chunk: 512,
                        sweep: Vec::new(),
                        constraint: None,
                        fit: None,
                    };
                    // It runs beside the turn on its own caches (the conversation's is left
                    // alone) and finishes once.
                    let rx2 = engine.submit(req).expect("send");
                    loop {
                        match rx2.recv_timeout(Duration::from_secs(60)).expect("reply") {
                            Event::Error { code, .. } => {
                                assert_eq!(code, ErrorCode::Busy);
                                break;
                            }
                            Event::Finished { .. } => break,
                            Event::Pane { .. }
                            | Event::SweepPoint { .. }
                            | Event::Scoring { .. } => {}
                            other => panic!("not a comparison's event: {other:?}"),
                        }
                    }
                    assert_closed(&rx2, "busy compare");
                    tally.busy_refusals += 1;
                }
                7 => {
                    let n = 1 + dice.below(100);
                    let costs = engine.context_costs(n).expect("costs");
                    assert!(!costs.is_empty());
                    let fits = engine.document_fits(None, &[n, 2 * n], 16).expect("fits");
                    assert_eq!(fits.len(), 2);
                    assert!(fits[1].context_after > fits[0].context_after);
                    tally.queries += 1;
                }
                _ => {
                    let s = engine.status();
                    assert!(s.busy || s.context_tokens > 0, "{s:?}");
                    tally.queries += 1;
                }
            }
        }
        while !ended {
            if let Some(end) = next(&rx) {
                (turn.reason, turn.ids) = end;
                ended = true;
            }
        }
        assert_closed(&rx, "generation");
        turn.context = engine.status().context_tokens;
        turns.push(turn);
        // Between turns: sometimes a comparison opened and closed, then the next prompt.
        if dice.below(4) == 0 {
            let pair = [
                policies[dice.below(policies.len())].clone(),
                policies[dice.below(policies.len())].clone(),
            ];
            compare(&engine, &[2, 9, 17], pair, 1 + dice.below(10));
            tally.compares += 1;
            actions += 1;
        }
        let last = turns.last().expect("a turn");
        prompt = match dice.below(3) {
            // Regenerate: the same prompt again (the cache rewinds to it).
            0 => {
                tally.regenerations += 1;
                last.prompt.clone()
            }
            // Continue the conversation, while it fits.
            1 if last.prompt.len() + last.ids.len() + 60 < 256 => {
                let mut p = last.prompt.clone();
                p.extend(&last.ids);
                p.extend([40 + dice.below(60) as u32, 7]);
                p
            }
            // A new conversation sharing a short prefix.
            _ => vec![2, 9, 5 + dice.below(200) as u32],
        };
    }
    let sample = engine.memory_sample(
        0,
        &mut RssProbe::new(),
        Some(&kvlab_engine::contract::ConversationId::default_id()),
    );
    let status = engine.status();
    assert_eq!(sample.kv.total_used, status.kv.total_used);
    assert_eq!(sample.tokens_in_context, status.context_tokens);

    let (tokens, replayed) = replay(&path, &start, &turns);
    assert_eq!(
        replayed.len(),
        status.context_tokens,
        "context after replay"
    );
    assert_eq!(
        replayed.memory().total.0 as u64,
        status.kv.total_used,
        "the replay's KV bytes"
    );
    assert_eq!(sample.kv.total_used, replayed.memory().total.0 as u64);
    let _ = std::io::stderr().lock().write_all(format!("{}\n", format_args!("HOSTILE generation under churn: {actions} actions over {} turns ({} switches, {} stops, \
         {} regenerations, {} busy refusals, {} comparisons, {} queries), {tokens} tokens \
         replayed -> no_corruption",
        turns.len(),
        tally.switches,
        tally.stops,
        tally.regenerations,
        tally.busy_refusals,
        tally.compares,
        tally.queries)).as_bytes());
    assert!(
        tally.switches >= 40 && tally.stops >= 10,
        "{actions} actions"
    );
}

/// Replays `turns` on a fresh session: the same prompts, each switch at the context length
/// the engine reported, each token checked against the replay's own greedy pick. Returns the
/// tokens checked and the session.
fn replay(path: &Path, start: &PrecisionPolicy, turns: &[Turn]) -> (usize, Session) {
    let model = Model::load(path, &LoadOptions::default()).expect("model");
    let mut session = Session::new(&model, start).expect("session");
    session.set_rewind_margin(MARGIN);
    let mut probe = kvlab_engine::host::RssProbe::new();
    let mut checked = 0;
    for (n, turn) in turns.iter().enumerate() {
        let mut switches = turn.switches.iter().peekable();
        let mut apply = |session: &mut Session| {
            while let Some((_, policy)) = switches.next_if(|(at, _)| *at == session.len()) {
                let plan = session.plan_switch(policy).expect("plan");
                session.switch(&plan, &mut probe).expect("switch");
            }
        };
        // A turn cancelled while it waited in the engine's queue never ran: the cache is as
        // the last turn left it.
        if turn.ids.is_empty()
            && turn.reason == DoneReason::Cancelled
            && turn.context == session.len()
        {
            apply(&mut session);
            continue;
        }
        let prepared = session.prepare(&turn.prompt, &[]).expect("prepare");
        apply(&mut session);
        // A stop before the prefill leaves the cache at the reused prefix.
        let prefilled = !(turn.ids.is_empty() && turn.context == prepared.reused);
        if prefilled {
            let mut logits = session
                .forward(&model, &turn.prompt[prepared.reused..], Logits::Last)
                .expect("prefill");
            // Ids the engine ran through the model: all when stopped, all but the last
            // otherwise (a stop token or the length limit ends before running it).
            let ran = match turn.reason {
                DoneReason::Cancelled => turn.ids.len(),
                _ => turn.ids.len().saturating_sub(1),
            };
            for (i, &id) in turn.ids.iter().enumerate() {
                apply(&mut session);
                let v = logits.to_vec1::<f32>().expect("logits");
                let mut greedy = Sampler::new(SamplingParams::greedy()).expect("sampler");
                let pick = greedy.sample(&v).expect("sample");
                assert_eq!(
                    pick, id,
                    "turn {n}, token {i}: the engine's cache diverged from the replay's"
                );
                checked += 1;
                if i < ran {
                    logits = session
                        .forward(&model, &[id], Logits::Last)
                        .expect("forward");
                }
            }
        }
        apply(&mut session);
        assert_eq!(
            switches.count(),
            0,
            "turn {n}: a switch at a context length the turn never had"
        );
        assert_eq!(session.len(), turn.context, "turn {n}: context length");
    }
    (checked, session)
}
