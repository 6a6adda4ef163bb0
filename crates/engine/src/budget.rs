//! Refuse before allocating: whether a model load or a context's growth fits the memory the
//! machine has available (sysinfo, or a fixed figure set by the caller or
//! `KVLAB_AVAILABLE_MEMORY`) minus a margin kept free, computed from the same estimates the
//! card shows ([`crate::memory::estimate_kv_bytes`]), and, when it does not fit, what would:
//! a TurboQuant cache, or a shorter context. The verdict is one [`MemoryFit`], shown before a
//! load and carried by the `out_of_memory` error's message.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::checkpoint::config::ModelConfig;
use crate::error::Result;
use crate::kv::{presets, CacheSpec, ConvertPlan, PrecisionPolicy};
use crate::memory::{estimate_kv_bytes, format_bytes};

/// Bytes kept free by default: room for the system, the app's window and the activations of
/// a prefill chunk.
pub const DEFAULT_MARGIN: u64 = 1 << 30;

/// The environment variable that fixes the available memory, in bytes (tests, and trying
/// what a smaller machine would be told).
pub const AVAILABLE_ENV: &str = "KVLAB_AVAILABLE_MEMORY";

/// How much memory the engine may plan to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// `None`: ask the system each time (then the machine's total is the system's too).
    available: Option<u64>,
    margin: u64,
}

impl Default for MemoryBudget {
    /// [`MemoryBudget::from_env`].
    fn default() -> Self {
        Self::from_env()
    }
}

impl MemoryBudget {
    /// The system's available memory, or `KVLAB_AVAILABLE_MEMORY` bytes when that is set to
    /// a number; [`DEFAULT_MARGIN`] kept free.
    pub fn from_env() -> Self {
        let fixed = std::env::var(AVAILABLE_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok());
        Self {
            available: fixed,
            margin: DEFAULT_MARGIN,
        }
    }

    /// A fixed figure: `available` bytes, `margin` of them kept free.
    pub fn fixed(available: u64, margin: u64) -> Self {
        Self {
            available: Some(available),
            margin,
        }
    }

    /// Bytes available now.
    pub fn available(&self) -> u64 {
        self.available.unwrap_or_else(|| {
            let mut sys = sysinfo::System::new();
            sys.refresh_memory();
            sys.available_memory()
        })
    }

    /// Bytes kept free.
    pub fn margin(&self) -> u64 {
        self.margin
    }

    /// The machine's memory, when the budget is the system's (a fixed figure says what is
    /// available, not what the machine has).
    pub fn total(&self) -> Option<u64> {
        // It does not change while we run: read once (the KV limit asks every step).
        static TOTAL: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        self.available.is_none().then(|| {
            *TOTAL.get_or_init(|| {
                let mut sys = sysinfo::System::new();
                sys.refresh_memory();
                sys.total_memory()
            })
        })
    }
}

/// The most KV bytes conversations hold together unless the user sets a budget.
pub const MAX_DEFAULT_KV_BUDGET: u64 = 8 << 30;

/// The KV budget unless the user sets one: a quarter of the machine's memory, at most
/// [`MAX_DEFAULT_KV_BUDGET`] (llama-server's host cache defaults to 8 GiB too), so that
/// however many conversations clients open, the machine keeps room for everything else.
/// With a fixed budget (tests, `KVLAB_AVAILABLE_MEMORY`) the machine's size is unknown: the
/// cap alone, beside what is available.
pub fn default_kv_budget(budget: &MemoryBudget) -> u64 {
    budget.total().map_or(MAX_DEFAULT_KV_BUDGET, |t| {
        (t / 4).min(MAX_DEFAULT_KV_BUDGET)
    })
}

/// Another choice that would fit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct FitOption {
    /// Its cache, as a canonical SPEC.
    pub spec: String,
    /// Bytes it would need.
    pub needed_bytes: u64,
}

/// Whether a load or a context fits in memory, with the figures and what would fit instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct MemoryFit {
    /// Bytes the request needs beyond what is held now: weights (for a load) plus KV.
    pub needed_bytes: u64,
    /// Of which weights (0 when growing a context).
    pub weights_bytes: u64,
    /// Of which KV cache.
    pub kv_bytes: u64,
    /// The context asked for, in tokens.
    pub context: usize,
    /// The cache asked for, as a canonical SPEC.
    pub spec: String,
    /// Memory available now.
    pub available_bytes: u64,
    /// Of which kept free.
    pub margin_bytes: u64,
    /// `needed ≤ available − margin`.
    pub fits: bool,
    /// The TurboQuant cache with the most bits that fits the same context, when the asked
    /// cache does not fit and one does.
    pub turboquant: Option<FitOption>,
    /// The longest context that fits with the asked cache, when the asked one does not fit
    /// (absent when not even the weights fit).
    pub max_context: Option<usize>,
}

