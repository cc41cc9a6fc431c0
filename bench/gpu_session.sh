#!/usr/bin/env bash
# A lent GPU session in two calls: correctness first, then timings, each inside its call's limit.
#
#   bash bench/gpu_session.sh OUTDIR check [BUDGET]   (repository root, .deps and .device-cache.txz carried; BUDGET 520 s,
#                                                     timeout_s 560)
#   bash bench/gpu_session.sh OUTDIR bench [BUDGET]   (the same machine while warm, or a fresh one:
#                                                     it builds what it lacks; BUDGET 220 s,
#                                                     timeout_s 260)
#
# check: tests/device/device_check.sh with every correctness step: the probes, then eight lanes side
#   by side (the GPU tests, the Python package's GPU subset and the four sanitizers:
#   ATTNJIT_DC_LANES), within BUDGET seconds; OUTDIR/dc/report.{md,json}, the logs packed in
#   OUTDIR/dc.tgz. Kernel compiles dominated these steps and shared the CPU (nine lanes on 16
#   cores cut five steps at 320 s on an H200): carry .device-cache.txz, the kernels compiled here
#   beforehand (tests/device/precompile_cache.sh), and the lanes wait for the GPU instead.
# bench: what each call of a session has measured so far, by priority: bench/peers.py on the cases
#   that decide the headline (dense d128, BigBird, LongNet 32K; OUTDIR/peers/peers.{md,json}), then
#   bench/decode_peers.py (OUTDIR/decode.md) where 60 s are left, then kernel options against the
#   default (attnjit_gpu_bench on dense and BigBird per setting in processes of their own, the
#   settings interleaved in rounds: default (with LongNet), ATTNJIT_PACK_BRANCHES=0 (LongNet's forward),
#   ATTNJIT_KEEP_POOL_MEMORY=1, ATTNJIT_BWD_WGMMA=0, ATTNJIT_DETERMINISTIC=1 (the backward's two-pass
#   form: its target is 85% of the default's speed), ATTNJIT_LAZY_RESCALE=1, ATTNJIT_POLY_EXP2=1,
#   ATTNJIT_PERSISTENT=1 (forward and backward; with causal_local, whose short items should gain
#   most, and the default on it too); OUTDIR/ab.txt; the bench reports each call's host time too)
#   and Nsight Compute on the dense backward's dK/dV kernel, then on decode's paged forward
#   (bench/ncu_profile.sh; their summaries appended to ab.txt) with what is left.
# Everything else (logs, profiles, peers.png) in OUTDIR/session.tgz. At most 8 files come back from
# a lent machine: check leaves dc/report.md, dc/report.json, dc.tgz; bench leaves peers/peers.md,
# peers/peers.json, decode.md, ab.txt, session.tgz.
set -u
[ $# -ge 2 ] && [[ "$2" == check || "$2" == bench ]] || {
  echo "usage: bash bench/gpu_session.sh OUTDIR check|bench [BUDGET]" >&2
  exit 2
}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
part="$2"
cd "$root" || exit 2
build="$root/build-device"
mkdir -p "$out/logs"

if [ "$part" = check ]; then
  budget="${3:-520}"
  echo "== device check (budget ${budget}s)"
  ATTNJIT_DC_BUDGET="$budget" ATTNJIT_DC_PACK=1 ATTNJIT_DC_ONLY=probes \
  ATTNJIT_DC_LANES="gpu_forward_examples gpu_forward gpu_forward_sm90a_cpasync;gpu_backward;gpu_backward_wgmma;gpu_backward_random gpu_forward_sm80;gpu_paged gpu_driver;python_tests;memcheck synccheck;racecheck initcheck" \
    bash tests/device/device_check.sh "$out/dc" > "$out/logs/device_check.out" 2>&1
  echo "device check: exit $? ($SECONDS s)"
  grep -m1 'result:' "$out/dc/report.md"
  rm -rf "$out/logs"
  exit 0
fi

