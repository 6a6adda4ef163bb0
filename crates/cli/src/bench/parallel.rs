//! `kvlab bench parallel`: N clients stream greedy answers at once through the engine (each
//! in its own conversation, all stepped in one forward pass per step); per client count, the
//! aggregate decode rate while all N stream together, each client's inter-token latency
//! (median and p95) and time to first token. Then the compare view's two panes against a
//! lone chat, and, with `--prefill-load`, the streams' latency while another client
//! prefills a long prompt. A benchmark: it prints figures and fails on none.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::contract::CacheSelection;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{ConversationChoice, ConversationId, Event};
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::CompareRequest;
use kvlab_engine::GenerateRequest;
use kvlab_engine::PoolSettings;
use kvlab_engine::{Engine, EngineHandle};
use serde::Serialize;

use crate::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct BenchParallelArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Client counts, comma-separated: each streams at once, one count after another.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Tokens each client generates.
    #[arg(long, default_value_t = 96)]
    tokens: usize,
    /// Bytes of text each client's prompt holds (~4 bytes a token), a passage of its own.
    #[arg(long, default_value_t = 200)]
    prompt_bytes: usize,
    /// Every client's cache SPEC.
    #[arg(long, default_value = "f16")]
    kv: String,
    /// Also measure the streams of the largest `--clients` count while one more client
    /// prefills a prompt of this many bytes of text (0: not measured).
    #[arg(long, default_value_t = 0)]
    prefill_load: usize,
    /// The tested pane's cache of the compare row (the reference pane holds `--kv`).
    #[arg(long, default_value = "tq4@all")]
    compare_kv: String,
    /// Rounds: each figure is the best (latencies: the lowest) of this many.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// One client's stream as the bench saw it.
#[derive(Debug, Clone, Default)]
struct Stream {
    submitted: Option<Instant>,
    /// Arrival of each token event.
    tokens: Vec<Instant>,
    generated: usize,
    decode_tok_per_s: f64,
}

/// One client count's figures.
#[derive(Debug, Clone, Serialize)]
struct Row {
    clients: usize,
    /// Tokens per second of all streams together, over the time all N streamed at once.
    aggregate_tok_per_s: f64,
    /// Each client's own decode rate (the engine's stats), their mean.
    per_client_tok_per_s: f64,
    itl_median_ms: f64,
    itl_p95_ms: f64,
    ttft_median_s: f64,
    ttft_max_s: f64,
}

