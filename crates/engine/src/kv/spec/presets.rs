//! The cache choices offered to users, as data: the presets (label, the canonical SPEC at
//! every layer scope), the formats a side can take, and how a structured choice (keys, values,
//! scope) becomes one canonical SPEC. Front ends show these strings and send choices back;
//! they never compose SPEC strings of their own, so a choice and the current policy always
//! compare equal when they mean the same cache.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::{CacheSpec, LayerScope};
use crate::error::{EngineError, Result};
use crate::kv::{KvPrecision, LayerPrecision, PrecisionPolicy, SideFormat};

/// A cache as a user picks it: each side's format and the layers it applies to (the other
/// layers stay f16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct CacheChoice {
    /// How keys are stored.
    pub keys: SideFormat,
    /// How values are stored.
    pub values: SideFormat,
    /// Which cache-owning layers get these formats.
    pub scope: LayerScope,
    /// Whether compressed sides keep the first token as f16 too (`+sink`, docs/cache-options.md).
    #[serde(default)]
    pub sink: bool,
}

impl CacheChoice {
    /// The SPEC this choice stands for, built from the registry's rows: one dense format on
    /// both sides is a dense cache, any other two formats a layer of each (`f32` keys with
    /// `q4_0` values, `q8_0` with TurboQuant 3-bit). TurboQuant keys are
    /// query-weighted (`+qw`): on Gemma 3 270M and Alice it cuts the KL divergence of the
    /// caches at 3–5 bits 1.6–2.4× for one f32 row per head (docs/cache-options.md). `sink` needs a
    /// side that is not dense.
    pub fn spec(&self) -> Result<CacheSpec> {
        let (k, v) = (self.keys, self.values);
        let (key, value) = (k.side(true), v.side(false));
        let precision = LayerPrecision {
            weigh_keys: k.is_turboquant(),
            sink: self.sink,
            ..LayerPrecision::new(key, value)
        };
        if let Some(why) = precision.refusal() {
            return Err(EngineError::invalid(why));
        }
        if k == v && k.is_dense() {
            let precision = match k {
                SideFormat::F32 => KvPrecision::F32,
                SideFormat::Bf16 => KvPrecision::BF16,
                _ => KvPrecision::F16,
            };
            return Ok(CacheSpec::dense(precision, self.scope));
        }
        Ok(CacheSpec::Split {
            precision,
            scope: self.scope,
        })
    }
}

/// What a front end sends to pick a cache: a SPEC string (typed, or saved with a session) or
/// a structured choice from the menus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(untagged)]
pub enum CacheSelection {
    /// A SPEC string (`tq3.5@all`).
    Spec(String),
    /// Menu choices.
    Choice(CacheChoice),
}

impl CacheSelection {
    /// The SPEC selected.
    pub fn spec(&self) -> Result<CacheSpec> {
        match self {
            CacheSelection::Spec(s) => CacheSpec::parse(s),
            CacheSelection::Choice(c) => c.spec(),
        }
    }

    /// The policy selected: a SPEC string may give layers their own formats
    /// (`tq3@all,0-1=q8_0`, [`super::parse_policy`]).
    pub fn policy(&self) -> Result<PrecisionPolicy> {
        match self {
            CacheSelection::Spec(s) => super::parse_policy(s),
            CacheSelection::Choice(c) => Ok(c.spec()?.to_policy()),
        }
    }
}

/// The canonical SPEC of each layer scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct ScopedSpecs {
    /// Every cache-owning layer.
    pub all: String,
    /// Full-attention layers only.
    pub full: String,
    /// Sliding-window layers only.
    pub sliding: String,
}

