//! The codec's configuration: a small serde type, validated before use.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Bits per coordinate. Fractional widths put half of the rotated coordinates one width up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub enum Bits {
    /// 1 bit per coordinate.
    B1,
    /// 2 bits.
    B2,
    /// Half the coordinates at 3 bits, half at 2.
    B2_5,
    /// 3 bits.
    B3,
    /// Half at 4 bits, half at 3.
    B3_5,
    /// 4 bits.
    B4,
    /// Half at 5 bits, half at 4.
    B4_5,
    /// 5 bits (the wide widths, 5–8: their codebooks do not fit one x86 register, so x86
    /// scores them by gathers and sums them in portable code; NEON by table lookups).
    B5,
    /// Half at 6 bits, half at 5.
    B5_5,
    /// 6 bits.
    B6,
    /// 7 bits.
    B7,
    /// 8 bits.
    B8,
}

impl Bits {
    /// Every width, ascending.
    pub const ALL: [Bits; 12] = [
        Bits::B1,
        Bits::B2,
        Bits::B2_5,
        Bits::B3,
        Bits::B3_5,
        Bits::B4,
        Bits::B4_5,
        Bits::B5,
        Bits::B5_5,
        Bits::B6,
        Bits::B7,
        Bits::B8,
    ];

    /// Nominal bits per coordinate (2.5 for `B2_5`).
    pub fn value(self) -> f64 {
        match self {
            Bits::B1 => 1.0,
            Bits::B2 => 2.0,
            Bits::B2_5 => 2.5,
            Bits::B3 => 3.0,
            Bits::B3_5 => 3.5,
            Bits::B4 => 4.0,
            Bits::B4_5 => 4.5,
            Bits::B5 => 5.0,
            Bits::B5_5 => 5.5,
            Bits::B6 => 6.0,
            Bits::B7 => 7.0,
            Bits::B8 => 8.0,
        }
    }

    /// Expected squared error E‖u − û‖² of a uniform unit vector of `dim` coded at these bits
    /// without QJL (the D_mse of the paper): a fractional width codes half the coordinates at
    /// each of its two widths, so it errs by the mean of theirs. What a fitted cache predicts
    /// a layer's loss by, relative to its loss measured at one width.
    pub fn unit_mse(self, dim: usize) -> f64 {
        let (lo, hi) = self.widths();
        let mse = |w: u8| crate::codebook::codebook(dim, w).mse();
        if lo == hi {
            mse(lo)
        } else {
            0.5 * (mse(lo) + mse(hi))
        }
    }

    /// (low width, high width): equal for integer widths.
    pub(crate) fn widths(self) -> (u8, u8) {
        match self {
            Bits::B1 => (1, 1),
            Bits::B2 => (2, 2),
            Bits::B2_5 => (2, 3),
            Bits::B3 => (3, 3),
            Bits::B3_5 => (3, 4),
            Bits::B4 => (4, 4),
            Bits::B4_5 => (4, 5),
            Bits::B5 => (5, 5),
            Bits::B5_5 => (5, 6),
            Bits::B6 => (6, 6),
            Bits::B7 => (7, 7),
            Bits::B8 => (8, 8),
        }
    }
}

impl TryFrom<f64> for Bits {
    type Error = Error;
    fn try_from(v: f64) -> Result<Self> {
        Bits::ALL
            .into_iter()
            .find(|b| b.value() == v)
            .ok_or(Error::InvalidBits(v))
    }
}

impl From<Bits> for f64 {
    fn from(b: Bits) -> f64 {
        b.value()
    }
}

impl std::str::FromStr for Bits {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let v: f64 = s.trim().parse().map_err(|_| Error::InvalidBits(f64::NAN))?;
        Bits::try_from(v)
    }
}

/// Which quantizer of the paper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Algorithm 1: minimizes mean squared error (inner products shrink by 1 − D_mse).
    #[default]
    Mse,
    /// Algorithm 2: (b−1)-bit mse code + 1-bit QJL sketch of the residual; unbiased inner
    /// products, higher variance. Integer widths only, no norm correction.
    Prod,
}

/// Which random rotation is applied before quantizing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RotationKind {
    /// Randomized Walsh–Hadamard (signs, then normalized H), O(d log d).
    #[default]
    Hadamard,
    /// Dense Haar-random orthogonal matrix, O(d²): the reference.
    Haar,
}

