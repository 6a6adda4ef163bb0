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
//!          | "sink"                                   TYPE sides keep their first token
//! ```
//!
//! llama.cpp's types (`TYPE`) are stored as ggml stores them, block for block
//! ([`kvlab_turboquant::ggml`]), and rotated as upstream does since April 2026 (PR #21038):
//! when the head size is a multiple of 64, keys (and the queries scored against them) by the
//! normalized Hadamard matrix of the largest power of two dividing it, values by 64-wide
//! blocks, the attention output rotated back. `+norot` is `LLAMA_ATTN_ROT_DISABLE=1`. The
//! options other than `norot`, `sink` and `qw` tune TurboQuant sides and need one.
//!
//! Sink (`+sink`, ours, not llama.cpp's): each TYPE side also keeps the first token it holds
//! (`<bos>`, which Gemma's heads park their attention on) as an f16 row, `head_dim` × 2
//! bytes per head, and attention reads that row instead of its blocks. Every window and
//! conversation shares that token, so its 4-bit rounding is one draw that every later
//! token pays: on Gemma 3 270M and Alice, q4_0's mean KLD 0.129 → 0.099 with it, and
//! which 4-bit value format beside q4_0 keys costs most stops depending on that draw
//! (README, "Where they differ").
//!
//! Norm scale (mse only): by default keys store the unbiased scale (`Spec::unbiased`: a
//! query aligned with a key sees all of it, where the plain norm shrinks every score by
//! 1 − D_mse and flattens the softmax) and values the plain norm (their error averages out
//! in the weighted sum, and the plain norm has the lower MSE). On Gemma 3 270M, 512 tokens
//! of Alice, all layers: tq4 KLD 0.085 → 0.079, tq2.5 1.07 → 0.76, tq3 unchanged; values
//! alone at 3 bits are slightly worse unbiased (0.044 → 0.046). `ub` makes both sides
//! unbiased, `plain` neither (the paper), `nc` norm-corrects both.
//!
//! Calibration: a layer that centers or weighs (below) holds its first tokens as f16 rows
//! until it has seen the model's `kv::calibration_rows` (512 on every Gemma), then measures
//! each head's offset and weights on all of them and codes them; a conversation opened with
//! a short message so loses what a long first prefill loses, not 2–3.4× as much.
//!
//! Centering (the default): each kv head of a TurboQuant layer stores its vectors relative
//! to an offset, the mean of the tokens it calibrates on. Gemma's keys carry 30–77% of
//! their energy in a mean shared by all tokens; the codec's error scales with the coded
//! vector's norm, so coding `k − μ` instead of `k` cuts the key error 1.4–4×. It costs
//! `head_dim` f32 per head and side, and nothing at attention time: a key offset shifts
//! every score of a query by the same `q·μ`, which the softmax ignores, and a value offset
//! comes back whole because the attention weights sum to one. `nocenter` gives the paper's
//! algorithm as published.
//!
//! Query-weighted keys (`+qw`): the codec's error is isotropic in the rotated domain, so a
//! key's score error q·e grows with ‖q‖ whatever direction q takes, while Gemma's queries
//! put most of their energy on a few channels, and not on the channels where keys vary
//! most. Each kv head of a `+qw` layer codes w ⊙ (k − μ) instead of k − μ, with
//! w_j = (E q_j² / Var k_j)^¼ measured on the tokens it calibrates on (the queries of those
//! tokens and of any earlier ones the cache saw), and scores q ⊘ w against the codes, which is the
//! same product: error moves off the channels queries read onto those they ignore. By
//! Cauchy–Schwarz the score error's variance falls by (Σ√(E q_j²·Var k_j))² / (Σ E q_j² ·
//! Σ Var k_j); on Gemma 3 270M and Alice that is 1.1–3.4× on sliding layers and 5–18× on
//! the full ones. It costs `head_dim` f32 per head and one multiply per query channel.
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

use std::fmt;
use std::str::FromStr;

