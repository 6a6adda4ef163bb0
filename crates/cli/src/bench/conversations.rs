//! `kvlab bench conversations`: N conversations of real text (Alice and Paradise Lost
//! chapters, each followed by short questions) take turns round robin under a KV budget that
//! holds two of them at f16, through the engine's pool; per turn, where its cache came from
//! (held, demoted, restored from disk, or read again), its time to first token and the KV
//! bytes held. The same run then repeats with the pool set as llama-server's prompt cache
//! works (f16 only, the oldest dropped first, nothing demoted or spilled) and prints both
//! side by side. Last, two conversations stream at once. A benchmark: it prints figures and
//! fails on none.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::contract::Message;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{CacheOrigin, ConversationChoice, ConversationId, Event, GenStats};
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::lab::PrecisionPolicy;
use kvlab_engine::GenerateRequest;
use kvlab_engine::PoolSettings;
use kvlab_engine::{Engine, EngineHandle};
use serde::Serialize;

use crate::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct BenchConversationsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Conversations taking turns.
    #[arg(long, default_value_t = 8)]
    conversations: usize,
    /// Rounds: every conversation speaks once per round.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Bytes of text each conversation opens with (~4 bytes a token: 8 KB ≈ 2k tokens).
    #[arg(long, default_value_t = 8192)]
    bytes: usize,
    /// Tokens of each answer.
    #[arg(long, default_value_t = 16)]
    answer_tokens: usize,
    /// The KV budget, in f16 conversations of the size the last round reaches.
    #[arg(long, default_value_t = 2.0)]
    budget_conversations: f64,
    /// What idle conversations are demoted to (default: the suggested TurboQuant preset).
    #[arg(long)]
    demote_to: Option<String>,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
}

/// One turn as the benchmark saw it.
#[derive(Debug, Clone, Serialize)]
struct TurnRow {
    round: usize,
    conversation: usize,
    origin: CacheOrigin,
    prompt_tokens: usize,
    cached_tokens: usize,
    ttft_s: f64,
    /// KV bytes all conversations held in memory after the turn.
    kv_held: u64,
    /// Of which on disk (the pool's files).
    disk: u64,
}

/// One pool's run.
#[derive(Debug, Clone, Serialize)]
struct PoolRun {
    name: &'static str,
    turns: Vec<TurnRow>,
    /// Turns after the first round that started without reading their history again.
    kept_share: f64,
    /// Mean time to first token after the first round.
    mean_ttft_s: f64,
    peak_kv: u64,
    demotions: u64,
    spills: u64,
    drops: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    model: String,
    conversations: usize,
    rounds: usize,
    budget_bytes: u64,
    demote_to: String,
    pool: PoolRun,
    oldest_first: PoolRun,
    /// Mean TTFT after the first round, ours over llama-server's policy.
    ttft_ratio: f64,
    /// Two conversations streamed at once: each one's first token came before either ended.
    concurrent_first_tokens_before_either_ended: bool,
}

const QUESTIONS: [&str; 6] = [
    "Who speaks in this passage? Answer briefly.",
    "Where does it take place? Answer briefly.",
    "What happens next? One sentence.",
    "What is the mood here? One word.",
    "Name one object it mentions.",
    "Summarize it in five words.",
];

