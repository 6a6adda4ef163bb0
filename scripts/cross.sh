#!/usr/bin/env bash
# Checks for the platforms KV Lab's users run, from this Linux x86-64 machine. scripts/test.sh
# runs both; scripts/setup.sh test installs what they need (cross compiler, qemu, targets).
#   scripts/cross.sh aarch64-test   the tests of the two crates that hold NEON code, the codec
#                                   (kvlab-turboquant) and the CPU kernels (kvlab-cpu), built
#                                   for aarch64 Linux and run under qemu-aarch64: this proves
#                                   the NEON kernels bit for bit against their portable
#                                   references (emulated timings say nothing about speed on
#                                   Apple hardware). The engine calls those kernels and holds
#                                   no NEON code of its own, so it is not built for aarch64
#                                   here: that build of candle and the rest took ~5 minutes.
#   scripts/cross.sh macos-check    clippy -D warnings for aarch64-apple-darwin with Metal on
#                                   the codec, the engine and the CLI (checked, never linked)
# The cargo linker and runner are set here, not in a committed .cargo/config, so ordinary
# builds are untouched.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

AARCH64=aarch64-unknown-linux-gnu
MACOS=aarch64-apple-darwin

need() {
  command -v "$1" >/dev/null || { say "$1 is missing: run scripts/setup.sh test"; exit 1; }
}

need_target() {
  rustup target list --installed | grep -qx "$1" || { say "Rust target $1 is missing: run scripts/setup.sh test"; exit 1; }
}

aarch64_test() {
  local t=()
  case "$(uname -m)" in
    aarch64 | arm64)
      # An ARM host (a Mac, an ARM Linux box) runs the same tests natively.
      ;;
    *)
      need aarch64-linux-gnu-gcc
      need qemu-aarch64
      need_target "$AARCH64"
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
      # C code in dependencies (built by cc-rs) gets the cross compiler too.
      export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
      export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
      t=(--target "$AARCH64")
      ;;
  esac
  # Every test of both crates, doc tests included: their backend tests assert NEON ran.
  cargo test ${t[@]+"${t[@]}"} -p kvlab-turboquant -p kvlab-cpu
}

macos_check() {
  need_target "$MACOS"
  # The app package (`-p kvlab`) is left out: its dependencies' build scripts need the macOS
  # SDK. objc2-exception-helper (objc2's `exception` feature, enabled by wry) compiles
  # Objective-C with `cc -arch arm64`, which gcc rejects; with clang as the C compiler it
  # passes, and then aws-lc-sys (rustls' crypto, via hf-hub's HTTP client) compiles C
  # against the SDK's libc headers and CoreServices, which only Xcode ships. For the same
  # reason kvlab-engine's `hub` feature is not enabled here. The macOS workflow
  # (.github/workflows/macos.yml) builds the app on a real Mac.
  cargo clippy --target "$MACOS" -p kvlab-turboquant -p kvlab-cpu -p kvlab-engine -p kvlab-cli \
    --features kvlab-engine/metal --all-targets -- -D warnings
}

case "${1:-}" in
  aarch64-test) aarch64_test ;;
  macos-check) macos_check ;;
  *)
    echo "usage: $0 aarch64-test|macos-check" >&2
    exit 2
    ;;
esac
