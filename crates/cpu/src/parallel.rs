//! How kernels split work: the caller's pool runs `f` over disjoint ranges covering `0..n`.
//! The engine passes its tensor library's compute pool, so the kernels never compete with a
//! second set of threads for the same cores.

use std::ops::Range;

/// A pool that runs `f` over ranges that together cover `0..n` exactly once.
pub trait Parallel: Sync {
    /// Runs `f` on every index of `0..n`, in ranges, possibly at once on several threads.
    fn for_ranges(&self, n: usize, f: &(dyn Fn(Range<usize>) + Sync));
}

/// Everything on the calling thread (tests, and callers without a pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct Serial;

impl Parallel for Serial {
    fn for_ranges(&self, n: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        if n > 0 {
            f(0..n)
        }
    }
}
