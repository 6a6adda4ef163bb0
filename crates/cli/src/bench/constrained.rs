//! `kvlab bench constrained`: what constrained decoding costs a token. The same prompt is
//! answered free and held to grammars (a JSON schema whose long string lets the model write
//! freely, so each step's mask is computed over the whole vocabulary; and any JSON object),
//! in alternating rounds; each row's decode rate, its ratio to the free answer's, and the
//! time the mask adds per token. A benchmark: it prints figures and fails on none.

use anyhow::{bail, Context};
use clap::Args;
use kvlab_engine::contract::Constraint;
use kvlab_engine::contract::Prompt;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{ConversationChoice, ConversationId, Event};
use kvlab_engine::lab::CacheSpec;
use kvlab_engine::Engine;
use kvlab_engine::GenerateRequest;
use serde::Serialize;
use serde_json::json;

use crate::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct BenchConstrainedArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens each answer generates (a schema's string holds them).
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Alternating rounds: each row's figure is its median.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The cache SPEC.
    #[arg(long, default_value = "f16")]
    kv: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    grammar: &'static str,
    decode_tok_per_s: f64,
    /// This row's rate over the free answer's.
    ratio: f64,
    /// Time the mask adds to a token, in microseconds (from the two rates).
    added_us_per_token: f64,
    generated: usize,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    model: String,
    vocab: usize,
    /// What the first constrained request adds (the vocabulary's grammar engine, built once
    /// per model, and the grammar's compile), in milliseconds.
    first_request_extra_ms: f64,
    kv: String,
    rounds: usize,
    rows: Vec<Row>,
}

/// The grammars measured: none; a schema with one long free string (the mask spans the
/// vocabulary); a long list of small objects (the mask is structure: keys, enums,
/// integers, booleans).
fn grammars(tokens: usize) -> Vec<(&'static str, Option<Constraint>)> {
    vec![
        ("none", None),
        (
            "json_schema, one long string",
            Some(Constraint::JsonSchema {
                schema: json!({"type": "object", "properties": {
                    "story": {"type": "string", "minLength": tokens * 6}},
                  "required": ["story"], "additionalProperties": false}),
            }),
        ),
        (
            "json_schema, list of records",
            Some(Constraint::JsonSchema {
                schema: json!({"type": "object", "properties": {
                    "rows": {"type": "array", "minItems": tokens / 4, "items": {
                        "type": "object", "properties": {
                            "n": {"type": "integer", "minimum": 0, "maximum": 999},
                            "ok": {"type": "boolean"},
                            "colour": {"enum": ["red", "green", "blue"]}},
                        "required": ["n", "ok", "colour"], "additionalProperties": false}}},
                  "required": ["rows"], "additionalProperties": false}),
            }),
        ),
    ]
}

pub fn run(args: BenchConstrainedArgs) -> anyhow::Result<()> {
    if args.tokens < 16 || args.rounds == 0 {
        bail!("at least 16 tokens and one round");
    }
    let engine = Engine::spawn()?;
    let card = args
        .model
        .load_into(&engine, CacheSpec::parse(&args.kv)?.to_policy(), 2048)?;
    let vocab = engine.tokenizer().context("no tokenizer")?.vocab_size();
    let prompt = super::corpus()?.chars().take(600).collect::<String>();
    let grammars = grammars(args.tokens);
    // One token free, then one under the first grammar: the second also builds the
    // vocabulary's grammar engine.
    let one = |i: usize, tag: &str| -> anyhow::Result<f64> {
        let req = GenerateRequest {
            sampling: SamplingParams::greedy(),
            max_tokens: 1,
            constraint: grammars[i].1.clone(),
            conversation: Some(ConversationChoice::Id {
                id: ConversationId::new(format!("constrained-first-{tag}"))?,
            }),
            ..GenerateRequest::new(Prompt::Text {
                text: prompt.clone(),
            })
        };
        let start = std::time::Instant::now();
        engine
            .submit(req)?
            .wait(|_| true)
            .map_err(|e| anyhow::anyhow!("[{}] {}", e.code, e.message))?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    let free_ms = one(0, "free")?;
    let first_request_extra_ms = (one(1, "constrained")? - free_ms).max(0.0);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); grammars.len()];
    let mut generated = vec![0usize; grammars.len()];
    for round in 0..args.rounds {
        for (i, (name, constraint)) in grammars.iter().enumerate() {
            let req = GenerateRequest {
                sampling: SamplingParams::greedy(),
                max_tokens: args.tokens,
                constraint: constraint.clone(),
                conversation: Some(ConversationChoice::Id {
                    id: ConversationId::new(format!("constrained-{round}-{i}"))?,
                }),
                ..GenerateRequest::new(Prompt::Text {
                    text: prompt.clone(),
                })
            };
            let ticket = engine.submit(req)?;
            for ev in ticket.events() {
                match ev {
                    Event::Stats(s) => {
                        rates[i].push(s.decode_tok_per_s);
                        generated[i] = s.generated_tokens;
                    }
                    Event::Done { .. } => break,
                    Event::Error { code, message } => bail!("{name}: [{code}] {message}"),
                    _ => {}
                }
            }
            if !args.json {
                eprintln!(
                    "round {round}: {name}: {:.1} tok/s",
                    rates[i].last().unwrap_or(&0.0)
                );
            }
        }
    }
    engine.shutdown();
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let free = median(&rates[0]);
    let rows = grammars
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let rate = median(&rates[i]);
            Row {
                grammar: name,
                decode_tok_per_s: rate,
                ratio: if free > 0.0 { rate / free } else { 0.0 },
                added_us_per_token: if rate > 0.0 && free > 0.0 {
                    (1e6 / rate - 1e6 / free).max(0.0)
                } else {
                    0.0
                },
                generated: generated[i],
            }
        })
        .collect();
    let report = Report {
        model: card.name,
        vocab,
        first_request_extra_ms,
        kv: args.kv,
        rounds: args.rounds,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{} ({} tokens in the vocabulary), cache {}, median of {} alternating rounds",
        report.model, report.vocab, report.kv, report.rounds
    );
    println!(
        "the first constrained request: +{:.0} ms (the vocabulary's grammar engine, built once per model)",
        report.first_request_extra_ms
    );
    println!(
        "{:<32} {:>10} {:>8} {:>14} {:>10}",
        "grammar", "decode t/s", "× free", "mask µs/token", "generated"
    );
    for r in &report.rows {
        println!(
            "{:<32} {:>10.1} {:>8.3} {:>14.0} {:>10}",
            r.grammar, r.decode_tok_per_s, r.ratio, r.added_us_per_token, r.generated
        );
    }
    Ok(())
}
