//! The instruction sets this CPU runs, detected once per process: the one place that asks
//! the CPU (every kernel family chooses its backend from these).

use std::sync::OnceLock;

/// What the CPU runs (all false off its architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// AVX-512 foundation and byte/word instructions (x86-64).
    pub avx512: bool,
    /// AVX-512 VNNI integer dot products (x86-64).
    pub avx512_vnni: bool,
    /// AVX2 with FMA and F16C (x86-64).
    pub avx2: bool,
    /// BMI2's `pext` (x86-64).
    pub bmi2: bool,
    /// NEON (aarch64).
    pub neon: bool,
}

/// This CPU's features, read once.
pub fn features() -> &'static Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let avx512 = avx2 && has!("avx512f") && has!("avx512bw");
    Features {
        avx512,
        avx512_vnni: avx512 && has!("avx512vnni"),
        avx2,
        bmi2: has!("bmi2"),
        neon: false,
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Features {
    Features {
        neon: std::arch::is_aarch64_feature_detected!("neon"),
        ..Features::default()
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Features {
    Features::default()
}
