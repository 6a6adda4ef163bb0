//! Structured (non-random) inputs through the Hadamard rotation: why the random signs
//! before H matter, and what norm correction does for spikes.

use crate::prng::Rng;
use crate::rotation::{Hadamard, Rotation};
use crate::{Bits, Codec, Spec};

/// mean ‖x − x̂‖² / ‖x‖² over `xs`.
fn relative_mse(codec: &Codec, xs: &[Vec<f32>]) -> f64 {
    let mut block = codec.new_block();
    let mut s = codec.scratch();
    let mut y = vec![0.0; codec.dim()];
    let mut total = 0.0;
    for (t, x) in xs.iter().enumerate() {
        codec.encode(x, &mut block, &mut s).unwrap();
        codec.decode(&block, t, &mut y, &mut s).unwrap();
        let e: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum();
        let n: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        total += e / n;
    }
    total / xs.len() as f64
}

fn without_signs(mut codec: Codec) -> Codec {
    codec.rotation = Rotation::Hadamard(Hadamard::without_signs(codec.dim));
    codec
}

#[test]
fn constant_offset_needs_the_random_signs() {
    let d = 256;
    let mut rng = Rng::new(4, 4);
    // Offset 2 on every coordinate plus unit Gaussian noise: 80% of the energy is the offset.
    let xs: Vec<Vec<f32>> = (0..500)
        .map(|_| (0..d).map(|_| 2.0 + rng.gaussian() as f32).collect())
        .collect();
    let codec = Codec::new(d, Spec::mse(Bits::B3)).unwrap();
    let signed = relative_mse(&codec, &xs);
    let unsigned = relative_mse(&without_signs(codec), &xs);
    println!(
        "offset inputs, b=3: randomized Hadamard {signed:.4}, Hadamard without signs {unsigned:.4}"
    );
    assert!(signed < 0.05, "{signed}");
    assert!(unsigned > 0.5, "{unsigned}");
}

#[test]
fn one_hot_spikes() {
    let d = 256;
    let xs: Vec<Vec<f32>> = (0..d)
        .step_by(5)
        .map(|k| {
            let mut x = vec![0.0; d];
            x[k] = 7.0;
            x
        })
        .collect();
    let codec = Codec::new(d, Spec::mse(Bits::B3)).unwrap();
    let plain = relative_mse(&codec, &xs);
    let spec = Spec {
        norm_correction: true,
        unbiased: false,
        ..Spec::mse(Bits::B3)
    };
    let corrected = relative_mse(&Codec::new(d, spec).unwrap(), &xs);
    println!("one-hot inputs, b=3: plain {plain:.4}, norm-corrected {corrected:.2e}");
    assert!(plain < 0.065, "{plain}");
    // Every rotated coordinate is ±1/√d, all quantized to the same level: rescaling by the
    // stored n/‖c‖ recovers the vector up to the f16 rounding of the norm.
    assert!(corrected < 1e-5, "{corrected}");
}
