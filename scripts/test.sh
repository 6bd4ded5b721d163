#!/usr/bin/env bash
# The whole test suite: lint, then pytest (tiny generated models and the real demo pair).
# Extra arguments go to pytest, e.g. ./scripts/test.sh -m "not real" -x
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check ead_cli tests scripts
exec .venv/bin/python -m pytest -q "$@"
