//! Caches fitted to a budget: each cache-owning layer's keys and values get their own
//! TurboQuant width, chosen by measured sensitivity to minimise the predicted loss within a
//! budget of bits per coordinate or bytes at a context (the idea of KVTuner, per layer and
//! side). The contract: [`probes`] are the caches to measure (one side of one layer at
//! [`PROBE_BITS`], every other layer f16), [`Sensitivity::from_probes`] reads their mean
//! KLDs, and [`allocate`] is a pure, deterministic choice from those figures.
//!
//! The model of the loss: a layer side coded at `b` bits loses its probe's KLD times the
//! codec's error at `b` over its error at the probe's width ([`Bits::unit_mse`]): to first
//! order KLD is quadratic in the logits' change, which is linear in the attention output's
//! error, whose square the codec's MSE is. The sides' losses are added. Neither holds
//! exactly: on a quantized model any change pays a floor (f16 against bf16 everywhere costs
//! 0.0025 on Gemma 3 270M), so a probe overstates how a side's loss shrinks with more bits,
//! and the losses compound; the prediction undershoots the measurement. Subtracting that
//! floor from each probe was tried and starved the least sensitive full layers (2 bits),
//! which then dominated the loss (0.0166 against 0.0075 at 5 bits on Alice): the raw probes
//! rank the sides better. The fit prints its prediction beside the measurement on text it
//! did not fit on. Every fitted side is query-weighted (keys) and
//! keeps its first token as f16 (`+qw+sink`): the cheapest losses to remove.

use std::collections::BTreeMap;

use kvlab_turboquant::Bits;
use serde::{Deserialize, Serialize};

use crate::checkpoint::config::ModelConfig;
use crate::contract::AttentionKind;
use crate::error::{EngineError, Result};
use crate::kv::{CacheSpec, KvPrecision, PrecisionPolicy};
use crate::memory::estimate_kv_bytes_at_once;

/// The width a side is probed at: low enough that one side's loss stands clear of the floor
/// any change pays on a quantized model, near the widths a fit at 3–5 bits chooses.
pub const PROBE_BITS: Bits = Bits::B3;

/// Widths a side may take, from the most to the fewest bits (`None`: f16).
const LADDER: [Option<Bits>; 12] = [
    None,
    Some(Bits::B8),
    Some(Bits::B7),
    Some(Bits::B6),
    Some(Bits::B5_5),
    Some(Bits::B5),
    Some(Bits::B4_5),
    Some(Bits::B4),
    Some(Bits::B3_5),
    Some(Bits::B3),
    Some(Bits::B2_5),
    Some(Bits::B2),
];

/// What a fit must stay within, counted at `ctx` tokens (sliding layers hold their window).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum FitBudget {
    /// Bits per coordinate as held: the cache's bytes against an f32 cache's, times 32.
    Bits(f64),
    /// Bytes of the whole cache.
    Bytes(u64),
}

/// Keys or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum KvSide {
    Keys,
    Values,
}

/// One cache to measure, and what it probes.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The layer and side coded at [`PROBE_BITS`].
    pub target: (usize, KvSide),
    pub label: String,
    pub policy: PrecisionPolicy,
}

/// The caches a fit measures: for each cache-owning layer, its keys and then its values at
/// [`PROBE_BITS`] with the other side and every other layer f16.
pub fn probes(config: &ModelConfig, seed: u64) -> Result<Vec<Probe>> {
    let mut out = Vec::new();
    for l in config.cache_owning_layers() {
        for side in [KvSide::Keys, KvSide::Values] {
            let (k, v) = match side {
                KvSide::Keys => (Some(PROBE_BITS), None),
                KvSide::Values => (None, Some(PROBE_BITS)),
            };
            let mut policy = PrecisionPolicy::default();
            policy.overrides.insert(l.index, precision(k, v, seed)?);
            out.push(Probe {
                target: (l.index, side),
                label: format!("layer {} {}", l.index, side_name(side)),
                policy,
            });
        }
    }
    Ok(out)
}

fn side_name(side: KvSide) -> &'static str {
    match side {
        KvSide::Keys => "keys",
        KvSide::Values => "values",
    }
}

/// A layer's precision with keys and values at these widths (`None`: f16), query-weighted
/// keys and first tokens kept, as the SPEC grammar builds it (`k4v3+qw+sink`).
fn precision(key: Option<Bits>, value: Option<Bits>, seed: u64) -> Result<KvPrecision> {
    let side = |b: Option<Bits>| b.map_or("f16".to_string(), |b| b.value().to_string());
    if key.is_none() && value.is_none() {
        return Ok(KvPrecision::F16);
    }
    let qw = if key.is_some() { "+qw" } else { "" };
    let seed = if seed == 0 {
        String::new()
    } else {
        format!("+seed={seed}")
    };
    let text = format!("k{}v{}{qw}+sink{seed}@all", side(key), side(value));
    match CacheSpec::parse(&text)? {
        CacheSpec::Split { precision, .. } => Ok(KvPrecision::Split(precision)),
        _ => Err(EngineError::invalid(format!("{text} is not a split cache"))),
    }
}

