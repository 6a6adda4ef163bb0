# Shared settings for KV Lab's scripts (sourced, not run).
# Downloads and build outputs live outside the clone so repeated runs are fast.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KVLAB_CACHE="${KVLAB_CACHE:-$HOME/.cache/kvlab}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KVLAB_CACHE/target}"
# No incremental caches in scripted builds: they roughly double the target dir (about 5 GB
# here) and only help the edit-compile loop, which these scripts never run. A CI run once
# failed with a full disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export PATH="$HOME/.cargo/bin:$PATH"

# One package list and feature set for clippy, tests and the app build (scripts/test.sh), so
# every crate is compiled once; scripts/hostile.sh runs its tests with the same.
# kvlab-engine/hub: the app enables it anyway; named so the Hub download code and its tests
# are always compiled, linted and run. kvlab-turboquant/bench: the codec's criterion bench,
# compiled and linted here (and nowhere else in a test run).
TEST_PACKAGES=(-p kvlab -p kvlab-cli -p kvlab-engine -p kvlab-turboquant -p kvlab-cpu -p kvlab-assets -p kvlab-server --features kvlab/custom-protocol,kvlab-engine/hub,kvlab-turboquant/bench)

# Clippy lints the workspace's crates while they compile (as `cargo clippy` runs its driver
# over a check build), so scripts/test.sh's one build serves the lints, the tests and the app:
# a separate `cargo clippy` compiled every dependency a second time and took ~7 minutes on a
# bare machine. Every script builds with it, so all share one build (the driver is part of a
# crate's fingerprint: a build without it recompiles the workspace's crates). Its findings are
# warnings; scripts/test.sh fails on any. Called again once setup.sh has installed clippy.
lint_while_building() {
  local driver
  driver="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)"
  if [ -n "$driver" ] && [ -x "$driver" ]; then
    export RUSTC_WORKSPACE_WRAPPER="$driver"
  fi
}
lint_while_building

say() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }

# Runs a command as root, through sudo when we are not root already.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# npm ci, skipped when node_modules already matches package-lock.json.
npm_ci() {
  local dir="$1" stamp="$1/node_modules/.kvlab-lock-sha256" want
  want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "npm ci in ${dir#"$ROOT"/}"
  (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
  echo "$want" >"$stamp"
}
