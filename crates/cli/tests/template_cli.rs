//! `kvlab template` on GGUF files converted by llama.cpp's own converter (each carries its
//! family's published template as `tokenizer.chat_template`): the printed prompt equals the
//! reference (jinja2) rendering of that template for every conversation of `cases.json`, the
//! stop set is the file's and the family's, and a base model's conversation stays plain text.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures")
}

/// `kvlab template` on `gguf` for `messages`; returns stdout, or panics with stderr.
fn template(gguf: &Path, messages: &serde_json::Value, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("messages.json");
    std::fs::write(&file, messages.to_string()).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["template", "--model"])
        .arg(gguf)
        .arg("--messages")
        .arg(&file)
        .args(extra)
        .output()
        .expect("run kvlab");
    assert!(
        out.status.success(),
        "kvlab template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn converted_ggufs_print_the_reference_rendering_of_their_own_template() {
    let cases: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("templates/cases.json")).expect("cases"),
    )
    .expect("json");
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("templates/expected.json")).expect("expected"),
    )
    .expect("json");
    // The fixture and the template make_gguf.py gave it.
    for (fixture, tmpl) in [
        ("tiny_e", "g4_e2b_jul14"),
        ("tiny_dense", "g4_31b_jul14"),
        ("tiny_gemma3", "gemma3_it"),
    ] {
        let gguf = fixtures().join(format!("gguf/{fixture}.f16.gguf"));
        for c in &cases {
            let name = c["name"].as_str().expect("name");
            // The command always asks for the generation prompt; these cases do not. Nor does
            // it offer tools (the engine's template tests render those cases).
            if c["add_generation_prompt"] == false || c.get("tools").is_some() {
                continue;
            }
            let want = &expected[tmpl][name];
            let Some(want) = want["text"].as_str() else {
                continue; // the template refuses it: covered by the engine's tests
            };
            let think: &[&str] = if c["enable_thinking"] == true {
                &["--think"]
            } else {
                &[]
            };
            if fixture == "tiny_gemma3" && !think.is_empty() {
                continue; // Gemma 3 has no thinking mode (refused before rendering)
            }
            assert_eq!(
                template(&gguf, &c["messages"], think),
                want,
                "{fixture} / {name}"
            );
        }
    }
}

#[test]
fn the_stop_set_is_the_files_and_the_familys() {
    let msgs = serde_json::json!([{"role": "user", "content": "Hi"}]);
    let stops = |fixture: &str| -> Vec<u64> {
        let out = template(
            &fixtures().join(format!("gguf/{fixture}.f16.gguf")),
            &msgs,
            &["--json"],
        );
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        v["stops"]
            .as_array()
            .expect("stops")
            .iter()
            .map(|s| s["id"].as_u64().expect("id"))
            .collect()
    };
    let g4 = stops("tiny_e");
    assert!(
        g4.contains(&1) && g4.contains(&106) && g4.contains(&50),
        "{g4:?}"
    );
    assert_eq!(stops("tiny_gemma3"), [1, 106]);
}

#[test]
fn the_base_270m_still_continues_text() {
    let Some(gguf) = kvlab_assets::require_asset!("gemma3-270m") else {
        return;
    };
    let msgs = serde_json::json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "The capital of France is"}
    ]);
    assert_eq!(
        template(&gguf, &msgs, &[]),
        "<bos>Be brief.\n\nThe capital of France is"
    );
    let v: serde_json::Value =
        serde_json::from_str(&template(&gguf, &msgs, &["--json"])).expect("json");
    assert!(v["template"].is_null(), "{v}");
    assert_eq!(v["ids"][0], 2);
}
