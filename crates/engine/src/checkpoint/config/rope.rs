//! Rotary position embedding parameters and their inverse-frequency tables, for the three
//! kinds Gemma uses (plain, linearly scaled, proportional/partial).

use serde::{Deserialize, Serialize};

/// How the RoPE frequencies of one layer are derived.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeKind {
    /// `inv_freq[i] = θ^(−2i/d)` over all `d/2` pairs.
    Default,
    /// Default frequencies divided by `factor` (Gemma 3 global layers).
    Linear {
        /// The position interpolation factor.
        factor: f64,
    },
    /// Gemma 4 full layers: only the first `⌊partial·d/2⌋` pairs rotate, with the exponent
    /// still over the full head dim; the remaining pairs are the identity (frequency 0).
    Proportional {
        /// Fraction of the head dim that rotates.
        partial_rotary_factor: f64,
    },
}

/// The RoPE of one layer: base θ and kind. Always the NeoX "rotate half" pairing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    /// The base θ.
    pub theta: f64,
    /// How frequencies are derived from θ.
    pub kind: RopeKind,
}

impl RopeSpec {
    /// Inverse frequencies for a head of `head_dim` (length `head_dim / 2`), in f64 so the
    /// angle tables stay accurate at long positions.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let half = head_dim / 2;
        let base = |i: usize| 1.0 / self.theta.powf((2 * i) as f64 / head_dim as f64);
        match self.kind {
            RopeKind::Default => (0..half).map(base).collect(),
            RopeKind::Linear { factor } => (0..half).map(|i| base(i) / factor).collect(),
            RopeKind::Proportional {
                partial_rotary_factor,
            } => {
                let rotated = ((partial_rotary_factor * head_dim as f64) as usize / 2).min(half);
                (0..half)
                    .map(|i| if i < rotated { base(i) } else { 0.0 })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_rotates_only_the_leading_pairs_with_full_dim_exponent() {
        let spec = RopeSpec {
            theta: 1e6,
            kind: RopeKind::Proportional {
                partial_rotary_factor: 0.25,
            },
        };
        let f = spec.inv_freq(32);
        assert_eq!(f.len(), 16);
        assert_eq!(f.iter().filter(|x| **x != 0.0).count(), 4);
        assert!((f[1] - 1e6f64.powf(-2.0 / 32.0)).abs() < 1e-15);
        assert_eq!(f[4], 0.0);
    }

    #[test]
    fn linear_divides_by_factor() {
        let d = RopeSpec {
            theta: 1e6,
            kind: RopeKind::Default,
        }
        .inv_freq(16);
        let l = RopeSpec {
            theta: 1e6,
            kind: RopeKind::Linear { factor: 8.0 },
        }
        .inv_freq(16);
        assert!((d[3] / 8.0 - l[3]).abs() < 1e-18);
        assert_eq!(d[0], 1.0);
    }
}
