//! Byte layout of one stored vector (a "record") for a given (dim, spec).
//!
//! ```text
//! [code bits ............................................][norm f16][gamma f16 (prod only)]
//!  segment 0 | segment 1 (fractional widths) | signs (prod)
//! ```
//! The code area is one little-endian bit stream (see `bits`) with no padding between
//! segments, rounded up to whole bytes once per record. f16 fields are little-endian.
//! * integer width b, mse: one segment of d values at b bits.
//! * b + ½ (2.5, 3.5): coordinates [0, h) at b + 1 bits then [h, d) at b bits, where
//!   h = d/2 rounded down to a multiple of 8 (so both segments start on a byte; h = d/2
//!   whenever d is a multiple of 16).
//! * prod at b bits: d values at b − 1 bits (none when b = 1), then d sign bits of the QJL
//!   sketch, and γ = ‖residual‖ after the norm.

use crate::error::{Error, Result};
use crate::spec::{RotationKind, Spec, Variant};

/// Largest supported dimension (the codebook grid and u32 bit offsets are sized for it).
pub const MAX_DIM: usize = 1 << 16;
/// Largest dimension for the dense (d²) Haar rotation and QJL matrix.
pub const MAX_DENSE_DIM: usize = 4096;

/// A run of coordinates quantized with one codebook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// First coordinate.
    pub start: usize,
    /// Number of coordinates.
    pub len: usize,
    /// Bits per value.
    pub width: u8,
    /// Stream bit where the segment starts.
    pub bit_offset: usize,
}

/// The full record layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub dim: usize,
    pub segments: Vec<Segment>,
    /// Stream bit of the d QJL sign bits (prod only).
    pub sign_bit_offset: Option<usize>,
    pub norm_offset: usize,
    pub gamma_offset: Option<usize>,
    pub stride: usize,
}

impl Layout {
    pub(crate) fn new(dim: usize, spec: &Spec) -> Result<Self> {
        spec.validate()?;
        if dim < 3 {
            return Err(Error::InvalidDimension {
                dim,
                reason: "at least 3 coordinates are required",
            });
        }
        if dim > MAX_DIM {
            return Err(Error::InvalidDimension {
                dim,
                reason: "at most 65536 coordinates are supported",
            });
        }
        let dense = spec.rotation == RotationKind::Haar || spec.variant == Variant::Prod;
        if dense && dim > MAX_DENSE_DIM {
            return Err(Error::InvalidDimension {
                dim,
                reason: "haar rotation and prod variant are limited to 4096 coordinates",
            });
        }
        let (lo, hi) = spec.bits.widths();
        let mut segments = Vec::new();
        let mut bit = 0;
        let mut push = |start: usize, len: usize, width: u8, bit: &mut usize| {
            if len > 0 && width > 0 {
                segments.push(Segment {
                    start,
                    len,
                    width,
                    bit_offset: *bit,
                });
                *bit += len * width as usize;
            }
        };
        let mut sign_bit_offset = None;
        match spec.variant {
            Variant::Mse if lo == hi => push(0, dim, lo, &mut bit),
            Variant::Mse => {
                let h = if dim >= 16 { (dim / 2) & !7 } else { dim / 2 };
                push(0, h, hi, &mut bit);
                push(h, dim - h, lo, &mut bit);
            }
            Variant::Prod => {
                push(0, dim, lo - 1, &mut bit);
                sign_bit_offset = Some(bit);
                bit += dim;
            }
        }
        let code_bytes = bit.div_ceil(8);
        let norm_offset = code_bytes;
        let (gamma_offset, stride) = match spec.variant {
            Variant::Mse => (None, code_bytes + 2),
            Variant::Prod => (Some(code_bytes + 2), code_bytes + 4),
        };
        Ok(Layout {
            dim,
            segments,
            sign_bit_offset,
            norm_offset,
            gamma_offset,
            stride,
        })
    }

    /// Stored bits per coordinate, everything included.
    pub(crate) fn bits_per_coordinate(&self) -> f64 {
        (self.stride * 8) as f64 / self.dim as f64
    }
}

/// Bytes one stored vector occupies for `(dim, spec)`: exactly what a block stores per vector.
pub fn bytes_per_vector(dim: usize, spec: &Spec) -> Result<usize> {
    Ok(Layout::new(dim, spec)?.stride)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Bits;

    #[test]
    fn sizes() {
        let s = |b| Spec::mse(b);
        assert_eq!(bytes_per_vector(256, &s(Bits::B4)), Ok(130));
        assert_eq!(bytes_per_vector(128, &s(Bits::B3)), Ok(48 + 2));
        assert_eq!(bytes_per_vector(256, &s(Bits::B2_5)), Ok(80 + 2));
        assert_eq!(bytes_per_vector(256, &s(Bits::B3_5)), Ok(112 + 2));
        assert_eq!(bytes_per_vector(10, &s(Bits::B3)), Ok(4 + 2));
        let mut p = s(Bits::B3);
        p.variant = Variant::Prod;
        assert_eq!(bytes_per_vector(128, &p), Ok(32 + 16 + 4));
        let l = Layout::new(256, &s(Bits::B2_5)).unwrap();
        assert_eq!(l.segments[0].len, 128);
        assert_eq!(l.segments[1].bit_offset, 128 * 3);
        assert!((l.bits_per_coordinate() - 2.5625).abs() < 1e-12);
    }

    #[test]
    fn bad_dimensions() {
        let s = Spec::mse(Bits::B2);
        assert!(matches!(
            bytes_per_vector(2, &s),
            Err(Error::InvalidDimension { .. })
        ));
        assert!(matches!(
            bytes_per_vector(MAX_DIM + 1, &s),
            Err(Error::InvalidDimension { .. })
        ));
        let mut h = s;
        h.rotation = RotationKind::Haar;
        assert!(matches!(
            bytes_per_vector(8192, &h),
            Err(Error::InvalidDimension { .. })
        ));
    }
}