/// Everything that determines a codec besides the dimension. Two codecs with equal
/// `(dim, Spec)` produce and read identical bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Bits per coordinate: 1, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 7 or 8 (JSON number).
    pub bits: Bits,
    /// `"mse"` (default) or `"prod"`.
    #[serde(default)]
    pub variant: Variant,
    /// `"hadamard"` (default) or `"haar"`.
    #[serde(default)]
    pub rotation: RotationKind,
    /// Store n/‖c[idx]‖ instead of n so decoded vectors keep their norm (mse only).
    #[serde(default)]
    pub norm_correction: bool,
    /// Store n/⟨u, û⟩ instead of n (u the unit input, û its unit-scale reconstruction), so
    /// ⟨x, x̂⟩ = ‖x‖²: inner products are no longer shrunk by (1 − D_mse). Attention needs
    /// this on keys: the shrink flattens every softmax by the same factor, a bias, while
    /// the rest of the error is zero-mean noise (mse only; excludes `norm_correction`).
    #[serde(default)]
    pub unbiased: bool,
    /// Seed of the rotation (and of the QJL matrix for `prod`).
    #[serde(default)]
    pub seed: u64,
}

impl Spec {
    /// The default mse spec at `bits`: Hadamard rotation, no norm correction, seed 0.
    pub fn mse(bits: Bits) -> Self {
        Spec {
            bits,
            variant: Variant::Mse,
            rotation: RotationKind::Hadamard,
            norm_correction: false,
            unbiased: false,
            seed: 0,
        }
    }

    /// Rejects combinations the codec does not implement.
    pub fn validate(&self) -> Result<()> {
        if self.unbiased && self.norm_correction {
            return Err(Error::UnsupportedSpec(
                "the unbiased scale and norm correction are two choices of one stored norm".into(),
            ));
        }
        if self.unbiased && self.variant == Variant::Prod {
            return Err(Error::UnsupportedSpec(
                "variant prod is unbiased through its residual signs already".into(),
            ));
        }
        if self.variant == Variant::Prod {
            let (lo, hi) = self.bits.widths();
            if lo != hi {
                return Err(Error::UnsupportedSpec(
                    "variant prod supports integer bit widths only".into(),
                ));
            }
            if self.norm_correction {
                return Err(Error::UnsupportedSpec(
                    "norm correction applies to variant mse only".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_roundtrip_and_names() {
        let spec = Spec {
            bits: Bits::B3_5,
            variant: Variant::Mse,
            rotation: RotationKind::Haar,
            norm_correction: true,
            unbiased: false,
            seed: 7,
        };
        let json = serde_json::to_value(spec).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"bits": 3.5, "variant": "mse", "rotation": "haar",
                               "norm_correction": true, "unbiased": false, "seed": 7})
        );
        let back: Spec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
        let minimal: Spec = serde_json::from_str(r#"{"bits": 4}"#).unwrap();
        assert_eq!(minimal, Spec::mse(Bits::B4));
    }

    #[test]
    fn bad_values_are_typed_errors() {
        assert!(serde_json::from_str::<Spec>(r#"{"bits": 9}"#).is_err());
        assert!(serde_json::from_str::<Spec>(r#"{"bits": 6.5}"#).is_err());
        assert_eq!("4.5".parse::<Bits>(), Ok(Bits::B4_5));
        assert_eq!("8".parse::<Bits>(), Ok(Bits::B8));
        assert!(serde_json::from_str::<Spec>(r#"{"bits": 2, "variant": "fast"}"#).is_err());
        assert_eq!(Bits::try_from(0.0), Err(Error::InvalidBits(0.0)));
        assert!("x".parse::<Bits>().is_err());
        assert_eq!("2.5".parse::<Bits>(), Ok(Bits::B2_5));
        let mut s = Spec::mse(Bits::B2_5);
        s.variant = Variant::Prod;
        assert!(matches!(s.validate(), Err(Error::UnsupportedSpec(_))));
        let mut s = Spec::mse(Bits::B3);
        s.variant = Variant::Prod;
        assert!(s.validate().is_ok());
        s.norm_correction = true;
        assert!(matches!(s.validate(), Err(Error::UnsupportedSpec(_))));
    }
}
