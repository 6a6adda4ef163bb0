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

/// llama.cpp's block types as keys: one q8-quantized query dotted with 4096 keys of 256
/// (q8_0 and q4_0 in AVX2 where the CPU has it, the others portable), beside the dense f16
/// scores over the same keys.
fn bench_ggml(c: &mut Criterion) {
    use kvlab_turboquant::ggml::BlockType;
    let (d, keys) = (256usize, 4096usize);
    let xs = values(d * keys, 1);
    let q = values(d, 2);
    let mut group = c.benchmark_group("ggml_scores_d256");
    group.throughput(Throughput::Elements(keys as u64));
    for t in [
        BlockType::Q8_0,
        BlockType::Q4_0,
        BlockType::Q5_0,
        BlockType::Q4_1,
    ] {
        let row = t.row_bytes(d).unwrap();
        let mut k = vec![0u8; row * keys];
        for (x, out) in xs.chunks(d).zip(k.chunks_mut(row)) {
            t.quantize_row(x, out).unwrap();
        }
        let mut qq = vec![0u8; t.query_bytes(d).unwrap()];
        t.quantize_query(&q, &mut qq).unwrap();
        let mut out = vec![0.0f32; keys];
        group.bench_function(t.name(), |b| {
            b.iter(|| {
                for (o, kr) in out.iter_mut().zip(k.chunks(row)) {
                    *o = t.dot(kr, &qq).unwrap();
                }
            })
        });
    }
    let keys16: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
    let mut out = vec![0.0; keys];
    group.bench_function("f16_baseline", |b| {
        b.iter(|| baseline::f16_scores(&q, &keys16, &mut out))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench, bench_decode_group, bench_ggml
}
criterion_main!(benches);
