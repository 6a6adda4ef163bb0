//! Criterion benchmarks: encode, compressed scores / accumulate, and the dense f16 baseline.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use kvlab_turboquant::{baseline, Bits, Codec, Spec};

/// Deterministic pseudo-random values in [−1, 1) (benchmarks need no statistics).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = kvlab_turboquant::Rng::new(seed, 0);
    (0..n).map(|_| rng.symmetric()).collect()
}

fn bench(c: &mut Criterion) {
    let d = 256;
    let keys = 32 * 1024;
    let xs = values(d * keys, 1);
    let q = values(d, 2);
    let mut g = c.benchmark_group("d256");
    g.throughput(Throughput::Elements(keys as u64));
    for bits in [Bits::B2, Bits::B3, Bits::B4] {
        let codec = Codec::new(d, Spec::mse(bits)).unwrap();
        g.bench_with_input(
            BenchmarkId::new("encode_batch", bits.value()),
            &bits,
            |b, _| {
                b.iter(|| {
                    let mut block = codec.new_block();
                    codec.encode_batch(&xs, &mut block).unwrap();
                    block
                })
            },
        );
        let mut block = codec.new_block();
        codec.encode_batch(&xs, &mut block).unwrap();
        let mut scratch = codec.scratch();
        let mut out = vec![0.0; keys];
        g.bench_with_input(BenchmarkId::new("scores", bits.value()), &bits, |b, _| {
            b.iter(|| codec.scores(&q, &block, &mut scratch, &mut out).unwrap())
        });
        let w = values(keys, 3);
        let mut acc = vec![0.0; d];
        g.bench_with_input(
            BenchmarkId::new("accumulate", bits.value()),
            &bits,
            |b, _| {
                b.iter(|| {
                    codec
                        .accumulate(&w, &block, &mut scratch, &mut acc)
                        .unwrap()
                })
            },
        );
    }
    let keys16: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
    let mut out = vec![0.0; keys];
    g.bench_function("scores_f16_baseline", |b| {
        b.iter(|| baseline::f16_scores(&q, &keys16, &mut out))
    });
    g.finish();
}

/// A decode step's shape in Gemma 4 E2B: a group of 8 query heads over one kv head, a full
/// layer (head dim 512, 4096 keys) and a sliding one (256, 512 keys), 4-bit codes.
fn bench_decode_group(c: &mut Criterion) {
    let g = 8;
    let mut group = c.benchmark_group("decode_group8");
    for (d, keys) in [(512usize, 4096usize), (256, 512)] {
        let codec = Codec::new(d, Spec::mse(Bits::B4)).unwrap();
        let mut block = codec.new_block();
        codec
            .encode_batch(&values(d * keys, 1), &mut block)
            .unwrap();
        let queries = values(d * g, 2);
        let weights = values(keys * g, 3);
        let mut scratch = codec.scratch();
        let mut out = vec![0.0; g * keys];
        let mut acc = vec![0.0; g * d];
        let id = format!("d{d}_keys{keys}");
        group.bench_function(BenchmarkId::new("scores_multi", &id), |b| {
            b.iter(|| {
                codec
                    .scores_multi(&queries, &block, &mut scratch, &mut out)
                    .unwrap()
            })
        });
        group.bench_function(BenchmarkId::new("accumulate_multi", &id), |b| {
            b.iter(|| {
                codec
                    .accumulate_multi(&weights, &block, &mut scratch, &mut acc)
                    .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench, bench_decode_group
}
criterion_main!(benches);
