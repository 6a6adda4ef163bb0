#!/usr/bin/env bash
# Installs what KV Lab needs, and does nothing for what is already there.
#   scripts/setup.sh run    system libraries, Rust and npm packages, the offline model
#   scripts/setup.sh test   the same, plus Xvfb, WebKitWebDriver, tauri-driver, test assets
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODE="${1:-run}"

APT_RUN=(libwebkit2gtk-4.1-dev libgtk-3-dev librsvg2-dev libayatana-appindicator3-dev libxdo-dev
  libssl-dev build-essential pkg-config curl file xvfb xauth fonts-dejavu-core)
APT_TEST=(webkit2gtk-driver imagemagick)
# scripts/cross.sh aarch64-test: a cross linker and libc for aarch64 Linux, and qemu to run it.
APT_CROSS=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
# scripts/cross.sh: the standard libraries of the aarch64 Linux and Apple Silicon targets.
RUST_CROSS_TARGETS=(aarch64-unknown-linux-gnu aarch64-apple-darwin)
TAURI_DRIVER_VERSION=2.1.0

install_system_packages() {
  case "$(uname -s)" in
    Linux)
      if ! command -v apt-get >/dev/null; then
        say "not a Debian/Ubuntu system: install WebKitGTK 4.1, GTK 3 and Xvfb with your package manager"
        return 0
      fi
      local wanted=("${APT_RUN[@]}") missing=()
      [ "$MODE" = test ] && wanted+=("${APT_TEST[@]}")
      [ "$MODE" = test ] && [ "$(uname -m)" = x86_64 ] && wanted+=("${APT_CROSS[@]}")
      for pkg in "${wanted[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
      done
      if [ ${#missing[@]} -gt 0 ]; then
        say "installing system packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
      fi
      ;;
    Darwin)
      xcode-select -p >/dev/null 2>&1 || { say "run: xcode-select --install"; exit 1; }
      ;;
  esac
}

install_rust() {
  if ! command -v cargo >/dev/null; then
    say "Rust is missing: install it with rustup (https://rustup.rs), then run this again"
    exit 1
  fi
  rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
}

install_rust_targets() {
  local installed missing=()
  installed="$(rustup target list --installed 2>/dev/null)"
  for t in "${RUST_CROSS_TARGETS[@]}"; do
    grep -qx "$t" <<<"$installed" || missing+=("$t")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "adding Rust targets: ${missing[*]}"
    rustup target add "${missing[@]}"
  fi
}

install_tauri_driver() {
  [ "$(uname -s)" = Linux ] || return 0
  if command -v tauri-driver >/dev/null && tauri-driver --help >/dev/null 2>&1; then return 0; fi
  say "installing tauri-driver $TAURI_DRIVER_VERSION (once)"
  cargo install tauri-driver --version "$TAURI_DRIVER_VERSION" --locked --quiet
}

# Reports the free disk where builds go (a cold test run writes about 10 GB there), and
# drops incremental caches left by builds made before CARGO_INCREMENTAL=0 (common.sh).
check_disk() {
  mkdir -p "$CARGO_TARGET_DIR"
  rm -rf "$CARGO_TARGET_DIR"/debug/incremental "$CARGO_TARGET_DIR"/*/debug/incremental
  local free_kb
  free_kb="$(df -Pk "$CARGO_TARGET_DIR" | awk 'NR == 2 {print $4}')"
  say "free disk for builds ($CARGO_TARGET_DIR): $((free_kb / 1048576)) GB"
  if [ "$free_kb" -lt $((4 * 1048576)) ]; then
    # A warning, not a failure: a warm run writes little. A cold one will not fit.
    say "warning: less than 4 GB free; a cold build needs about 10 GB (\"No space left on device\")"
  fi
}

# tests/server/test_openai.py: the real `openai` client in its own venv, kept in the cache
# (wheels too), reinstalled only when tests/server/requirements.txt changes.
install_openai_client() {
  local venv="$KVLAB_CACHE/openai-venv" req="$ROOT/tests/server/requirements.txt"
  if [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/requirements.txt"; then return 0; fi
  say "installing the openai client into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --cache-dir "$KVLAB_CACHE/pip" -r "$req"
  cp "$req" "$venv/requirements.txt"
}

# Runs "$@" in the background, its output kept in a log that `wait_all` shows; the installs
# below are independent of each other and mostly wait on the network.
BG_LOGS="$(mktemp -d)"
trap 'rm -rf "$BG_LOGS"' EXIT
bg_pids=()
bg_names=()
in_background() {
  local name="$1"
  shift
  ("$@") >"$BG_LOGS/$name.log" 2>&1 &
  bg_pids+=("$!")
  bg_names+=("$name")
}

# Waits for every background install, prints each one's output, and fails if any failed.
wait_all() {
  local i failed=0
  for i in "${!bg_pids[@]}"; do
    local status=0
    wait "${bg_pids[$i]}" || status=$?
    cat "$BG_LOGS/${bg_names[$i]}.log" >&2
    if [ "$status" -ne 0 ]; then
      say "${bg_names[$i]} failed"
      failed=1
    fi
  done
  return "$failed"
}

fetch_assets() {
  say "fetching the offline assets (model, tokenizer, texts) into $KVLAB_CACHE/assets"
  # The small kvlab-assets crate alone (no candle, no engine): the engine and the CLI are
  # built once, later, with the test or app features.
  cargo run --quiet -p kvlab-assets -- fetch
}

check_disk
install_system_packages
install_rust
lint_while_building
command -v npm >/dev/null || { say "Node.js 20+ and npm are required"; exit 1; }
# Side by side: a cold CI machine spent 218 s here one after another. The two compiles
# (tauri-driver, the asset fetcher) share the cores; the rest is downloads.
in_background ui-npm npm_ci "$ROOT/ui"
in_background assets fetch_assets
if [ "$MODE" = test ]; then
  in_background tauri-driver install_tauri_driver
  in_background rust-targets install_rust_targets
  in_background e2e-npm npm_ci "$ROOT/tests/e2e"
  in_background openai install_openai_client
fi
wait_all
