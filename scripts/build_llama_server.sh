#!/usr/bin/env bash
# Build llama.cpp's HTTP server (`llama-server`) from the llama.cpp tree that the
# llama-cpp-python sdist vendors (vendor/llama.cpp), so the server matches the
# llama.cpp that the Python bindings use.
#
# Output: ${EAD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/ead-cli}/llama-server/<version>/llama-server,
# a static build (no libllama/libggml .so next to it; it needs only libc,
# libstdc++, libgomp and libm from the system). CPU only, tuned for this
# machine (GGML_NATIVE=ON), without the web UI (only the HTTP API is needed).
#
# Cached and idempotent: if the binary exists and answers --version, its path is
# printed and the script exits at once. Build logs go to stderr; the last (and
# only) line on stdout is the binary's path, so `BIN=$(scripts/build_llama_server.sh)`
# works.
#
# Environment:
#   EAD_CACHE           cache root (default ~/.cache/ead-cli)
#   EAD_LLAMA_SDIST     optional path to an already-downloaded
#                       llama_cpp_python-<version>.tar.gz (skips pip download)
#   EAD_BUILD_JOBS      parallel compile jobs (default: nproc)
#   TMPDIR              where the temporary source and build trees go
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"  # `sh script.sh` (dash): no pipefail, no [[
set -euo pipefail

VERSION=0.3.36
home=~  # $HOME, or where HOME is unset the passwd entry's home, as Python's Path.home() and so ead's
CACHE_ROOT="${EAD_CACHE:-${XDG_CACHE_HOME:-$home/.cache}/ead-cli}"
DEST_DIR="$CACHE_ROOT/llama-server/$VERSION"
BIN="$DEST_DIR/llama-server"

log() { printf '[build_llama_server] %s\n' "$*" >&2; }

works() { [[ -f "$1" && -x "$1" ]] && "$1" --version >/dev/null 2>&1; }

if works "$BIN"; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$DEST_DIR"

# One build at a time per cache: a second caller waits, then finds the binary.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DEST_DIR/.build.lock"
    flock 9
    if works "$BIN"; then
        echo "$BIN"
        exit 0
    fi
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
else
    PY="$(command -v python3)"
fi

for tool in cmake tar; do
    command -v "$tool" >/dev/null 2>&1 || { log "error: $tool not found"; exit 1; }
done
if command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; then :; else
    log "error: no C++ compiler (c++/g++) found"; exit 1
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ead-llama-server.XXXXXX")"
cleanup() { rm -rf "$WORK"; rm -f "$DEST_DIR/.llama-server.tmp.$$"; }
trap cleanup EXIT

start=$SECONDS

# 1. Source: the llama-cpp-python sdist.
if [[ -n "${EAD_LLAMA_SDIST:-}" ]]; then
    SDIST="$EAD_LLAMA_SDIST"
    [[ -f "$SDIST" ]] || { log "error: EAD_LLAMA_SDIST=$SDIST does not exist"; exit 1; }
    log "using sdist $SDIST"
else
    log "downloading llama-cpp-python==$VERSION sdist with $PY -m pip"
    mkdir -p "$WORK/dl"
    "$PY" -m pip download --no-deps --no-binary :all: --disable-pip-version-check \
        "llama-cpp-python==$VERSION" -d "$WORK/dl" >&2 \
        || { log "error: pip could not download llama-cpp-python==$VERSION's sdist (its messages above):" \
                 "it needs the package index within reach, or EAD_LLAMA_SDIST at a llama_cpp_python-$VERSION.tar.gz"
             exit 1; }
    SDIST="$(ls "$WORK"/dl/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null | head -n 1 || true)"
    [[ -n "$SDIST" ]] || { log "error: pip did not produce llama_cpp_python-$VERSION.tar.gz"; exit 1; }
fi

mkdir -p "$WORK/src"
tar -xzf "$SDIST" -C "$WORK/src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
[[ -f "$SRC/tools/server/server.cpp" ]] || { log "error: $SRC/tools/server/server.cpp missing"; exit 1; }

# 2. Configure. Notes on the options (llama.cpp as vendored by 0.3.36):
#  - LLAMA_CURL is deprecated and ignored in this llama.cpp; there is no libcurl.
#  - The server embeds a web UI (tools/ui) that is either built with npm
#    (LLAMA_BUILD_UI, default OFF) or downloaded from a Hugging Face bucket at
#    build time (LLAMA_USE_PREBUILT_UI, default ON). Both are turned off: the
#    build then embeds an empty asset table and the HTTP API works as usual.
#  - LLAMA_OPENSSL=OFF: no HTTPS in the server and no libssl dependency.
#  - LLAMA_BUILD_TOOLS must stay ON (the server lives under tools/); only the
#    llama-server target is built.
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
JOBS="${EAD_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log "configuring in $WORK/build"
cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON \
    -DGGML_BACKEND_DL=OFF \
    -DLLAMA_BUILD_COMMON=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_LLGUIDANCE=OFF >&2

# 3. Build only the server.
log "building llama-server with $JOBS jobs (several minutes on 2 cores)"
cmake --build "$WORK/build" --config Release --target llama-server -j "$JOBS" >&2

BUILT="$WORK/build/bin/llama-server"
[[ -x "$BUILT" ]] || BUILT="$(find "$WORK/build" -type f -name llama-server -perm -u+x | head -n 1)"
[[ -n "$BUILT" && -x "$BUILT" ]] || { log "error: build produced no llama-server"; exit 1; }

# 4. Install atomically: copy next to the destination, check it runs, rename.
TMP_BIN="$DEST_DIR/.llama-server.tmp.$$"
cp "$BUILT" "$TMP_BIN"
chmod 755 "$TMP_BIN"
if ! "$TMP_BIN" --version >&2; then
    log "error: the built llama-server does not run --version"
    exit 1
fi
mv -f "$TMP_BIN" "$BIN"

log "built in $((SECONDS - start)) s"
echo "$BIN"