bench_budget="${3:-220}"
# A fresh machine (no warm one from the check): configure and build what the timings need.
if [ ! -x "$build/bench/attnjit_gpu_bench" ] || [ ! -d "$build/python/attnjit" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTNJIT_LIT_TESTS=OFF > "$out/logs/build.out" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >> "$out/logs/build.out" 2>&1
  echo "build: exit $? ($SECONDS s)"
fi
t_bench=$SECONDS
left() { echo $(( bench_budget - (SECONDS - t_bench) )); }
export ATTNJIT_CACHE_DIR="$build/kernel-cache"
py=(env PYTHONUNBUFFERED=1 PYTHONPATH="$build/python" python3)

# 1. The peers, keeping 20 s for packing and, where the budget allows, 60 s for decode.
decode_budget=0
(( $(left) - 20 - 60 >= 120 )) && decode_budget=60
peers_budget=$(( $(left) - 20 - decode_budget ))
if (( peers_budget >= 40 )) && [ -d "$build/python/attnjit" ]; then
  timeout $(( peers_budget + 15 )) "${py[@]}" bench/peers.py --out "$out/peers" --budget "$peers_budget" \
    --cases 'dense-d128-s16384,bigbird-s16384,longnet-s32768' > "$out/logs/peers.out" 2>&1
  echo "peers: exit $? ($SECONDS s)"
else
  echo "peers: not run (${peers_budget}s left, or no Python package)"
fi
# 2. Decode: the paged forward, planned on the host and on the device, against SDPA on a contiguous
#    cache and a copy of the same bytes (FlexAttention's compiles do not fit here: --systems).
if (( decode_budget > 0 )) && [ -d "$build/python/attnjit" ]; then
  timeout $(( decode_budget + 15 )) "${py[@]}" bench/decode_peers.py --out "$out/logs/decode" --budget 8 \
    --systems 'ours*,sdpa*' > "$out/logs/decode.out" 2>&1
  echo "decode: exit $? ($SECONDS s)"
  cp "$out/logs/decode/decode.md" "$out/decode.md" 2>/dev/null
else
  echo "decode: not run (budget, or no Python package)"
fi
# 3. Kernel options against the default, attnjit alone, in interleaved rounds, while 60 s are left.
bench_bin="$build/bench/attnjit_gpu_bench"
common=(--seq 16384 --heads 16 --head-dim 128 --dtype bf16 --batch 1 --no-ttfr)
: > "$out/ab.txt"
if [ -x "$bench_bin" ]; then
  for round in 1 2; do
    for setting in default ATTNJIT_PACK_BRANCHES=0 ATTNJIT_KEEP_POOL_MEMORY=1 ATTNJIT_BWD_WGMMA=0 ATTNJIT_DETERMINISTIC=1 \
      ATTNJIT_LAZY_RESCALE=1 ATTNJIT_POLY_EXP2=1 ATTNJIT_PERSISTENT=1; do
      (( $(left) < 60 )) && { echo "round $round $setting: not run (budget)" >> "$out/ab.txt"; continue; }
      extra=()
      [[ "$setting" == *RESCALE* || "$setting" == *POLY* || "$setting" == *PACK* ]] && extra=(--no-backward)
      env_set=()
      [ "$setting" != default ] && env_set=("$setting")
      # LongNet's packed plans (the default) against one tile per branch: its forward only.
      patterns=("$root/bench/patterns/dense.json" "$root/examples/bigbird.json")
      [ "$setting" = default ] && patterns+=("$root/examples/longnet.json" "$root/examples/causal_local.json")
      [[ "$setting" == *PERSISTENT* ]] && patterns+=("$root/examples/causal_local.json")
      [[ "$setting" == *PACK* ]] && patterns=("$root/examples/longnet.json")
      echo "## round $round: $setting" >> "$out/ab.txt"
      env "${env_set[@]}" timeout 60 "$bench_bin" "${common[@]}" "${extra[@]}" "${patterns[@]}" >> "$out/ab.txt" 2>&1
      echo "exit $?" >> "$out/ab.txt"
    done
  done
fi
echo "ab: done ($SECONDS s)"
# 4. Nsight Compute on the dense dK/dV kernel, where 110 s are left.
if (( $(left) > 110 )); then
  KERNELS=dkdv BUILD_DIR="$build" timeout 90 bash bench/ncu_profile.sh "$out/logs/ncu" "$root/bench/patterns/dense.json" \
    > "$out/logs/ncu.out" 2>&1
  echo "ncu: exit $? ($SECONDS s)"
  { echo; echo "== Nsight Compute, the dK/dV kernel (bench/ncu_profile.sh)"; cat "$out/logs/ncu/summary.txt"; } >> "$out/ab.txt" 2>/dev/null
  rm -f "$out"/logs/ncu/*.ncu-rep  # the text exports stay; the reports are too big to bring back
fi
# 5. Nsight Compute on decode's paged forward (32 requests of 8K tokens), where 70 s are left.
if (( $(left) > 70 )) && [ -d "$build/python/attnjit" ]; then
  KERNELS=paged BUILD_DIR="$build" timeout 60 bash bench/ncu_profile.sh "$out/logs/ncu_decode" dense-b32-l8192 \
    > "$out/logs/ncu_decode.out" 2>&1
  echo "ncu decode: exit $? ($SECONDS s)"
  { echo; echo "== Nsight Compute, decode's paged forward (bench/ncu_profile.sh, KERNELS=paged)"
    cat "$out/logs/ncu_decode/summary.txt"; } >> "$out/ab.txt" 2>/dev/null
  rm -f "$out"/logs/ncu_decode/*.ncu-rep
fi
mkdir -p "$out/peers"
[ -f "$out/peers/peers.png" ] && mv "$out/peers/peers.png" "$out/logs/"
tar czf "$out/session.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "done ($SECONDS s)"
