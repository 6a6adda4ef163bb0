//! Per-layer cache SPECs: a whole-model SPEC, then layers that take their own format.
//!
//! ```text
//! POLICY := SPEC ( "," LAYERS "=" LSPEC )*   every layer as SPEC says, but the listed ones
//! LAYERS := N | N "-" N                      layer indexes, inclusive (below MAX_LAYER)
//! LSPEC  := SPEC with no "@" scope            that layer's keys and values (`f32`, `q8_0`,
//!                                            `k4v3+qw`, `q4_0/tq3+sink`)
//! ```
//!
//! Later parts override earlier ones (`tq3@all,0-5=q8_0,2=f16`). The canonical form lists the
//! overridden layers in order, runs of one format as one range: `k4v3+qw@all,0-1=q8_0,17=f16`.
//! A policy whose base no SPEC can express keeps its descriptive form and does not parse.
//! Layers past a model's last, and layers that share another's KV, are never asked for.

use std::collections::BTreeMap;

use super::CacheSpec;
use crate::error::{EngineError, Result};
use crate::kv::{KvPrecision, PrecisionPolicy};

/// Layer indexes a per-layer SPEC may name: more than any Gemma has, few enough that a
/// hostile range allocates nothing to speak of.
pub const MAX_LAYER: usize = 1024;

/// Bytes a per-layer SPEC may take (each part is also a SPEC, held to its own bound).
pub const MAX_POLICY_BYTES: usize = 1024;

fn bad(input: &str, why: impl std::fmt::Display) -> EngineError {
    let head: String = input.chars().take(48).collect();
    EngineError::invalid(format!(
        "invalid per-layer cache spec `{head}`: {why} (expected e.g. tq3@all,0-1=q8_0,17=f16)"
    ))
}

/// Parses a SPEC with or without per-layer parts into the policy it stands for.
pub fn parse_policy(input: &str) -> Result<PrecisionPolicy> {
    if input.len() > MAX_POLICY_BYTES {
        return Err(bad(
            input,
            format!("{} bytes, at most {MAX_POLICY_BYTES}", input.len()),
        ));
    }
    let mut parts = input.split(',');
    let base = parts.next().unwrap_or_default();
    let mut policy = CacheSpec::parse(base)?.to_policy();
    for part in parts {
        let (layers, format) = part
            .split_once('=')
            .ok_or_else(|| bad(input, format!("`{}` is not LAYERS=FORMAT", part.trim())))?;
        let (first, last) = layer_range(layers).map_err(|why| bad(input, why))?;
        let precision = layer_precision(format).map_err(|why| bad(input, why))?;
        for layer in first..=last {
            policy.overrides.insert(layer, precision);
        }
    }
    Ok(policy)
}

/// `N` or `N-M` (inclusive, N ≤ M < [`MAX_LAYER`]).
fn layer_range(text: &str) -> std::result::Result<(usize, usize), String> {
    let text = text.trim();
    let index = |s: &str| -> std::result::Result<usize, String> {
        let n: usize = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a layer index"))?;
        if n >= MAX_LAYER {
            return Err(format!("layer {n} is past {}", MAX_LAYER - 1));
        }
        Ok(n)
    };
    let (first, last) = match text.split_once('-') {
        Some((a, b)) => (index(a)?, index(b)?),
        None => (index(text)?, index(text)?),
    };
    if first > last {
        return Err(format!("`{text}` runs backwards"));
    }
    Ok((first, last))
}

/// One layer's format: a SPEC without a scope.
fn layer_precision(text: &str) -> std::result::Result<KvPrecision, String> {
    if text.contains('@') {
        return Err(format!(
            "`{}`: a layer's format takes no @scope",
            text.trim()
        ));
    }
    match CacheSpec::parse(text).map_err(|e| e.to_string())? {
        CacheSpec::Dense(p) => Ok(p),
        CacheSpec::Split { precision, .. } => Ok(KvPrecision::Split(precision)),
        CacheSpec::DenseScoped { .. } => Err(format!("`{}` is scoped", text.trim())),
    }
}