/// Each layer side's measured loss at [`PROBE_BITS`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sensitivity {
    /// Per cache-owning layer, in order.
    pub layers: Vec<LayerSensitivity>,
}

/// One layer's probes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerSensitivity {
    pub layer: usize,
    pub kind: AttentionKind,
    /// Mean KLD with only this layer's keys at [`PROBE_BITS`].
    pub keys_kld: f64,
    /// Mean KLD with only this layer's values at [`PROBE_BITS`].
    pub values_kld: f64,
}

impl Sensitivity {
    /// The figures of `probes` (as [`probes`] made them) from their mean KLDs, in order.
    pub fn from_probes(config: &ModelConfig, probes: &[Probe], mean_klds: &[f64]) -> Result<Self> {
        if probes.len() != mean_klds.len() {
            return Err(EngineError::invalid(format!(
                "{} probes, {} measurements",
                probes.len(),
                mean_klds.len()
            )));
        }
        let by: BTreeMap<(usize, KvSide), f64> = probes
            .iter()
            .zip(mean_klds)
            .map(|(p, &kld)| (p.target, kld))
            .collect();
        let layers = config
            .cache_owning_layers()
            .map(|l| {
                let get = |side| {
                    by.get(&(l.index, side)).copied().ok_or_else(|| {
                        EngineError::invalid(format!("layer {} was not probed", l.index))
                    })
                };
                Ok(LayerSensitivity {
                    layer: l.index,
                    kind: l.kind,
                    keys_kld: get(KvSide::Keys)?,
                    values_kld: get(KvSide::Values)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers })
    }

    /// A side's loss at its probe width (a side that measured nothing still costs something
    /// to compress).
    fn excess(kld: f64) -> f64 {
        kld.max(1e-9)
    }
}

/// What [`allocate`] chose.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fitted {
    /// The per-layer policy.
    #[serde(skip)]
    pub policy: PrecisionPolicy,
    /// Its canonical SPEC (`BASE,LAYERS=FORMAT,…`).
    pub spec: String,
    /// Bits per coordinate it holds at the context.
    pub bits_per_coordinate: f64,
    /// Bytes it holds at the context.
    pub bytes: u64,
    /// The loss the model of this module predicts: the sum of each side's.
    pub predicted_kld: f64,
    /// Per cache-owning layer: keys' and values' widths (`None`: f16).
    pub widths: Vec<(usize, Option<f64>, Option<f64>)>,
}

/// Refuses, before anything is probed, a budget no fit can meet (2 bits on every side holds
/// more at `ctx` tokens): [`allocate`] itself on sides that lose nothing.
pub fn check_budget(config: &ModelConfig, budget: FitBudget, ctx: usize) -> Result<()> {
    let lossless = Sensitivity {
        layers: config
            .cache_owning_layers()
            .map(|l| LayerSensitivity {
                layer: l.index,
                kind: l.kind,
                keys_kld: 0.0,
                values_kld: 0.0,
            })
            .collect(),
    };
    allocate(config, &lossless, budget, ctx, 0).map(|_| ())
}

/// The per-layer widths that minimise the predicted loss within `budget` at `ctx` tokens:
/// every side starts at f16 and the step down with the least predicted loss per byte saved
/// is taken until the cache fits (ties to the lower layer, keys first). Refused when even
/// 2 bits everywhere does not fit.
pub fn allocate(
    config: &ModelConfig,
    sensitivity: &Sensitivity,
    budget: FitBudget,
    ctx: usize,
    seed: u64,
) -> Result<Fitted> {
    if ctx == 0 {
        return Err(EngineError::invalid(
            "a fit needs a context of at least 1 token",
        ));
    }
    let dim = config
        .cache_owning_layers()
        .map(|l| l.head_dim)
        .max()
        .unwrap_or(0);
    let probe_mse = PROBE_BITS.unit_mse(dim);
    let loss = |excess: f64, rung: usize| match LADDER[rung] {
        None => 0.0,
        Some(b) => excess * b.unit_mse(dim) / probe_mse,
    };
    // Per layer (in `sensitivity.layers`' order): rungs of keys and values.
    let mut rungs = vec![[0usize; 2]; sensitivity.layers.len()];
    let policy_of = |rungs: &[[usize; 2]]| -> Result<PrecisionPolicy> {
        let mut p = PrecisionPolicy::default();
        for (l, r) in sensitivity.layers.iter().zip(rungs) {
            let prec = precision(LADDER[r[0]], LADDER[r[1]], seed)?;
            if prec != KvPrecision::F16 {
                p.overrides.insert(l.layer, prec);
            }
        }
        Ok(p)
    };
    let f32_bytes =
        estimate_kv_bytes_at_once(config, &PrecisionPolicy::uniform(KvPrecision::F32), ctx, 0)?;
    let bits_of = |bytes: u64| 32.0 * bytes as f64 / (f32_bytes.max(1)) as f64;
    let fits = |bytes: u64| match budget {
        FitBudget::Bits(b) => bits_of(bytes) <= b + 1e-9,
        FitBudget::Bytes(b) => bytes <= b,
    };
    let mut bytes = estimate_kv_bytes_at_once(config, &policy_of(&rungs)?, ctx, 0)?;
    while !fits(bytes) {
        // (whether it saves nothing, loss per byte saved or the loss alone, layer, side,
        // bytes after): a step that saves nothing (a side's first coded width adds its
        // offsets and weights) is taken only when no other step saves bytes.
        let mut best: Option<((bool, f64), usize, usize, u64)> = None;
        for (i, l) in sensitivity.layers.iter().enumerate() {
            for s in 0..2 {
                if rungs[i][s] + 1 >= LADDER.len() {
                    continue;
                }
                let excess = Sensitivity::excess(if s == 0 { l.keys_kld } else { l.values_kld });
                let gain = loss(excess, rungs[i][s] + 1) - loss(excess, rungs[i][s]);
                let mut next = rungs.clone();
                next[i][s] += 1;
                let after = estimate_kv_bytes_at_once(config, &policy_of(&next)?, ctx, 0)?;
                let saved = bytes.saturating_sub(after);
                let key = match saved {
                    0 => (true, gain),
                    saved => (false, gain / saved as f64),
                };
                let better = |(b, r): (bool, f64)| (key.0, key.1) < (b, r);
                if best.is_none_or(|(k, ..)| better(k)) {
                    best = Some((key, i, s, after));
                }
            }
        }
        let Some((_, i, s, after)) = best else {
            return Err(EngineError::invalid(format!(
                "no cache of TurboQuant widths fits {}: 2 bits on every side holds {} at {ctx} tokens",
                match budget {
                    FitBudget::Bits(b) => format!("{b} bits per coordinate"),
                    FitBudget::Bytes(b) => format!("{b} bytes"),
                },
                match budget {
                    FitBudget::Bits(_) => format!("{:.2} bits per coordinate", bits_of(bytes)),
                    FitBudget::Bytes(_) => format!("{bytes} bytes"),
                }
            )));
        };
        rungs[i][s] += 1;
        bytes = after;
    }
    let policy = policy_of(&rungs)?;
    let predicted_kld = sensitivity
        .layers
        .iter()
        .zip(&rungs)
        .map(|(l, r)| {
            loss(Sensitivity::excess(l.keys_kld), r[0])
                + loss(Sensitivity::excess(l.values_kld), r[1])
        })
        .sum::<f64>();
    let spec = crate::kv::spec::layers::policy_spec(&policy)
        .ok_or_else(|| EngineError::invalid("the fitted policy has no SPEC"))?;
    Ok(Fitted {
        spec,
        bits_per_coordinate: bits_of(bytes),
        bytes,
        predicted_kld,
        widths: sensitivity
            .layers
            .iter()
            .zip(&rungs)
            .map(|(l, r)| {
                let w = |rung: usize| LADDER[rung].map(Bits::value);
                (l.layer, w(r[0]), w(r[1]))
            })
            .collect(),
        policy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gguf/tiny_gemma3.f32.gguf");
        crate::models::common::Model::load(&path, &crate::LoadOptions::default())
            .expect("tiny model")
            .config()
            .clone()
    }

    /// Sensitivities rising with the layer index, values half the keys'.
    fn rising(config: &ModelConfig) -> Sensitivity {
        Sensitivity {
            layers: config
                .cache_owning_layers()
                .map(|l| LayerSensitivity {
                    layer: l.index,
                    kind: l.kind,
                    keys_kld: 0.003 + 0.01 * (l.index + 1) as f64,
                    values_kld: 0.003 + 0.005 * (l.index + 1) as f64,
                })
                .collect(),
        }
    }

    /// Bits per coordinate of 2 bits on every side, as [`allocate`] builds it.
    fn smallest_bits(config: &ModelConfig, s: &Sensitivity) -> Result<f64> {
        let mut p = PrecisionPolicy::default();
        for l in &s.layers {
            p.overrides
                .insert(l.layer, precision(Some(Bits::B2), Some(Bits::B2), 0)?);
        }
        let bytes = |p: &PrecisionPolicy| estimate_kv_bytes_at_once(config, p, 300, 0);
        let f32_bytes = bytes(&PrecisionPolicy::uniform(KvPrecision::F32))?;
        Ok(32.0 * bytes(&p)? as f64 / f32_bytes as f64)
    }

    #[test]
    fn a_fit_stays_within_its_budget_and_spends_bits_where_the_loss_is() -> Result<()> {
        let config = tiny();
        let s = rising(&config);
        // These heads of 16 carry a norm and offsets that a head of 256 spreads thinner:
        // budgets from f16's 16 bits down to what 2 bits on every side holds.
        let least = smallest_bits(&config, &s)?;
        let mut last = 0.0;
        for bits in [16.0, 12.0, 8.0, least + 2.0, least + 0.5, least] {
            let f = allocate(&config, &s, FitBudget::Bits(bits), 300, 0)?;
            assert!(f.bits_per_coordinate <= bits + 1e-9, "{bits}: {f:?}");
            // Fewer bits, more predicted loss.
            assert!(
                f.predicted_kld >= last,
                "{bits}: {} < {last}",
                f.predicted_kld
            );
            last = f.predicted_kld;
            // The SPEC is the policy, printed and parsed back.
            assert_eq!(crate::kv::parse_policy(&f.spec)?, f.policy, "{}", f.spec);
            // The byte formula of that policy is what the fit counted.
            assert_eq!(
                estimate_kv_bytes_at_once(&config, &f.policy, 300, 0)?,
                f.bytes
            );
            // Among layers of a kind (whose bits cost the same bytes), a more sensitive
            // layer's keys keep at least a less sensitive one's bits.
            let bits_of = |w: Option<f64>| w.unwrap_or(16.0);
            for kind in [AttentionKind::Sliding, AttentionKind::Full] {
                let keys: Vec<f64> = s
                    .layers
                    .iter()
                    .zip(&f.widths)
                    .filter(|(l, _)| l.kind == kind)
                    .map(|(_, w)| bits_of(w.1))
                    .collect();
                assert!(
                    keys.windows(2).all(|w| w[1] >= w[0]),
                    "{bits}: {:?}",
                    f.widths
                );
            }
        }
        // By bytes: the same rule.
        let f32_bytes = estimate_kv_bytes_at_once(
            &config,
            &PrecisionPolicy::uniform(KvPrecision::F32),
            300,
            0,
        )?;
        let f = allocate(&config, &s, FitBudget::Bytes(f32_bytes / 4), 300, 0)?;
        assert!(f.bytes <= f32_bytes / 4 && f.bits_per_coordinate <= 8.0);
        // Below 2 bits everywhere: refused, saying what the smallest cache holds.
        let e = allocate(&config, &s, FitBudget::Bits(least - 0.01), 300, 0).unwrap_err();
        assert!(e.to_string().contains("2 bits on every side"), "{e}");
        assert!(allocate(&config, &s, FitBudget::Bits(4.0), 0, 0).is_err());
        Ok(())
    }

    #[test]
    fn a_fit_is_deterministic_and_follows_its_seed() -> Result<()> {
        let config = tiny();
        let s = rising(&config);
        let bits = smallest_bits(&config, &s)? + 1.0;
        let a = allocate(&config, &s, FitBudget::Bits(bits), 300, 0)?;
        let b = allocate(&config, &s, FitBudget::Bits(bits), 300, 0)?;
        assert_eq!(a, b);
        let seeded = allocate(&config, &s, FitBudget::Bits(bits), 300, 7)?;
        assert!(seeded.spec.contains("seed=7"), "{}", seeded.spec);
        assert_eq!(seeded.widths, a.widths);
        Ok(())
    }

    #[test]
    fn probes_cover_each_side_of_each_layer_once_and_read_back() -> Result<()> {
        let config = tiny();
        let p = probes(&config, 0)?;
        let owners = config.cache_owning_layers().count();
        assert_eq!(p.len(), 2 * owners);
        // Each probe codes one side of one layer; the rest is f16.
        for probe in &p {
            let (layer, side) = probe.target;
            assert_eq!(probe.policy.overrides.len(), 1);
            let KvPrecision::Split(lp) = probe.policy.overrides[&layer] else {
                panic!("{} is dense", probe.label);
            };
            let (coded, dense) = match side {
                KvSide::Keys => (lp.key, lp.value),
                KvSide::Values => (lp.value, lp.key),
            };
            assert_eq!(coded.spec().map(|s| s.bits), Some(PROBE_BITS));
            assert!(dense.is_dense() && lp.sink);
        }
        let klds: Vec<f64> = (0..p.len()).map(|i| i as f64).collect();
        let s = Sensitivity::from_probes(&config, &p, &klds)?;
        assert_eq!(s.layers[0].keys_kld, 0.0);
        assert_eq!(s.layers[0].values_kld, 1.0);
        assert!(Sensitivity::from_probes(&config, &p[1..], &klds[1..]).is_err());
        Ok(())
    }
}
