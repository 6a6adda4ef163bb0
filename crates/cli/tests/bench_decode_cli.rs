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

/// `--profile`: per decode token, one attention call per layer, one vocabulary projection and
/// one sampling step; the MoE model's routing once per layer; every figure non-negative, the
/// rows largest first with the unattributed rest (`other`) last, and their sum the phase's
/// wall time.
#[test]
fn the_profile_accounts_for_each_decode_step_and_adds_up_to_its_wall_time() {
    for (name, layers) in [("tiny_gemma3", 6.0), ("tiny_moe", 6.0)] {
        let dir = fixture(name);
        let out = Command::new(env!("CARGO_BIN_EXE_kvlab"))
            .args(["bench", "decode", "--device", "cpu", "--ctx", "12"])
            .args([
                "--decode",
                "6",
                "--sampling",
                "default",
                "--profile",
                "--json",
            ])
            .arg("--model")
            .arg(&dir)
            .output()
            .expect("run kvlab");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let rows = v["decode_profile"].as_array().expect("decode_profile");
        let row = |op: &str| {
            rows.iter()
                .find(|r| r["op"] == op)
                .unwrap_or_else(|| panic!("{name}: no `{op}` row in {rows:?}"))
        };
        let calls = |op: &str| row(op)["calls_per_token"].as_f64().unwrap();
        assert_eq!(calls("attention"), layers, "{name}");
        assert_eq!(calls("vocab projection"), 1.0, "{name}");
        assert_eq!(calls("sampling"), 1.0, "{name}");
        assert_eq!(calls("embedding"), 1.0, "{name}");
        if name == "tiny_moe" {
            assert_eq!(calls("moe routing"), layers);
        }
        assert_eq!(rows.last().unwrap()["op"], "other");
        let ms: Vec<f64> = rows
            .iter()
            .map(|r| r["ms_per_token"].as_f64().unwrap())
            .collect();
        assert!(ms.iter().all(|m| *m >= 0.0), "{rows:?}");
        assert!(
            ms[..ms.len() - 1].windows(2).all(|w| w[0] >= w[1]),
            "{rows:?}"
        );
        let total_ms = ms.iter().sum::<f64>() * 6.0;
        let wall_ms = 1e3 * v["decode_secs"].as_f64().unwrap();
        assert!(
            (total_ms - wall_ms).abs() <= 0.01 * wall_ms + 0.01,
            "{name}: rows add to {total_ms} ms, the decode took {wall_ms} ms"
        );
        // The prefill has its own profile: one chunk of 12 tokens, one vocabulary projection.
        let pre = v["prefill_profile"].as_array().expect("prefill_profile");
        let vp = pre.iter().find(|r| r["op"] == "vocab projection").unwrap();
        assert!((vp["calls_per_token"].as_f64().unwrap() - 1.0 / 12.0).abs() < 1e-9);
    }
}

/// `--text`: the prefill is the first `--ctx` tokens of a real text, tokenized by the GGUF's
/// own vocabulary; a text shorter than `--ctx` is refused with the counts.
#[test]
fn a_text_prefill_runs_the_texts_first_tokens_and_refuses_a_short_one() {
    let test = "a_text_prefill_runs_the_texts_first_tokens_and_refuses_a_short_one";
    let Some(model) = kvlab_assets::require_or_skip(test, "gemma3-270m") else {
        return;
    };
    if kvlab_assets::require_or_skip(test, "alice").is_none() {
        return;
    }
    let run = |ctx: &str| {
        Command::new(env!("CARGO_BIN_EXE_kvlab"))
            .args(["--threads", "2", "bench", "decode", "--text", "alice"])
            .args(["--ctx", ctx, "--decode", "2", "--json", "--model"])
            .arg(&model)
            .output()
            .expect("run kvlab")
    };
    let out = run("96");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["prefill_tokens"], 96);
    assert_eq!(v["decode_tokens"], 2);
    let out = run("10000000");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fewer than --ctx 10000000"), "{err}");
}

/// `--prefill-each`: every cache's own prefill timed in each round, the first's ratio one;
/// refused with a single SPEC.
#[test]
fn prefill_each_times_every_cache_in_every_round() {
    let dir = fixture("tiny_gemma3");
    let run = |kv: &str| {
        Command::new(env!("CARGO_BIN_EXE_kvlab"))
            .args(["bench", "decode", "--device", "cpu", "--ctx", "30"])
            .args(["--decode", "3", "--rounds", "2", "--prefill-each", "--json"])
            .arg("--model")
            .arg(&dir)
            .args(["--kv", kv])
            .output()
            .expect("run kvlab")
    };
    let out = run("f32,f16,tq4@all");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let secs = v["prefill_each_secs"].as_array().expect("per cache");
    assert_eq!(secs.len(), 3);
    for rounds in secs {
        let rounds = rounds.as_array().expect("rounds");
        assert_eq!(rounds.len(), 2);
        assert!(rounds.iter().all(|s| s.as_f64().is_some_and(|s| s > 0.0)));
    }
    let ratios = v["prefill_vs_first"].as_array().expect("ratios");
    assert_eq!(ratios[0], 1.0);
    assert!(ratios.iter().all(|r| r.as_f64().is_some_and(|r| r > 0.0)));
    let out = run("f16");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prefill-each compares"));
}
