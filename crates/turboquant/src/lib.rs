//! TurboQuant: a vector codec (random rotation + Lloyd–Max scalar codebook + exact bit packing)
//! with kernels that score and accumulate directly on the compressed codes.
//!
//! ```
//! use kvlab_turboquant::{Bits, Codec, Spec};
//! let codec = Codec::new(256, Spec::mse(Bits::B4)).unwrap();
//! let mut block = codec.new_block();
//! let mut scratch = codec.scratch();
//! let x: Vec<f32> = (0..256).map(|i| (i as f32).sin()).collect();
//! codec.encode(&x, &mut block, &mut scratch).unwrap();
//! assert_eq!(block.bytes_used(), 130); // 128 bytes of 4-bit codes + an f16 norm
//! let mut scores = vec![0.0; block.len()];
//! codec.scores(&x, &block, &mut scratch, &mut scores).unwrap();
//! ```
//! See the crate README for the byte layout and the codebook choice.

pub mod baseline;
pub mod bits;
mod block;
pub mod codebook;
mod codec;
mod error;
mod features;
pub mod ggml;
mod kernels;
mod layout;
pub mod prng;
mod qjl;
mod rotation;
mod scratch;
mod shared;
mod spec;
#[cfg(test)]
mod structured_tests;

pub use block::{CodeBlock, DEFAULT_CHUNK_VECTORS};
pub use codebook::codebook;
pub use codec::Codec;
pub use error::{Error, Result};
pub use kernels::{Backend, PreparedQueries};
pub use layout::{bytes_per_vector, MAX_DENSE_DIM, MAX_DIM};
pub use prng::Rng;
pub use scratch::Scratch;
pub use spec::{Bits, RotationKind, Spec, Variant};

/// The backend the scoring and accumulation kernels pick on this CPU now (see
/// [`Backend::detect`]); [`Scratch::last_backend`] tells which one ran a given call.
pub fn kernel_backend() -> Backend {
    Backend::detect()
}

/// Routes the kernels and the encoder to the portable scalar backend even where SIMD
/// (AVX-512, AVX2, NEON) is available (for cross-checking the backends; results agree to
/// rounding, encoded bytes exactly).
#[doc(hidden)]
pub fn force_portable_kernels(on: bool) {
    features::force_portable(on);
}

/// Never uses AVX-512 kernels (exercises the AVX2 backend on AVX-512 machines).
#[doc(hidden)]
pub fn force_avx2_kernels(on: bool) {
    features::force_avx2(on);
}