/// One preset of the cache menu.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct CachePreset {
    /// A short stable name (`f16`, `k4v3+qw`): its SPEC on all layers without the scope.
    pub id: String,
    /// Button label: the format for dense caches (`FP16`), the measured bits per coordinate
    /// for TurboQuant ones (`TQ 3.6`).
    pub label: String,
    /// Keys' format.
    pub keys: SideFormat,
    /// Values' format.
    pub values: SideFormat,
    /// Whether it keeps the first token as f16 too ([`CacheChoice::sink`]).
    pub sink: bool,
    /// Its canonical SPEC at each scope, to compare with the current policy.
    pub specs: ScopedSpecs,
    /// What it costs and loses on all layers, as measured ([`MEASURED_ON`]); `None` for the
    /// dense presets (FP16 is the reference).
    pub measured: Option<PresetFidelity>,
    /// One of llama.cpp's types (`-ctk`/`-ctv`), which a menu shows apart.
    pub llama_cpp: bool,
}

/// A preset's measured cost and loss on all layers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, TS)]
pub struct PresetFidelity {
    /// Bits per coordinate as held (codes, norms, offsets and weights).
    pub bits_per_coordinate: f64,
    /// Mean KL divergence against the FP16 cache, nats.
    pub mean_kld: f64,
    /// Top-1 agreement with the FP16 cache.
    pub top1_agreement: f64,
}

/// Where the presets' figures come from: `kvlab fidelity sweep --kv presets` (release,
/// 2 threads) on this model and text, llama.cpp's perplexity protocol.
pub const MEASURED_ON: &str =
    "Gemma 3 270M Q4_K_M on Alice: 4 windows of 2048 tokens, second halves scored against FP16";

/// The TurboQuant presets: the measured front of the sweeps in issue 24 (keys, values,
/// then bits per coordinate, mean KLD and top-1 agreement on all layers, [`MEASURED_ON`]).
/// Every one weighs its keys by query energy (`+qw`).
const TURBOQUANT_PRESETS: [(SideFormat, SideFormat, f64, f64, f64); 5] = [
    (SideFormat::Tq8, SideFormat::Tq4, 6.125, 0.0118, 0.9348),
    (SideFormat::Tq5, SideFormat::Tq4, 4.625, 0.0204, 0.9076),
    (SideFormat::Tq4, SideFormat::Tq4, 4.125, 0.0443, 0.8634),
    (SideFormat::Tq4, SideFormat::Tq3, 3.625, 0.0767, 0.8253),
    (SideFormat::Tq3, SideFormat::Tq3, 3.125, 0.1626, 0.7603),
];

/// llama.cpp's types as presets, measured by this engine as the TurboQuant ones are (keys,
/// values, bits per coordinate, mean KLD, top-1; all layers, [`MEASURED_ON`], rotated as
/// upstream does), and q4_0 keeping its first token as f16 (`+sink`, ours).
const LLAMA_CPP_PRESETS: [(SideFormat, SideFormat, f64, f64, f64); 3] = [
    (SideFormat::Q8_0, SideFormat::Q8_0, 8.5, 0.0032, 0.9609),
    (SideFormat::Q8_0, SideFormat::Q4_0, 6.5, 0.0079, 0.9416),
    (SideFormat::Q4_0, SideFormat::Q4_0, 4.5, 0.1288, 0.7818),
];

/// The `+sink` presets (keys, values, bits per coordinate as held, mean KLD, top-1; as
/// [`LLAMA_CPP_PRESETS`]), shown among llama.cpp's types before the type without.
const SINK_PRESETS: [(SideFormat, SideFormat, f64, f64, f64); 1] =
    [(SideFormat::Q4_0, SideFormat::Q4_0, 4.521, 0.0990, 0.8109)];

/// A cache a menu offers by its SPEC, with the label it shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct LabeledSpec {
    /// Canonical SPEC.
    pub spec: String,
    /// What the menu shows.
    pub label: String,
}

