#!/usr/bin/env bash
# The whole test suite: lint, then pytest (tiny generated models, the real demo pair, a real llama-server).
# Extra arguments go to pytest, e.g. ./scripts/test.sh -m "not real" -x
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"  # `sh script.sh` (dash): no pipefail, no [[
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build_llama_server.sh > /dev/null  # the remote-model tests run a real llama-server (cached)
./scripts/install_chromium.sh  # the page test of ead serve drives a headless Chromium
./scripts/install_agents.sh  # Claude Code and Codex (npm, pinned) for the agent tests of ead serve
.venv/bin/ruff check ead_cli tests scripts
.venv/bin/ruff format --check ead_cli tests scripts  # the one layout: `ruff format` writes it
exec .venv/bin/python -m pytest -q "$@"