impl MemoryFit {
    /// The refusal, with the numbers and what would fit.
    pub fn message(&self, what: &str) -> String {
        let mut s = format!(
            "not enough memory to {what}: it needs {} ({}KV cache {} for {} tokens as {}), \
             {} is available and {} of it is kept free",
            format_bytes(self.needed_bytes),
            if self.weights_bytes > 0 {
                format!("weights {} + ", format_bytes(self.weights_bytes))
            } else {
                String::new()
            },
            format_bytes(self.kv_bytes),
            self.context,
            self.spec,
            format_bytes(self.available_bytes),
            format_bytes(self.margin_bytes),
        );
        let mut offers = Vec::new();
        if let Some(tq) = &self.turboquant {
            offers.push(format!(
                "the TurboQuant cache {} needs {} and fits",
                tq.spec,
                format_bytes(tq.needed_bytes)
            ));
        }
        if let Some(c) = self.max_context {
            offers.push(format!("a context of up to {c} tokens fits"));
        }
        if offers.is_empty() {
            if self.weights_bytes > 0
                && self.weights_bytes + self.margin_bytes > self.available_bytes
            {
                s.push_str("; the weights alone do not fit: choose a smaller or more quantized model, or close other programs");
            } else {
                s.push_str("; close other programs and retry");
            }
        } else {
            s.push_str("; ");
            s.push_str(&offers.join(", or "));
        }
        s
    }
}

/// Whether a planned cache switch fits `budget`: its new storages are built while the old
/// ones are still held, so it needs [`ConvertPlan::peak_extra_bytes`] on top of what the
/// process uses now. Checked before anything is converted.
pub fn switch_fit(plan: &ConvertPlan, budget: &MemoryBudget) -> MemoryFit {
    let available = budget.available();
    let needed = plan.peak_extra_bytes();
    MemoryFit {
        needed_bytes: needed,
        weights_bytes: 0,
        kv_bytes: needed,
        context: plan.tokens(),
        spec: plan.policy.spec_string(),
        available_bytes: available,
        margin_bytes: budget.margin(),
        fits: needed <= available.saturating_sub(budget.margin()),
        turboquant: None,
        max_context: None,
    }
}

/// What is being planned: the model's config, bytes of weights still to load (0 when the
/// model is loaded), KV bytes the cache holds now (they are already counted as used), and
/// the context and cache asked for.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    /// The model.
    pub config: &'a ModelConfig,
    /// Weights still to load.
    pub weights_bytes: u64,
    /// KV bytes held now (subtracted: the memory is in use already).
    pub held_kv_bytes: u64,
    /// Tokens the cache is to hold.
    pub context: usize,
    /// The cache.
    pub policy: &'a PrecisionPolicy,
    /// Tokens sliding layers keep beyond their window.
    pub rewind_margin: usize,
    /// Count what the cache allocates, at most ([`crate::memory::estimate_kv_allocated`]),
    /// not what it holds: the pool's admissions, whose budget bounds allocated bytes.
    pub allocated: bool,
}

