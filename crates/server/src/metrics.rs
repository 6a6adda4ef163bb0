//! Prometheus text for `/metrics`: the server's request and token counters, and the engine's
//! queue depth and exact KV bytes by attention kind and precision at the moment of the scrape.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use kvlab_engine::contract::AttentionKind;
use kvlab_engine::contract::{EngineStatus, PoolCounters, StepCounters};

/// Counters since the server started.
#[derive(Debug, Default)]
pub struct Counters {
    pub chat_requests: AtomicU64,
    pub completion_requests: AtomicU64,
    pub failed_requests: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
}

impl Counters {
    /// Adds a finished request's tokens.
    pub fn tokens(&self, prompt: usize, generated: usize) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
    }
}

/// The exposition text.
pub fn render(
    c: &Counters,
    status: &EngineStatus,
    pool: &PoolCounters,
    steps: &StepCounters,
) -> String {
    let mut out = String::new();
    // Every running stream shares one forward pass per step: sequences and tokens per step
    // are these totals' ratios to the steps'.
    for (name, help, v) in [
        (
            "kvlab_steps_total",
            "Forward passes the engine ran.",
            steps.steps,
        ),
        (
            "kvlab_step_sequences_total",
            "Sequences the forward passes ran, summed (per step: over kvlab_steps_total).",
            steps.sequences,
        ),
        (
            "kvlab_step_tokens_total",
            "Tokens the forward passes ran, summed (per step: over kvlab_steps_total).",
            steps.tokens,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(out, "{name} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP kvlab_step_sequences Sequences the last forward pass ran together."
    );
    let _ = writeln!(out, "# TYPE kvlab_step_sequences gauge");
    let _ = writeln!(out, "kvlab_step_sequences {}", steps.last_sequences);
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# HELP kvlab_requests_total Requests received, by endpoint."
    );
    let _ = writeln!(out, "# TYPE kvlab_requests_total counter");
    let _ = writeln!(
        out,
        "kvlab_requests_total{{endpoint=\"chat\"}} {}",
        get(&c.chat_requests)
    );
    let _ = writeln!(
        out,
        "kvlab_requests_total{{endpoint=\"completions\"}} {}",
        get(&c.completion_requests)
    );
    let _ = writeln!(
        out,
        "# HELP kvlab_failed_requests_total Requests answered with an error."
    );
    let _ = writeln!(out, "# TYPE kvlab_failed_requests_total counter");
    let _ = writeln!(
        out,
        "kvlab_failed_requests_total {}",
        get(&c.failed_requests)
    );
    let _ = writeln!(
        out,
        "# HELP kvlab_tokens_total Tokens read (prompt) and written (generated)."
    );
    let _ = writeln!(out, "# TYPE kvlab_tokens_total counter");
    let _ = writeln!(
        out,
        "kvlab_tokens_total{{kind=\"prompt\"}} {}",
        get(&c.prompt_tokens)
    );
    let _ = writeln!(
        out,
        "kvlab_tokens_total{{kind=\"generated\"}} {}",
        get(&c.generated_tokens)
    );
    let _ = writeln!(
        out,
        "# HELP kvlab_queue_depth Requests waiting behind the running one."
    );
    let _ = writeln!(out, "# TYPE kvlab_queue_depth gauge");
    let _ = writeln!(out, "kvlab_queue_depth {}", status.queued);
    let _ = writeln!(out, "# HELP kvlab_busy 1 while the engine runs a job.");
    let _ = writeln!(out, "# TYPE kvlab_busy gauge");
    let _ = writeln!(out, "kvlab_busy {}", u8::from(status.busy));
    let _ = writeln!(
        out,
        "# HELP kvlab_context_tokens Tokens all conversations' caches hold in memory."
    );
    let _ = writeln!(out, "# TYPE kvlab_context_tokens gauge");
    let _ = writeln!(out, "kvlab_context_tokens {}", status.context_tokens);
    let _ = writeln!(out, "# HELP kvlab_kv_bytes KV cache bytes holding live tokens, by attention kind and precision.");
    let _ = writeln!(out, "# TYPE kvlab_kv_bytes gauge");
    for part in &status.kv.parts {
        let kind = match part.kind {
            AttentionKind::Sliding => "sliding",
            AttentionKind::Full => "full",
        };
        let _ = writeln!(
            out,
            "kvlab_kv_bytes{{kind=\"{kind}\",precision=\"{}\"}} {}",
            part.precision, part.bytes.used
        );
    }
    let _ = writeln!(
        out,
        "# HELP kvlab_kv_bytes_total KV cache bytes holding live tokens."
    );
    let _ = writeln!(out, "# TYPE kvlab_kv_bytes_total gauge");
    let _ = writeln!(out, "kvlab_kv_bytes_total {}", status.kv.total_used);
    let _ = writeln!(
        out,
        "# HELP kvlab_weights_bytes Bytes of the model's weights as held."
    );
    let _ = writeln!(out, "# TYPE kvlab_weights_bytes gauge");
    let _ = writeln!(out, "kvlab_weights_bytes {}", status.weights_bytes);
    let _ = writeln!(
        out,
        "# HELP kvlab_turns_total Turns by where their cache came from (held in memory, held demoted, restored from disk, prefilled again, new)."
    );
    let _ = writeln!(out, "# TYPE kvlab_turns_total counter");
    for (origin, n) in [
        ("held", pool.held),
        ("demoted", pool.demoted_hits),
        ("restored", pool.restored),
        ("prefilled", pool.prefilled),
        ("new", pool.new),
    ] {
        let _ = writeln!(out, "kvlab_turns_total{{origin=\"{origin}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP kvlab_pool_actions_total What the pool did to idle conversations to make room."
    );
    let _ = writeln!(out, "# TYPE kvlab_pool_actions_total counter");
    for (action, n) in [
        ("demote", pool.demotions),
        ("spill", pool.spills),
        ("drop", pool.drops),
    ] {
        let _ = writeln!(out, "kvlab_pool_actions_total{{action=\"{action}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP kvlab_conversations Conversations the pool knows, by tier."
    );
    let _ = writeln!(out, "# TYPE kvlab_conversations gauge");
    for tier in ["held", "demoted", "on_disk", "dropped"] {
        let n = status
            .conversations
            .iter()
            .filter(|c| {
                serde_json::to_value(c.tier)
                    .ok()
                    .as_ref()
                    .and_then(|v| v.as_str())
                    == Some(tier)
            })
            .count();
        let _ = writeln!(out, "kvlab_conversations{{tier=\"{tier}\"}} {n}");
    }
    out
}
