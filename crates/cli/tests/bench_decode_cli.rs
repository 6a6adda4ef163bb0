//! `kvlab bench decode --golden` on the tiny golden fixtures, as the macOS workflow's Metal
//! smoke run uses it: a faithful cache passes and reports what it ran on, a coarse one fails.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures")
        .join(name)
}

fn bench(name: &str, extra: &[&str]) -> Output {
    let dir = fixture(name);
    Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args([
            "bench", "decode", "--device", "cpu", "--ctx", "12", "--decode", "4",
        ])
        .arg("--model")
        .arg(&dir)
        .arg("--golden")
        .arg(dir.join("golden.safetensors"))
        .args(extra)
        .output()
        .expect("run kvlab")
}

#[test]
fn a_faithful_cache_matches_the_goldens_and_says_what_it_ran() {
    for name in ["tiny_gemma3", "tiny_moe"] {
        let out = bench(name, &["--kv", "f32", "--json"]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["kv"], "f32");
        assert_eq!(v["dtype"], "f32");
        assert_eq!(v["decode_tokens"], 4);
        let g = &v["golden"];
        assert_eq!(g["tokens"], 40);
        for k in ["full_max_abs_diff", "incremental_max_abs_diff"] {
            let d = g[k].as_f64().expect(k);
            assert!((0.0..=1e-3).contains(&d), "{name} {k}: {d}");
        }
        assert_eq!(g["top1_agreement"], 1.0);
    }
}

#[test]
fn a_coarse_cache_fails_the_golden_check() {
    let out = bench("tiny_gemma3", &["--kv", "tq2@all"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("differ from the golden"), "{err}");
    // A bad SPEC is refused before anything runs.
    let out = bench("tiny_gemma3", &["--kv", "tq9"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad --kv"));
}
