#!/usr/bin/env bash
# Create .venv and install ead-cli into it with the offline demo models and the test tools.
# Installs only when pyproject.toml or CMAKE_ARGS changed (see below), and always ends with the (cached)
# smoke decode. The first run compiles llama-cpp-python (~4 minutes on 2 cores; pip caches the wheel,
# later runs take seconds).
# Set CMAKE_ARGS for a GPU build, e.g. CMAKE_ARGS="-DGGML_CUDA=on" ./scripts/setup.sh
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"  # `sh script.sh` (dash): no pipefail, no [[
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(sys.version_info < (3, 10))' 2>/dev/null); then
  [ -n "$version" ] && found="is Python $version" || found="does not run here"
  echo "error: ead-cli needs Python 3.10 or newer, and $python $found: set PYTHON to one" >&2
  exit 1
fi
stamp=.venv/.ead-installed
# Hashed by Python: sha256sum is GNU's (macOS has none).
want=$("$python" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
# pip's own lines say what it could not get or build; the last line says what to do (the stamp is not
# written, so the next run installs again).
offline="a package it cannot find needs the package index within reach (or PIP_INDEX_URL at a mirror)"
pip_install() {  # $1: what to do where pip fails; the rest: pip install's arguments
  local advice=$1
  shift
  .venv/bin/python -m pip install --quiet "$@" >&2 && return
  echo "error: pip could not install ead-cli into .venv (its messages above): $advice;" \
    "then run ./scripts/setup.sh again" >&2
  exit 1
}
# A CMAKE_ARGS other than the one llama-cpp-python was built with (a GPU build asked for after a CPU
# set-up) builds it again: pip would keep the installed one, and its wheel cache keys a built wheel by the
# sdist alone, so a CPU wheel from any earlier set-up would come back. No CMAKE_ARGS keeps what was built.
# Asked again once .venv is ready: one made anew has forgotten what it was built with.
built=.venv/.ead-cmake-args
wants_build() { [ -n "${CMAKE_ARGS:-}" ] && [ "$(cat "$built" 2>/dev/null)" != "$CMAKE_ARGS" ]; }
# A .venv whose python is gone (its link dangling once the Python that made it was removed) or too old
# (another tool's .venv) is installed anew: its ead script and stamp would outlive it.
venv_python_fits() { .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2> /dev/null; }
if ! [ -x .venv/bin/ead ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || wants_build \
  || ! venv_python_fits; then
  # Made anew where it has no pip (or no fitting python): venv's own failure without ensurepip (Debian's
  # python3-venv missing) leaves one so, as does a pip upgrade stopped between removing the old pip and
  # installing the new.
  { venv_python_fits && .venv/bin/python -m pip --version > /dev/null 2>&1; } || "$python" -m venv --clear .venv
  echo "setting up .venv (the first time compiles llama-cpp-python: a few minutes)..." >&2
  pip_install "$offline" --upgrade pip
  if wants_build; then
    pin=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
    echo "building $pin with CMAKE_ARGS=$CMAKE_ARGS..." >&2
    advice="the build with CMAKE_ARGS=$CMAKE_ARGS failed: change CMAKE_ARGS or give the build what it lacks"
    advice+=" (without CMAKE_ARGS, set-up keeps the llama-cpp-python it has)"
    pip_install "$advice" --force-reinstall --no-deps --no-cache-dir "$pin"
    echo "$CMAKE_ARGS" > "$built"
  fi
  pip_install "$offline" -e ".[demo,test,plot,serve]"
  echo "$want" > "$stamp"
fi
# A smoke decode of the default pair in a child process, once per model file, CPU and library version
# (cached): if llama.cpp crashes on this CPU, the user reads what crashed, why and what avoids it
# (ead_cli/smoke.py), not a bare exit status 139.
.venv/bin/python -m ead_cli.smoke
