//! The cache choices offered to users, as data: the presets (label, the canonical SPEC at
//! every layer scope), the formats a side can take, and how a structured choice (keys, values,
//! scope) becomes one canonical SPEC. Front ends show these strings and send choices back;
//! they never compose SPEC strings of their own, so a choice and the current policy always
//! compare equal when they mean the same cache.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::spec::{CacheSpec, LayerScope};
use super::storage::KvPrecision;
use super::PrecisionPolicy;
use crate::error::{EngineError, Result};

/// How one side (keys or values) is stored, as a choice: a dense dtype or TurboQuant bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
pub enum SideFormat {
    /// 32-bit floats.
    #[serde(rename = "f32")]
    F32,
    /// IEEE half precision.
    #[serde(rename = "f16")]
    F16,
    /// bfloat16.
    #[serde(rename = "bf16")]
    Bf16,
    /// TurboQuant, 4 bits per coordinate.
    #[serde(rename = "4")]
    Tq4,
    /// TurboQuant, 3.5 bits (half the coordinates at 4, half at 3).
    #[serde(rename = "3.5")]
    Tq3_5,
    /// TurboQuant, 3 bits.
    #[serde(rename = "3")]
    Tq3,
    /// TurboQuant, 2.5 bits.
    #[serde(rename = "2.5")]
    Tq2_5,
    /// TurboQuant, 2 bits.
    #[serde(rename = "2")]
    Tq2,
}

impl SideFormat {
    /// Every format, dense first, then TurboQuant from most to fewest bits.
    pub const ALL: [SideFormat; 8] = [
        SideFormat::F32,
        SideFormat::F16,
        SideFormat::Bf16,
        SideFormat::Tq4,
        SideFormat::Tq3_5,
        SideFormat::Tq3,
        SideFormat::Tq2_5,
        SideFormat::Tq2,
    ];

    /// The token the SPEC grammar uses for this side (`f16`, `3.5`, …).
    fn token(self) -> &'static str {
        match self {
            SideFormat::F32 => "f32",
            SideFormat::F16 => "f16",
            SideFormat::Bf16 => "bf16",
            SideFormat::Tq4 => "4",
            SideFormat::Tq3_5 => "3.5",
            SideFormat::Tq3 => "3",
            SideFormat::Tq2_5 => "2.5",
            SideFormat::Tq2 => "2",
        }
    }

    fn is_dense(self) -> bool {
        matches!(self, SideFormat::F32 | SideFormat::F16 | SideFormat::Bf16)
    }

    /// Whether the side is TurboQuant codes.
    pub fn is_turboquant(self) -> bool {
        !self.is_dense()
    }

    /// What a menu shows (`FP16`, `TQ 3.5`).
    pub fn label(self) -> String {
        match self {
            SideFormat::F32 => "FP32".into(),
            SideFormat::F16 => "FP16".into(),
            SideFormat::Bf16 => "BF16".into(),
            tq => format!("TQ {}", tq.token()),
        }
    }
}

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
}

impl CacheChoice {
    /// The SPEC this choice stands for. Dense formats cover both sides (`f32` keys with
    /// `f32` values); TurboQuant sides may differ, and either may be `f16`.
    pub fn spec(&self) -> Result<CacheSpec> {
        let (k, v) = (self.keys, self.values);
        let body = if k == v && k.is_dense() {
            k.token().to_string()
        } else if k == v {
            format!("tq{}", k.token())
        } else if (k.is_dense() && k != SideFormat::F16) || (v.is_dense() && v != SideFormat::F16) {
            return Err(EngineError::invalid(format!(
                "keys {} with values {}: a side can only be f16 when the other is TurboQuant",
                k.label(),
                v.label()
            )));
        } else {
            format!("k{}v{}", k.token(), v.token())
        };
        CacheSpec::parse(&format!("{body}@{}", scope_token(self.scope)))
    }
}

