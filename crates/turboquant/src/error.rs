//! The crate's single error type: every rejected spec, shape or byte string is a typed variant.

use thiserror::Error;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything the codec can refuse. Nothing in this crate panics on caller-controlled input.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A bit width that is not one of 1, 2, 2.5, 3, 3.5, 4.
    #[error("unsupported bit width {0} (expected 1, 2, 2.5, 3, 3.5 or 4)")]
    InvalidBits(f64),
    /// A combination of spec fields the codec does not implement.
    #[error("unsupported spec: {0}")]
    UnsupportedSpec(String),
    /// The vector dimension is outside the supported range.
    #[error("unsupported dimension {dim}: {reason}")]
    InvalidDimension {
        /// The dimension asked for.
        dim: usize,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A slice does not have the length the codec expects.
    #[error("length mismatch: expected {expected} values, got {got}")]
    DimensionMismatch {
        /// Expected length.
        expected: usize,
        /// Received length.
        got: usize,
    },
    /// A block was built for a different (dimension, spec) than the codec it is used with.
    #[error(
        "block layout (dim {block_dim}) does not match the codec (dim {codec_dim}) or its spec"
    )]
    LayoutMismatch {
        /// Dimension the block was built for.
        block_dim: usize,
        /// Dimension of the codec.
        codec_dim: usize,
    },
    /// A byte string is not a whole number of stored vectors.
    #[error("truncated block: {len} bytes is not a multiple of the {stride}-byte vector record")]
    TruncatedBlock {
        /// Bytes received.
        len: usize,
        /// Bytes per stored vector.
        stride: usize,
    },
    /// The input vector contains NaN/inf, or its norm does not fit the f16 norm field.
    #[error("vector cannot be encoded: norm {norm} is not finite or exceeds the f16 range")]
    NotEncodable {
        /// The offending norm (possibly NaN or inf).
        norm: f32,
    },
    /// A vector index past the end of a block.
    #[error("index {index} out of range for a block of {len} vectors")]
    IndexOutOfRange {
        /// Index asked for.
        index: usize,
        /// Vectors in the block.
        len: usize,
    },
}
