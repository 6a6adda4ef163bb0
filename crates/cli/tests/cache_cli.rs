//! `kvlab chat --save-cache` then `--load-cache` on the offline Gemma 3 270M: a greedy run of
//! 24 tokens saved and continued for 16 prints exactly what one unbroken run of 40 prints
//! after its first 24, without reading the saved tokens again. One TurboQuant cache: every
//! precision's bit-identical restore and every refused file are the engine's tests
//! (crates/engine/tests/it/kv_persist.rs); this one proves the CLI's wiring, at 7 s a run.

use std::path::Path;
use std::process::Command;

const PROMPT: &str = "The keeper of the lighthouse";

/// The answer `kvlab chat` prints (without its final newline), and its stderr.
fn chat(model: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["--threads", "2", "chat", "--temp", "0"])
        .arg("--model")
        .arg(model)
        .args(extra)
        .output()
        .expect("run kvlab");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{extra:?}: {stderr}");
    let mut text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(text.pop(), Some('\n'));
    (text, stderr)
}

#[test]
fn a_saved_cache_continues_exactly_where_its_run_stopped() {
    let Some(model) = kvlab_assets::require_asset!("gemma3-270m") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kv = "tq3.5@all";
    let file = dir.path().join(format!("{kv}.kvc"));
    let file_arg = file.to_str().expect("utf-8 path");
    let (whole, _) = chat(
        &model,
        &["--kv", kv, "--prompt", PROMPT, "--max-tokens", "40"],
    );
    let (first, saved) = chat(
        &model,
        &[
            "--kv",
            kv,
            "--prompt",
            PROMPT,
            "--max-tokens",
            "24",
            "--save-cache",
            file_arg,
        ],
    );
    assert!(saved.contains("[saved 29 tokens"), "{saved}");
    // The precision comes from the file.
    let (rest, restored) = chat(
        &model,
        &[
            "--prompt",
            "",
            "--max-tokens",
            "16",
            "--load-cache",
            file_arg,
        ],
    );
    assert!(restored.contains("[restored 29 tokens"), "{restored}");
    // Only the one pending token was run before decoding: nothing was read again.
    assert!(restored.contains("[30 prompt (29 reused)"), "{restored}");
    // The base model continues the prompt, which the first run prints before its answer.
    assert_eq!(format!("{first}{rest}"), whole, "{kv}");
}