pub fn run(args: BenchConversationsArgs) -> anyhow::Result<()> {
    if args.conversations < 2 || args.rounds < 2 {
        bail!("at least 2 conversations and 2 rounds");
    }
    let texts = opening_texts(args.conversations, args.bytes)?;
    let engine = Engine::spawn()?;
    let f16 = PrecisionPolicy::default();
    let card = args.model.load_into(
        &engine,
        f16.clone(),
        kvlab_engine::contract::DEFAULT_LOAD_CONTEXT,
    )?;
    let tokenizer = engine.tokenizer().context("no tokenizer")?;
    // The budget: so many f16 conversations of the size the last round reaches.
    let longest = texts
        .iter()
        .map(|t| tokenizer.encode(t, false).map(|ids| ids.len()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    let last_len = longest + args.rounds * (args.answer_tokens + 40);
    let checkpoint = kvlab_engine::lab::Checkpoint::open(
        &args.model.resolve()?.weights,
        &kvlab_engine::LoadOptions::default(),
    )?;
    let one = kvlab_engine::lab::estimate_kv_bytes(
        checkpoint.config(),
        &f16,
        last_len,
        kvlab_engine::contract::REWIND_MARGIN,
    )?;
    let budget = (one as f64 * args.budget_conversations) as u64;
    let demote_to = match &args.demote_to {
        Some(s) => CacheSpec::parse(s)?.to_policy(),
        None => kvlab_engine::contract::suggested_policy(),
    };
    let spill =
        std::env::temp_dir().join(format!("kvlab-bench-conversations-{}", std::process::id()));
    let ours = PoolSettings {
        kv_budget: Some(budget),
        disk_budget: 8 << 30,
        spill_dir: Some(spill.clone()),
        demote_to: demote_to.clone(),
        ..PoolSettings::default()
    };
    let theirs = PoolSettings {
        kv_budget: Some(budget),
        disk_budget: 0,
        spill_dir: None,
        // Demoting to what they hold already changes nothing: the oldest are dropped.
        demote_to: f16.clone(),
        ..PoolSettings::default()
    };
    let pool = run_pool(&engine, "pool", "p", ours, &texts, &args)?;
    let oldest_first = run_pool(&engine, "f16 oldest-first", "o", theirs, &texts, &args)?;
    let concurrent = two_at_once(&engine, &texts)?;
    let _ = std::fs::remove_dir_all(&spill);
    let report = Report {
        model: card.name,
        conversations: args.conversations,
        rounds: args.rounds,
        budget_bytes: budget,
        demote_to: demote_to.spec_string(),
        ttft_ratio: pool.mean_ttft_s / oldest_first.mean_ttft_s.max(1e-9),
        pool,
        oldest_first,
        concurrent_first_tokens_before_either_ended: concurrent,
    };
    engine.shutdown();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_report(&report);
    Ok(())
}

/// The opening text of each conversation: consecutive passages of Alice, then Paradise Lost.
fn opening_texts(n: usize, bytes: usize) -> anyhow::Result<Vec<String>> {
    let chars: Vec<char> = super::corpus()?.chars().collect();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let start = (i * bytes) % chars.len().max(1);
        let text: String = chars.iter().cycle().skip(start).take(bytes).collect();
        out.push(text);
    }
    Ok(out)
}

/// Runs every round of every conversation under `settings`; conversations named `tag-i`.
fn run_pool(
    engine: &EngineHandle,
    name: &'static str,
    tag: &str,
    settings: PoolSettings,
    texts: &[String],
    args: &BenchConversationsArgs,
) -> anyhow::Result<PoolRun> {
    engine.set_pool_settings(settings);
    let before = engine.pool_counters();
    let mut histories: Vec<Vec<Message>> = texts
        .iter()
        .map(|t| vec![Message::user(format!("{t}\n\n{}", QUESTIONS[0]))])
        .collect();
    let mut turns = Vec::new();
    let mut peak = 0u64;
    for round in 0..args.rounds {
        for (i, history) in histories.iter_mut().enumerate() {
            if round > 0 {
                history.push(Message::user(QUESTIONS[(round + i) % QUESTIONS.len()]));
            }
            let id = ConversationId::new(format!("{tag}-{i}"))?;
            let (answer, stats) = turn(engine, &id, history, args.answer_tokens)?;
            history.push(Message::model(answer));
            let status = engine.status();
            let disk = status.conversations.iter().map(|c| c.disk_bytes).sum();
            peak = peak.max(status.kv.total_used);
            turns.push(TurnRow {
                round,
                conversation: i,
                origin: stats.cache_origin,
                prompt_tokens: stats.prompt_tokens,
                cached_tokens: stats.reused_tokens,
                ttft_s: stats.time_to_first_token_s,
                kv_held: status.kv.total_used,
                disk,
            });
        }
    }
    let after = engine.pool_counters();
    for i in 0..texts.len() {
        let _ = engine.forget(&ConversationId::new(format!("{tag}-{i}"))?, true);
    }
    let later: Vec<&TurnRow> = turns.iter().filter(|t| t.round > 0).collect();
    let kept = later.iter().filter(|t| !t.origin.prefilled()).count();
    Ok(PoolRun {
        name,
        kept_share: kept as f64 / later.len().max(1) as f64,
        mean_ttft_s: later.iter().map(|t| t.ttft_s).sum::<f64>() / later.len().max(1) as f64,
        turns,
        peak_kv: peak,
        demotions: after.demotions - before.demotions,
        spills: after.spills - before.spills,
        drops: after.drops - before.drops,
    })
}

fn request(id: &ConversationId, history: &[Message], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens,
        conversation: Some(ConversationChoice::Id { id: id.clone() }),
        ..GenerateRequest::new(Prompt::Conversation {
            messages: history.to_vec(),
            thinking: false,
            tools: Vec::new(),
        })
    }
}

