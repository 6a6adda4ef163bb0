//! Cache SPEC strings: a short, validated, round-tripping text form of a whole-model cache
//! policy (`f16`, `tq4`, `k4v3@all+nc`, …) and the per-layer TurboQuant precision it yields.
//!
//! # Grammar
//!
//! ```text
//! SPEC    := DENSE | TQ
//! DENSE   := ( "f16" | "bf16" | "f32" ) [ "@" SCOPE ] every layer dense in that dtype, or
//!                                                     only the scoped ones (f16 elsewhere;
//!                                                     a dense scope defaults to "all")
//! TQ      := BASE ( "+" OPTION | "@" SCOPE )*
//! BASE    := "tq" BITS                                keys and values at BITS
//!          | "k" SIDE "v" SIDE                        keys and values apart
//!          | TYPE                                     llama.cpp's type on both sides
//!          | PSIDE "/" PSIDE                          keys/values, as -ctk/-ctv: any two
//!                                                     formats of the registry (`kv::format`)
//!                                                     but one dense dtype twice (that is DENSE)
//! SIDE    := BITS | "f16"                             f16: that side stays dense f16
//! PSIDE   := TYPE | "tq" BITS | "f16" | "bf16" | "f32"
//! TYPE    := "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "iq4_nl"   ggml's blocks
//! BITS    := "1" | "2" | "2.5" | "3" | "3.5" | "4" | "4.5" | "5" | "5.5" | "6" | "7" | "8"
//! SCOPE   := "full" | "sliding" | "all"              which layers are quantized; the
//!                                                     default is "all" when a side is a
//!                                                     TYPE (as llama.cpp) or neither is
//!                                                     "tq", else "full"
//! OPTION  := "mse" (default) | "prod"                 TurboQuant variant
//!          | "nc"                                     norm correction (mse only)
//!          | "ub" | "plain"                            norm scale of both sides (below)
//!          | "nocenter"                               no per-head offset (see below)
//!          | "qw"                                     keys weighted by query energy (below)
//!          | "hadamard" (default) | "haar"            rotation
//!          | "seed=" N  | "s" N                       rotation seed (u64, default 0)
//!          | "norot"                                  TYPE sides stored unrotated
//!          | "sink"                                   TYPE and tq sides keep their first
//!                                                     token as f16
//! ```
//!
//! What each option does, and the measurements behind it (centering, `+qw`, `+sink`, the
//! norm scale, calibration, llama.cpp's rotation), are in docs/cache-options.md.
//!
//! Case and surrounding blanks are ignored; options and the scope may come in any order, each
//! at most once. Layers outside the scope stay dense f16. Layers that share another layer's
//! KV (Gemma 4 KV-sharing consumers) own no storage and simply read their producer's cache,
//! whatever its precision. The canonical form printed by `Display` is
//! `BASE[+prod][+nc][+haar][+seed=N][@sliding|@all]`, with `tqB` when both sides are equal;
//! parsing it gives the same value back.
//!
//! Examples: `tq4` (4-bit K and V on full-attention layers), `tq3.5@all`, `k4v3`,
//! `k3.5v2.5@all`, `k4vf16`, `tq4+prod`, `tq3+nc`, `tq3+haar+seed=7`.

pub(crate) mod layers;
pub mod presets;

pub use layers::parse_policy;

use std::fmt;
use std::str::FromStr;

use kvlab_turboquant::ggml::BlockType;
use kvlab_turboquant::{Bits, RotationKind, Spec, Variant};
use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::format::{DenseType, KvPrecision, LayerPrecision, SideSpec};
use super::PrecisionPolicy;
use crate::error::{EngineError, Result};

/// A side's token in the `key/value` SPEC form (`f16`, `tq3.5`, `q8_0`).
fn side_token(side: &SideSpec) -> String {
    match side {
        SideSpec::Dense(d) => d.name().to_string(),
        SideSpec::Codes(c) => format!("tq{}", bits_str(c.bits)),
        SideSpec::Blocks(b) => b.name().to_string(),
    }
}

impl LayerPrecision {
    /// Whether the SPEC takes the `key/value` form (llama.cpp's types, or a dense side other
    /// than f16) rather than TurboQuant's `kXvY`.
    fn pair_form(&self) -> bool {
        self.has_block()
            || [self.key, self.value]
                .iter()
                .any(|s| matches!(s, SideSpec::Dense(DenseType::Bf16 | DenseType::F32)))
    }

