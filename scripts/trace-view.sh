#!/usr/bin/env bash
# Look at a delegation tree as one trace: installs Arize Phoenix (an OTLP-native trace viewer)
# into a temporary virtualenv, starts it on 127.0.0.1, runs the narrated demo and a small load
# run exporting their spans to it, and takes a screenshot of the demo's trace with headless
# Chromium.
#
#   scripts/trace-view.sh            # prints the screenshot's path, then stops Phoenix
#   KEEP=1 scripts/trace-view.sh     # leaves Phoenix running for a person to browse
#
# Not part of `cargo test`: it needs PyPI, and Debian's `chromium` (apt-get install chromium)
# for the screenshot. SUBAGENTS=<path> uses that binary instead of building
# `target/release/subagents`; PHOENIX_PORT (6006) and OUT (trace.png) may be set.
set -euo pipefail

PHOENIX_VERSION=20.26.1

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
WORK=$(mktemp -d -t subagents-trace-view.XXXXXX)
PORT=${PHOENIX_PORT:-6006}
OUT=${OUT:-$PWD/trace.png}
PHOENIX_PID=

cleanup() {
    if [[ ${KEEP:-0} != 1 && -n $PHOENIX_PID ]]; then
        kill "$PHOENIX_PID" 2>/dev/null || true
        wait "$PHOENIX_PID" 2>/dev/null || true
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

step() { printf '== %s\n' "$*" >&2; }

if [[ -z ${SUBAGENTS:-} ]]; then
    step "building subagents (release)"
    cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
    SUBAGENTS=$ROOT/target/release/subagents
fi

step "installing arize-phoenix==$PHOENIX_VERSION into $WORK/venv"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet "arize-phoenix==$PHOENIX_VERSION"

step "starting Phoenix on http://127.0.0.1:$PORT"
mkdir -p "$WORK/phoenix"
# Its gRPC receiver on a port of its own, so that nothing else on 4317 is in the way.
PHOENIX_WORKING_DIR=$WORK/phoenix PHOENIX_HOST=127.0.0.1 PHOENIX_PORT=$PORT \
    PHOENIX_GRPC_PORT=$((PORT + 1)) "$WORK/venv/bin/phoenix" serve > "$WORK/phoenix.log" 2>&1 &
PHOENIX_PID=$!
for _ in $(seq 120); do
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/" && break
    kill -0 "$PHOENIX_PID" 2>/dev/null || { cat "$WORK/phoenix.log" >&2; exit 1; }
    sleep 0.5
done

step "running the demo and a small load with their spans exported to Phoenix"
ENDPOINT=http://127.0.0.1:$PORT
(cd "$WORK" && "$SUBAGENTS" demo --store memory --otlp-endpoint "$ENDPOINT" > demo.txt)
(cd "$WORK" && "$SUBAGENTS" load --store memory --roots 2 --children 10 \
    --otlp-endpoint "$ENDPOINT" > load.txt)

# The demo's trace: the one whose root is the `subagents demo` span (Phoenix's REST API).
TRACE=
for _ in $(seq 40); do
    TRACE=$(curl -sf "http://127.0.0.1:$PORT/v1/projects/default/spans?limit=1000" | python3 -c '
import json, sys
spans = json.load(sys.stdin)["data"]
print(next((s["context"]["trace_id"] for s in spans if s["name"] == "subagents demo"), ""))
' || true)
    [[ -n $TRACE ]] && break
    sleep 0.5
done
[[ -n $TRACE ]] || { echo "Phoenix never received the demo's trace" >&2; exit 1; }
PROJECT=$(curl -sf "http://127.0.0.1:$PORT/v1/projects" | python3 -c '
import json, sys
print(next(p["id"] for p in json.load(sys.stdin)["data"] if p["name"] == "default"))')
URL="http://127.0.0.1:$PORT/projects/$PROJECT/traces/$TRACE"

if command -v chromium > /dev/null; then
    step "taking a screenshot of $URL"
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,1100 \
        --virtual-time-budget=15000 --screenshot="$OUT" "$URL" 2> "$WORK/chromium.log"
    echo "screenshot: $OUT"
else
    echo "no chromium here (apt-get install chromium): open the trace in a browser instead" >&2
fi
echo "trace: $URL"
if [[ ${KEEP:-0} == 1 ]]; then
    echo "Phoenix keeps running (pid $PHOENIX_PID, data in $WORK); kill it when done"
fi