/// One turn: its answer's text and its stats.
fn turn(
    engine: &EngineHandle,
    id: &ConversationId,
    history: &[Message],
    max_tokens: usize,
) -> anyhow::Result<(String, GenStats)> {
    let ticket = engine.submit(request(id, history, max_tokens))?;
    let (mut text, mut stats) = (String::new(), None);
    for ev in ticket.events() {
        match ev {
            Event::Token { text: t } => text.push_str(&t),
            Event::Stats(s) => stats = Some(s),
            Event::Done { .. } => break,
            Event::Error { code, message } => bail!("turn of {id} failed [{code}]: {message}"),
            _ => {}
        }
    }
    Ok((text, stats.context("no stats")?))
}

/// Two conversations submitted together: whether each one's first token came before either
/// ended.
fn two_at_once(engine: &EngineHandle, texts: &[String]) -> anyhow::Result<bool> {
    let ids = [ConversationId::new("c-0")?, ConversationId::new("c-1")?];
    let tickets = ids
        .iter()
        .zip(texts)
        .map(|(id, t)| {
            let opening: String = t.chars().take(2000).collect();
            engine.submit(request(id, &[Message::user(opening)], 48))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let (mut first, mut ended) = ([None::<f64>; 2], [None::<f64>; 2]);
    while ended.iter().any(Option::is_none) {
        for (k, t) in tickets.iter().enumerate() {
            if ended[k].is_some() {
                continue;
            }
            match t.recv_timeout(Duration::from_millis(5)) {
                Ok(Event::Token { .. }) => {
                    first[k].get_or_insert(started.elapsed().as_secs_f64());
                }
                Ok(Event::Done { .. } | Event::Error { .. }) => {
                    ended[k] = Some(started.elapsed().as_secs_f64());
                }
                Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    ended[k] = Some(started.elapsed().as_secs_f64());
                }
            }
        }
    }
    for id in &ids {
        let _ = engine.forget(id, true);
    }
    let first_end = ended.iter().flatten().fold(f64::INFINITY, |a, &b| a.min(b));
    Ok(first.iter().all(|f| f.is_some_and(|f| f < first_end)))
}

fn origin_name(o: CacheOrigin) -> &'static str {
    match o {
        CacheOrigin::New => "new",
        CacheOrigin::Held => "held",
        CacheOrigin::Demoted => "demoted",
        CacheOrigin::Restored => "restored",
        CacheOrigin::Dropped => "prefilled",
        CacheOrigin::Reread => "reread",
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

fn print_report(r: &Report) {
    println!(
        "{} conversations x {} rounds on {}; KV budget {:.1} MiB (two f16 conversations); idle ones demoted to {}",
        r.conversations,
        r.rounds,
        r.model,
        mib(r.budget_bytes),
        r.demote_to
    );
    for run in [&r.pool, &r.oldest_first] {
        println!("\n{}:", run.name);
        println!(
            "{:>5} {:>4} {:>10} {:>7} {:>7} {:>8} {:>10} {:>9}",
            "round", "conv", "cache", "prompt", "cached", "TTFT s", "KV MiB", "disk MiB"
        );
        for t in &run.turns {
            println!(
                "{:>5} {:>4} {:>10} {:>7} {:>7} {:>8.3} {:>10.2} {:>9.2}",
                t.round,
                t.conversation,
                origin_name(t.origin),
                t.prompt_tokens,
                t.cached_tokens,
                t.ttft_s,
                mib(t.kv_held),
                mib(t.disk)
            );
        }
    }
    println!(
        "\n{:<18} {:>14} {:>14} {:>12} {:>9} {:>7} {:>6}",
        "pool", "kept history", "mean TTFT s", "peak KV MiB", "demoted", "spilled", "dropped"
    );
    for run in [&r.pool, &r.oldest_first] {
        println!(
            "{:<18} {:>13.0}% {:>14.3} {:>12.2} {:>9} {:>7} {:>6}",
            run.name,
            100.0 * run.kept_share,
            run.mean_ttft_s,
            mib(run.peak_kv),
            run.demotions,
            run.spills,
            run.drops
        );
    }
    println!(
        "mean TTFT after the first round: {:.3} of llama-server's policy's; peak KV {:.2} MiB of a {:.2} MiB budget; two conversations at once both streamed before either ended: {}",
        r.ttft_ratio,
        mib(r.pool.peak_kv),
        mib(r.budget_bytes),
        if r.concurrent_first_tokens_before_either_ended { "yes" } else { "no" }
    );
}
