//! Measuring tools behind the `bench` cargo feature (what `kvlab bench` runs), kept out of
//! the app's build: the decode benchmark ([`decode`]), a loaded model against a golden
//! reference's logits ([`golden`]), and the quantized matmul kernels' timings.

pub mod decode;
pub mod golden;

pub use crate::qmatmul::bench::matmul_bench as bench_matmul;