/// Everything a cache menu offers. Front ends name caches only through these SPECs, never
/// by writing one of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct CacheOptions {
    /// The presets, in menu order.
    pub presets: Vec<CachePreset>,
    /// Formats a side may take (for keys and values set apart): every row of the registry.
    pub formats: Vec<FormatOption>,
    /// The cache a model loads with unless the user picks another.
    pub default_spec: String,
    /// The TurboQuant cache suggested for a first try: the switch demo's target and the
    /// comparison's test pane.
    pub suggested_spec: String,
    /// The comparison's menu: every preset on all layers, then the suggested cache on the
    /// full-attention layers only.
    pub compare: Vec<LabeledSpec>,
    /// Where the presets' measured figures come from.
    pub measured_on: String,
}

/// The suggested TurboQuant cache is the preset with the least loss at or below this many
/// bits per coordinate (the issue's rule: the best default at or below 4 bits).
const SUGGESTED_MAX_BITS: f64 = 4.0;

/// A format with its label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct FormatOption {
    /// The format.
    pub format: SideFormat,
    /// Its label.
    pub label: String,
    /// One of llama.cpp's types.
    pub llama_cpp: bool,
    /// Dense floats: holds every token as it came (a cache with a side that is not dense may
    /// keep its first token as f16, `sink`).
    pub dense: bool,
}

/// The presets: FP32, FP16, then the TurboQuant ones from most to fewest bits, each labelled
/// by its measured bits per coordinate.
pub fn presets() -> Vec<CachePreset> {
    use SideFormat::*;
    type Row = (SideFormat, SideFormat, f64, f64, f64);
    let dense = [F32, F16].map(|f| (f.label().to_string(), f, f, false, None));
    let measured = |(keys, values, bits, kld, top1): Row| {
        let measured = PresetFidelity {
            bits_per_coordinate: bits,
            mean_kld: kld,
            top1_agreement: top1,
        };
        (keys, values, Some(measured))
    };
    let turboquant = TURBOQUANT_PRESETS.map(measured).map(|(keys, values, m)| {
        let bits = m.map_or(0.0, |m| m.bits_per_coordinate);
        (format!("TQ {bits:.1}"), keys, values, false, m)
    });
    // llama.cpp's types are named as llama.cpp names them (`-ctk q8_0 -ctv q4_0`), each after
    // its `+sink` form if it has one.
    let llama_cpp = LLAMA_CPP_PRESETS.into_iter().flat_map(|row| {
        let sunk = SINK_PRESETS
            .into_iter()
            .filter(move |s| (s.0, s.1) == (row.0, row.1))
            .map(|s| (s, true));
        sunk.chain([(row, false)]).map(|(row, sink)| {
            let (keys, values, m) = measured(row);
            let mut label = if keys == values {
                keys.label().to_string()
            } else {
                format!("{}/{}", keys.label(), values.label())
            };
            if sink {
                label.push_str("+sink");
            }
            (label, keys, values, sink, m)
        })
    });
    dense
        .into_iter()
        .chain(turboquant)
        .chain(llama_cpp)
        .filter_map(|(label, keys, values, sink, measured)| {
            let at = |scope| {
                CacheChoice {
                    keys,
                    values,
                    scope,
                    sink,
                }
                .spec()
                .ok()
                .map(|s| s.to_string())
            };
            let all = at(LayerScope::All)?;
            Some(CachePreset {
                llama_cpp: keys.is_llama_cpp() || values.is_llama_cpp(),
                id: all.trim_end_matches("@all").to_string(),
                label,
                keys,
                values,
                sink,
                specs: ScopedSpecs {
                    all,
                    full: at(LayerScope::Full)?,
                    sliding: at(LayerScope::Sliding)?,
                },
                measured,
            })
        })
        .collect()
}

