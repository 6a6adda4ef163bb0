# Sourced by scripts/bench.sh and scripts/bench/*.sh: the `kvlab` they measure (KVLAB_BIN, a
# release build, built here unless the caller names one) and the GGUF files their model
# names stand for.

# Sets KVLAB_BIN, building the release CLI when it is not set.
kvlab_release() {
  if [ -z "${KVLAB_BIN:-}" ]; then
    say "building kvlab (release)"
    cargo build --release --quiet -p kvlab-cli
    KVLAB_BIN="$CARGO_TARGET_DIR/release/kvlab"
  fi
}

# A model name or path -> the GGUF file:
#   gemma3-270m   the offline Gemma 3 270M Q4_K_M (an asset)
#   e2b-q4_k_m    the shape-true Gemma 4 E2B, built once by scripts/bench/e2b_gguf.sh
#   e2b-q8_0
model_path() {
  case "$1" in
    gemma3-270m) "$KVLAB_BIN" assets path gemma3-270m ;;
    e2b-q4_k_m) "$ROOT/scripts/bench/e2b_gguf.sh" q4_k_m ;;
    e2b-q8_0) "$ROOT/scripts/bench/e2b_gguf.sh" q8_0 ;;
    *) echo "$1" ;;
  esac
}
