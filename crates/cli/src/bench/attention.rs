//! `kvlab bench attention`: the time of one attention call over a full-attention layer cache
//! of N tokens, per cache SPEC, and its speedup over f16: a decode step's (one query per
//! head), or with `--queries Q` a prefill chunk's (the last Q positions, causal).
//! Synthetic K/V (attention cost does not depend on the values); the storages are the
//! engine's own, so this is exactly the per-layer work of a decode step. Every cache of a
//! context is built first and then timed in alternating rounds, each one's best round
//! reported: on a shared machine one pass per cache moved the ratios by 20–35%.

use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::{Device, Tensor};
use clap::Args;
use kvlab_engine::lab::KvPrecision;
use kvlab_engine::lab::{new_storage, AttendSpec, CacheSpec, StorageShape};
use serde::Serialize;

use crate::bench::memory::parse_contexts;

/// `kvlab bench attention` options (defaults: a Gemma 3 270M full layer).
#[derive(Args, Debug)]
pub struct BenchAttentionArgs {
    /// Context lengths, comma-separated (`2k` = 2048).
    #[arg(long, default_value = "2k,32k")]
    contexts: String,
    /// Cache SPECs, comma-separated (the full-layer precision of each is measured).
    #[arg(long, default_value = "f16,tq4")]
    kv: String,
    /// Query heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Key/value heads.
    #[arg(long, default_value_t = 1)]
    kv_heads: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 256)]
    head_dim: usize,
    /// Query positions per call: 1 is a decode step; more is a prefill chunk, the context's
    /// last positions, each seeing the keys up to its own.
    #[arg(long, default_value_t = 1)]
    queries: usize,
    /// Minimum measuring time per configuration, seconds (all rounds together).
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Alternating rounds over the caches of a context; each cache's best round is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct AttentionRow {
    context: usize,
    kv: String,
    /// Query positions per call.
    queries: usize,
    /// Microseconds per attention call (all heads of one layer), in its best round.
    us_per_call: f64,
    /// Each round's microseconds per call, in order.
    rounds_us: Vec<f64>,
    /// f16's time over this one (same context), when f16 was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    speedup_vs_f16: Option<f64>,
    kv_bytes: usize,
}

fn synthetic(seed: u64, dims: (usize, usize, usize)) -> anyhow::Result<Tensor> {
    let mut rng = kvlab_turboquant::Rng::new(seed, 0);
    let n = dims.0 * dims.1 * dims.2;
    let v: Vec<f32> = (0..n).map(|_| rng.symmetric()).collect();
    Ok(Tensor::from_vec(v, dims, &Device::Cpu)?)
}

pub fn run(args: BenchAttentionArgs) -> anyhow::Result<()> {
    let contexts = parse_contexts(&args.contexts)?;
    if args.kv_heads == 0 || !args.heads.is_multiple_of(args.kv_heads) {
        bail!("--heads must be a positive multiple of --kv-heads");
    }
    if args.queries == 0 || contexts.iter().any(|&n| n < args.queries) {
        bail!("--queries must be at least 1 and at most each context");
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let mut rows: Vec<AttentionRow> = Vec::new();
    for &n in &contexts {
        // Every cache of this context, built before any is timed.
        let mut caches = Vec::new();
        for spec in args.kv.split(',') {
            let cs = CacheSpec::parse(spec).with_context(|| format!("bad --kv `{spec}`"))?;
            let precision: KvPrecision = cs.to_policy().full;
            let shape = StorageShape::new(args.kv_heads, args.head_dim, Device::Cpu);
            let mut st = new_storage(precision, shape)?;
            let mut at = 0;
            while at < n {
                let t = 512.min(n - at);
                let k = synthetic(at as u64, (args.kv_heads, t, args.head_dim))?;
                let v = synthetic(at as u64 + 7, (args.kv_heads, t, args.head_dim))?;
                st.append(&k, &v)?;
                at += t;
            }
            caches.push((cs.to_string(), st, Vec::new()));
        }
        let q = synthetic(99, (args.heads, args.queries, args.head_dim))?;
        let spec_a = AttendSpec {
            query_start: n - args.queries,
            key_start: 0,
            window: None,
            scale: 1.0 / (args.head_dim as f64).sqrt(),
            both_ways: None,
        };
        let budget = args.seconds / args.rounds as f64;
        for _ in 0..args.rounds {
            for (_, st, rounds) in caches.iter_mut() {
                st.attend(&q, &spec_a)?; // warm-up: this cache's bytes back in the caches
                let t0 = Instant::now();
                let mut calls = 0u32;
                while calls < 3 || t0.elapsed().as_secs_f64() < budget {
                    st.attend(&q, &spec_a)?;
                    calls += 1;
                }
                rounds.push(t0.elapsed().as_secs_f64() * 1e6 / calls as f64);
            }
        }
        let best = |r: &[f64]| r.iter().copied().fold(f64::INFINITY, f64::min);
        let f16_us = caches
            .iter()
            .find(|(name, _, _)| name == "f16")
            .map(|(_, _, r)| best(r));
        for (name, st, rounds_us) in caches {
            let us = best(&rounds_us);
            rows.push(AttentionRow {
                context: n,
                kv: name,
                queries: args.queries,
                us_per_call: us,
                rounds_us,
                speedup_vs_f16: f16_us.map(|f| f / us),
                kv_bytes: st.bytes_used(),
            });
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in &rows {
            let rounds: Vec<String> = r.rounds_us.iter().map(|u| format!("{u:.0}")).collect();
            println!(
                "context {:>6} queries {:>4} kv {:<10} {:>10.1} µs/call  KV {:>8.2} MiB{}  (rounds: {})",
                r.context,
                r.queries,
                r.kv,
                r.us_per_call,
                r.kv_bytes as f64 / 1048576.0,
                r.speedup_vs_f16
                    .map(|s| format!("  ×{s:.2} vs f16"))
                    .unwrap_or_default(),
                rounds.join(" ")
            );
        }
    }
    Ok(())
}
