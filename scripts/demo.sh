#!/usr/bin/env bash
# The main job on the default model pair (Qwen2.5-Coder 0.5B + 1.5B Instruct, Q4_K_M): sets up .venv on
# first use, then `ead generate --mode ead --stats` (the pair switching: a bare `ead generate` runs the
# large model alone) with any arguments you pass: ./scripts/demo.sh ["prompt"] [options]
# (without a prompt, or when the first argument is an option, it asks its own question; a prompt that
# starts with - goes after --, as ead generate's does: ./scripts/demo.sh --max-tokens 9 -- "-v or -q?").
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"  # `sh script.sh` (dash): no pipefail, no [[
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ $# -eq 0 ] || { [[ "$1" == --* ]] && ! [[ " $* " == *" -- "* ]]; }; then
  set -- "Write a Python function that checks whether a number is prime" "$@"
fi
exec .venv/bin/ead generate --mode ead --stats "$@"  # the pair switching: the demo of the tool
