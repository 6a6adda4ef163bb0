//! The compute thread count is the caller's, for every pool candle computes on. One test: the
//! count is a process fact, and this binary is its own process.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use kvlab_engine::host::{compute_threads, set_compute_threads, ThreadsError};

/// Threads of this process whose name starts with `prefix` (Linux keeps them in /proc).
#[cfg(target_os = "linux")]
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with(prefix))
        .count()
}

#[test]
fn the_chosen_count_sizes_every_compute_pool() {
    assert_eq!(set_compute_threads(0), Err(ThreadsError::Zero));
    assert_eq!(compute_threads(), None);
    // Three: more than this 2-core machine's default, so it is our choice that shows.
    assert_eq!(set_compute_threads(3), Ok(3));
    assert_eq!(
        set_compute_threads(3),
        Ok(3),
        "the same choice again is fine"
    );
    assert_eq!(set_compute_threads(2), Err(ThreadsError::AlreadyChosen(3)));
    assert_eq!(compute_threads(), Some(3));
    assert_eq!(rayon::current_num_threads(), 3);

    // A one-row quantized matmul (a decode step's) starts candle's barrier pool: the calling
    // thread and two workers. Its result is checked too, so the pool did the work.
    let dev = Device::Cpu;
    let w = Tensor::randn(0f32, 1.0, (512, 256), &dev).unwrap();
    let x = Tensor::randn(0f32, 1.0, (1, 256), &dev).unwrap();
    let mm = QMatMul::from_qtensor(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap()).unwrap();
    let got = mm
        .forward(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let want = x
        .matmul(&w.t().unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    // Q8_0 rounds weights and the row to 8 bits: errors of ~1% of the output's range.
    assert!(
        worst < 0.03 * scale,
        "Q8_0 one-row matmul off by {worst} (outputs up to {scale})"
    );

    #[cfg(target_os = "linux")]
    {
        assert_eq!(
            threads_named("candle-bp-"),
            2,
            "candle's quantized-matmul workers"
        );
        assert_eq!(threads_named("kvlab-compute-"), 3, "rayon's global pool");
    }
}
