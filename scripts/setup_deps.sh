#!/usr/bin/env bash
# Installs what attnjit needs to build and test, if it is missing: Debian packages (compiler,
# CMake, header-only libraries, binutils (addr2line for the emulator's reports), lit + FileCheck,
# clang with libFuzzer and its sanitizer runtimes for scripts/fuzz.sh)
# numpy for the contract tests, what the Python package builds and tests with, and CUDA 12's NVRTC.
# Idempotent: a machine that has everything is left alone.
# With --build-only: only what building the CLI and the C++ example needs (the quick start).
set -euo pipefail

build_only=0
[ "${1:-}" = "--build-only" ] && build_only=1
packages=(g++ cmake make python3 binutils nlohmann-json3-dev libcli11-dev libeigen3-dev)
((build_only)) || packages+=(catch2 llvm-19-tools clang libclang-rt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "attnjit: installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
((build_only)) && exit 0
if ! python3 -c "import numpy" 2>/dev/null; then
  echo "attnjit: installing numpy (used by the contract tests)"
  python3 -m pip install -q numpy
fi
# The Python package: nanobind and scikit-build-core build it, PyTorch and pytest test it.
if ! python3 -c "import nanobind, scikit_build_core, pytest, torch" 2>/dev/null; then
  echo "attnjit: installing nanobind, scikit-build-core, pytest and PyTorch (the Python package and its tests)"
  python3 -m pip install -q nanobind scikit-build-core pytest torch
fi
# CUDA 12's NVRTC from PyPI: the toolkit's CUDA 13 no longer targets sm_60/61/70, and the tests
# compile the SIMT kernels for Pascal and Volta through it (tests/lit/nvrtc/, "[nvrtc]" unit tests).
if ! python3 -c "import nvidia.cuda_nvrtc" 2>/dev/null; then
  echo "attnjit: installing CUDA 12's NVRTC (nvidia-cuda-nvrtc-cu12, for the sm_61/sm_70 compile tests)"
  python3 -m pip install -q nvidia-cuda-nvrtc-cu12
fi
# SASS (attnjit dump --stage sass, the HMMA checks in the tests) needs nvdisasm or cuobjdump; a
# toolkit installed from pip lacks them, so fetch NVIDIA's own wheels and put them on PATH.
if ! command -v nvdisasm >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvdisasm ]; then
  echo "attnjit: installing nvdisasm and cuobjdump (NVIDIA's wheels, for SASS)"
  tools_dir=/opt/attnjit-cuda-tools
  [ -w /opt ] || tools_dir="$HOME/.local/attnjit-cuda-tools"
  python3 -m pip install -q --target "$tools_dir" nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump
  bin_dir=$(dirname "$(find "$tools_dir" -type f -name nvdisasm | head -n 1)")
  link_dir=/usr/local/bin
  [ -w "$link_dir" ] || link_dir="$HOME/.local/bin"
  mkdir -p "$link_dir"
  ln -sf "$bin_dir/nvdisasm" "$link_dir/nvdisasm"
  ln -sf "$bin_dir/cuobjdump" "$link_dir/cuobjdump"
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -d /usr/local/cuda ]; then
  echo "attnjit: note: no CUDA toolkit found; building without NVRTC (GPU code generation needs it)"
fi
