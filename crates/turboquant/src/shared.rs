//! Seeded dense matrices (a Haar rotation, a QJL sketch) built once per process and shared by
//! every codec of the same kind, dimension and seed, within a byte budget.
//!
//! Building one costs O(d³) (the rotation's Gram–Schmidt) or d² Gaussian draws, and every
//! layer's codec of a cache asks for the same matrix; without sharing each held its own copy.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

/// Bytes of matrices kept alive by the cache itself (codecs keep theirs regardless).
const BUDGET: usize = 64 << 20;
/// Larger matrices (a dense part above 2048 dimensions) are built for each codec, not kept:
/// one would crowd out every other.
const LARGEST: usize = BUDGET / 4;

/// What a matrix is, so a rotation and a sketch of one (dim, seed) never collide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Haar,
    Qjl,
}

type Key = (Kind, usize, u64);
/// Oldest first; evicted from the front once the budget is exceeded.
type Cache = Mutex<VecDeque<(Key, Arc<[f32]>)>>;

/// The matrix of `kind` for (`dim`, `seed`), from the cache or from `build` (run outside the
/// lock, so codecs of other shapes are not held up by it).
pub(crate) fn matrix(
    kind: Kind,
    dim: usize,
    seed: u64,
    build: impl FnOnce() -> Vec<f32>,
) -> Arc<[f32]> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(VecDeque::new()));
    let key = (kind, dim, seed);
    let find = |entries: &VecDeque<(Key, Arc<[f32]>)>| {
        entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, m)| m.clone())
    };
    // A poisoned lock only means another thread panicked while holding it; the entries are
    // whole values, so the list is still consistent.
    if let Some(m) = find(&cache.lock().unwrap_or_else(|e| e.into_inner())) {
        return m;
    }
    let built: Arc<[f32]> = build().into();
    if bytes(&built) > LARGEST {
        return built;
    }
    let mut entries = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = find(&entries) {
        return m; // built meanwhile by another thread: one copy stays shared
    }
    entries.push_back((key, built.clone()));
    let mut held: usize = entries.iter().map(|(_, m)| bytes(m)).sum();
    while held > BUDGET {
        match entries.pop_front() {
            Some((_, m)) => held -= bytes(&m),
            None => break,
        }
    }
    built
}

fn bytes(m: &[f32]) -> usize {
    std::mem::size_of_val(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_build_per_key_and_kinds_kept_apart() {
        let mut builds = 0;
        let a = matrix(Kind::Haar, 7, 991, || {
            builds += 1;
            vec![1.0; 49]
        });
        let b = matrix(Kind::Haar, 7, 991, || {
            builds += 1;
            vec![2.0; 49]
        });
        assert_eq!(builds, 1);
        assert!(Arc::ptr_eq(&a, &b));
        let c = matrix(Kind::Qjl, 7, 991, || vec![3.0; 49]);
        assert_eq!(c[0], 3.0);
        let d = matrix(Kind::Haar, 7, 992, || vec![4.0; 49]);
        assert_eq!(d[0], 4.0);
    }

    #[test]
    fn matrices_over_the_limit_are_not_kept() {
        let n = LARGEST / 4 + 1;
        let mut builds = 0;
        for _ in 0..2 {
            let m = matrix(Kind::Qjl, 1 << 20, 5, || {
                builds += 1;
                vec![0.0; n]
            });
            assert_eq!(m.len(), n);
        }
        assert_eq!(builds, 2);
    }
}