use kvlab_turboquant::ggml::BlockType;
use kvlab_turboquant::{Bits, RotationKind, Spec, Variant};
use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::storage::KvPrecision;
use super::PrecisionPolicy;
use crate::error::{EngineError, Result};

/// How one side (keys or values) of a quantized layer is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TqSide {
    /// Dense IEEE half precision (e.g. values kept exact while keys are quantized).
    F16,
    /// Dense bfloat16.
    Bf16,
    /// Dense 32-bit floats.
    F32,
    /// TurboQuant codes under this codec spec.
    Codes(Spec),
    /// One of llama.cpp's block types (`q8_0`, `q4_0`, …), bit for bit as ggml stores it.
    Block(BlockType),
}

impl TqSide {
    /// The codec spec, if this side is TurboQuant codes.
    pub fn spec(&self) -> Option<&Spec> {
        match self {
            TqSide::Codes(s) => Some(s),
            _ => None,
        }
    }

    /// The llama.cpp block type, if this side is one.
    pub fn block(&self) -> Option<BlockType> {
        match self {
            TqSide::Block(b) => Some(*b),
            _ => None,
        }
    }

    /// The dtype of a dense side.
    pub fn dense_dtype(&self) -> Option<candle_core::DType> {
        match self {
            TqSide::F16 => Some(candle_core::DType::F16),
            TqSide::Bf16 => Some(candle_core::DType::BF16),
            TqSide::F32 => Some(candle_core::DType::F32),
            _ => None,
        }
    }

    /// The side's token in the `key/value` SPEC form (`f16`, `tq3.5`, `q8_0`).
    fn token(&self) -> String {
        match self {
            TqSide::F16 => "f16".to_string(),
            TqSide::Bf16 => "bf16".to_string(),
            TqSide::F32 => "f32".to_string(),
            TqSide::Codes(c) => format!("tq{}", bits_str(c.bits)),
            TqSide::Block(b) => b.name().to_string(),
        }
    }
}

/// The precision of one quantized layer: keys and values each TurboQuant codes, a llama.cpp
/// block type or dense f16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TqPrecision {
    /// How keys are stored.
    pub key: TqSide,
    /// How values are stored.
    pub value: TqSide,
    /// Whether coded sides store vectors relative to a per-head offset (module doc).
    #[serde(default = "center_by_default")]
    pub center: bool,
    /// Whether coded keys are weighted per channel by the queries' energy (`+qw`, module
    /// doc).
    #[serde(default)]
    pub weigh_keys: bool,
    /// Whether block-type sides are stored Hadamard-rotated as upstream llama.cpp does
    /// (`+norot` turns it off; module doc). TurboQuant sides always rotate.
    #[serde(default = "rotate_by_default")]
    pub rotate: bool,
    /// Whether block-type sides keep their first token as an f16 row as well (`+sink`;
    /// module doc).
    #[serde(default)]
    pub sink: bool,
}

fn rotate_by_default() -> bool {
    true
}

fn center_by_default() -> bool {
    true
}

impl TqPrecision {
    /// Whether the keys (`is_key`) or the values calibrate on their first rows (module doc):
    /// a coded side that is centered, or coded keys weighted by the queries (`+qw`).
    pub(crate) fn calibrates(&self, is_key: bool) -> bool {
        let side = if is_key { self.key } else { self.value };
        side.spec().is_some() && (self.center || (is_key && self.weigh_keys))
    }

    /// Keys and values as given, centered (the default).
    pub fn new(key: TqSide, value: TqSide) -> Self {
        Self {
            key,
            value,
            center: true,
            weigh_keys: false,
            rotate: true,
            sink: false,
        }
    }

    /// Bytes a layer of `n_kv_heads × head_dim` holds for its first token as f16 rows, one
    /// per `+sink` block side and head.
    pub(crate) fn sink_bytes(&self, n_kv_heads: usize, head_dim: usize) -> usize {
        if !self.sink {
            return 0;
        }
        let sides = [self.key, self.value]
            .iter()
            .filter(|s| s.block().is_some())
            .count();
        sides * n_kv_heads * head_dim * std::mem::size_of::<half::f16>()
    }

