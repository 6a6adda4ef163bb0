#!/usr/bin/env bash
# Builds KV Lab (release) and opens it on the default model. Extra arguments go to the app.
# Without a display (a headless Linux machine) the window opens inside Xvfb.
set -euo pipefail
source "$(dirname "$0")/common.sh"

"$ROOT/scripts/setup.sh" run
say "building the UI"
npm --prefix "$ROOT/ui" run --silent build >/dev/null
say "building the app (release)"
cargo build --release -p kvlab --features custom-protocol
APP="$CARGO_TARGET_DIR/release/kvlab-app"
say "starting KV Lab"
if [ "$(uname -s)" = Linux ] && [ -z "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
  say "no display: running inside Xvfb"
  exec xvfb-run -a -s "-screen 0 1440x900x24" "$APP" "$@"
fi
exec "$APP" "$@"
