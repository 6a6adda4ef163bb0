//! KV Lab's CPU kernels, apart from any model or tensor library: quantized matrices and their
//! matmuls ([`qmatmul`]), the f16 attention block products ([`attention`]) and vectorized
//! math ([`vmath`]). Each family runs on the widest instruction set this CPU has, read once
//! per process ([`features`]); every SIMD kernel has a portable reference it is tested
//! against, bit for bit where the arithmetic allows (NEON under qemu in `scripts/cross.sh`).
//! Work is split over a caller's thread pool ([`Parallel`]), so the engine runs these on the
//! same pool as its tensor library's own operations.
//!
//! The TurboQuant codec keeps its kernels in its own crate (`kvlab-turboquant`), in the same
//! style: it knows nothing of this one.

pub mod attention;
mod features;
mod parallel;
pub mod qmatmul;
#[cfg(test)]
mod test_rng;
pub mod vmath;

pub use features::{features, Features};
pub use parallel::{Parallel, Serial};

/// A kernel was called with shapes or a backend that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CpuError(pub String);

impl CpuError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, CpuError>;