    /// The layers a SPEC of this precision covers when it names no scope: every layer for
    /// llama.cpp's types (what `-ctk`/`-ctv` do) and for two dense formats, the
    /// full-attention ones for TurboQuant.
    pub fn default_scope(&self) -> LayerScope {
        if self.has_block() || !self.has_codes() {
            LayerScope::All
        } else {
            LayerScope::Full
        }
    }
}

impl fmt::Display for LayerPrecision {
    /// The SPEC form without a scope (`tq4`, `k4vf16+nc`, `q8_0/q4_0+norot`, `f32/tq3`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pair_form() {
            let (k, v) = (side_token(&self.key), side_token(&self.value));
            if k == v {
                f.write_str(&k)?;
            } else {
                write!(f, "{k}/{v}")?;
            }
        } else {
            let side = |s: &SideSpec| match s {
                SideSpec::Codes(c) => bits_str(c.bits).to_string(),
                _ => "f16".to_string(),
            };
            let same_bits = match (self.key.spec(), self.value.spec()) {
                (Some(k), Some(v)) => k.bits == v.bits,
                _ => false,
            };
            if same_bits {
                write!(f, "tq{}", side(&self.key))?;
            } else {
                write!(f, "k{}v{}", side(&self.key), side(&self.value))?;
            }
        }
        // Options are shared by both sides; print those of the first TurboQuant one.
        if let Some(s) = self.key.spec().or(self.value.spec()) {
            write_options(f, s)?;
            f.write_str(scale_option(&self.key, &self.value))?;
            if !self.center {
                f.write_str("+nocenter")?;
            }
        }
        if self.weigh_keys {
            f.write_str("+qw")?;
        }
        if self.has_block() && !self.rotate {
            f.write_str("+norot")?;
        }
        if self.sink {
            f.write_str("+sink")?;
        }
        Ok(())
    }
}

/// Which cache-owning layers a TurboQuant SPEC quantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum LayerScope {
    /// Full-attention layers only (where long contexts put nearly all KV bytes).
    #[default]
    Full,
    /// Sliding-window layers only.
    Sliding,
    /// Every cache-owning layer.
    All,
}

impl LayerScope {
    fn name(self) -> &'static str {
        match self {
            LayerScope::Full => "full",
            LayerScope::Sliding => "sliding",
            LayerScope::All => "all",
        }
    }
}

/// A whole-model cache policy in SPEC-string form (see the module doc for the grammar).
/// Serializes as its canonical string; deserializing validates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CacheSpec {
    /// Every layer dense in this precision (`f16`, `bf16`, `f32`).
    Dense(KvPrecision),
    /// One dense precision on the layers of `scope` only, f16 elsewhere (`f32@full`).
    DenseScoped {
        /// The precision of the scoped layers.
        precision: KvPrecision,
        /// Which layers get it (never `All`: that is [`CacheSpec::Dense`]).
        scope: LayerScope,
    },
    /// Keys and values each in their own format (TurboQuant, llama.cpp's blocks or dense) on the
    /// layers of `scope`, dense f16 elsewhere.
    Split {
        /// Key and value formats.
        precision: LayerPrecision,
        /// Which layers are quantized.
        scope: LayerScope,
    },
}

impl CacheSpec {
    /// Parses and validates a SPEC string.
    pub fn parse(s: &str) -> Result<Self> {
        parse_spec(s)
    }

    /// The per-layer precision policy this SPEC stands for.
    pub fn to_policy(self) -> PrecisionPolicy {
        match self {
            CacheSpec::Dense(p) => PrecisionPolicy::uniform(p),
            CacheSpec::DenseScoped { precision, scope } => scoped(precision, scope),
            CacheSpec::Split { precision, scope } => scoped(KvPrecision::Split(precision), scope),
        }
    }

    /// One dense precision on the layers of `scope`, f16 elsewhere, in canonical form (f16
    /// anywhere is f16 everywhere).
    pub fn dense(precision: KvPrecision, scope: LayerScope) -> Self {
        if scope == LayerScope::All || precision == KvPrecision::F16 {
            CacheSpec::Dense(precision)
        } else {
            CacheSpec::DenseScoped { precision, scope }
        }
    }

