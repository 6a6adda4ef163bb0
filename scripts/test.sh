#!/usr/bin/env bash
# Runs every KV Lab test: formatting and lints, Rust tests, UI checks and unit tests, and the
# end-to-end tests on the real built app under Xvfb. Installs what is missing first.
# Ends with one line "summary: N passed, N failed" and exits non-zero on any failure.
set -uo pipefail
source "$(dirname "$0")/common.sh"
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
failed_steps=()
step_times=()
RUN_START=$SECONDS

# step NAME CMD...: runs CMD, keeps its output for the summary, records its time and any
# failure.
step() {
  local name="$1" start=$SECONDS status=ok
  shift
  say "$name"
  if ! "$@" 2>&1 | tee "$LOGS/$name.log"; then
    failed_steps+=("$name")
    status=FAILED
  fi
  step_times+=("$(printf '%-12s %5ds  %s' "$name" $((SECONDS - start)) "$status")")
}

step setup "$ROOT/scripts/setup.sh" test
if [ ${#failed_steps[@]} -gt 0 ]; then echo "summary: 0 passed, 1 failed"; exit 1; fi
cd "$ROOT"
# clippy, installed by setup.sh, lints every build below (common.sh).
lint_while_building
if [ -z "${RUSTC_WORKSPACE_WRAPPER:-}" ]; then
  say "clippy-driver not found: rustup component add clippy"
  echo "summary: 0 passed, 1 failed"
  exit 1
fi

# deny_warnings CMD...: runs a cargo build and fails it when a workspace crate had warnings,
# lints included (clippy's `-D warnings`, without putting it in the build's flags, which would
# make every other script's build recompile the workspace). Cargo replays a crate's warnings
# when it is fresh, so a warm run fails on them too.
deny_warnings() {
  local out status
  out="$(mktemp)"
  "$@" 2>&1 | tee "$out"
  status=${PIPESTATUS[0]}
  if sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -qE '^warning: `[^`]+` \(.*\) generated [0-9]+ warnings?'; then
    say "the warnings above fail the build (clippy -D warnings)"
    status=1
  fi
  rm -f "$out"
  return "$status"
}
# Assets were fetched by setup.sh: tests that need the real model must not skip silently.
export KVLAB_REQUIRE_ASSETS=1
# One package list and feature set for the lints, tests and the app build (TEST_PACKAGES in
# common.sh), so every crate is compiled once (the CLI turns on kvlab-engine/lab; a build of
# the app alone would not); kvlab-engine/hub keeps the Hub code and its tests
# (crates/engine/tests/it/hub_download.rs) always compiled, linted and run.
FEATURES=("${TEST_PACKAGES[@]}")

step ui-build npm --prefix ui run --silent build
step fmt cargo fmt --all --check
# Every target compiled once, benches and examples included, and linted on the way.
step build deny_warnings cargo test --no-run --all-targets "${FEATURES[@]}"
# --no-fail-fast: every test binary runs, so the tally counts every failure, not the first.
step cargo-test cargo test --no-fail-fast "${FEATURES[@]}"
step aarch64-test "$ROOT/scripts/cross.sh" aarch64-test
step macos-check "$ROOT/scripts/cross.sh" macos-check
step ui-check npm --prefix ui run --silent check
step ui-test npm --prefix ui test
# The same packages and features as the test step, so the app build only links.
step app-build cargo build "${FEATURES[@]}"
# `kvlab serve` under the real openai client (tests/server), on the offline 270M.
KVLAB_BIN="$CARGO_TARGET_DIR/debug/kvlab"
step server-test env KVLAB_BIN="$KVLAB_BIN" \
  KVLAB_SERVE_MODEL="$("$KVLAB_BIN" assets path gemma3-270m)" \
  "$KVLAB_CACHE/openai-venv/bin/python" "$ROOT/tests/server/test_openai.py"
export KVLAB_APP_BIN="$CARGO_TARGET_DIR/debug/kvlab-app"
export KVLAB_E2E_ARTIFACTS="${KVLAB_E2E_ARTIFACTS:-$ROOT/tests/e2e/artifacts}"
step e2e xvfb-run -a -s "-screen 0 1440x900x24" npm --prefix tests/e2e test
# The hostile-input tally from the logs above (the hostile_* Rust tests ran in cargo-test,
# tests/e2e/hostile.test.mjs in e2e): nothing runs twice.
step hostile "$ROOT/scripts/hostile.sh" "$LOGS/cargo-test.log" "$LOGS/e2e.log"

# Count tests from each runner's own closing lines.
passed=0
failed=0
add() { passed=$((passed + ${1:-0})); failed=$((failed + ${2:-0})); }
while read -r p f; do add "$p" "$f"; done < <(
  grep -hoE 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$LOGS/cargo-test.log" 2>/dev/null |
    awk '{print $4, $6}')
ui_pass=$(sed 's/\x1b\[[0-9;]*m//g' "$LOGS/ui-test.log" 2>/dev/null | grep -oE 'Tests +[0-9]+ passed' | grep -oE '[0-9]+' || true)
ui_fail=$(sed 's/\x1b\[[0-9;]*m//g' "$LOGS/ui-test.log" 2>/dev/null | grep -oE 'Tests +.*[0-9]+ failed' | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || true)
add "${ui_pass:-0}" "${ui_fail:-0}"
e2e_pass=$(grep -oE '^ℹ pass [0-9]+' "$LOGS/e2e.log" 2>/dev/null | grep -oE '[0-9]+' || true)
e2e_fail=$(grep -oE '^ℹ fail [0-9]+' "$LOGS/e2e.log" 2>/dev/null | grep -oE '[0-9]+' || true)
add "${e2e_pass:-0}" "${e2e_fail:-0}"
# Python's unittest: "Ran N tests", then "OK" or "FAILED (failures=F, errors=E)".
py_ran=$(grep -oE '^Ran [0-9]+ tests?' "$LOGS/server-test.log" 2>/dev/null | grep -oE '[0-9]+' || true)
py_bad=$(grep -oE '^FAILED \(.*\)' "$LOGS/server-test.log" 2>/dev/null | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}' || true)
add $(( ${py_ran:-0} - ${py_bad:-0} )) "${py_bad:-0}"

say "step times"
printf '  %s\n' "${step_times[@]}"
printf '  %-12s %5ds\n' total $((SECONDS - RUN_START))
if [ ${#failed_steps[@]} -gt 0 ]; then
  say "failed steps: ${failed_steps[*]}"
  [ "$failed" -eq 0 ] && failed=${#failed_steps[@]}
  echo "summary: $passed passed, $failed failed"
  exit 1
fi
echo "summary: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
