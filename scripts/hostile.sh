#!/usr/bin/env bash
# The hostile-input tally (issue 14). Every hostile test feeds one fault and prints one line,
#   HOSTILE <fault> -> <outcome>
# where <outcome> is the ErrorCode it came back as, or a word for a fault survived without an
# error (reloaded_whole, not_run, not_followed, blocked_by_csp). Rust tests are named
# `hostile_*` and write the line to the stderr handle, which libtest does not capture (see
# tests/hostile/tally.rs), so it shows in an ordinary `cargo test` run; the end-to-end file
# tests/e2e/hostile.test.mjs writes it to stdout.
#
#   scripts/hostile.sh LOG...  tallies the lines in logs a test run already wrote; this is how
#                              scripts/test.sh calls it, with its cargo-test and e2e logs, so
#                              nothing runs twice
#   scripts/hostile.sh         runs the Rust hostile tests (and tests/e2e/hostile.test.mjs when
#                              KVLAB_APP_BIN names a built app), then tallies them
#
# Prints one line per fault, then "N hostile inputs tried, M coded errors, K handled without
# an error, C crashes". A crash is a hostile test that failed: a fault that was not turned into
# its code. Exits non-zero on any crash, and when an expected row (EXPECTED below) is missing.
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

# Rows that must be there: "SOURCE|text in the fault|outcome". SOURCE is rust or e2e; e2e
# rows are required only when an e2e log is tallied. Each part of issue 14 adds its rows.
EXPECTED=(
  "rust|compare fit below 2 bits everywhere|invalid_request"
  "rust|compare fit of 0 bytes|invalid_request"
  "rust|image a PNG header of 100000×100000|invalid_request"
  "rust|image a decompression bomb|invalid_request"
  "rust|image a truncated PNG|invalid_request"
  "rust|image a PNG that lies about its size|invalid_request"
  "rust|image an animated GIF of 10000 frames|first_frame"
  "rust|an image that cannot be read or was never added|bad_image"
  "rust|an image for a model without a vision tower|bad_image"
  "rust|image a truncated PNG through the reader child|bad_image"
  "rust|image a PNG header of 100000×100000 through the reader child|bad_image"
  "rust|image a decompression bomb through the reader child|bad_image"
  "rust|image a text file named .png through the reader child|bad_image"
  "rust|image of 3000 pixels a side past a 2048 limit|bad_image"
  "rust|a remote image URL|invalid_request"
  "rust|an image data URL that is not base64|invalid_request"
  "rust|a truncated PNG as a data URL|bad_image"
  "rust|an image past --max-image-side|bad_image"
  "rust|deep-recursion.pdf|document_crashed"
  "rust|endless-loop.pdf|document_timeout"
  "rust|inflate-bomb.pdf|document_out_of_memory"
  "rust|empty.txt|document_empty"
  "rust|notes.txt|document_binary"
  "rust|scan.pdf|pdf_unreadable"
  "rust|latin1.txt|document_not_utf8"
  "rust|huge.txt|document_too_large"
  "rust|SIGKILL|reloaded_whole"
  "rust|session file truncated.json|session_corrupt"
  "rust|session file garbage.json|session_corrupt"
  "rust|full disk|disk_full"
  "rust|gguf tensor count over the file's length|bad_model_file"
  "rust|gguf metadata string longer than the file|bad_model_file"
  "rust|gguf tensor dimensions that overflow|bad_model_file"
  "rust|gguf tensor offset past the end of the file|bad_model_file"
  "rust|gguf tokenizer scores fewer than its tokens|bad_model_file"
  "rust|safetensors header over its 100 MB limit|bad_model_file"
  "rust|safetensors tensor shape larger than its byte span|bad_model_file"
  "rust|config whose MLP width contradicts the tensors|bad_model_file"
  "rust|NaN in a weight|non_finite_logits"
  "rust|mutated tiny GGUF headers|bad_model_file"
  "rust|mutated safetensors headers|bad_model_file"
  "rust|mutated real Gemma 3 270M GGUF headers|bad_model_file"
  "rust|arbitrary KV code block bytes|truncated_block"
  "rust|hub 401|hub_auth"
  "rust|hub 403|hub_auth"
  "rust|hub 404|model_not_found"
  "rust|hub 429 with Retry-After|hub_rate_limited"
  "rust|hub 5xx after retries|hub_unavailable"
  "rust|hub body shorter than Content-Length|download_incomplete"
  "rust|hub wrong sha256|download_corrupt"
  "rust|hub disk full mid-download|disk_full"
  "rust|generation under churn|no_corruption"
  "rust|model load larger than memory|out_of_memory"
  "rust|context growth larger than memory|out_of_memory"
  "rust|cache switch larger than memory|out_of_memory"
  "rust|cache file truncated|cache_corrupt"
  "rust|cache file flipped byte in a layer section|cache_corrupt"
  "rust|cache file future format version|cache_mismatch"
  "rust|cache file header says a section of 1 TiB|cache_corrupt"
  "rust|cache file header length past the file|cache_corrupt"
  "rust|cache file from another model|cache_mismatch"
  "rust|cache file of another policy|cache_mismatch"
  "rust|cache switch to a SPEC that names no cache|invalid_request"
  "rust|default cache to a SPEC that names no cache|invalid_request"
  "rust|model load to a SPEC that names no cache|invalid_request"
  "rust|saved cache the engine did not write, dropped 3x|left_in_place"
  "rust|cache file save, SIGKILL|reloaded_whole"
  "rust|chat template: syntax|bad_chat_template"
  "rust|chat template: endless loop|bad_chat_template"
  "rust|chat template: recursion|bad_chat_template"
  "rust|chat template: huge output|bad_chat_template"
  "rust|pool KV budget smaller than one conversation|out_of_memory"
  "rust|no room on disk for a spill|dropped_and_read_again"
  "rust|corrupt spill file|read_again"
  "rust|16 clients at once|all_served"
  "rust|client that leaves mid-prefill|cancelled"
  "rust|panic in a request's step on the engine thread|internal"
  "rust|header says a rewind margin of 2^64-1 tokens|cache_corrupt"
  "rust|hub commit id ../../escaped|network"
  "rust|max_tokens of 1e9|capped"
  "rust|prompt over the server's --ctx|context_overflow"
  "rust|262 KB chat message|context_overflow"
  "rust|requests past a full queue while the engine is held|queue_full"
  "rust|16 queued clients that leave|places_freed"
  "rust|half a request head, then nothing|connection_closed"
  "rust|a body that stops after 12 of 100 bytes|request_timeout"
  "rust|Content-Length of 10 GiB|request_too_large"
  "rust|connections over the limit|too_many_connections"
  "rust|24 bodies of 8.3 MB at once|busy"
  "rust|unknown field of 7.9 MB|skipped"
  "rust|kv_cache SPEC of 7.9 MB|invalid_request"
  "rust|2 MB prompt|context_overflow"
  "rust|stop (Ctrl-C, the app's switch) with a stream open|cancelled"
  "rust|61 reads of GET /v1/kv|no_side_effects"
  "rust|60 requests refused while rendered|context_overflow"
  "rust|/v1/completions with \"prompt\": []|invalid_request"
  "rust|400 requests refused out_of_memory|out_of_memory"
  "rust|40 one-turn conversations under a budget of three|bounded"
  "rust|another client's conversation named, guessed or listed|isolated"
  "rust|empty conversation name|invalid_request"
  "rust|owner's cache demoted by another client|undone"
  "rust|one client with 20 long streams|queue_full"
  "rust|64 clients streaming at once, bounded memory|shared_steps_or_queue_full"
  "rust|one client's 7 streams beside another's|one_token_each_per_step"
  "rust|a cache file the server did not write, disk budget spent|kept"
  "rust|conversation idle past --idle-ttl|spilled"
  "rust|8 bodies of 8 MB sent a byte every 0.5 s|request_timeout"
  "rust|GET /v1/kv with 40 other clients' conversations|bounded"
  "rust|a stream waiting for a place|first_byte"
  "rust|idle connections holding every place|shed"
  "rust|one client opening 530 conversations|own_forgotten"
  "rust|a client that stops reading its answers|closed"
  "rust|gguf with a NaN weight scale|bad_model_file"
  "rust|gguf with a NaN rope_freq_base|bad_model_file"
  "rust|schema of 770 KiB|invalid_request"
  "rust|schema with a 10k-member enum|bounded"
  "rust|schema nested 2000 deep|invalid_request"
  "rust|recursive schema|bounded"
  "rust|schema with a blow-up regex|bounded"
  "rust|schema with a broken regex|invalid_request"
  "rust|request schema of 848 KiB|invalid_request"
  "rust|request forcing a tool it does not offer|invalid_request"
  "rust|response_format schema nested 600 deep|invalid_request"
  "rust|tool_choice required on a model without tools|invalid_request"
  "rust|129 tools|invalid_request"
  "rust|tool call arguments that are not JSON|invalid_request"
  "rust|response_format enum of 10k members|bounded"
  "e2e|message with <script>|not_run"
  "e2e|message with <img onerror>|not_run"
  "e2e|message with javascript: link|not_run"
  "e2e|message with data: link|not_run"
  "e2e|message with SVG with script|not_run"
  "e2e|message with markdown image off-machine|not_run"
  "e2e|link clicks|not_followed"
  "e2e|injected into the DOM|blocked_by_csp"
  "e2e|truncated, found at start|session_corrupt"
  "e2e|deep-recursion.pdf dropped on the window|document_crashed"
  "e2e|endless-loop.pdf dropped on the window|document_timeout"
)

