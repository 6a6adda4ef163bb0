//! Parallel maps for attention kernels, run on candle's barrier pool: the pool the quantized
//! matmuls of the same decode step run on. Its workers spin for a while after each matmul
//! before they sleep, so work handed to them right away starts at once; a second pool
//! (rayon's) would compete with those spinning workers for the same cores.

use std::sync::OnceLock;

/// `f` of every item, in order, computed on the compute pool (inline when called from one of
/// its workers). `init` makes per-worker state (a scratch buffer) once per run of items a
/// worker takes, not once per item.
pub fn map_on_compute_pool<I: Sync, O: Send + Sync, S>(
    items: &[I],
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &I) -> O + Sync,
) -> Vec<O> {
    let slots: Vec<OnceLock<O>> = items.iter().map(|_| OnceLock::new()).collect();
    candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
        let mut state = init();
        for i in range {
            let _ = slots[i].set(f(&mut state, &items[i]));
        }
    });
    // execute_chunked runs every index exactly once; were one missed, it is computed here
    // rather than lost.
    let mut state = None;
    slots
        .into_iter()
        .zip(items)
        .map(|(slot, item)| {
            slot.into_inner()
                .unwrap_or_else(|| f(state.get_or_insert_with(&init), item))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_mapped_once_in_order() {
        let items: Vec<u64> = (0..1000).collect();
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let inits = std::sync::atomic::AtomicUsize::new(0);
        let out = map_on_compute_pool(
            &items,
            || inits.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            |_, x| {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                x * x
            },
        );
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert_eq!(calls.into_inner(), 1000);
        // Per-worker state is made per run of items, far fewer times than there are items.
        let inits = inits.into_inner();
        assert!(inits >= 1 && inits < items.len(), "{inits} inits");
        assert!(map_on_compute_pool(&[] as &[u8], || (), |_, x| *x).is_empty());
    }
}