#[derive(Debug, Clone, Serialize)]
struct CompareRow {
    /// Each pane's decode rate.
    panes_tok_per_s: [f64; 2],
    /// The lone chat's decode rate (the one-client row's per-client rate).
    lone_tok_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
struct LoadRow {
    streams: usize,
    prefill_tokens: usize,
    /// The streams' inter-token latency p95 before the prefill and while it ran.
    itl_p95_unloaded_ms: f64,
    itl_p95_loaded_ms: f64,
    /// Time to first token of the prefilling client.
    prefill_ttft_s: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    model: String,
    kv: String,
    tokens: usize,
    rows: Vec<Row>,
    compare: Option<CompareRow>,
    load: Option<LoadRow>,
}

pub fn run(args: BenchParallelArgs) -> anyhow::Result<()> {
    if args.clients.is_empty() || args.clients.contains(&0) || args.tokens < 8 {
        bail!("client counts of at least 1 and at least 8 tokens");
    }
    let most = args.clients.iter().copied().max().unwrap_or(1) + 1;
    if most > kvlab_engine::contract::MAX_PARALLEL {
        bail!(
            "at most {} clients",
            kvlab_engine::contract::MAX_PARALLEL - 1
        );
    }
    CacheSpec::parse(&args.kv)?;
    let text: Vec<char> = super::corpus()?.chars().collect();
    let engine = Engine::spawn()?;
    let context = (args.prefill_load / 3 + args.tokens + 512).max(2048);
    let card = args
        .model
        .load_into(&engine, CacheSpec::parse(&args.kv)?.to_policy(), context)?;
    engine.set_pool_settings(PoolSettings {
        parallel: most,
        idle_ttl: None,
        ..engine.pool_settings()
    });
    let mut rows = Vec::new();
    for &n in &args.clients {
        let mut best: Option<Row> = None;
        for round in 0..args.rounds.max(1) {
            let streams = run_clients(&engine, &args, &text, n, &format!("r{round}"), None)?;
            let row = summarize(n, &streams.0);
            best = Some(match best {
                None => row,
                Some(b) => better(b, row),
            });
        }
        let row = best.context("no round")?;
        if !args.json {
            eprintln!(
                "{} clients: {:.1} tok/s together",
                row.clients, row.aggregate_tok_per_s
            );
        }
        rows.push(row);
    }
    let lone = rows
        .iter()
        .find(|r| r.clients == 1)
        .map(|r| r.per_client_tok_per_s);
    let compare = match lone {
        Some(lone) => Some(compare_row(&engine, &args, &text, lone)?),
        None => None,
    };
    let load = if args.prefill_load > 0 {
        let n = args.clients.iter().copied().max().unwrap_or(1);
        Some(load_row(&engine, &args, &text, n)?)
    } else {
        None
    };
    engine.shutdown();
    let report = Report {
        model: card.name,
        kv: args.kv.clone(),
        tokens: args.tokens,
        rows,
        compare,
        load,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn passage(text: &[char], i: usize, bytes: usize) -> String {
    let start = (i * 7919 * 64) % text.len().max(1);
    text.iter().cycle().skip(start).take(bytes).collect()
}

fn request(id: &ConversationId, prompt: String, args: &BenchParallelArgs) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: args.tokens,
        cache: Some(CacheSelection::Spec(args.kv.clone())),
        conversation: Some(ConversationChoice::Id { id: id.clone() }),
        ..GenerateRequest::new(Prompt::Text { text: prompt })
    }
}

/// `n` clients submitted together, each streamed on its own thread; with `extra`, one more
/// client (prompt bytes, delay) submitted once every other client has its first token and
/// the delay has passed. Returns the clients' streams and the extra one's.
fn run_clients(
    engine: &EngineHandle,
    args: &BenchParallelArgs,
    text: &[char],
    n: usize,
    tag: &str,
    extra: Option<(usize, Duration)>,
) -> anyhow::Result<(Vec<Stream>, Option<Stream>)> {
    let ids: Vec<ConversationId> = (0..n + 1)
        .map(|i| ConversationId::new(format!("bench-{tag}-{n}-{i}")))
        .collect::<Result<_, _>>()?;
    let streamed = std::thread::scope(|scope| -> anyhow::Result<_> {
        let first_tokens = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let req = request(&ids[i], passage(text, i, args.prompt_bytes), args);
                let firsts = first_tokens.clone();
                scope.spawn(move || stream(engine, req, Some(firsts)))
            })
            .collect();
        let extra_stream = match extra {
            Some((bytes, delay)) => {
                while first_tokens.load(std::sync::atomic::Ordering::SeqCst) < n {
                    std::thread::sleep(Duration::from_millis(2));
                }
                std::thread::sleep(delay);
                let mut req = request(&ids[n], passage(text, n + 11, bytes), args);
                req.max_tokens = 2;
                Some(stream(engine, req, None)?)
            }
            None => None,
        };
        let mut out = Vec::with_capacity(n);
        for h in handles {
            out.push(
                h.join()
                    .map_err(|_| anyhow::anyhow!("a client panicked"))??,
            );
        }
        Ok((out, extra_stream))
    })?;
    for id in &ids {
        let _ = engine.forget(id, true);
    }
    Ok(streamed)
}

