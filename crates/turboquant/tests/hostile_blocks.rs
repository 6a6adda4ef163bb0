//! The block decoder fed arbitrary bytes: a stored block of any length and content either
//! rebuilds (whole records) or is `TruncatedBlock`, never a panic; a rebuilt block serializes
//! back to the same bytes; and the fast scoring and accumulation kernels agree with the
//! decode-then-compute oracle on every bit pattern (non-finite exactly where the oracle is).
//! Named `hostile_*` with a `HOSTILE <fault> -> <code>` line for the tally. Fixed seed and
//! `KVLAB_HOSTILE_CASES` cases (default 256); `KVLAB_HOSTILE_SEED=random` for fresh ones.

mod common;

// HOSTILE lines go to the stderr handle itself, which libtest does not capture, so
// scripts/hostile.sh finds them in an ordinary `cargo test` log.
use std::cell::Cell;
use std::io::Write as _;

use common::TestRng;
use kvlab_turboquant::{Bits, CodeBlock, Codec, Error, RotationKind, Spec, Variant};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed, TestRunner};

fn config() -> Config {
    let cases = std::env::var("KVLAB_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let rng_seed = match std::env::var("KVLAB_HOSTILE_SEED").as_deref() {
        Ok("random") => RngSeed::Random,
        Ok(v) => RngSeed::Fixed(v.parse().unwrap_or(14)),
        Err(_) => RngSeed::Fixed(14),
    };
    Config {
        cases,
        rng_seed,
        // Relative to the package root, where cargo runs tests.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/hostile_blocks.proptest-regressions",
        ))),
        ..Config::default()
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    let bits = [
        Bits::B1,
        Bits::B2,
        Bits::B2_5,
        Bits::B3,
        Bits::B3_5,
        Bits::B4,
    ];
    (0..bits.len(), any::<bool>(), any::<bool>(), any::<u64>())
        .prop_map(move |(b, prod, haar, seed)| {
            let bits = bits[b];
            let prod = prod && matches!(bits, Bits::B1 | Bits::B2 | Bits::B3 | Bits::B4);
            Spec {
                bits,
                variant: if prod { Variant::Prod } else { Variant::Mse },
                rotation: if haar {
                    RotationKind::Haar
                } else {
                    RotationKind::Hadamard
                },
                norm_correction: false,
                unbiased: false,
                seed,
            }
        })
        .prop_filter("a valid spec", |s| s.validate().is_ok())
}

/// Oracle and kernel agree: both non-finite, or within a tolerance scaled by the magnitudes.
fn close(fast: f32, oracle: f32, scale: f64) -> bool {
    if !oracle.is_finite() || !fast.is_finite() {
        return oracle.is_finite() == fast.is_finite();
    }
    f64::from((fast - oracle).abs()) <= 1e-3 * scale + 1e-4
}

#[test]
fn hostile_arbitrary_block_bytes_decode_or_are_truncated_block() {
    let mut runner = TestRunner::new(config());
    let (tried, truncated) = (Cell::new(0u32), Cell::new(0u32));
    // A quarter of the blocks carry a torn record.
    let extra = prop_oneof![3 => Just(0usize), 1 => 1usize..4];
    let strategy = (spec(), 3usize..70, any::<u64>(), 0usize..6, extra);
    let result = runner.run(&strategy, |(spec, d, seed, records, extra)| {
        let codec = Codec::new(d, spec).expect("valid spec");
        let stride = codec.bytes_per_vector();
        let mut rng = TestRng::new(seed);
        let len = records * stride + extra;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        tried.set(tried.get() + 1);
        let block = match CodeBlock::from_bytes(&codec, &bytes) {
            Err(Error::TruncatedBlock { len: l, stride: s }) => {
                prop_assert!(extra % stride != 0, "whole records refused");
                prop_assert_eq!((l, s), (len, stride));
                truncated.set(truncated.get() + 1);
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
            Ok(b) => b,
        };
        prop_assert_eq!(extra % stride, 0);
        prop_assert_eq!(block.len(), len / stride);
        prop_assert_eq!(block.to_bytes(), bytes);
        let q = rng.gaussian_vec(d);
        let qn = q.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        let fast = codec.scores_vec(&q, &block).expect("scores");
        let oracle = codec.scores_reference(&q, &block).expect("oracle");
        let mut x = vec![0.0; d];
        let mut s = codec.scratch();
        for t in 0..block.len() {
            codec.decode(&block, t, &mut x, &mut s).expect("decode");
            let xn = x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
            prop_assert!(
                close(fast[t], oracle[t], qn * xn),
                "record {t}: kernel {} vs oracle {}",
                fast[t],
                oracle[t]
            );
        }
        let w: Vec<f32> = (0..block.len()).map(|_| rng.uniform() as f32).collect();
        let acc = codec.accumulate_vec(&w, &block).expect("accumulate");
        let acc_oracle = codec.accumulate_reference(&w, &block).expect("oracle");
        let scale = acc_oracle
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
        for (a, o) in acc.iter().zip(&acc_oracle) {
            prop_assert!(close(*a, *o, scale.max(1.0)), "accumulate {a} vs {o}");
        }
        Ok(())
    });
    let _ = std::io::stderr().lock().write_all(
        format!(
            "{}\n",
            format_args!(
                "HOSTILE arbitrary KV code block bytes: {} blocks, {} truncated -> truncated_block",
                tried.get(),
                truncated.get()
            )
        )
        .as_bytes(),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
