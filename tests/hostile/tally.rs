//! The tally line every hostile test prints for `scripts/hostile.sh`, one per fault fed:
//! `HOSTILE <fault> -> <code>`. It goes straight to the stderr handle, which the test harness
//! does not capture, so the line shows in the ordinary `cargo test` output and the tally
//! needs no second run.

use std::fmt::Display;
use std::io::Write;

/// Records that `fault` was fed and came back as `code`: an `ErrorCode`, or a word for a
/// fault that is survived without an error (`reloaded_whole`).
pub fn row(fault: &str, code: impl Display) {
    let line = format!("HOSTILE {fault} -> {code}\n");
    // One write per line, so lines of tests running in parallel do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