impl Plan<'_> {
    /// Bytes needed for `tokens` under `policy`.
    fn need(&self, policy: &PrecisionPolicy, tokens: usize) -> Result<u64> {
        let kv = if self.allocated {
            crate::memory::estimate_kv_allocated(self.config, policy, tokens, self.rewind_margin)?
        } else {
            estimate_kv_bytes(self.config, policy, tokens, self.rewind_margin)?
        };
        Ok(self
            .weights_bytes
            .saturating_add(kv.saturating_sub(self.held_kv_bytes)))
    }

    /// The verdict under `budget`.
    pub fn fit(&self, budget: &MemoryBudget) -> Result<MemoryFit> {
        let available = budget.available();
        let usable = available.saturating_sub(budget.margin());
        let needed = self.need(self.policy, self.context)?;
        let kv = needed - self.weights_bytes;
        let fits = needed <= usable;
        let mut turboquant = None;
        let mut max_context = None;
        if !fits {
            turboquant = self.turboquant_that_fits(usable)?;
            max_context = self.longest_context(usable)?;
        }
        Ok(MemoryFit {
            needed_bytes: needed,
            weights_bytes: self.weights_bytes,
            kv_bytes: kv,
            context: self.context,
            spec: self.policy.spec_string(),
            available_bytes: available,
            margin_bytes: budget.margin(),
            fits,
            turboquant,
            max_context,
        })
    }

    /// The first TurboQuant preset (most bits first) whose need fits `usable`, unless the
    /// asked cache is that preset already.
    fn turboquant_that_fits(&self, usable: u64) -> Result<Option<FitOption>> {
        for p in presets() {
            if !p.keys.is_turboquant() {
                continue;
            }
            let policy = CacheSpec::parse(&p.specs.all)?.to_policy();
            if &policy == self.policy {
                continue;
            }
            let needed = self.need(&policy, self.context)?;
            if needed <= usable {
                return Ok(Some(FitOption {
                    spec: p.specs.all,
                    needed_bytes: needed,
                }));
            }
        }
        Ok(None)
    }

    /// The longest context (below the asked one) that fits `usable` with the asked cache;
    /// `None` when not even an empty one does. The need grows with the context, so a binary
    /// search finds it.
    fn longest_context(&self, usable: u64) -> Result<Option<usize>> {
        if self.need(self.policy, 0)? > usable {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0usize, self.context);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if self.need(self.policy, mid)? <= usable {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok((lo > 0).then_some(lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPrecision;

    fn config() -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny_gemma3/config.json");
        crate::checkpoint::config::hf::load_config(&path).expect("fixture config")
    }

    #[test]
    fn a_plan_fits_up_to_the_margin_and_names_what_would_fit() {
        // 4 sliding layers (window 8) and 2 full ones, 2 KV heads × 16 dims: in f32 a token
        // costs 2 × 256 B on the full layers; sliding layers hold at most 7 + 16 tokens.
        let cfg = config();
        let f32 = PrecisionPolicy::uniform(KvPrecision::F32);
        let plan = Plan {
            allocated: false,
            config: &cfg,
            weights_bytes: 1_000_000,
            held_kv_bytes: 0,
            context: 200,
            policy: &f32,
            rewind_margin: 16,
        };
        let kv = 2 * 256 * 200 + 4 * 256 * 23;
        let needed = 1_000_000 + kv;
        let exact = plan.fit(&MemoryBudget::fixed(needed + 4096, 4096)).unwrap();
        assert!(exact.fits);
        assert_eq!((exact.needed_bytes, exact.kv_bytes), (needed, kv));
        assert_eq!((exact.turboquant, exact.max_context), (None, None));

        // One byte short: refused, with a TurboQuant cache and a shorter context that fit.
        let short = plan.fit(&MemoryBudget::fixed(needed + 4095, 4096)).unwrap();
        assert!(!short.fits);
        let tq = short.turboquant.clone().expect("a TurboQuant option");
        assert_eq!(tq.spec, "k8v4+qw@all");
        assert!(tq.needed_bytes < needed);
        assert_eq!(short.max_context, Some(199));
        let msg = short.message("load tiny");
        for want in [
            "load tiny",
            &format_bytes(needed),
            "k8v4+qw@all",
            "199 tokens",
        ] {
            assert!(msg.contains(want), "{want}: {msg}");
        }

        // Not even the weights: no option, and the message says so.
        let none = plan.fit(&MemoryBudget::fixed(900_000, 0)).unwrap();
        assert_eq!(
            (none.fits, none.turboquant.clone(), none.max_context),
            (false, None, None)
        );
        assert!(none.message("load tiny").contains("weights alone"));
    }

    #[test]
    fn growth_counts_only_the_bytes_not_held_yet() {
        let cfg = config();
        let f32 = PrecisionPolicy::uniform(KvPrecision::F32);
        let at = |t| estimate_kv_bytes(&cfg, &f32, t, 0).unwrap();
        let plan = Plan {
            allocated: false,
            config: &cfg,
            weights_bytes: 0,
            held_kv_bytes: at(100),
            context: 150,
            policy: &f32,
            rewind_margin: 0,
        };
        let fit = plan.fit(&MemoryBudget::fixed(u64::MAX, 0)).unwrap();
        assert_eq!(fit.needed_bytes, at(150) - at(100));
    }
}
