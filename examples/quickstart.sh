#!/usr/bin/env bash
# The main job on a bundled example: install what is missing, build, then validate
# examples/longnet.json, print its canonical form and statistics, draw its mask, run it on the CPU
# reference on random inputs, run its generated GPU kernel in the CPU emulator, and run it through
# the C++ API (on the GPU when there is one).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
spec="${1:-$root/examples/longnet.json}"
out="${OUT_DIR:-$root/build/quickstart}"
# Only what this needs: the CLI and the C++ example (tests/run.sh installs and builds the rest).
bash "$root/scripts/setup_deps.sh" --build-only
ATTNJIT_BUILD_TESTS=OFF ATTNJIT_PYTHON=OFF bash "$root/scripts/build.sh" attnjit attnjit_example
attnjit="${BUILD_DIR:-$root/build}/attnjit"
mkdir -p "$out"

echo; echo "== attnjit validate: canonical form and statistics"
"$attnjit" validate "$spec" --seq 4096 --heads-q 8
echo; echo "== attnjit mask: a picture of the mask (first 4 heads)"
"$attnjit" mask "$spec" --seq-q 4096 --heads-q 8 --out "$out/mask.svg"
echo; echo "== attnjit run: the CPU reference on random inputs"
"$attnjit" run "$spec" --random 1 --batch 1 --seq 2048 --heads-q 8 --head-dim 64 \
  --out "$out/o.npy" --lse "$out/lse.npy"
echo; echo "== attnjit run --device emu: the generated sm_80 kernel (bf16) in the CPU emulator"
"$attnjit" run "$spec" --random 1 --batch 1 --seq 512 --heads-q 4 --head-dim 64 --device emu --dtype bf16 \
  --out "$out/o_emu.npy"
echo; echo "== the C++ API (examples/run_pattern.cpp): on the GPU checked against the CPU device, or on the CPU"
"${BUILD_DIR:-$root/build}/examples/attnjit_example" "$spec" --seq 2048 --heads 8 --head-dim 64
echo; echo "outputs are in $out"
