#!/usr/bin/env bash
# Pack what the GPU run (scripts/gpu_run.sh, docs/gpu-run.md) needs on a machine with no network, in
# gpu-run/ (ignored; with the checkout at most 64 MiB, the device tool's carry limit):
#   llama_cpp_python-0.3.36.tar.gz  the sdist, trimmed to what a CPU or CUDA build compiles (no models,
#                                   docs, tests, tools, other GPU backends); gguf-py stays inside
#   wheels/                         every run-time and build dependency of ead-cli and llama-cpp-python
#                                   but numpy (on the machine), for CPython 3.12 and for this machine's
#                                   Python (the CPU test), from the local package index; pip itself
#                                   (a system Python may lack ensurepip)
#   tokenizer.gguf                  the real demo pair's tokenizer only (write_twin.py --tokenizer-only)
#   prebuilt/                       with --wheel: a llama-cpp-python wheel built elsewhere (CUDA), which
#                                   the build step installs instead of compiling where it loads
#   MANIFEST.json                   the commit packed, every file's size, the total
# Usage: scripts/pack_gpu_run.sh [--small ALIAS_OR_GGUF] [--wheel LLAMA_CPP_PYTHON_WHEEL]
#   (--small's default: qc0.5b, the demo pair's small model)
set -euo pipefail
cd "$(dirname "$0")/.."
small=qc0.5b
wheel=
usage="usage: scripts/pack_gpu_run.sh [--small ALIAS_OR_GGUF] [--wheel LLAMA_CPP_PYTHON_WHEEL]"
while [ $# -gt 0 ]; do
  case "$1" in
    --small) [ -n "${2:-}" ] || { echo "error: $usage" >&2; exit 2; }; small=$2; shift 2 ;;
    --wheel) [ -f "${2:-}" ] || { echo "error: --wheel needs a wheel file ($usage)" >&2; exit 2; }
      wheel=$2; shift 2 ;;
    *) echo "error: $usage" >&2; exit 2 ;;
  esac
done
version=0.3.36
if [ -n "$wheel" ] && [[ "$(basename "$wheel")" != llama_cpp_python-$version-*.whl ]]; then
  echo "error: --wheel $wheel is not a llama_cpp_python-$version wheel" >&2
  exit 2
fi
py=.venv/bin/python
[ -x "$py" ] || { echo "error: no .venv: run ./scripts/setup.sh first" >&2; exit 1; }
bundle=gpu-run
limit=$((64 << 20))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$bundle"
mkdir -p "$bundle/wheels"

echo "the llama-cpp-python $version sdist..." >&2
"$py" -m pip download --quiet "llama-cpp-python==$version" --no-deps --no-binary :all: -d "$tmp"
tar xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
src=$tmp/llama_cpp_python-$version
lc=$src/vendor/llama.cpp
# Built as a subproject, llama.cpp compiles ggml (CPU, and CUDA when asked), src, common and vendor;
# gpu_run.sh turns LLAVA_BUILD off, so tools/ (mtmd) goes too.
rm -rf "$src"/{docs,docker,examples,tests} \
  "$lc"/{models,docs,media,tests,benches,examples,pocs,app,tools,scripts,conversion,skills,ci,.github} \
  "$lc"/convert_*.py \
  "$src/.git" "$lc/.git" \
  "$lc"/ggml/src/ggml-{cann,et,hexagon,metal,opencl,openvino,rpc,sycl,virtgpu,vulkan,webgpu,zdnn,zendnn}
tar czf "$bundle/llama_cpp_python-$version.tar.gz" -C "$tmp" "llama_cpp_python-$version"