logs=("$@")
if [ ${#logs[@]} -eq 0 ]; then
  RUN="$(mktemp -d)"
  trap 'rm -rf "$RUN"' EXIT
  say "hostile tests (Rust)"
  cargo test "${TEST_PACKAGES[@]}" hostile_ 2>&1 | tee "$RUN/cargo-test.log"
  logs+=("$RUN/cargo-test.log")
  if [ -n "${KVLAB_APP_BIN:-}" ]; then
    say "hostile tests (end to end)"
    (cd tests/e2e && xvfb-run -a -s "-screen 0 1440x900x24" node --test --test-reporter=spec \
      --test-reporter-destination=stdout hostile.test.mjs) 2>&1 | tee "$RUN/e2e.log"
    logs+=("$RUN/e2e.log")
  fi
fi

# The ErrorCode vocabulary, from the generated bindings (the engine's enum), and the server's
# own HTTP codes (kvlab_server::error::HttpCode).
codes=" $(grep -E '^export type ErrorCode = ' ui/src/lib/bindings.ts | grep -oE '"[a-z0-9_]+"' | tr -d '"' | tr '\n' ' ') "
codes+="$(grep -oE 'HttpCode::[A-Za-z]+ => "[a-z_]+"' crates/server/src/error.rs | grep -oE '"[a-z_]+"' | tr -d '"' | tr '\n' ' ') "
# A row may follow libtest's "test NAME ... " on the same line (parallel tests share the
# terminal's lines, and a row goes straight to stderr): it is taken from where it starts.
rows="$(cat "${logs[@]}" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | grep -oE 'HOSTILE .+ -> [a-z0-9_]+$' || true)"
e2e_tallied=0
grep -qE '^(ℹ tests|# tests) ' "${logs[@]}" 2>/dev/null && e2e_tallied=1

say "hostile inputs"
tried=0 coded=0 handled=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  fault="${line#HOSTILE }"
  outcome="${fault##* -> }"
  fault="${fault% -> *}"
  tried=$((tried + 1))
  if [[ "$codes" == *" $outcome "* ]]; then coded=$((coded + 1)); else handled=$((handled + 1)); fi
  printf '  %-78s → %s\n' "$fault" "$outcome"
done <<<"$rows"

# Crashes: hostile Rust tests that failed, and failing tests of the hostile e2e file.
failed_rust="$(cat "${logs[@]}" 2>/dev/null | grep -oE '^test [^ ]*hostile_[^ ]* \.\.\. FAILED' | cut -d' ' -f2 || true)"
failed_e2e="$(cat "${logs[@]}" 2>/dev/null | grep -oE '^test at hostile\.test\.mjs:[0-9]+' || true)"
crashes=$(printf '%s\n%s\n' "$failed_rust" "$failed_e2e" | grep -c . || true)
[ -n "$failed_rust$failed_e2e" ] && printf '  failed: %s\n' $failed_rust $failed_e2e

missing=()
for want in "${EXPECTED[@]}"; do
  IFS='|' read -r source text outcome <<<"$want"
  [ "$source" = e2e ] && [ "$e2e_tallied" -eq 0 ] && continue
  if ! grep -F -- "$text" <<<"$rows" | grep -qE -- " -> $outcome\$"; then missing+=("$text -> $outcome"); fi
done

echo "$tried hostile inputs tried, $coded coded errors, $handled handled without an error, $crashes crashes"
if [ ${#missing[@]} -gt 0 ]; then
  say "missing rows:"
  printf '  %s\n' "${missing[@]}"
fi
[ "$crashes" -eq 0 ] && [ ${#missing[@]} -eq 0 ] && [ "$tried" -gt 0 ]