/// The canonical per-layer SPEC of `policy`, when its base has a SPEC: the base, then each
/// run of consecutive layers of one format as `,A-B=FORMAT` (`,A=FORMAT` for one layer).
pub(crate) fn policy_spec(policy: &PrecisionPolicy) -> Option<String> {
    let base = PrecisionPolicy {
        overrides: BTreeMap::new(),
        ..policy.clone()
    }
    .to_spec()?;
    let mut out = base.to_string();
    let mut runs: Vec<(usize, usize, KvPrecision)> = Vec::new();
    for (&layer, &p) in &policy.overrides {
        match runs.last_mut() {
            Some((_, last, q)) if *last + 1 == layer && *q == p => *last = layer,
            _ => runs.push((layer, layer, p)),
        }
    }
    for (first, last, p) in runs {
        if first == last {
            out.push_str(&format!(",{first}={p}"));
        } else {
            out.push_str(&format!(",{first}-{last}={p}"));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::CacheSelection;

    fn full(spec: &str) -> KvPrecision {
        CacheSpec::parse(spec).expect("spec").to_policy().full
    }

    #[test]
    fn per_layer_specs_parse_print_and_round_trip() {
        // (as written, canonical)
        let cases = [
            ("tq3+qw@all,0-1=q8_0,17=f16", "tq3+qw@all,0-1=q8_0,17=f16"),
            ("TQ3@ALL, 0 = Q8_0 ,1=q8_0", "tq3@all,0-1=q8_0"),
            ("f16,2-4=k4v3+qw,3=f32", "f16,2=k4v3+qw,3=f32,4=k4v3+qw"),
            (
                "q4_0+sink,0-2=q8_0/q4_0+sink",
                "q4_0+sink,0-2=q8_0/q4_0+sink",
            ),
            ("k4v3,5=bf16,6=bf16,8=bf16", "k4v3,5-6=bf16,8=bf16"),
            ("tq4,0-1023=f32", "tq4,0-1023=f32"),
        ];
        for (written, canonical) in cases {
            let policy = parse_policy(written).expect(written);
            assert_eq!(policy.spec_string(), canonical, "{written}");
            assert_eq!(
                parse_policy(canonical).expect(canonical),
                policy,
                "{canonical}"
            );
            // And through the front ends' door.
            let selected = CacheSelection::Spec(written.into())
                .policy()
                .expect("selection");
            assert_eq!(selected, policy);
        }
        let p = parse_policy("tq3+qw@all,0-1=q8_0,17=f16").expect("policy");
        assert_eq!(p.overrides.len(), 3);
        assert_eq!(p.overrides[&0], full("q8_0"));
        assert_eq!(p.overrides[&1], full("q8_0"));
        assert_eq!(p.overrides[&17], KvPrecision::F16);
        assert_eq!(p.full, full("tq3+qw@all"));
        assert_eq!(p.sliding, full("tq3+qw@all"));
        // A SPEC with no layer parts is the SPEC's policy, printed as before.
        assert_eq!(
            parse_policy("tq3.5@all").expect("plain").spec_string(),
            "tq3.5@all"
        );
    }

    #[test]
    fn malformed_per_layer_specs_are_refused_with_the_reason() {
        for (spec, why) in [
            ("tq3,0-1", "is not LAYERS=FORMAT"),
            ("tq3,5-2=q8_0", "runs backwards"),
            ("tq3,x=q8_0", "not a layer index"),
            ("tq3,-1=q8_0", "not a layer index"),
            ("tq3,1024=q8_0", "past 1023"),
            ("tq3,0-18446744073709551615=q8_0", "past 1023"),
            ("tq3,0-99999999999999999999999=q8_0", "not a layer index"),
            ("tq3,0=tq4@all", "no @scope"),
            ("tq3,0=tq9", "invalid cache spec"),
            ("tq3,0=", "invalid cache spec"),
            ("tq3,", "is not LAYERS=FORMAT"),
            (",0=q8_0", "invalid cache spec"),
        ] {
            let err = parse_policy(spec).expect_err(spec).to_string();
            assert!(err.contains(why), "{spec}: {err}");
        }
        let long = format!("tq3{}", ",0=q8_0".repeat(200));
        let err = parse_policy(&long).expect_err("too long").to_string();
        assert!(err.contains("at most 1024"), "{err}");
    }
}