/// Streams one request, recording when each token arrived.
fn stream(
    engine: &EngineHandle,
    req: GenerateRequest,
    firsts: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
) -> anyhow::Result<Stream> {
    let mut s = Stream {
        submitted: Some(Instant::now()),
        ..Stream::default()
    };
    let ticket = engine.submit(req)?;
    for ev in ticket.events() {
        match ev {
            Event::Token { .. } | Event::Thinking { .. } => {
                if s.tokens.is_empty() {
                    if let Some(f) = &firsts {
                        f.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                s.tokens.push(Instant::now());
            }
            Event::Stats(st) => {
                s.generated = st.generated_tokens;
                s.decode_tok_per_s = st.decode_tok_per_s;
            }
            Event::Done { .. } => break,
            Event::Error { code, message } => bail!("a client failed [{code}]: {message}"),
            _ => {}
        }
    }
    Ok(s)
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Inter-token gaps (ms) of `streams` whose later token arrived within `[from, to]`.
fn gaps(streams: &[Stream], from: Instant, to: Instant) -> Vec<f64> {
    streams
        .iter()
        .flat_map(|s| s.tokens.windows(2))
        .filter(|w| w[1] >= from && w[1] <= to)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect()
}

fn summarize(n: usize, streams: &[Stream]) -> Row {
    // The window in which every client streams: from the last first token to the first last.
    let start = streams
        .iter()
        .filter_map(|s| s.tokens.first())
        .max()
        .copied();
    let end = streams
        .iter()
        .filter_map(|s| s.tokens.last())
        .min()
        .copied();
    let aggregate = match (start, end) {
        (Some(a), Some(b)) if b > a => {
            let inside = streams
                .iter()
                .flat_map(|s| &s.tokens)
                .filter(|t| **t > a && **t <= b)
                .count();
            inside as f64 / (b - a).as_secs_f64()
        }
        _ => 0.0,
    };
    let far = Instant::now() + Duration::from_secs(3600);
    let all_gaps = match start {
        Some(a) => gaps(streams, a, end.unwrap_or(far)),
        None => Vec::new(),
    };
    let ttfts: Vec<f64> = streams
        .iter()
        .filter_map(|s| Some((*s.tokens.first()? - s.submitted?).as_secs_f64()))
        .collect();
    Row {
        clients: n,
        aggregate_tok_per_s: aggregate,
        per_client_tok_per_s: streams.iter().map(|s| s.decode_tok_per_s).sum::<f64>()
            / n.max(1) as f64,
        itl_median_ms: percentile(all_gaps.clone(), 0.5),
        itl_p95_ms: percentile(all_gaps, 0.95),
        ttft_median_s: percentile(ttfts.clone(), 0.5),
        ttft_max_s: ttfts.iter().copied().fold(0.0, f64::max),
    }
}

/// The better of two rounds: the higher rates, the lower latencies.
fn better(a: Row, b: Row) -> Row {
    Row {
        clients: a.clients,
        aggregate_tok_per_s: a.aggregate_tok_per_s.max(b.aggregate_tok_per_s),
        per_client_tok_per_s: a.per_client_tok_per_s.max(b.per_client_tok_per_s),
        itl_median_ms: a.itl_median_ms.min(b.itl_median_ms),
        itl_p95_ms: a.itl_p95_ms.min(b.itl_p95_ms),
        ttft_median_s: a.ttft_median_s.min(b.ttft_median_s),
        ttft_max_s: a.ttft_max_s.min(b.ttft_max_s),
    }
}

/// The compare view's two panes (`--kv` against `--compare-kv`), their decode rates.
fn compare_row(
    engine: &EngineHandle,
    args: &BenchParallelArgs,
    text: &[char],
    lone: f64,
) -> anyhow::Result<CompareRow> {
    let req = CompareRequest {
        prompt: Prompt::Text {
            text: passage(text, 3, args.prompt_bytes),
        },
        sampling: SamplingParams::greedy(),
        max_tokens: args.tokens,
        caches: [
            CacheSelection::Spec(args.kv.clone()),
            CacheSelection::Spec(args.compare_kv.clone()),
        ],
        prefill_chunk: kvlab_engine::contract::PREFILL_CHUNK,
        sweep: Vec::new(),
        constraint: None,
        fit: None,
    };
    let mut panes = [0.0f64; 2];
    let ticket = engine.submit(req)?;
    for ev in ticket.events() {
        match ev {
            Event::Pane { pane, event } if pane < 2 => {
                if let Event::Stats(s) = *event {
                    panes[pane] = s.decode_tok_per_s;
                }
            }
            Event::Finished { .. } => break,
            Event::Error { code, message } => {
                bail!("the comparison failed [{code}]: {message}")
            }
            _ => {}
        }
    }
    Ok(CompareRow {
        panes_tok_per_s: panes,
        lone_tok_per_s: lone,
    })
}

/// `n` streams, then one more client prefilling `--prefill-load` bytes of text: the streams'
/// p95 inter-token latency before it and while it prefills.
fn load_row(
    engine: &EngineHandle,
    args: &BenchParallelArgs,
    text: &[char],
    n: usize,
) -> anyhow::Result<LoadRow> {
    let delay = Duration::from_millis(400);
    let (streams, extra) = run_clients(
        engine,
        args,
        text,
        n,
        "load",
        Some((args.prefill_load, delay)),
    )?;
    let extra = extra.context("no prefilling client")?;
    let (Some(submitted), Some(&first)) = (extra.submitted, extra.tokens.first()) else {
        bail!("the prefilling client gave no token");
    };
    let before_from = submitted - delay;
    let unloaded = gaps(&streams, before_from, submitted);
    let loaded = gaps(&streams, submitted, first);
    let tokenizer = engine.tokenizer().context("no tokenizer")?;
    let prefill_tokens = tokenizer
        .encode(&passage(text, n + 11, args.prefill_load), true)
        .map(|ids| ids.len())
        .unwrap_or(0);
    Ok(LoadRow {
        streams: n,
        prefill_tokens,
        itl_p95_unloaded_ms: percentile(unloaded, 0.95),
        itl_p95_loaded_ms: percentile(loaded, 0.95),
        prefill_ttft_s: (first - submitted).as_secs_f64(),
    })
}

fn print_report(r: &Report) {
    println!(
        "{}: {} clients at once, {} greedy tokens each, cache {}",
        r.model,
        r.rows
            .iter()
            .map(|r| r.clients.to_string())
            .collect::<Vec<_>>()
            .join("/"),
        r.tokens,
        r.kv
    );
    println!();
    println!("| clients | aggregate tok/s | × one stream | per client tok/s | ITL median ms | ITL p95 ms | TTFT median s | TTFT max s |");
    println!("|---|---|---|---|---|---|---|---|");
    let one = r
        .rows
        .iter()
        .find(|x| x.clients == 1)
        .map(|x| x.per_client_tok_per_s);
    for x in &r.rows {
        let ratio = one.map_or("–".to_string(), |o| {
            format!("{:.2}", x.aggregate_tok_per_s / o.max(1e-9))
        });
        println!(
            "| {} | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} |",
            x.clients,
            x.aggregate_tok_per_s,
            ratio,
            x.per_client_tok_per_s,
            x.itl_median_ms,
            x.itl_p95_ms,
            x.ttft_median_s,
            x.ttft_max_s
        );
    }
    if let Some(c) = &r.compare {
        println!();
        println!(
            "compare view: panes {:.1} and {:.1} tok/s, a lone chat {:.1}: {:.2}× and {:.2}×",
            c.panes_tok_per_s[0],
            c.panes_tok_per_s[1],
            c.lone_tok_per_s,
            c.panes_tok_per_s[0] / c.lone_tok_per_s.max(1e-9),
            c.panes_tok_per_s[1] / c.lone_tok_per_s.max(1e-9)
        );
    }
    if let Some(l) = &r.load {
        println!(
            "{} streams while a client prefills {} tokens: ITL p95 {:.1} ms unloaded, {:.1} ms loaded ({:.2}×); its first token after {:.2} s",
            l.streams,
            l.prefill_tokens,
            l.itl_p95_unloaded_ms,
            l.itl_p95_loaded_ms,
            l.itl_p95_loaded_ms / l.itl_p95_unloaded_ms.max(1e-9),
            l.prefill_ttft_s
        );
    }
}
