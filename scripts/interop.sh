#!/usr/bin/env bash
# Proof against the real products: the out-of-process providers driven against the official
# TypeScript ACP SDK, the real Codex app-server and the real Claude Code CLI.
#
#   scripts/interop.sh
#
# Not part of `cargo test`: it needs the npm registry. Into a temporary directory it installs,
# at the pinned versions below, Node from npm and the real packages, then runs every check with
# a throwaway HOME and no credential anywhere: Codex and Claude Code talk to a fake model
# endpoint on 127.0.0.1 (scripts/interop/fake_model.py). It prints a table of pass/fail, checks
# that no child process outlived its run, and exits 1 if anything failed.
#
# SUBAGENTS=<path> uses that binary instead of building `target/release/subagents`;
# KEEP=1 keeps the temporary directory (its fake-model.log lists every model request).
set -euo pipefail

NODE_VERSION=22.23.3
ACP_SDK_VERSION=2.4.0
CODEX_VERSION=0.171.0
CLAUDE_CODE_VERSION=2.1.332

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
WORK=$(mktemp -d -t subagents-interop.XXXXXX)
PREFIX=$WORK/prefix
RESULTS=$WORK/results.jsonl
FAKE_PID=

cleanup() {
    [[ -n $FAKE_PID ]] && kill "$FAKE_PID" 2>/dev/null || true
    if [[ ${KEEP:-0} == 1 ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

step() { printf '== %s\n' "$*" >&2; }

# --- the binary under test --------------------------------------------------------------------
if [[ -z ${SUBAGENTS:-} ]]; then
    step "building subagents (release)"
    cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
    SUBAGENTS=$ROOT/target/release/subagents
fi

# --- the real packages, pinned ----------------------------------------------------------------
step "installing node@$NODE_VERSION @agentclientprotocol/sdk@$ACP_SDK_VERSION" \
    "@openai/codex@$CODEX_VERSION @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
mkdir -p "$PREFIX"
# Exact versions, and the two install scripts the packages need (node fetches its platform's
# binary, Claude Code links its native executable) allowed by name.
cat > "$PREFIX/package.json" <<EOF
{
  "private": true,
  "dependencies": {
    "node": "$NODE_VERSION",
    "@agentclientprotocol/sdk": "$ACP_SDK_VERSION",
    "@openai/codex": "$CODEX_VERSION",
    "@anthropic-ai/claude-code": "$CLAUDE_CODE_VERSION"
  },
  "allowScripts": { "node": true, "@anthropic-ai/claude-code": true }
}
EOF
(cd "$PREFIX" && npm install --no-audit --no-fund --loglevel=error >&2)
export PATH="$PREFIX/node_modules/.bin:$PATH"
NODE=$PREFIX/node_modules/.bin/node
cp "$HERE"/interop/*.mjs "$PREFIX/"
step "node $("$NODE" --version), $(codex --version), claude $(claude --version)"

# --- a throwaway HOME, and the fake model ------------------------------------------------------
export HOME=$WORK/home
mkdir -p "$HOME"
python3 "$HERE/interop/fake_model.py" --port-file "$WORK/port" --log "$WORK/fake-model.log" &
FAKE_PID=$!
for _ in $(seq 100); do [[ -s $WORK/port ]] && break; sleep 0.1; done
PORT=$(cat "$WORK/port")
CWD=$WORK/cwd
mkdir -p "$CWD"

# One Codex home per behaviour of the fake: the provider passes CODEX_HOME through its overlay.
for mode in ok unauthorized hang tool; do
    mkdir -p "$WORK/codex-$mode"
    cat > "$WORK/codex-$mode/config.toml" <<EOF
model = "interop-model"
model_provider = "interop"

[model_providers.interop]
name = "interop"
base_url = "http://127.0.0.1:$PORT/$mode/v1"
wire_api = "responses"
env_key = "INTEROP_MODEL_KEY"
EOF
done

codex_config() { # mode
    printf '{"command":"codex","env":{"CODEX_HOME":"%s","INTEROP_MODEL_KEY":"not-a-key"},"disposeGraceMs":2000}' \
        "$WORK/codex-$1"
}
claude_config() { # mode
    printf '{"command":"claude","env":{"ANTHROPIC_BASE_URL":"http://127.0.0.1:%s/%s","ANTHROPIC_API_KEY":"not-a-key","CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC":"1","DISABLE_AUTOUPDATER":"1"},"disposeGraceMs":2000}' \
        "$PORT" "$1"
}
acp_config() { # permission, extra env as JSON members
    printf '{"command":"%s","args":["%s"],"permission":"%s","env":{%s},"disposeGraceMs":2000}' \
        "$NODE" "$PREFIX/acp_agent.mjs" "$1" "${2:-}"
}

# check SUITE NAME EXPECTATION -- DELEGATE-ARGS...: runs `subagents delegate` and records one
# result line; EXPECTATION is a Python expression over `r` (the printed JSON), `out` (its
# output's text), `stop` (its stop reason), `diag` (its diagnostic, or the error message) and
# `marker` (whether the fake model's shell command created its file in the child's cwd).
check() {
    local suite=$1 name=$2 expectation=$3
    shift 4
    local printed
    rm -f "$CWD/interop-marker"
    printed=$(timeout 120 "$SUBAGENTS" delegate --cwd "$CWD" "$@" 2>"$WORK/stderr" || true)
    python3 - "$suite" "$name" "$expectation" "$printed" "$CWD/interop-marker" >> "$RESULTS" <<'EOF'
import json, os, sys
suite, name, expectation, printed, marker_path = sys.argv[1:]
marker = os.path.exists(marker_path)
try:
    r = json.loads(printed)
except ValueError:
    r = {"error": {"code": "NO_OUTPUT", "message": printed[:200]}}
result = r.get("result") or {}
out = "".join(b.get("text", "") for b in result.get("output", []))
stop = result.get("stopReason") or result.get("stop_reason")
diag = result.get("diagnostic") or r.get("error", {}).get("message") or ""
passed = bool(eval(expectation))
if "error" in r:
    detail = r["error"]["code"] + ": " + r["error"]["message"]
else:
    detail = f"{stop}: {out!r}" + (f" / {diag}" if diag else "")
if marker:
    detail = "the shell command ran! " + detail
detail = detail.replace("\n", " / ")
print(json.dumps({"suite": suite, "check": name, "pass": passed, "detail": detail[:200]}))
EOF
}

# --- 1. the SDK's client driving `subagents acp-agent` ----------------------------------------
step "the ACP SDK's client against subagents acp-agent"
"$NODE" "$PREFIX/acp_client.mjs" "$SUBAGENTS" >> "$RESULTS" || true

# --- 2. an SDK-built agent under AcpProvider --------------------------------------------------
step "an ACP SDK agent under AcpProvider"
check acp-provider completed "stop == 'completed' and out == 'sdk agent answer'" \
    -- --provider acp --config "$(acp_config reject)" complete
check acp-provider permission-allow "stop == 'completed' and out == 'permission: selected yes'" \
    -- --provider acp --config "$(acp_config allow)" permission
check acp-provider permission-deny "stop == 'completed' and out == 'permission: cancelled'" \
    -- --provider acp --config "$(acp_config reject)" permission
check acp-provider cancel "stop == 'aborted'" \
    -- --provider acp --config "$(acp_config reject)" --cancel-after-ms 1500 hang
check acp-provider unknown-stop-reason "stop == 'error' and 'unknown-stop-reason' in diag" \
    -- --provider acp --config "$(acp_config reject)" unknown-stop
check acp-provider protocol-version-mismatch \
    "r.get('error', {}).get('code') == 'CHILD_START_FAILED' and 'protocol-version-mismatch' in diag" \
    -- --provider acp --config "$(acp_config reject '"INTEROP_PROTOCOL_VERSION":"2"')" complete
# Disposal: the agent's pid, written at its start, is gone once the delegation has returned.
check acp-provider dispose "stop == 'completed'" \
    -- --provider acp --config "$(acp_config reject "\"INTEROP_PID_FILE\":\"$WORK/agent.pid\"")" complete
python3 - "$WORK/agent.pid" >> "$RESULTS" <<'EOF'
import json, os, sys
try:
    pid = int(open(sys.argv[1]).read())
    os.kill(pid, 0)
    passed, detail = False, f"pid {pid} still running"
except ProcessLookupError:
    passed, detail = True, f"pid {pid} exited"
except (OSError, ValueError) as error:
    passed, detail = False, f"no pid: {error}"
print(json.dumps({"suite": "acp-provider", "check": "dispose-reaps", "pass": passed, "detail": detail}))
EOF
check sdk-provider completed "stop == 'completed' and out == 'interop sdk child'" \
    -- --provider sdk --config "{\"command\":\"$SUBAGENTS\",\"env\":{\"ACP_AGENT_TEXT\":\"interop sdk child\"}}" go

# --- 3. the real Codex app-server -------------------------------------------------------------
step "CodexProvider against codex app-server $CODEX_VERSION"
check codex completed "stop == 'completed' and out == 'interop answer'" \
    -- --provider codex --config "$(codex_config ok)" "say the answer"
check codex unauthorized "stop == 'error' and 'HTTP status: 401' in diag" \
    -- --provider codex --config "$(codex_config unauthorized)" "say the answer"
check codex cancel "stop == 'aborted'" \
    -- --provider codex --config "$(codex_config hang)" --cancel-after-ms 5000 "say the answer"
# The default mode, `untrusted`: the model's shell command is put to the provider, which
# declines it (Codex then ends the turn `interrupted`); the command never runs.
check codex untrusted-declines-shell "'decision: declined' in diag and not marker" \
    -- --provider codex --config "$(codex_config tool)" "make the marker"

# --- 4. the real Claude Code CLI --------------------------------------------------------------
step "ClaudeCodeProvider against claude $CLAUDE_CODE_VERSION"
check claude-code completed "stop == 'completed' and out == 'interop answer'" \
    -- --provider claude-code --config "$(claude_config ok)" "say the answer"
check claude-code unauthorized "stop == 'error' and 'category: authentication' in diag" \
    -- --provider claude-code --config "$(claude_config unauthorized)" "say the answer"
check claude-code cancel "stop == 'aborted'" \
    -- --provider claude-code --config "$(claude_config hang)" --cancel-after-ms 5000 "say the answer"
# The default mode, `dontAsk`: Claude Code denies the model's Bash call itself and tells the
# model so; the command never runs.
check claude-code dontAsk-denies-bash "stop == 'completed' and 'denied' in out and not marker" \
    -- --provider claude-code --config "$(claude_config tool)" "make the marker"

# --- nothing left behind ----------------------------------------------------------------------
# Every product ran from $WORK (node, codex, claude) or was `subagents acp-agent`.
left=$(pgrep -af -- "$WORK|$SUBAGENTS acp-agent" | grep -v -e fake_model.py -e pgrep || true)
python3 - "$left" >> "$RESULTS" <<'EOF'
import json, sys
left = sys.argv[1].strip()
print(json.dumps({"suite": "all", "check": "no-process-left", "pass": not left,
                  "detail": left.replace("\n", "; ")[:160] or "none"}))
EOF

# --- the table --------------------------------------------------------------------------------
python3 - "$RESULTS" "$NODE_VERSION" "$ACP_SDK_VERSION" "$CODEX_VERSION" "$CLAUDE_CODE_VERSION" <<'EOF'
import json, sys
path, node, sdk, codex, claude = sys.argv[1:]
rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
print(f"node {node} · @agentclientprotocol/sdk {sdk} · @openai/codex {codex} · "
      f"@anthropic-ai/claude-code {claude}")
print(f"| {'suite':<13} | {'check':<26} | result | detail")
print(f"|{'-' * 15}|{'-' * 28}|--------|-------")
for row in rows:
    mark = "pass" if row["pass"] else "FAIL"
    print(f"| {row['suite']:<13} | {row['check']:<26} | {mark:<6} | {row['detail']}")
failed = sum(not row["pass"] for row in rows)
print(f"{len(rows) - failed} passed, {failed} failed")
sys.exit(1 if failed or not rows else 0)
EOF