    /// True for TurboQuant SPECs.
    pub fn is_turboquant(&self) -> bool {
        matches!(self, CacheSpec::Split { .. })
    }
}

/// `p` on the layers of `scope`, f16 on the others.
fn scoped(p: KvPrecision, scope: LayerScope) -> PrecisionPolicy {
    let (sliding, full) = match scope {
        LayerScope::Full => (KvPrecision::F16, p),
        LayerScope::Sliding => (p, KvPrecision::F16),
        LayerScope::All => (p, p),
    };
    PrecisionPolicy {
        sliding,
        full,
        overrides: Default::default(),
    }
}

impl From<CacheSpec> for PrecisionPolicy {
    fn from(s: CacheSpec) -> Self {
        s.to_policy()
    }
}

impl From<&CacheSpec> for PrecisionPolicy {
    fn from(s: &CacheSpec) -> Self {
        s.to_policy()
    }
}

impl fmt::Display for CacheSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheSpec::Dense(p) => write!(f, "{p}"),
            CacheSpec::DenseScoped { precision, scope } => {
                write!(f, "{precision}@{}", scope.name())
            }
            CacheSpec::Split { precision, scope } => {
                write!(f, "{precision}")?;
                if *scope != precision.default_scope() {
                    write!(f, "@{}", scope.name())?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for CacheSpec {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        parse_spec(s)
    }
}

impl TryFrom<String> for CacheSpec {
    type Error = EngineError;
    fn try_from(s: String) -> Result<Self> {
        parse_spec(&s)
    }
}

impl From<CacheSpec> for String {
    fn from(s: CacheSpec) -> String {
        s.to_string()
    }
}

fn bits_str(b: Bits) -> &'static str {
    match b {
        Bits::B1 => "1",
        Bits::B2 => "2",
        Bits::B2_5 => "2.5",
        Bits::B3 => "3",
        Bits::B3_5 => "3.5",
        Bits::B4 => "4",
        Bits::B4_5 => "4.5",
        Bits::B5 => "5",
        Bits::B5_5 => "5.5",
        Bits::B6 => "6",
        Bits::B7 => "7",
        Bits::B8 => "8",
    }
}

fn write_options(f: &mut fmt::Formatter<'_>, s: &Spec) -> fmt::Result {
    if s.variant == Variant::Prod {
        f.write_str("+prod")?;
    }
    if s.norm_correction {
        f.write_str("+nc")?;
    }

    if s.rotation == RotationKind::Haar {
        f.write_str("+haar")?;
    }
    if s.seed != 0 {
        write!(f, "+seed={}", s.seed)?;
    }
    Ok(())
}

/// The norm-scale option that parses back to these sides ("" for the default).
fn scale_option(key: &SideSpec, value: &SideSpec) -> &'static str {
    let (k, v) = (key.spec(), value.spec());
    if k.or(v).is_some_and(|s| s.norm_correction) {
        return ""; // `+nc`, printed with the shared options.
    }
    let ub = |s: Option<&Spec>| s.is_some_and(|s| s.unbiased);
    let default_key = k.is_some_and(|s| s.variant == Variant::Mse);
    if ub(k) == default_key && !ub(v) {
        ""
    } else if ub(k) == k.is_some() && ub(v) == v.is_some() && ub(v) {
        "+ub"
    } else {
        "+plain"
    }
}

fn bad(spec: &str, why: impl fmt::Display) -> EngineError {
    EngineError::invalid(format!(
        "invalid cache spec `{spec}`: {why} (expected e.g. f16, tq4, tq3.5@all, k4v3, q8_0, q8_0/q4_0, f16/tq3)"
    ))
}

/// A side before options are known: `None` = dense f16.
fn parse_side(spec: &str, s: &str) -> Result<Option<Bits>> {
    if s == "f16" {
        return Ok(None);
    }
    // Only plain decimal numbers: `Bits::from_str` would also take " 4" or "4.0e0".
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(bad(spec, format!("`{s}` is not a bit width or f16")));
    }
    s.parse::<Bits>().map(Some).map_err(|_| {
        bad(
            spec,
            format!("unsupported bit width `{s}` (1, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 7, 8)"),
        )
    })
}

