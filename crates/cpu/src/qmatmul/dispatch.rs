//! Which backend runs, chosen once per process from the CPU's features (tests ask for each
//! one by name), and the one `match` from a runtime format to a kernel compiled for it.

use std::ops::Range;
use std::sync::OnceLock;

use super::activation::{quantize_blocks_body, QuantizedActs};
use super::format::QFormat;
use super::layout::Layout;
use super::{Out, F4K, F5K, F6K, Q40, Q50, Q80};

/// A kernel family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// AVX-512 with VNNI (x86-64).
    Avx512Vnni,
    /// AVX2 with FMA and F16C (x86-64).
    Avx2,
    /// NEON (aarch64).
    Neon,
    /// Plain Rust, anywhere.
    Portable,
}

impl Backend {
    /// Whether this CPU runs `self`.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512Vnni => super::avx512::available(),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => super::avx2::available(),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => crate::features().neon,
            Backend::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest backend this CPU runs (`KVLAB_QMATMUL=portable|avx2|…` may ask for a
    /// slower one, to compare them).
    pub fn best() -> Backend {
        static BEST: OnceLock<Backend> = OnceLock::new();
        *BEST.get_or_init(|| {
            let forced = std::env::var("KVLAB_QMATMUL").ok().and_then(|s| {
                [
                    Backend::Avx512Vnni,
                    Backend::Avx2,
                    Backend::Neon,
                    Backend::Portable,
                ]
                .into_iter()
                .find(|b| b.name() == s.trim())
            });
            match forced {
                Some(b) if b.available() => b,
                _ => [Backend::Avx512Vnni, Backend::Avx2, Backend::Neon]
                    .into_iter()
                    .find(|b| b.available())
                    .unwrap_or(Backend::Portable),
            }
        })
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Avx512Vnni => "avx512vnni",
            Backend::Avx2 => "avx2",
            Backend::Neon => "neon",
            Backend::Portable => "portable",
        }
    }
}

/// Runs `backend`'s kernel for `lay.format` over `tiles` × `rows`.
///
/// # Safety
/// `backend.available()`; `data` laid out by `lay`; `out` as the kernels require.
pub(crate) unsafe fn run(
    backend: Backend,
    lay: &Layout,
    data: &[u8],
    acts: &QuantizedActs,
    rows: Range<usize>,
    tiles: Range<usize>,
    out: Out,
) {
    macro_rules! with_format {
        ($backend:ident) => {
            match lay.format {
                QFormat::Q4_0 => super::$backend::run::<Q40>(lay, data, acts, rows, tiles, out),
                QFormat::Q5_0 => super::$backend::run::<Q50>(lay, data, acts, rows, tiles, out),
                QFormat::Q8_0 => super::$backend::run::<Q80>(lay, data, acts, rows, tiles, out),
                QFormat::Q4K => super::$backend::run::<F4K>(lay, data, acts, rows, tiles, out),
                QFormat::Q5K => super::$backend::run::<F5K>(lay, data, acts, rows, tiles, out),
                QFormat::Q6K => super::$backend::run::<F6K>(lay, data, acts, rows, tiles, out),
            }
        };
    }
    match backend {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512Vnni => with_format!(avx512),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => with_format!(avx2),
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => with_format!(neon),
        _ => super::portable::run(lay, data, acts, rows, tiles, out),
    }
}

/// [`quantize_blocks_body`] compiled for the widest vectors this CPU has.
pub(crate) fn quantize_blocks(x: &[f32], a: &mut QuantizedActs) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn wide(x: &[f32], a: &mut QuantizedActs) {
            quantize_blocks_body(x, a)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow(x: &[f32], a: &mut QuantizedActs) {
            quantize_blocks_body(x, a)
        }
        match Backend::best() {
            // SAFETY: the backend's availability implies these features.
            Backend::Avx512Vnni => return unsafe { wide(x, a) },
            Backend::Avx2 => return unsafe { narrow(x, a) },
            _ => {}
        }
    }
    quantize_blocks_body(x, a)
}