/// The whole cache menu.
pub fn cache_options() -> CacheOptions {
    let presets = presets();
    let suggested = presets
        .iter()
        .filter(|p| p.keys.is_turboquant())
        .filter_map(|p| Some((p, p.measured?)))
        .filter(|(_, m)| m.bits_per_coordinate <= SUGGESTED_MAX_BITS)
        .min_by(|a, b| a.1.mean_kld.total_cmp(&b.1.mean_kld))
        .map(|(p, _)| p);
    let mut compare: Vec<LabeledSpec> = presets
        .iter()
        .map(|p| LabeledSpec {
            spec: p.specs.all.clone(),
            label: p.label.clone(),
        })
        .collect();
    if let Some(p) = suggested {
        compare.push(LabeledSpec {
            spec: p.specs.full.clone(),
            label: format!("{} full layers only", p.label),
        });
    }
    CacheOptions {
        measured_on: MEASURED_ON.to_string(),
        default_spec: PrecisionPolicy::default().spec_string(),
        suggested_spec: suggested.map(|p| p.specs.all.clone()).unwrap_or_default(),
        compare,
        presets,
        formats: SideFormat::all()
            .map(|format| FormatOption {
                format,
                label: format.label().to_string(),
                llama_cpp: format.is_llama_cpp(),
                dense: format.is_dense(),
            })
            .collect(),
    }
}

/// The suggested TurboQuant cache as a policy (what idle conversations are demoted to unless
/// the pool is told otherwise); FP16 if no preset qualifies.
pub fn suggested_policy() -> PrecisionPolicy {
    CacheSpec::parse(&cache_options().suggested_spec)
        .map(|s| s.to_policy())
        .unwrap_or_default()
}

impl PrecisionPolicy {
    /// The policy as the SPEC that stands for it, in canonical form (per-layer overrides as
    /// `,LAYERS=FORMAT` parts, `kv::spec::layers`); a policy no SPEC can express (two
    /// different non-f16 kinds) reads `full <p> · sliding <p>`.
    pub fn spec_string(&self) -> String {
        self.to_spec()
            .map(|s| s.to_string())
            .or_else(|| super::layers::policy_spec(self))
            .unwrap_or_else(|| format!("full {} · sliding {}", self.full, self.sliding))
    }

