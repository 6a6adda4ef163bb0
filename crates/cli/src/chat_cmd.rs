//! `kvlab chat`: one user turn through the engine thread (the same path the app takes),
//! streamed to stdout; thinking is dimmed on a terminal; a stats line ends the run (stderr).

use std::io::{IsTerminal, Write};

use crate::model_args::{kv_policy, ModelArgs};
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use kvlab_engine::contract::Constraint;
use kvlab_engine::contract::Message;
use kvlab_engine::contract::SamplingParams;
use kvlab_engine::contract::{DoneReason, Event, GenStats};
use kvlab_engine::contract::{Prompt, DEFAULT_MAX_TOKENS, PREFILL_CHUNK};
use kvlab_engine::Engine;
use kvlab_engine::GenerateRequest;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The user message.
    #[arg(long)]
    prompt: String,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// Let the model think before answering (Gemma 4 only).
    #[arg(long)]
    think: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = SamplingParams::chat().temperature)]
    temp: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = SamplingParams::chat().top_k.unwrap_or(0))]
    top_k: usize,
    /// Keep the smallest set of tokens with probability ≥ P (1 = off).
    #[arg(long, default_value_t = SamplingParams::chat().top_p.unwrap_or(1.0))]
    top_p: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// KV cache SPEC: f16, bf16, f32, or a TurboQuant spec such as tq4 (default: f16, or
    /// the precision of the --load-cache file).
    #[arg(long)]
    kv: Option<String>,
    /// After the answer, save the conversation's KV cache to this file, in the precision it
    /// holds (prompt and answer; `--load-cache` continues from it).
    #[arg(long)]
    save_cache: Option<std::path::PathBuf>,
    /// Before the prompt, restore a KV cache saved by `--save-cache` from the same model, in
    /// the precision it was saved in (`--kv` converts it): the run continues where that one
    /// stopped, without reading its tokens again; the prompt, if any, is appended to it as
    /// plain text (`--prompt ""` simply goes on generating).
    #[arg(long)]
    load_cache: Option<std::path::PathBuf>,
    /// How to prompt: `chat` renders the chat template; `raw` continues the text as is
    /// (for base models); `auto` uses raw only when the checkpoint has no chat template.
    #[arg(long, value_enum, default_value_t = Template::Auto)]
    template: Template,
    /// Switch the cache precision live after this many streamed tokens (with --switch-to).
    #[arg(long, requires = "switch_to")]
    switch_at: Option<usize>,
    /// The cache SPEC to switch to at --switch-at (e.g. tq4).
    #[arg(long, requires = "switch_at")]
    switch_to: Option<String>,
    /// Hold the answer to this JSON schema (a file) by constrained decoding: it always
    /// parses and validates (`{}` in the file: any JSON object).
    #[arg(long)]
    json_schema: Option<std::path::PathBuf>,
    /// An image (PNG, JPEG, WebP, GIF's first frame) shown before the prompt; repeat for
    /// more. Needs a model with a vision tower (a multimodal checkpoint, or an mmproj GGUF:
    /// --mmproj, or the one mmproj*.gguf beside the model).
    #[arg(long)]
    image: Vec<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Template {
    Auto,
    Chat,
    Raw,
}

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    // A restored cache is read in the precision it was saved in.
    let kv = match (&args.kv, &args.load_cache) {
        (Some(kv), _) => kv.clone(),
        (None, Some(file)) => {
            kvlab_engine::lab::peek_cache_file(file)
                .with_context(|| format!("reading {}", file.display()))?
                .spec
        }
        (None, None) => "f16".to_string(),
    };
    let policy = kv_policy(&kv)?;
    let switch = match (&args.switch_at, &args.switch_to) {
        (Some(at), Some(to)) => Some((*at, to.clone(), kv_policy(to)?)),
        _ => None,
    };
    let engine = Engine::spawn()?;
    let card = args.model.load_into(
        &engine,
        policy.clone(),
        kvlab_engine::contract::DEFAULT_LOAD_CONTEXT,
    )?;
    eprintln!(
        "{} ({}, {} layers, {:.0}M params)",
        card.name,
        card.architecture,
        card.layers,
        card.params as f64 / 1e6
    );
    let sampling = SamplingParams {
        temperature: args.temp,
        top_k: (args.top_k > 0).then_some(args.top_k),
        top_p: (args.top_p < 1.0).then_some(args.top_p),
        seed: args.seed,
    };
    let restored = match &args.load_cache {
        Some(file) => {
            let r = engine
                .restore_cache(
                    &kvlab_engine::contract::ConversationId::default_id(),
                    Some(std::path::PathBuf::from(file)),
                )
                .map_err(|e| {
                    anyhow::anyhow!("restoring {}: [{}] {}", file.display(), e.code, e.message)
                })?;
            eprintln!(
                "[restored {} tokens ({}, {:.2} MiB) from {} in {:.3} s, instead of reading them again]",
                r.tokens,
                r.spec,
                r.bytes as f64 / 1048576.0,
                file.display(),
                r.secs
            );
            if args.kv.as_deref().is_some_and(|kv| kv != r.spec) {
                // A restore is in the file's precision; --kv converts it, as a switch does.
                let marker = engine
                    .switch_cache(
                        &kvlab_engine::contract::ConversationId::default_id(),
                        &kvlab_engine::contract::CacheSelection::Spec(policy.spec_string()),
                    )
                    .map_err(|e| anyhow::anyhow!("converting the cache to {kv}: {e}"))?;
                eprintln!(
                    "[converted the restored cache {} → {}: {:.2} → {:.2} MiB]",
                    marker.from,
                    marker.to,
                    marker.kv_before.used as f64 / 1048576.0,
                    marker.kv_after.used as f64 / 1048576.0
                );
            }
            Some(r)
        }
        None => None,
    };
    if !args.image.is_empty() && (restored.is_some() || args.template == Template::Raw) {
        anyhow::bail!("--image needs a chat prompt (not --load-cache or --template raw)");
    }
    let raw = match args.template {
        Template::Raw => true,
        Template::Chat => false,
        Template::Auto => card.has_chat_template == Some(false),
    };
    let prompt = if let Some(r) = &restored {
        // What the cache holds, what was sampled after it, then the new text.
        let mut ids = r.token_ids.clone();
        ids.extend(&r.pending);
        if !args.prompt.is_empty() {
            let tokenizer = engine.tokenizer().context("no tokenizer")?;
            ids.extend(tokenizer.encode(&args.prompt, false)?);
        }
        Prompt::Ids { ids }
    } else if raw {
        eprintln!(
            "(no chat template: continuing the prompt as plain text; --template chat forces it)"
        );
        let text = match &args.system {
            Some(s) => format!("{s}\n\n{}", args.prompt),
            None => args.prompt.clone(),
        };
        // Show the prompt so the continuation reads as one text.
        print!("{text}");
        Prompt::Text { text }
    } else {
        let mut images = Vec::with_capacity(args.image.len());
        for file in &args.image {
            let bytes =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let info = engine
                .add_image(&bytes, kvlab_engine::contract::ImageLimits::default())
                .map_err(|e| anyhow::anyhow!("{}: [{}] {}", file.display(), e.code, e.message))?;
            eprintln!(
                "[{}: {}×{}, read at {}×{}: {} tokens]",
                file.display(),
                info.width,
                info.height,
                info.resized.0,
                info.resized.1,
                info.tokens
            );
            images.push(info.id);
        }
        Prompt::Chat {
            system: args.system.clone(),
            messages: vec![Message {
                images,
                ..Message::user(args.prompt.clone())
            }],
            thinking: args.think,
            tools: Vec::new(),
        }
    };
    let constraint = match &args.json_schema {
        None => None,
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            Some(match schema.as_object() {
                Some(o) if o.is_empty() => Constraint::JsonObject,
                _ => Constraint::JsonSchema { schema },
            })
        }
    };
    let request = GenerateRequest {
        prompt,
        sampling,
        max_tokens: args.max_tokens,
        prefill_chunk: PREFILL_CHUNK,
        cache: None,
        stop: Vec::new(),
        conversation: None,
        context: None,
        constraint,
    };
    let ticket = engine.submit(request)?;
    let tty = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    let mut stats: Option<GenStats> = None;
    let mut reason = None;
    let mut streamed = 0usize;
    for ev in ticket.events() {
        if matches!(ev, Event::Token { .. } | Event::Thinking { .. }) {
            streamed += 1;
            if let Some((at, to, p)) = &switch {
                if streamed == *at {
                    // Applied by the engine thread between this token and the next.
                    let marker = engine
                        .switch_cache(
                            &kvlab_engine::contract::ConversationId::default_id(),
                            &kvlab_engine::contract::CacheSelection::Spec(p.spec_string()),
                        )
                        .map_err(|e| anyhow::anyhow!("switching the cache to {to}: {e}"))?;
                    eprintln!(
                        "\n[switched the cache {} → {} after {at} tokens in {:.0} ms: KV {:.2} → {:.2} MiB]",
                        marker.from,
                        marker.to,
                        marker.duration_ms,
                        marker.kv_before.used as f64 / 1048576.0,
                        marker.kv_after.used as f64 / 1048576.0
                    );
                }
            }
        }
        match ev {
            Event::Token { text } => write!(out, "{text}")?,
            Event::Thinking { text } if tty => write!(out, "{DIM}{text}{RESET}")?,
            Event::Thinking { text } => write!(out, "{text}")?,
            Event::Stats(s) => stats = Some(s),
            Event::Done { reason: r, .. } => {
                reason = Some(r);
                break;
            }
            Event::Error { code, message } => bail!("generation failed [{code}]: {message}"),
            _ => {}
        }
        out.flush()?;
    }
    writeln!(out)?;
    drop(out);
    if let Some(file) = &args.save_cache {
        let saved = engine
            .save_cache(
                &kvlab_engine::contract::ConversationId::default_id(),
                Some(std::path::PathBuf::from(file)),
            )
            .map_err(|e| {
                anyhow::anyhow!(
                    "saving the cache to {}: [{}] {}",
                    file.display(),
                    e.code,
                    e.message
                )
            })?;
        eprintln!(
            "[saved {} tokens ({}) to {}: {:.2} MiB in {:.3} s]",
            saved.tokens,
            saved.spec,
            file.display(),
            saved.bytes as f64 / 1048576.0,
            saved.secs
        );
    }
    engine.shutdown();
    if let Some(s) = stats {
        eprintln!("{}", stats_line(&s, reason));
    }
    Ok(())
}

/// One line of figures.
pub fn stats_line(s: &GenStats, reason: Option<DoneReason>) -> String {
    format!(
        "[{} prompt ({} reused), {} generated, {:?}; ttft {:.2}s, prefill {:.1} tok/s, decode {:.1} tok/s; context {}/{}; KV {:.2} MiB]",
        s.prompt_tokens,
        s.reused_tokens,
        s.generated_tokens,
        reason.unwrap_or(DoneReason::Stop),
        s.time_to_first_token_s,
        s.prefill_tok_per_s,
        s.decode_tok_per_s,
        s.context_tokens,
        s.max_context,
        s.kv_bytes as f64 / 1048576.0
    )
}
