//! How many cores the engine computes on: chosen once per process, by the caller, before the
//! first model op.
//!
//! candle runs CPU kernels on two process-wide pools, each sized once, at first use, from the
//! environment: the barrier pool of the quantized matmuls (`CANDLE_NUM_THREADS`, else
//! `RAYON_NUM_THREADS`, else the physical cores) and rayon's global pool, which the dense
//! matmuls (gemm, split by `RAYON_NUM_THREADS`) and our own kernels use. So the count is a
//! process fact, not a per-model one: [`set_compute_threads`] sets all three and refuses a
//! second, different choice instead of silently keeping the first.
//!
//! Why it matters: a decode step is hundreds of short parallel ops, and each one ends at a
//! barrier. When another process holds one of the cores (the app's own webview rendering the
//! streamed tokens, a compile, a browser), every barrier waits for the descheduled worker, and
//! decode falls to a fraction of its quiet speed. A desktop app therefore computes on one core
//! fewer than the machine has ([`desktop_default`]).

use std::sync::OnceLock;

use thiserror::Error;

/// Why the thread count could not be chosen.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ThreadsError {
    /// Zero threads.
    #[error("the engine needs at least one compute thread")]
    Zero,
    /// Chosen before, differently: candle's pools are sized once per process.
    #[error(
        "compute threads were already set to {0} for this process (candle sizes its pools once)"
    )]
    AlreadyChosen(usize),
    /// rayon's global pool was started before the choice, at another size.
    #[error("rayon's thread pool was started with {started} threads before {wanted} were chosen")]
    TooLate {
        /// The pool's size.
        started: usize,
        /// The count asked for.
        wanted: usize,
    },
}

static CHOSEN: OnceLock<usize> = OnceLock::new();

/// The machine's physical cores (hyper-threads not counted), at least one.
pub fn physical_cores() -> usize {
    sysinfo::System::physical_core_count()
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1)
}

/// The desktop app's count: the physical cores minus one for the webview and the rest of the
/// desktop, at least one.
pub fn desktop_default() -> usize {
    physical_cores().saturating_sub(1).max(1)
}

/// The count `KVLAB_THREADS` asks for, if it is set to a positive number.
pub fn from_env() -> Option<usize> {
    std::env::var("KVLAB_THREADS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&n| n > 0)
}

/// Sets the compute threads of this process to `n`: candle's quantized-matmul pool, its dense
/// matmul split and rayon's global pool. Call it first thing in `main`, before any other
/// thread starts (it sets environment variables) and before the first model op. Choosing the
/// same count again is fine; another count is an error.
pub fn set_compute_threads(n: usize) -> Result<usize, ThreadsError> {
    if n == 0 {
        return Err(ThreadsError::Zero);
    }
    let chosen = *CHOSEN.get_or_init(|| {
        let count = n.to_string();
        // Read by candle when its pools start (they have not: this runs before any model op).
        std::env::set_var("CANDLE_NUM_THREADS", &count);
        std::env::set_var("RAYON_NUM_THREADS", &count);
        n
    });
    if chosen != n {
        return Err(ThreadsError::AlreadyChosen(chosen));
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("kvlab-compute-{i}"))
        .build_global();
    let started = rayon::current_num_threads();
    if built.is_err() && started != n {
        return Err(ThreadsError::TooLate { started, wanted: n });
    }
    Ok(n)
}

/// The compute threads chosen for this process, if [`set_compute_threads`] ran.
pub fn compute_threads() -> Option<usize> {
    CHOSEN.get().copied()
}
