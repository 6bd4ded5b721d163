#!/usr/bin/env bash
# A CUDA build of llama-cpp-python 0.3.36 made on a machine with CUDA's compiler but no GPU, for the GPU
# run (docs/gpu-run.md): pack_gpu_run.sh --wheel carries it, so the device spends none of its short lease
# compiling (on this 2-core machine ~17 min).
#   scripts/build_cuda_wheel.sh [ARCH]     ARCH: CMake's CUDA architecture (default 90: H100, H200);
#                                          machine code for it alone, no PTX (PTX would double the size)
# Writes dist-cuda/llama_cpp_python-0.3.36-*.whl (ignored). Needs nvcc (CUDA 13) and CMake; cuBLAS, which
# the toolkit here may lack, comes from the package index (nvidia-cublas). The driver's libcuda is not
# needed: the build leaves out llama.cpp's virtual-memory pool (GGML_CUDA_NO_VMM), the one part that links
# it. The CPU code is built for AVX2 (no -march=native: the device's CPU is another).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
[[ "$arch" =~ ^[0-9]+[af]?$ ]] || { echo "error: ARCH is CMake's CUDA architecture, e.g. 90" >&2; exit 2; }
py=.venv/bin/python
[ -x "$py" ] || { echo "error: no .venv: run ./scripts/setup.sh first" >&2; exit 1; }
command -v nvcc >/dev/null || { echo "error: no nvcc on PATH (CUDA's compiler)" >&2; exit 1; }
version=0.3.36
work=${TMPDIR:-/tmp}/ead-cuda-wheel
mkdir -p "$work" dist-cuda

echo "cuBLAS and the llama-cpp-python $version sdist..." >&2
"$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$work" "nvidia-cublas>=13,<14"
"$py" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$version"
rm -rf "$work/cublas" "$work/llama_cpp_python-$version"
"$py" -m zipfile -e "$(ls "$work"/nvidia_cublas-*.whl | tail -1)" "$work/cublas"
tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
cublas=$work/cublas/nvidia/cu13
for library in cublas cublasLt; do
  ln -sf "libcublas${library#cublas}.so.13" "$cublas/lib/lib$library.so"
done

flags="-I$cublas/include"
export CMAKE_ARGS="-DLLAVA_BUILD=off -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch-real -DGGML_CUDA_NO_VMM=on \
-DGGML_NATIVE=off -DGGML_AVX=on -DGGML_AVX2=on -DGGML_FMA=on -DGGML_F16C=on -DGGML_BMI2=on \
-DCUDA_cublas_LIBRARY=$cublas/lib/libcublas.so -DCUDA_cublasLt_LIBRARY=$cublas/lib/libcublasLt.so \
-DCMAKE_CUDA_FLAGS=$flags -DCMAKE_CXX_FLAGS=$flags -DCMAKE_C_FLAGS=$flags"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
echo "compiling (CUDA architecture $arch-real; the log: $work/build.log)..." >&2
began=$SECONDS
"$py" -m pip wheel --no-deps -v -w dist-cuda --config-settings=build-dir="$work/build" \
  "$work/llama_cpp_python-$version" >"$work/build.log" 2>&1 \
  || { tail -20 "$work/build.log" >&2; echo "error: the build failed (log: $work/build.log)" >&2; exit 1; }
echo "dist-cuda/: $(ls dist-cuda) ($((SECONDS - began)) s)" >&2
