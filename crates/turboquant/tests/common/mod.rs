//! Test helpers: random test vectors from the crate's seeded generator, on a stream of their
//! own so the data never shares draws with the rotations under test.
#![allow(dead_code)]

use kvlab_turboquant::Rng;

/// The test data stream ("TESTDATA").
const STREAM: u64 = 0x5445_5354_4441_5441;

pub struct TestRng(Rng);

impl TestRng {
    pub fn new(seed: u64) -> Self {
        TestRng(Rng::new(seed, STREAM))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    pub fn uniform(&mut self) -> f64 {
        self.0.uniform()
    }
    pub fn gaussian(&mut self) -> f64 {
        self.0.gaussian()
    }
    pub fn gaussian_vec(&mut self, d: usize) -> Vec<f32> {
        (0..d).map(|_| self.gaussian() as f32).collect()
    }
    pub fn unit_vec(&mut self, d: usize) -> Vec<f32> {
        let v = self.gaussian_vec(d);
        let n = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt() as f32;
        v.into_iter().map(|x| x / n).collect()
    }
}

pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

pub fn dist2(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum()
}
