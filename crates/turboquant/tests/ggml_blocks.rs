//! llama.cpp's KV block types against ggml's own reference code: every row of
//! tests/fixtures/ggml/ggml_blocks.json (written by make_ggml_blocks.sh, which compiles
//! ggml-quants.c from the llama.cpp that llama-cpp-python 0.3.36 vendors) quantizes to the
//! reference's bytes and dequantizes to its floats, bit for bit, and its query quantizes and
//! dots with it to ggml's portable `vec_dot`'s float; and the Hadamard rotation equals
//! upstream's explicit matrix.

use kvlab_turboquant::ggml::{hadamard_rotate, BlockType, BLOCK};
use serde_json::Value;

fn fixture() -> Value {
    let text = include_str!("fixtures/ggml/ggml_blocks.json");
    serde_json::from_str(text).expect("ggml_blocks.json")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

#[test]
fn every_block_type_matches_ggmls_reference_bit_for_bit() {
    let fixture = fixture();
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    let mut checked = 0;
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let row = floats(&case["row"]);
        for t in BlockType::ALL {
            let want = &case["types"][t.name()];
            let bytes = hex(want["bytes"].as_str().expect("bytes"));
            let mut got = vec![0u8; t.row_bytes(row.len()).expect("row")];
            t.quantize_row(&row, &mut got).expect("quantize");
            for (b, (g, w)) in got
                .chunks(t.block_bytes())
                .zip(bytes.chunks(t.block_bytes()))
                .enumerate()
            {
                // A block of zeros has scale 0, and the reference leaves iq4_nl's codes there
                // unwritten (stack bytes): only its scale is compared.
                let zero_scale = w[0] == 0 && w[1] == 0;
                if t == BlockType::Iq4Nl && zero_scale {
                    assert_eq!(g[..2], w[..2], "{name}, {}: block {b}", t.name());
                } else {
                    assert_eq!(g, w, "{name}, {}: block {b}", t.name());
                }
            }
            let mut back = vec![0f32; row.len()];
            t.dequantize_row(&bytes, &mut back).expect("dequantize");
            let want_back = floats(&want["dequantized"]);
            for (j, (g, w)) in back.iter().zip(&want_back).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{name}, {}: [{j}] {g} != {w}",
                    t.name()
                );
            }
            // The query as ggml quantizes it for this key type, and the dot it gets.
            let query = floats(&case["query"]);
            let want_query = hex(want["query_bytes"].as_str().expect("query bytes"));
            let mut got_query = vec![0u8; t.query_bytes(query.len()).expect("query")];
            t.quantize_query(&query, &mut got_query)
                .expect("quantize the query");
            assert_eq!(got_query, want_query, "{name}, {}: query", t.name());
            let dot = t.dot(&bytes, &want_query).expect("dot");
            let want_dot = want["dot"].as_f64().expect("dot") as f32;
            assert_eq!(
                dot.to_bits(),
                want_dot.to_bits(),
                "{name}, {}: {dot} != {want_dot}",
                t.name()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, cases.len() * BlockType::ALL.len());
}

/// Upstream's matrix as llama-kv-cache.cpp builds it: H[0][0] = 1/√n, then each doubling
/// copies the block right and down and negates it on the diagonal.
fn explicit_hadamard(n: usize) -> Vec<f64> {
    let mut h = vec![0f64; n * n];
    h[0] = 1.0 / (n as f64).sqrt();
    let mut s = 1;
    while s < n {
        for i in 0..s {
            for j in 0..s {
                let v = h[i * n + j];
                h[(i + s) * n + j] = v;
                h[i * n + j + s] = v;
                h[(i + s) * n + j + s] = -v;
            }
        }
        s *= 2;
    }
    h
}

#[test]
fn the_rotation_is_upstreams_hadamard_matrix_and_its_own_inverse() {
    for n in [64usize, 256, 512] {
        let h = explicit_hadamard(n);
        let x: Vec<f32> = (0..2 * n)
            .map(|i| ((i * 7919 % 1000) as f32 / 100.0 - 5.0) * if i % 3 == 0 { 3.0 } else { 1.0 })
            .collect();
        let mut y = x.clone();
        hadamard_rotate(&mut y, n).expect("rotate");
        for (b, (xb, yb)) in x.chunks(n).zip(y.chunks(n)).enumerate() {
            let norm: f64 = xb.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
            for i in 0..n {
                let want: f64 = (0..n).map(|j| h[i * n + j] * f64::from(xb[j])).sum();
                let err = (f64::from(yb[i]) - want).abs();
                assert!(
                    err <= 1e-6 * norm,
                    "n {n}, block {b}, [{i}]: {} vs {want}",
                    yb[i]
                );
            }
        }
        let mut back = y.clone();
        hadamard_rotate(&mut back, n).expect("rotate back");
        for (a, b) in back.iter().zip(&x) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
    assert_eq!(BLOCK, 32);
}