echo "wheels..." >&2
# ead-cli's dependencies and llama-cpp-python's, read from the two pyproject files; the build backends.
requirements=$("$py" - "$src/pyproject.toml" <<'EOF'
import sys

from ead_cli.registry import tomllib  # tomli before Python 3.11

skip = ("llama-cpp-python", "numpy")
deps = []
for path in ("pyproject.toml", sys.argv[1]):
    with open(path, "rb") as handle:
        deps += tomllib.load(handle)["project"]["dependencies"]
deps = [d for d in deps if not d.replace("_", "-").lower().startswith(skip)]
print("\n".join([*deps, "scikit-build-core>=0.9.2", "hatchling>=1.21", "pip"]))
EOF
)
printf '%s\n' "$requirements" > "$tmp/requirements.txt"
here=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
for pyver in 3.12 "$here"; do
  "$py" -m pip download --quiet --python-version "$pyver" --only-binary=:all: \
    -r "$tmp/requirements.txt" -d "$bundle/wheels"
done
rm -f "$bundle"/wheels/numpy-*.whl  # the machine has numpy (pip takes it from the system site-packages)

if [ -n "$wheel" ]; then
  echo "the prebuilt wheel, one copy of each library..." >&2
  mkdir -p "$bundle/prebuilt"
  # scikit-build-core writes each shared library under every name (.so, .so.0, .so.0.x.y), in
  # llama_cpp/lib and again at the wheel's root: the loader needs the sonames (.so.0) and Python the .so
  # of the libraries it opens, so the rest is left out (a CUDA build's libggml-cuda is tens of MiB).
  "$py" - "$wheel" "$bundle/prebuilt/$(basename "$wheel")" <<'EOF'
import re
import sys
import zipfile

source, target = sys.argv[1], sys.argv[2]
opened_by_python = {f"llama_cpp/lib/lib{name}.so" for name in ("llama", "ggml", "mtmd", "llava")}


def kept(name: str) -> bool:
    if not name.startswith(("llama_cpp/", "llama_cpp_python-")):
        return False  # the wheel root's lib/, include/, bin/: nothing imports them
    if name.startswith("llama_cpp/lib/"):
        return name in opened_by_python or re.fullmatch(r"llama_cpp/lib/lib[\w.-]+?\.so\.0", name) is not None
    return True


with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as new:
    for info in old.infolist():
        if info.filename.endswith(".dist-info/RECORD"):
            lines = old.read(info).decode().splitlines()
            new.writestr(info, "".join(f"{line}\n" for line in lines if kept(line.rsplit(",", 2)[0])))
        elif kept(info.filename):
            new.writestr(info, old.read(info))
EOF
fi

echo "the tokenizer of $small..." >&2
model=$("$py" -c 'import sys; from ead_cli import registry
print(registry.resolve(sys.argv[1], registry.load_catalog(), allow_download=False))' "$small")
"$py" scripts/write_twin.py --tokenizer-only --tokenizer-from "$model" --out "$bundle/tokenizer.gguf"

"$py" - "$bundle" "$limit" "$model" <<'EOF'
import json
import subprocess
import sys
from pathlib import Path

bundle, limit, model = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
files = {str(p.relative_to(bundle)): p.stat().st_size for p in sorted(bundle.rglob("*")) if p.is_file()}
git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()  # noqa: E731
manifest = {
    "commit": git("rev-parse", "HEAD"),
    "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    "tokenizer_from": model.name,
    "files": files,
}
manifest["bytes"] = sum(files.values())
(bundle / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
print(f"{bundle}/: {len(files) + 1} files, {total / 2**20:.1f} MiB")
for name, size in files.items():
    if not name.startswith("wheels/"):
        print(f"  {name}: {size / 2**20:.1f} MiB")
wheels = sum(size for name, size in files.items() if name.startswith("wheels/"))
print(f"  wheels/: {sum(n.startswith('wheels/') for n in files)} wheels, {wheels / 2**20:.1f} MiB")
# The device tool carries the checkout too (tracked files, untracked ones git does not ignore): the
# limit is on the two together.
listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
checkout = sum(Path(name).stat().st_size for name in listed if name and Path(name).is_file())
print(f"with the checkout's {checkout / 2**20:.1f} MiB: {(total + checkout) / 2**20:.1f} MiB travel")
if total + checkout > limit:
    sys.exit(
        f"error: {bundle}/ and the checkout are {(total + checkout) / 2**20:.1f} MiB, over the"
        f" {limit / 2**20:.0f} MiB that the device tool carries"
    )
EOF
