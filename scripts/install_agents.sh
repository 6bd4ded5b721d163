#!/usr/bin/env bash
# Claude Code and Codex CLI, pinned, for the end-to-end agent tests of `ead serve` (tests/test_agents.py),
# installed with npm into ${EAD_CACHE:-~/.cache/ead-cli}/agents; without npm (or the registry) those tests
# are skipped and say why. Never fails the test run.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"  # `sh script.sh` (dash): no pipefail, no [[
set -euo pipefail
# Claude Code 2.1.197 is the last release that runs on node 18/20 (2.1.198 on asks for node >= 22).
CLAUDE_CODE_VERSION=2.1.197
CODEX_VERSION=0.171.0
home=~  # $HOME, or where HOME is unset the passwd entry's home, as build_llama_server.sh and ead take it
AGENTS_DIR="${EAD_CACHE:-${XDG_CACHE_HOME:-$home/.cache}/ead-cli}/agents"
STAMP="$AGENTS_DIR/installed-claude-code-$CLAUDE_CODE_VERSION-codex-$CODEX_VERSION"
BIN="$AGENTS_DIR/node_modules/.bin"
[ -f "$STAMP" ] && [ -x "$BIN/claude" ] && [ -x "$BIN/codex" ] && exit 0  # these versions, still there
if ! command -v npm > /dev/null; then
  echo "note: no npm: the agent tests of ead serve (Claude Code, Codex) will be skipped" >&2
  exit 0
fi
echo "installing Claude Code $CLAUDE_CODE_VERSION and Codex $CODEX_VERSION into $AGENTS_DIR..." >&2
mkdir -p "$AGENTS_DIR"
if npm install --prefix "$AGENTS_DIR" --no-audit --no-fund --loglevel=error --save-exact \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" > /dev/null 2>&1; then
  touch "$STAMP"
else
  echo "note: npm could not install Claude Code and Codex: the agent tests of ead serve will be skipped" >&2
fi
exit 0