/// The longest SPEC read (one with every option, `tq3.5@sliding+haar+nc+s4294967295`, is 34
/// bytes): a longer string is refused before it is parsed, and its error echoes only
/// its start.
pub const MAX_SPEC_BYTES: usize = 64;

fn parse_spec(input: &str) -> Result<CacheSpec> {
    if input.len() > MAX_SPEC_BYTES {
        let head: String = input.chars().take(16).collect();
        return Err(EngineError::invalid(format!(
            "invalid cache spec `{head}…`: {} bytes, at most {MAX_SPEC_BYTES} (expected e.g. f16, tq4, tq3.5@all)",
            input.len()
        )));
    }
    let text = input.trim().to_ascii_lowercase();
    let spec = text.as_str();
    if spec.is_empty() {
        return Err(bad(input, "empty"));
    }
    // Split into the base and its `+option` / `@scope` suffixes, keeping each marker.
    let cut = spec.find(['+', '@']).unwrap_or(spec.len());
    let (base, mut rest) = spec.split_at(cut);
    let mut suffixes: Vec<(char, &str)> = Vec::new();
    while let Some(marker) = rest.chars().next() {
        let body = &rest[1..];
        let end = body.find(['+', '@']).unwrap_or(body.len());
        suffixes.push((marker, &body[..end]));
        rest = &body[end..];
    }

    let dense = match base {
        "f16" => Some(KvPrecision::F16),
        "bf16" => Some(KvPrecision::BF16),
        "f32" => Some(KvPrecision::F32),
        _ => None,
    };
    if let Some(p) = dense {
        let scope = match suffixes.as_slice() {
            [] => LayerScope::All,
            [('@', "full")] => LayerScope::Full,
            [('@', "sliding")] => LayerScope::Sliding,
            [('@', "all")] => LayerScope::All,
            _ => {
                return Err(bad(
                    input,
                    "a dense spec takes no options and at most one layer scope",
                ))
            }
        };
        return Ok(CacheSpec::dense(p, scope));
    }

    let (key, value) = if let Some((k, v)) = base.split_once('/') {
        (parse_pair_side(input, k)?, parse_pair_side(input, v)?)
    } else if let Some(t) = BlockType::from_name(base) {
        (SideTok::Block(t), SideTok::Block(t))
    } else if let Some(b) = base.strip_prefix("tq") {
        match parse_side(input, b)? {
            Some(bits) => (SideTok::Bits(bits), SideTok::Bits(bits)),
            None => return Err(bad(input, "use `f16` for a dense cache")),
        }
    } else if let Some(kv) = base.strip_prefix('k') {
        let Some((k, v)) = kv.split_once('v') else {
            return Err(bad(input, "`k…` must be followed by `v…`"));
        };
        let tok = |b: Option<Bits>| b.map_or(SideTok::Dense(SideSpec::F16), SideTok::Bits);
        (tok(parse_side(input, k)?), tok(parse_side(input, v)?))
    } else {
        return Err(bad(input, format!("unknown format `{base}`")));
    };
    if let (SideTok::Dense(k), SideTok::Dense(v)) = (key, value) {
        if k == v {
            return Err(bad(
                input,
                format!("keys and values are both {0}; use `{0}`", side_token(&k)),
            ));
        }
    }
    let has_tq = matches!(key, SideTok::Bits(_)) || matches!(value, SideTok::Bits(_));
    let has_block = matches!(key, SideTok::Block(_)) || matches!(value, SideTok::Block(_));

    let mut scope: Option<LayerScope> = None;
    let mut variant: Option<Variant> = None;
    let mut rotation: Option<RotationKind> = None;
    let mut nc = false;
    let mut scale: Option<&str> = None;
    let mut center = true;
    let mut weigh_keys = false;
    let mut seed: Option<u64> = None;
    let mut rotate = true;
    let mut sink = false;
    for (marker, body) in suffixes {
        let dup = || {
            bad(
                input,
                format!("`{marker}{body}` conflicts with an earlier option"),
            )
        };
        if marker == '@' {
            let s = match body {
                "full" => LayerScope::Full,
                "sliding" => LayerScope::Sliding,
                "all" => LayerScope::All,
                _ => return Err(bad(input, format!("unknown layer scope `@{body}`"))),
            };
            if scope.replace(s).is_some() {
                return Err(dup());
            }
            continue;
        }
        if body == "norot" {
            if !has_block {
                return Err(bad(
                    input,
                    "`+norot` turns off the rotation of llama.cpp's types; this cache has none",
                ));
            }
            if !rotate {
                return Err(dup());
            }
            rotate = false;
            continue;
        }
        if body == "sink" {
            if sink {
                return Err(dup());
            }
            sink = true;
            continue;
        }
        if !has_tq {
            return Err(bad(
                input,
                format!("`+{body}` is a TurboQuant option; this cache has no TurboQuant side"),
            ));
        }
        match body {
            "mse" | "prod" => {
                let v = if body == "prod" {
                    Variant::Prod
                } else {
                    Variant::Mse
                };
                if variant.replace(v).is_some() {
                    return Err(dup());
                }
            }
            "hadamard" | "haar" => {
                let r = if body == "haar" {
                    RotationKind::Haar
                } else {
                    RotationKind::Hadamard
                };
                if rotation.replace(r).is_some() {
                    return Err(dup());
                }
            }
            "nc" | "ub" | "plain" => {
                if scale.replace(body).is_some() {
                    return Err(dup());
                }
                nc = body == "nc";
            }
            "nocenter" => {
                if !center {
                    return Err(dup());
                }
                center = false;
            }
            "qw" => {
                if weigh_keys {
                    return Err(dup());
                }
                if !matches!(key, SideTok::Bits(_)) {
                    return Err(bad(
                        input,
                        "`+qw` weighs TurboQuant keys; these keys are not",
                    ));
                }
                weigh_keys = true;
            }
            _ => {
                let num = body
                    .strip_prefix("seed=")
                    .or_else(|| body.strip_prefix('s'))
                    .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
                let Some(n) = num else {
                    return Err(bad(input, format!("unknown option `+{body}`")));
                };
                let n: u64 = n
                    .parse()
                    .map_err(|_| bad(input, format!("seed `{n}` does not fit in u64")))?;
                if seed.replace(n).is_some() {
                    return Err(dup());
                }
            }
        }
    }

    let make = |side: SideTok, is_key: bool| -> Result<SideSpec> {
        let bits = match side {
            SideTok::Dense(d) => return Ok(d),
            SideTok::Block(t) => return Ok(SideSpec::Blocks(t)),
            SideTok::Bits(bits) => bits,
        };
        let s = Spec {
            bits,
            variant: variant.unwrap_or_default(),
            rotation: rotation.unwrap_or_default(),
            norm_correction: nc,
            unbiased: match scale {
                Some("ub") => true,
                None => is_key && variant.unwrap_or_default() == Variant::Mse,
                _ => false,
            },
            seed: seed.unwrap_or(0),
        };
        s.validate().map_err(|e| bad(input, e))?;
        Ok(SideSpec::Codes(s))
    };
    let precision = LayerPrecision {
        key: make(key, true)?,
        value: make(value, false)?,
        center,
        weigh_keys,
        rotate,
        sink,
    };
    if let Some(why) = precision.refusal() {
        return Err(bad(input, why));
    }
    Ok(CacheSpec::Split {
        scope: scope.unwrap_or(precision.default_scope()),
        precision,
    })
}

/// One side of a SPEC before its options are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SideTok {
    /// A dense side (`SideSpec::F16`, `Bf16` or `F32`).
    Dense(SideSpec),
    Bits(Bits),
    Block(BlockType),
}

/// A side of the `key/value` form, as the registry names it: `f32`, `f16`, `bf16`, `tq`
/// BITS or one of llama.cpp's type names.
fn parse_pair_side(spec: &str, s: &str) -> Result<SideTok> {
    use super::format::SideFormat;
    let Some(format) = SideFormat::from_token(s) else {
        return Err(bad(
            spec,
            format!(
                "`{s}` is not a side format (f32, f16, bf16, tq BITS, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)"
            ),
        ));
    };
    Ok(match format.side(true) {
        SideSpec::Codes(c) => SideTok::Bits(c.bits),
        SideSpec::Blocks(t) => SideTok::Block(t),
        dense => SideTok::Dense(dense),
    })
}

#[cfg(test)]
mod tests;
