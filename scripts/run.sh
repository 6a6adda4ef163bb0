#!/usr/bin/env bash
# Builds KV Lab and opens it on the default model. Extra arguments go to the app.
# Without a display (a headless Linux machine) the window opens inside Xvfb.
set -euo pipefail
source "$(dirname "$0")/common.sh"

"$ROOT/scripts/setup.sh" run
lint_while_building
say "building the UI"
npm --prefix "$ROOT/ui" run --silent build >/dev/null
# The dev profile already optimizes the engine, the codec and every dependency, and shares its
# build with scripts/test.sh (the same packages and features, TEST_PACKAGES: after a test run
# this only links); KVLAB_PROFILE=release builds a fully optimized binary instead.
PROFILE="${KVLAB_PROFILE:-dev}"
say "building the app ($PROFILE profile)"
cargo build --profile "$PROFILE" "${TEST_PACKAGES[@]}"
if [ "$PROFILE" = dev ]; then APP="$CARGO_TARGET_DIR/debug/kvlab-app"; else APP="$CARGO_TARGET_DIR/$PROFILE/kvlab-app"; fi
# The app links no asset code: it learns its default model (the offline Gemma 3 270M) here.
if [ -z "${KVLAB_DEFAULT_MODEL:-}" ]; then
  KVLAB_DEFAULT_MODEL="$(cargo run --quiet -p kvlab-assets -- path gemma3-270m)" || KVLAB_DEFAULT_MODEL=""
  export KVLAB_DEFAULT_MODEL
fi
say "starting KV Lab"
if [ "$(uname -s)" = Linux ] && [ -z "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
  say "no display: running inside Xvfb"
  exec xvfb-run -a -s "-screen 0 1440x900x24" "$APP" "$@"
fi
exec "$APP" "$@"