    /// The SPEC this policy is, if one is.
    pub fn to_spec(&self) -> Option<CacheSpec> {
        if !self.overrides.is_empty() {
            return None;
        }
        let (sliding, full) = (self.sliding, self.full);
        let (p, scope) = if sliding == full {
            (full, LayerScope::All)
        } else if sliding == KvPrecision::F16 {
            (full, LayerScope::Full)
        } else if full == KvPrecision::F16 {
            (sliding, LayerScope::Sliding)
        } else {
            return None;
        };
        Some(match (p, scope) {
            (KvPrecision::Split(precision), scope) => CacheSpec::Split { precision, scope },
            (dense, LayerScope::All) => CacheSpec::Dense(dense),
            (precision, scope) => CacheSpec::DenseScoped { precision, scope },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(keys: SideFormat, values: SideFormat, scope: LayerScope) -> CacheChoice {
        CacheChoice {
            keys,
            values,
            scope,
            sink: false,
        }
    }

    #[test]
    fn choices_become_canonical_specs() {
        use SideFormat::*;
        let spec = |c: CacheChoice| c.spec().map(|s| s.to_string());
        assert_eq!(spec(choice(F16, F16, LayerScope::All)).unwrap(), "f16");
        assert_eq!(
            spec(choice(F32, F32, LayerScope::Full)).unwrap(),
            "f32@full"
        );
        // TurboQuant keys are query-weighted.
        assert_eq!(
            spec(choice(Tq3_5, Tq3_5, LayerScope::All)).unwrap(),
            "tq3.5+qw@all"
        );
        // TurboQuant's default scope is the full layers: its canonical form drops it.
        assert_eq!(spec(choice(Tq4, Tq4, LayerScope::Full)).unwrap(), "tq4+qw");
        assert_eq!(
            spec(choice(Tq4, Tq3, LayerScope::Sliding)).unwrap(),
            "k4v3+qw@sliding"
        );
        assert_eq!(
            spec(choice(Tq8, Tq4_5, LayerScope::All)).unwrap(),
            "k8v4.5+qw@all"
        );
        assert_eq!(
            spec(choice(Tq4, F16, LayerScope::All)).unwrap(),
            "k4vf16+qw@all"
        );
        // Dense keys have nothing to weigh.
        assert_eq!(
            spec(choice(F16, Tq3, LayerScope::All)).unwrap(),
            "kf16v3@all"
        );
        // Any two formats: a dense side may be any dense format.
        assert_eq!(
            spec(choice(F32, Tq3, LayerScope::All)).unwrap(),
            "f32/tq3@all"
        );
        assert_eq!(spec(choice(F16, F32, LayerScope::All)).unwrap(), "f16/f32");
        assert_eq!(
            spec(choice(Q8_0, Bf16, LayerScope::Full)).unwrap(),
            "q8_0/bf16@full"
        );
        for (k, v) in [(F32, Q4_0), (Bf16, Tq3), (F16, Bf16)] {
            let s = choice(k, v, LayerScope::All).spec().unwrap();
            assert_eq!(CacheSpec::parse(&s.to_string()).unwrap(), s);
        }
        // llama.cpp's types: every layer by default, as -ctk/-ctv.
        assert_eq!(spec(choice(Q8_0, Q8_0, LayerScope::All)).unwrap(), "q8_0");
        assert_eq!(
            spec(choice(Q8_0, Q4_0, LayerScope::Full)).unwrap(),
            "q8_0/q4_0@full"
        );
        assert_eq!(
            spec(choice(F16, Q4_0, LayerScope::All)).unwrap(),
            "f16/q4_0"
        );
        assert_eq!(
            spec(choice(Q8_0, Tq3, LayerScope::All)).unwrap(),
            "q8_0/tq3"
        );
        assert_eq!(
            spec(choice(Tq4, Iq4Nl, LayerScope::All)).unwrap(),
            "tq4/iq4_nl+qw"
        );
        // Keeping the first token: for any side that is not dense.
        let sunk = |keys, values| CacheChoice {
            sink: true,
            ..choice(keys, values, LayerScope::All)
        };
        assert_eq!(spec(sunk(Q4_0, Q4_0)).unwrap(), "q4_0+sink");
        assert_eq!(spec(sunk(Tq4, Q4_0)).unwrap(), "tq4/q4_0+qw+sink");
        assert_eq!(spec(sunk(Tq4, Tq3)).unwrap(), "k4v3+qw+sink@all");
        assert!(sunk(F16, F32).spec().is_err());
    }

    #[test]
    fn every_choice_built_directly_is_the_spec_its_text_parses_to() {
        let scopes = [LayerScope::All, LayerScope::Full, LayerScope::Sliding];
        for keys in SideFormat::all() {
            for values in SideFormat::all() {
                for scope in scopes {
                    let Ok(built) = choice(keys, values, scope).spec() else {
                        continue;
                    };
                    let parsed = CacheSpec::parse(&built.to_string()).unwrap();
                    assert_eq!(parsed, built, "{keys:?} {values:?} {scope:?}");
                }
            }
        }
    }

    #[test]
    fn selections_take_strings_or_choices_in_json() {
        let s: CacheSelection = serde_json::from_str(r#""TQ3.5@ALL""#).unwrap();
        assert_eq!(s.spec().unwrap().to_string(), "tq3.5@all");
        let c: CacheSelection =
            serde_json::from_str(r#"{"keys": "4", "values": "3", "scope": "all"}"#).unwrap();
        assert_eq!(c.spec().unwrap().to_string(), "k4v3+qw@all");
        assert!(serde_json::from_str::<CacheSelection>(r#"{"keys": "5"}"#).is_err());
    }

    #[test]
    fn every_preset_round_trips_through_its_policy() {
        let presets = presets();
        assert_eq!(presets.len(), 11);
        assert_eq!(presets[5].label, "TQ 3.6");
        assert_eq!(presets[5].id, "k4v3+qw");
        assert_eq!(presets[5].specs.all, "k4v3+qw@all");
        assert_eq!(presets[5].specs.full, "k4v3+qw");
        for p in &presets {
            for spec in [&p.specs.all, &p.specs.full, &p.specs.sliding] {
                let policy = CacheSpec::parse(spec).unwrap().to_policy();
                assert_eq!(&policy.spec_string(), spec, "{}", p.label);
                assert_eq!(&CacheSpec::parse(spec).unwrap().to_string(), spec);
            }
        }
        // The old UI compared "tq3.5" with "tq3.5@all": distinct scopes stay distinct.
        assert_ne!(presets[5].specs.all, presets[5].specs.full);
        // Dense presets carry no figures; the TurboQuant ones run from most to fewest bits,
        // each losing more than the last, and each is labelled by its bits.
        assert!(presets[..2].iter().all(|p| p.measured.is_none()));
        // The same holds for llama.cpp's types, named as llama.cpp names them.
        for (group, labels) in [
            (&presets[2..7], None),
            (
                &presets[7..],
                Some(["q8_0", "q8_0/q4_0", "q4_0+sink", "q4_0"]),
            ),
        ] {
            let measured: Vec<PresetFidelity> = group.iter().filter_map(|p| p.measured).collect();
            assert_eq!(measured.len(), group.len());
            for w in measured.windows(2) {
                assert!(w[0].bits_per_coordinate > w[1].bits_per_coordinate);
                assert!(w[0].mean_kld < w[1].mean_kld);
            }
            for (i, p) in group.iter().enumerate() {
                let bits = p.measured.map(|m| m.bits_per_coordinate).unwrap_or(0.0);
                match labels {
                    None => assert_eq!(p.label, format!("TQ {bits:.1}")),
                    Some(l) => assert_eq!(p.label, l[i]),
                }
            }
        }
        assert_eq!(presets[8].specs.all, "q8_0/q4_0");
        assert_eq!(presets[8].specs.full, "q8_0/q4_0@full");
        let options = cache_options();
        assert_eq!(
            options
                .formats
                .iter()
                .map(|f| f.label.as_str())
                .collect::<Vec<_>>(),
            [
                "FP32", "FP16", "BF16", "TQ 8", "TQ 6", "TQ 5", "TQ 4.5", "TQ 4", "TQ 3.5", "TQ 3",
                "TQ 2.5", "TQ 2", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"
            ]
        );
        assert_eq!(
            options.formats.iter().filter(|f| f.llama_cpp).count(),
            6,
            "q8_0 to iq4_nl"
        );
        // The UI names caches only through these; the suggested cache is the least lossy
        // preset at or below 4 bits.
        assert_eq!(options.default_spec, "f16");
        assert_eq!(options.suggested_spec, "k4v3+qw@all");
        let compare: Vec<_> = options
            .compare
            .iter()
            .map(|c| (c.spec.as_str(), c.label.as_str()))
            .collect();
        assert_eq!(compare.len(), 12);
        assert_eq!(compare[1], ("f16", "FP16"));
        assert_eq!(compare[9], ("q4_0+sink", "q4_0+sink"));
        assert_eq!(compare[10], ("q4_0", "q4_0"));
        assert_eq!(compare[11], ("k4v3+qw", "TQ 3.6 full layers only"));
        assert!(presets[9].sink && !presets[10].sink);
        assert_eq!(presets[9].specs.full, "q4_0+sink@full");
    }

    #[test]
    fn policies_no_spec_can_express_say_so() {
        let p = PrecisionPolicy {
            sliding: KvPrecision::F32,
            full: CacheSpec::parse("tq4").unwrap().to_policy().full,
            overrides: Default::default(),
        };
        assert_eq!(p.to_spec(), None);
        assert_eq!(p.spec_string(), "full tq4 · sliding f32");
    }
}