    /// Why a precision cannot be: `+sink` with no block side to keep a token of.
    pub(crate) fn refusal(&self) -> Option<&'static str> {
        (self.sink && !self.has_block())
            .then_some("`+sink` keeps the first token of llama.cpp's types; this cache has none")
    }

    /// Whether a side is one of llama.cpp's block types (the SPEC then takes the
    /// `key/value` form and covers every layer unless scoped).
    pub fn has_block(&self) -> bool {
        self.key.block().is_some() || self.value.block().is_some()
    }

    /// Whether a side is TurboQuant codes.
    pub fn has_codes(&self) -> bool {
        self.key.spec().is_some() || self.value.spec().is_some()
    }

    /// Whether the SPEC takes the `key/value` form (llama.cpp's types, or a dense side other
    /// than f16) rather than TurboQuant's `kXvY`.
    fn pair_form(&self) -> bool {
        self.has_block()
            || [self.key, self.value]
                .iter()
                .any(|s| matches!(s, TqSide::Bf16 | TqSide::F32))
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

impl fmt::Display for TqPrecision {
    /// The SPEC form without a scope (`tq4`, `k4vf16+nc`, `q8_0/q4_0+norot`, `f32/tq3`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pair_form() {
            let (k, v) = (self.key.token(), self.value.token());
            if k == v {
                f.write_str(&k)?;
            } else {
                write!(f, "{k}/{v}")?;
            }
        } else {
            let side = |s: &TqSide| match s {
                TqSide::Codes(c) => bits_str(c.bits).to_string(),
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
        if self.has_block() && self.sink {
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
    /// TurboQuant on the layers of `scope`, dense f16 elsewhere.
    TurboQuant {
        /// Key and value formats.
        precision: TqPrecision,
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
    pub fn to_policy(&self) -> PrecisionPolicy {
        match *self {
            CacheSpec::Dense(p) => PrecisionPolicy::uniform(p),
            CacheSpec::DenseScoped { precision, scope } => scoped(precision, scope),
            CacheSpec::TurboQuant { precision, scope } => {
                scoped(KvPrecision::TurboQuant(precision), scope)
            }
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
        matches!(self, CacheSpec::TurboQuant { .. })
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
            CacheSpec::TurboQuant { precision, scope } => {
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
fn scale_option(key: &TqSide, value: &TqSide) -> &'static str {
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
        let tok = |b: Option<Bits>| b.map_or(SideTok::Dense(TqSide::F16), SideTok::Bits);
        (tok(parse_side(input, k)?), tok(parse_side(input, v)?))
    } else {
        return Err(bad(input, format!("unknown format `{base}`")));
    };
    if let (SideTok::Dense(k), SideTok::Dense(v)) = (key, value) {
        if k == v {
            return Err(bad(
                input,
                format!("keys and values are both {0}; use `{0}`", k.token()),
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

    let make = |side: SideTok, is_key: bool| -> Result<TqSide> {
        let bits = match side {
            SideTok::Dense(d) => return Ok(d),
            SideTok::Block(t) => return Ok(TqSide::Block(t)),
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
        Ok(TqSide::Codes(s))
    };
    let precision = TqPrecision {
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
    Ok(CacheSpec::TurboQuant {
        scope: scope.unwrap_or(precision.default_scope()),
        precision,
    })
}

/// One side of a SPEC before its options are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SideTok {
    /// A dense side (`TqSide::F16`, `Bf16` or `F32`).
    Dense(TqSide),
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
        TqSide::Codes(c) => SideTok::Bits(c.bits),
        TqSide::Block(t) => SideTok::Block(t),
        dense => SideTok::Dense(dense),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tq(bits: Bits) -> TqSide {
        TqSide::Codes(Spec::mse(bits))
    }

    /// A key side as parsed by default: mse with the unbiased scale.
    fn tk(bits: Bits) -> TqSide {
        TqSide::Codes(Spec {
            unbiased: true,
            ..Spec::mse(bits)
        })
    }

    #[test]
    fn parses_the_documented_examples() -> Result<()> {
        assert_eq!(CacheSpec::parse("f16")?, CacheSpec::Dense(KvPrecision::F16));
        assert_eq!(
            CacheSpec::parse(" BF16 ")?,
            CacheSpec::Dense(KvPrecision::BF16)
        );
        assert_eq!(
            CacheSpec::parse("tq3.5@all")?,
            CacheSpec::TurboQuant {
                precision: TqPrecision::new(tk(Bits::B3_5), tq(Bits::B3_5)),
                scope: LayerScope::All
            }
        );
        assert_eq!(
            CacheSpec::parse("k4v3")?,
            CacheSpec::TurboQuant {
                precision: TqPrecision::new(tk(Bits::B4), tq(Bits::B3)),
                scope: LayerScope::Full
            }
        );
        assert_eq!(
            CacheSpec::parse("k4vf16@sliding")?,
            CacheSpec::TurboQuant {
                precision: TqPrecision::new(tk(Bits::B4), TqSide::F16),
                scope: LayerScope::Sliding
            }
        );
        let CacheSpec::TurboQuant { precision, .. } = CacheSpec::parse("tq3@all+haar+nc+s9")?
        else {
            panic!("not turboquant");
        };
        let s = precision.key.spec().copied();
        assert_eq!(
            s,
            Some(Spec {
                bits: Bits::B3,
                variant: Variant::Mse,
                rotation: RotationKind::Haar,
                norm_correction: true,
                unbiased: false,
                seed: 9
            })
        );
        let CacheSpec::TurboQuant { precision, .. } = CacheSpec::parse("tq4+prod")? else {
            panic!("not turboquant");
        };
        assert_eq!(
            precision.value.spec().map(|s| s.variant),
            Some(Variant::Prod)
        );
        Ok(())
    }

    #[test]
    fn a_spec_past_its_length_is_refused_with_a_short_echo() {
        assert!(CacheSpec::parse("tq3.5@sliding+haar+nc+s4294967295").is_ok());
        let long = format!("tq4{}", "+nc".repeat(1_000_000));
        let e = CacheSpec::parse(&long).unwrap_err().to_string();
        assert!(e.contains("at most 64"), "{e}");
        assert!(e.len() < 200, "{} bytes of error", e.len());
    }

    #[test]
    fn display_round_trips_in_canonical_form() -> Result<()> {
        for (input, canonical) in [
            ("f16", "f16"),
            ("f32", "f32"),
            ("bf16", "bf16"),
            ("f32@all", "f32"),
            ("f16@full", "f16"),
            ("f32@full", "f32@full"),
            ("BF16@sliding", "bf16@sliding"),
            ("tq4", "tq4"),
            ("tq4@full", "tq4"),
            ("TQ3.5@ALL", "tq3.5@all"),
            ("tq2.5", "tq2.5"),
            ("tq2@sliding", "tq2@sliding"),
            ("k4v4", "tq4"),
            ("k3.5v2.5", "k3.5v2.5"),
            ("k4vf16", "k4vf16"),
            ("kf16v3", "kf16v3"),
            ("k8v4@all", "k8v4@all"),
            ("k5v5", "tq5"),
            ("k6vf16", "k6vf16"),
            ("k5v4.5+qw@all", "k5v4.5+qw@all"),
            ("tq4+prod", "tq4+prod"),
            ("tq3+mse+hadamard+seed=0", "tq3"),
            ("tq3@all+seed=12+nc+haar", "tq3+nc+haar+seed=12@all"),
            ("tq4+nocenter", "tq4+nocenter"),
            ("tq3.5@all+qw", "tq3.5+qw@all"),
            ("k4v3+qw+nocenter", "k4v3+nocenter+qw"),
            ("tq4@all+nocenter+ub", "tq4+ub+nocenter@all"),
            ("tq4+plain", "tq4+plain"),
            ("kf16v3+ub", "kf16v3+ub"),
            ("kf16v3+plain", "kf16v3"),
            ("k4vf16+plain", "k4vf16+plain"),
            ("k4vf16+ub", "k4vf16"),
            ("tq3+prod+plain", "tq3+prod"),
        ] {
            let s = CacheSpec::parse(input)?;
            assert_eq!(s.to_string(), canonical, "{input}");
            assert_eq!(CacheSpec::parse(&s.to_string())?, s, "{input}");
            let json =
                serde_json::to_string(&s).map_err(|e| EngineError::invalid(e.to_string()))?;
            assert_eq!(json, format!("\"{canonical}\""));
            let back: CacheSpec =
                serde_json::from_str(&json).map_err(|e| EngineError::invalid(e.to_string()))?;
            assert_eq!(back, s);
        }
        Ok(())
    }

    #[test]
    fn llama_cpp_types_take_the_key_value_form() -> Result<()> {
        use BlockType::*;
        let pair = |s: &str| -> Result<(TqPrecision, LayerScope)> {
            match CacheSpec::parse(s)? {
                CacheSpec::TurboQuant { precision, scope } => Ok((precision, scope)),
                other => Err(EngineError::invalid(format!("{other} is dense"))),
            }
        };
        let (p, scope) = pair("q8_0")?;
        assert_eq!((p.key, p.value), (TqSide::Block(Q8_0), TqSide::Block(Q8_0)));
        // As -ctk/-ctv: every layer unless scoped, rotated unless told not to.
        assert_eq!(scope, LayerScope::All);
        assert!(p.rotate);
        let (p, _) = pair("Q8_0/q4_0")?;
        assert_eq!((p.key, p.value), (TqSide::Block(Q8_0), TqSide::Block(Q4_0)));
        let (p, _) = pair("f16/iq4_nl+norot")?;
        assert_eq!(
            (p.key, p.value, p.rotate),
            (TqSide::F16, TqSide::Block(Iq4Nl), false)
        );
        let (p, scope) = pair("q8_0/tq3@full")?;
        assert_eq!(p.key, TqSide::Block(Q8_0));
        assert_eq!(p.value, tq(Bits::B3));
        assert_eq!(scope, LayerScope::Full);
        // Dense pairs cover every layer as llama.cpp's types do; a TurboQuant side keeps
        // TurboQuant's full-attention default.
        let (p, scope) = pair("f32/bf16")?;
        assert_eq!(
            (p.key, p.value, scope),
            (TqSide::F32, TqSide::Bf16, LayerScope::All)
        );
        let (p, scope) = pair("bf16/tq3")?;
        assert_eq!((p.key, scope), (TqSide::Bf16, LayerScope::Full));
        let (p, _) = pair("tq4/q4_1+qw+nc")?;
        assert!(p.weigh_keys);
        assert_eq!(p.key.spec().map(|s| s.norm_correction), Some(true));
        for (input, canonical) in [
            ("q8_0", "q8_0"),
            ("q8_0/q8_0@all", "q8_0"),
            ("q4_0@full", "q4_0@full"),
            ("q8_0/q4_0", "q8_0/q4_0"),
            ("q4_0+norot", "q4_0+norot"),
            ("q4_0+sink", "q4_0+sink"),
            ("q8_0/q4_0+sink+norot@all", "q8_0/q4_0+norot+sink"),
            ("q5_1/f16@sliding+norot", "q5_1/f16+norot@sliding"),
            ("f16/q4_0", "f16/q4_0"),
            ("q8_0/tq3", "q8_0/tq3"),
            ("tq3.5/q5_0+qw", "tq3.5/q5_0+qw"),
            // Without a llama.cpp side, the slash form is TurboQuant's.
            ("tq4/tq3", "k4v3"),
            ("f16/tq3@all", "kf16v3@all"),
            // Any two formats of the registry, dense ones included (as -ctk/-ctv take them).
            ("f32/q4_0", "f32/q4_0"),
            ("q8_0/bf16@full", "q8_0/bf16@full"),
            ("tq4/f32+qw", "tq4/f32+qw"),
            ("bf16/tq3@all", "bf16/tq3@all"),
            ("F32/BF16", "f32/bf16"),
            ("bf16/f16@sliding", "bf16/f16@sliding"),
        ] {
            let s = CacheSpec::parse(input)?;
            assert_eq!(s.to_string(), canonical, "{input}");
            assert_eq!(CacheSpec::parse(canonical)?, s, "{input}");
        }
        for bad in [
            "q8_0+nc",
            "q4_0+qw",
            "f16/q4_0+nocenter",
            "tq4+norot",
            "q4_0+norot+norot",
            "tq4+sink",
            "f32/bf16+sink",
            "q4_0+sink+sink",
            "q9_0",
            "f16/f16",
            "f32/f32",
            "bf16/bf16@all",
            "f32/bf16+nocenter",
            "f32/bf16+norot",
            "q8_0/",
            "/q4_0",
            "q8_0/q4_0/q4_0",
            "tqf16/q4_0",
            "q4_k",
        ] {
            assert!(CacheSpec::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        Ok(())
    }

    #[test]
    fn rejects_malformed_and_unsupported_specs() {
        for s in [
            "",
            "f8",
            "tq",
            "tq9",
            "tq6.5",
            "k8.5v4",
            "tq 4",
            "tqf16",
            "kf16vf16",
            "k4",
            "k4x3",
            "v3",
            "f16+nc",
            "f32@half",
            "f32@full@all",
            "f32@full+nc",
            "tq4@half",
            "tq4+fast",
            "tq4@all@full",
            "tq4+nc+nc",
            "tq4+prod+mse",
            "tq2.5+prod",
            "tq3+prod+nc",
            "tq4+seed=",
            "tq4+seed=-1",
            "tq4+seed=99999999999999999999999",
            "tq4+",
            "tq4@",
            "tq4+ub+nc",
            "tq4+plain+ub",
            "tq4+prod+ub",
            "tq4+nocenter+nocenter",
            "tq4+qw+qw",
            "kf16v3+qw",
        ] {
            assert!(CacheSpec::parse(s).is_err(), "{s:?} should be rejected");
        }
        assert!(serde_json::from_str::<CacheSpec>("\"tq9\"").is_err());
    }

    #[test]
    fn policy_quantizes_the_scoped_layers_only() -> Result<()> {
        use crate::contract::AttentionKind;
        let tq4 = KvPrecision::TurboQuant(TqPrecision::new(tk(Bits::B4), tq(Bits::B4)));
        let p = CacheSpec::parse("tq4")?.to_policy();
        assert_eq!(p.for_layer(0, AttentionKind::Sliding), KvPrecision::F16);
        assert_eq!(p.for_layer(5, AttentionKind::Full), tq4);
        let p: PrecisionPolicy = CacheSpec::parse("tq4@all")?.into();
        assert_eq!(p.for_layer(0, AttentionKind::Sliding), tq4);
        assert_eq!(p.for_layer(5, AttentionKind::Full), tq4);
        let p = CacheSpec::parse("tq4@sliding")?.to_policy();
        assert_eq!(p.for_layer(0, AttentionKind::Sliding), tq4);
        assert_eq!(p.for_layer(5, AttentionKind::Full), KvPrecision::F16);
        assert_eq!(
            CacheSpec::parse("f32")?.to_policy(),
            PrecisionPolicy::uniform(KvPrecision::F32)
        );
        let p = CacheSpec::parse("f32@full")?.to_policy();
        assert_eq!((p.sliding, p.full), (KvPrecision::F16, KvPrecision::F32));
        let p = CacheSpec::parse("bf16@sliding")?.to_policy();
        assert_eq!((p.sliding, p.full), (KvPrecision::BF16, KvPrecision::F16));
        Ok(())
    }
}
