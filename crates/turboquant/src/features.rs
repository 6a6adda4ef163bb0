//! The one place this crate asks the CPU what it runs: every kernel choice (TurboQuant's
//! scores, sums and encoder, ggml blocks' dots and value sums, the f16 baseline) reads these
//! answers, and the tests' caps ([`force_portable`], [`force_avx2`]) lower them for all of
//! them at once. The standard library caches the detection itself.

use std::sync::atomic::{AtomicU8, Ordering};

/// Highest backend tests allow: 0 = any, 1 = at most AVX2 (x86), 2 = portable only.
static CAP: AtomicU8 = AtomicU8::new(0);

/// Test hook: route every kernel to portable code (backends agree, so flipping this
/// concurrently only changes which path computes a result).
pub(crate) fn force_portable(on: bool) {
    CAP.store(if on { 2 } else { 0 }, Ordering::Relaxed);
}

/// Test hook: never use AVX-512 (exercises the AVX2 kernels on AVX-512 machines).
pub(crate) fn force_avx2(on: bool) {
    CAP.store(if on { 1 } else { 0 }, Ordering::Relaxed);
}

fn cap() -> u8 {
    CAP.load(Ordering::Relaxed)
}

/// AVX-512F (TurboQuant's x86 kernels, ggml blocks' 16-lane value sums).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512() -> bool {
    cap() == 0 && std::arch::is_x86_feature_detected!("avx512f")
}

/// AVX2 and FMA together (every AVX2 kernel here uses both).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    cap() <= 1
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
}

/// AVX-512 with BMI2: the TurboQuant encoder's SIMD path.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_bmi2() -> bool {
    avx512() && std::arch::is_x86_feature_detected!("bmi2")
}

/// AVX-512 VNNI and VL beside AVX2: ggml blocks' eight-query dot kernel.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_vnni() -> bool {
    avx512()
        && avx2()
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// NEON on a little-endian aarch64 build (the only one the NEON kernels are compiled for).
#[cfg(all(
    target_arch = "aarch64",
    target_feature = "neon",
    target_endian = "little"
))]
pub(crate) fn neon() -> bool {
    cap() < 2 && std::arch::is_aarch64_feature_detected!("neon")
}
