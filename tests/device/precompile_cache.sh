#!/usr/bin/env bash
# Compiles, on a machine without a GPU, the kernels the device check's GPU steps will ask for, so
# that a lent GPU's minutes go to running them rather than to NVRTC (tests/device/device_check.sh
# unpacks the archive into its kernel cache when it finds it).
#
#   bash tests/device/precompile_cache.sh [ARCHIVE] [BUDGET]   (repository root, after scripts/build.sh;
#                                                               ARCHIVE .device-cache.txz, BUDGET 3600 s)
#
# The GPU test binary runs each of the device check's GPU steps (the same filters and knobs) over
# tests/device/stand_in_driver.cpp, a libcuda.so.1 that reports the GPU named by
# ATTNJIT_STAND_IN_GPU (h200, default; h100) and runs nothing. attnjit compiles each kernel for that
# GPU's arch as it would there: the same generated source, NVRTC options and NVRTC version give the
# same cache key (docs/kernels-cache-knobs.md), provided this machine's NVRTC is the GPU machine's
# (CUDA 13.0 on both here). The tests' checks fail, since nothing ran; their output goes to
# ARCHIVE's name with .log for .txz, and only the cache is kept. Steps run two at a time; each
# stops at its share of BUDGET, keeping what it compiled. The archive is xz'ed (CUBINs shrink
# about 10x), to travel with the tree within the device machine's 64 MiB.
#
# ATTNJIT_NVRTC, when unset, names the CUDA toolkit's NVRTC beside nvcc: a newer NVRTC from a
# Python package here would make other keys than the GPU machine's toolkit NVRTC.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
archive="$(realpath -m "${1:-$root/.device-cache.txz}")"
budget="${2:-3600}"
build="${BUILD_DIR:-$root/build}"
tests="$build/tests/attnjit_gpu_tests"
[ -x "$tests" ] || { echo "precompile_cache: $tests is missing: build it first (bash scripts/build.sh attnjit_gpu_tests)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lib" "$work/cache"
g++ -O1 -shared -fPIC -o "$work/lib/libcuda.so.1" "$root/tests/device/stand_in_driver.cpp" || exit 1
if [ -z "${ATTNJIT_NVRTC:-}" ]; then
  toolkit="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")"
  export ATTNJIT_NVRTC="$(ls "$toolkit"/lib64/libnvrtc.so.* "$toolkit"/lib/libnvrtc.so.* 2>/dev/null | head -n1)"
fi
mkdir -p "$(dirname "$archive")" || exit 2
log="${archive%.txz}.log"
: > "$log"
ATTNJIT_CACHE_DIR="$work/cache" "$build/attnjit" info | grep -A1 "^nvrtc" | tee -a "$log"

# The device check's GPU steps: name, knobs, Catch2 filter (as gpu_run and its sm_80 and cp.async
# steps give them), the sanitizers' subset last.
steps=(
  "gpu_forward_examples||[attention][examples]"
  "gpu_forward||[attention]~[graph]~[examples]"
  "gpu_backward||[grad]~[random]~[sm90a]"
  "gpu_backward_wgmma||[grad][sm90a]"
  "gpu_driver||~[attention]~[grad]~[paged],[graph]"
  "gpu_paged||[paged]"
  "gpu_backward_random||[grad][random]"
  "gpu_forward_sm80|ATTNJIT_SM90A=0|[attention][examples],[attention][random],[attention][configs]"
  "gpu_forward_sm90a_cpasync|ATTNJIT_TMA=0|[attention][examples]"
  "sanitize||[sanitize]"
)
run_step() {  # NAME KNOBS FILTER
  local t0=$SECONDS
  env ${2:+$2} LD_LIBRARY_PATH="$work/lib" ATTNJIT_CACHE_DIR="$work/cache" ATTNJIT_GPU_TESTS_DEVICE=gpu \
    timeout "$share" "$tests" "$3" > "$work/$1.log" 2>&1
  local rc=$?
  echo "$1: $(( SECONDS - t0 )) s$([ $rc = 124 ] && echo ", cut at its ${share} s")" >> "$log"
}
# And bench/gpu_session.sh's bench stage, run first: attnjit_gpu_bench per kernel option (the same
# shapes; bench/peers.py asks for the same kernels through the Python package), one run each.
bench="$build/bench/attnjit_gpu_bench"
shape=(--heads 16 --head-dim 128 --dtype bf16 --batch 1 --no-ttfr --runs 1 --warmup 0 --flush-mb 1)
ex="$root/examples"
bench_runs=(
  "bench_default||--seq 16384 $root/bench/patterns/dense.json $ex/bigbird.json $ex/longnet.json $ex/causal_local.json"
  "bench_longnet_32k||--seq 32768 $ex/longnet.json"
  "bench_separate_branches|ATTNJIT_PACK_BRANCHES=0|--seq 16384 --no-backward $ex/longnet.json"
  "bench_sm80_backward|ATTNJIT_BWD_WGMMA=0|--seq 16384 $root/bench/patterns/dense.json $ex/bigbird.json"
  "bench_deterministic|ATTNJIT_DETERMINISTIC=1|--seq 16384 $root/bench/patterns/dense.json $ex/bigbird.json"
  "bench_lazy_rescale|ATTNJIT_LAZY_RESCALE=1|--seq 16384 --no-backward $root/bench/patterns/dense.json $ex/bigbird.json"
  "bench_poly_exp2|ATTNJIT_POLY_EXP2=1|--seq 16384 --no-backward $root/bench/patterns/dense.json $ex/bigbird.json"
  "bench_persistent|ATTNJIT_PERSISTENT=1|--seq 16384 $root/bench/patterns/dense.json $ex/bigbird.json $ex/causal_local.json"
)
# Each run's share of BUDGET: two run at a time.
share=$(( budget * 2 / (${#steps[@]} + ${#bench_runs[@]}) ))
run_bench() {  # NAME KNOBS ARGS
  local t0=$SECONDS
  # shellcheck disable=SC2086
  env ${2:+$2} LD_LIBRARY_PATH="$work/lib" ATTNJIT_CACHE_DIR="$work/cache" \
    timeout "$share" "$bench" "${shape[@]}" $3 > "$work/$1.log" 2>&1
  echo "$1: $(( SECONDS - t0 )) s" >> "$log"
}
for i in "${!bench_runs[@]}"; do
  IFS='|' read -r name knobs args <<< "${bench_runs[$i]}"
  [ -x "$bench" ] && run_bench "$name" "$knobs" "$args" &
  (( i % 2 == 1 )) && wait
done
wait
for i in "${!steps[@]}"; do
  IFS='|' read -r name knobs filter <<< "${steps[$i]}"
  run_step "$name" "$knobs" "$filter" &
  (( i % 2 == 1 )) && wait
done
wait
cat "$work"/*.log >> "$log"
count=$(find "$work/cache" -type f -name '*.ajk' | wc -l)
tar cJf "$archive" -C "$work/cache" . || exit 1
echo "precompile_cache: $count kernels, $(du -h "$archive" | cut -f1) in $archive (steps: $log)"
grep -E '^[a-z_0-9]+: [0-9]+ s' "$log"
