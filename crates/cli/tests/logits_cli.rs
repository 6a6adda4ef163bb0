//! `kvlab logits` on the tiny Gemma 3 golden fixture: the written all-position logits equal
//! the reference's within 1e-3, in one chunk and under the fixture's chunk schedule.

use std::path::PathBuf;
use std::process::Command;

use candle_core::{Device, Tensor};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/tiny_gemma3")
}

fn logits(extra: &[&str]) -> Tensor {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("logits.safetensors");
    let status = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .arg("logits")
        .arg("--model")
        .arg(fixture().join("model.safetensors"))
        .arg("--input-ids")
        .arg(fixture().join("golden.safetensors"))
        .arg("--out")
        .arg(&out)
        .args(extra)
        .status()
        .expect("run kvlab");
    assert!(status.success(), "kvlab logits failed: {status}");
    let mut t = candle_core::safetensors::load(&out, &Device::Cpu).expect("read output");
    t.remove("logits").expect("logits tensor")
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("diff")
}

fn golden(name: &str) -> Tensor {
    let mut g = candle_core::safetensors::load(fixture().join("golden.safetensors"), &Device::Cpu)
        .expect("golden");
    g.remove(name).expect("golden tensor")
}

#[test]
fn one_chunk_matches_the_full_reference() {
    let got = logits(&[]);
    assert_eq!(got.dims(), [40, 512]);
    let d = max_diff(&got, &golden("logits_full"));
    assert!(d <= 1e-3, "max |diff| {d}");
}

#[test]
fn the_fixture_schedule_matches_the_incremental_reference() {
    let got = logits(&["--schedule", "10,1,3,1,5"]);
    let d = max_diff(&got, &golden("logits_incremental"));
    assert!(d <= 1e-3, "max |diff| {d}");
}

#[test]
fn a_file_without_input_ids_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("x.safetensors");
    let output = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .arg("logits")
        .arg("--model")
        .arg(fixture().join("model.safetensors"))
        .arg("--input-ids")
        .arg(fixture().join("model.safetensors"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run kvlab");
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("input_ids"), "{err}");
    assert!(!out.exists());
}

#[test]
fn an_image_file_gives_the_references_logits_with_the_image() {
    // fixtures/vision/e: the E-style tiny Gemma 4 with its tower, and images/model.png, the
    // image its golden logits were computed over by transformers.
    let vision = fixture().join("../vision");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("logits.safetensors");
    let status = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .arg("logits")
        .arg("--model")
        .arg(vision.join("e"))
        .arg("--input-ids")
        .arg(vision.join("e/golden.safetensors"))
        .arg("--image")
        .arg(vision.join("images/model.png"))
        .arg("--out")
        .arg(&out)
        .status()
        .expect("run kvlab");
    assert!(status.success(), "kvlab logits --image failed: {status}");
    let got = candle_core::safetensors::load(&out, &Device::Cpu)
        .expect("read output")
        .remove("logits")
        .expect("logits");
    let want = candle_core::safetensors::load(vision.join("e/golden.safetensors"), &Device::Cpu)
        .expect("golden")
        .remove("logits")
        .expect("golden logits");
    let d = max_diff(&got, &want);
    assert!(d <= 1e-3, "max |diff| {d}");
}
