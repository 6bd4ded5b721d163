#!/usr/bin/env bash
# Headless Chromium for the page test of `ead serve` (tests/test_serve.py), from Debian's packages where
# apt-get can be used; elsewhere the test is skipped and says why. Never fails the test run.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"  # `sh script.sh` (dash): no pipefail, no [[
set -euo pipefail
if command -v chromium > /dev/null || command -v chromium-browser > /dev/null; then
  exit 0  # either name, as the page test looks for both (Ubuntu's is chromium-browser)
fi
if ! command -v apt-get > /dev/null || [ "$(id -u)" != 0 ]; then
  echo "note: no chromium, and apt-get is not usable here: the page test of ead serve will be skipped" >&2
  exit 0
fi
echo "installing chromium (Debian's package) for the page test of ead serve..." >&2
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } > /dev/null 2>&1 \
  || echo "note: apt-get could not install chromium: the page test of ead serve will be skipped" >&2
exit 0