fn scope_token(s: LayerScope) -> &'static str {
    match s {
        LayerScope::All => "all",
        LayerScope::Full => "full",
        LayerScope::Sliding => "sliding",
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

    /// The policy selected.
    pub fn policy(&self) -> Result<PrecisionPolicy> {
        Ok(self.spec()?.to_policy())
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct CachePreset {
    /// A short stable name (`tq3.5`, `tq4-k4v3`): its SPEC on all layers without the scope.
    pub id: String,
    /// Button label (`TQ 3.5`).
    pub label: String,
    /// Keys' and values' format.
    pub keys: SideFormat,
    /// (Equal to `keys` for every preset but the split ones.)
    pub values: SideFormat,
    /// Its canonical SPEC at each scope, to compare with the current policy.
    pub specs: ScopedSpecs,
}

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct CacheOptions {
    /// The presets, in menu order.
    pub presets: Vec<CachePreset>,
    /// Formats a side may take (for keys and values set apart).
    pub formats: Vec<FormatOption>,
    /// The cache a model loads with unless the user picks another.
    pub default_spec: String,
    /// The TurboQuant cache suggested for a first try: the switch demo's target and the
    /// comparison's test pane.
    pub suggested_spec: String,
    /// The comparison's menu: every uniform preset on all layers, then the suggested cache
    /// on the full-attention layers only.
    pub compare: Vec<LabeledSpec>,
}

/// The suggested TurboQuant cache's keys and values: 3.5 bits, the paper's quality-neutral
/// point.
const SUGGESTED: SideFormat = SideFormat::Tq3_5;

/// A format with its label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct FormatOption {
    /// The format.
    pub format: SideFormat,
    /// Its label.
    pub label: String,
}

/// The presets: FP32, FP16, TurboQuant at 4 … 2 bits, and keys 4 / values 3 bits.
pub fn presets() -> Vec<CachePreset> {
    use SideFormat::*;
    let mut out: Vec<(String, SideFormat, SideFormat)> = [F32, F16, Tq4, Tq3_5, Tq3, Tq2_5, Tq2]
        .into_iter()
        .map(|f| (f.label(), f, f))
        .collect();
    out.push(("TQ K4 V3".into(), Tq4, Tq3));
    out.into_iter()
        .filter_map(|(label, keys, values)| {
            let at = |scope| {
                CacheChoice {
                    keys,
                    values,
                    scope,
                }
                .spec()
                .ok()
                .map(|s| s.to_string())
            };
            let all = at(LayerScope::All)?;
            Some(CachePreset {
                id: all.trim_end_matches("@all").to_string(),
                label,
                keys,
                values,
                specs: ScopedSpecs {
                    all,
                    full: at(LayerScope::Full)?,
                    sliding: at(LayerScope::Sliding)?,
                },
            })
        })
        .collect()
}

/// The whole cache menu.
pub fn cache_options() -> CacheOptions {
    let presets = presets();
    let suggested = presets
        .iter()
        .find(|p| p.keys == SUGGESTED && p.values == SUGGESTED);
    let mut compare: Vec<LabeledSpec> = presets
        .iter()
        .filter(|p| p.keys == p.values)
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
        default_spec: PrecisionPolicy::default().spec_string(),
        suggested_spec: suggested.map(|p| p.specs.all.clone()).unwrap_or_default(),
        compare,
        presets,
        formats: SideFormat::ALL
            .iter()
            .filter(|f| !f.is_dense() || **f == SideFormat::F16)
            .map(|&format| FormatOption {
                format,
                label: format.label(),
            })
            .collect(),
    }
}

/// The canonical SPEC of any SPEC string (`TQ3.5@ALL` → `tq3.5@all`, `tq4@full` → `tq4`).
pub fn canonical(spec: &str) -> Result<String> {
    Ok(CacheSpec::parse(spec)?.to_string())
}

impl PrecisionPolicy {
    /// The policy as the SPEC that stands for it, in canonical form; a policy no SPEC can
    /// express (per-layer overrides, two different non-f16 kinds) reads
    /// `full <p> · sliding <p>`.
    pub fn spec_string(&self) -> String {
        self.to_spec()
            .map(|s| s.to_string())
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
            (KvPrecision::TurboQuant(precision), scope) => {
                CacheSpec::TurboQuant { precision, scope }
            }
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
        assert_eq!(
            spec(choice(Tq3_5, Tq3_5, LayerScope::All)).unwrap(),
            "tq3.5@all"
        );
        // TurboQuant's default scope is the full layers: its canonical form drops it.
        assert_eq!(spec(choice(Tq4, Tq4, LayerScope::Full)).unwrap(), "tq4");
        assert_eq!(
            spec(choice(Tq4, Tq3, LayerScope::Sliding)).unwrap(),
            "k4v3@sliding"
        );
        assert_eq!(
            spec(choice(Tq4, F16, LayerScope::All)).unwrap(),
            "k4vf16@all"
        );
        assert!(spec(choice(F32, Tq3, LayerScope::All)).is_err());
        assert!(spec(choice(F16, F32, LayerScope::All)).is_err());
    }

    #[test]
    fn selections_take_strings_or_choices_in_json() {
        let s: CacheSelection = serde_json::from_str(r#""TQ3.5@ALL""#).unwrap();
        assert_eq!(s.spec().unwrap().to_string(), "tq3.5@all");
        let c: CacheSelection =
            serde_json::from_str(r#"{"keys": "4", "values": "3", "scope": "all"}"#).unwrap();
        assert_eq!(c.spec().unwrap().to_string(), "k4v3@all");
        assert!(serde_json::from_str::<CacheSelection>(r#"{"keys": "5"}"#).is_err());
    }

    #[test]
    fn every_preset_round_trips_through_its_policy() {
        let presets = presets();
        assert_eq!(presets.len(), 8);
        assert_eq!(presets[3].label, "TQ 3.5");
        assert_eq!(presets[3].specs.all, "tq3.5@all");
        assert_eq!(presets[3].specs.full, "tq3.5");
        for p in &presets {
            for spec in [&p.specs.all, &p.specs.full, &p.specs.sliding] {
                let policy = CacheSpec::parse(spec).unwrap().to_policy();
                assert_eq!(&policy.spec_string(), spec, "{}", p.label);
                assert_eq!(&canonical(spec).unwrap(), spec);
            }
        }
        // The old UI compared "tq3.5" with "tq3.5@all": distinct scopes stay distinct.
        assert_ne!(presets[3].specs.all, presets[3].specs.full);
        let options = cache_options();
        assert_eq!(
            options
                .formats
                .iter()
                .map(|f| f.label.as_str())
                .collect::<Vec<_>>(),
            ["FP16", "TQ 4", "TQ 3.5", "TQ 3", "TQ 2.5", "TQ 2"]
        );
        // The UI names caches only through these.
        assert_eq!(options.default_spec, "f16");
        assert_eq!(options.suggested_spec, "tq3.5@all");
        let compare: Vec<_> = options
            .compare
            .iter()
            .map(|c| (c.spec.as_str(), c.label.as_str()))
            .collect();
        assert_eq!(compare.len(), 8);
        assert_eq!(compare[1], ("f16", "FP16"));
        assert_eq!(compare[7], ("tq3.5", "TQ 3.5 full layers only"));
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
