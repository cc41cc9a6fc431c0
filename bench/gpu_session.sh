#!/usr/bin/env bash
# One call on a lent GPU machine: correctness first, then timings, inside the call's limit.
#
#   bash bench/gpu_session.sh OUTDIR [DC_BUDGET] [BENCH_BUDGET]   (repository root, .deps carried;
#   the two budgets and about 20 s more within the call: timeout_s 580 with the defaults)
#
# 1. tests/device/device_check.sh with every correctness step (probes, then the GPU tests,
#    Python's GPU subset and the four sanitizers in lanes side by side: ATTNJIT_DC_LANES), within
#    DC_BUDGET seconds (330); OUTDIR/dc/report.{md,json}, the logs packed in OUTDIR/dc.tgz.
# 2. Kernel options against the default, attnjit alone: attnjit_gpu_bench on dense and BigBird
#    (16384 tokens, 16 heads, head dim 128, bf16) per setting in processes of its own, the
#    settings interleaved in rounds so drift hits each alike; OUTDIR/ab.txt.
#    Settings: default; ATTNJIT_BWD_WGMMA=0 (the sm_80 backward on Hopper); ATTNJIT_LAZY_RESCALE=1
#    and ATTNJIT_POLY_EXP2=1 (forward only).
# 3. Nsight Compute on the dense backward's dK/dV kernel (bench/ncu_profile.sh), where ncu is
#    there; its summary appended to OUTDIR/ab.txt.
# 4. bench/peers.py on the cases that decide the headline (dense d128, BigBird, LongNet 32K) with
#    what is left of BENCH_BUDGET (230); OUTDIR/peers/peers.{md,json}; then, where 60 s are left
#    beside at least 90 for the peers, bench/decode_peers.py (OUTDIR/decode.md; its JSON in the logs).
# Everything else (logs, profiles, peers.png) in OUTDIR/session.tgz. At most 8 files come back
# from a lent machine: this leaves dc/report.md, dc/report.json, dc.tgz, ab.txt (the Nsight
# summary at its end), decode.md, peers/peers.md, peers/peers.json, session.tgz.
set -u
[ $# -ge 1 ] || { echo "usage: bash bench/gpu_session.sh OUTDIR [DC_BUDGET] [BENCH_BUDGET]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
dc_budget="${2:-330}"
bench_budget="${3:-230}"
cd "$root" || exit 2
build="$root/build-device"
mkdir -p "$out/logs"

echo "== device check (budget ${dc_budget}s)"
ATTNJIT_DC_BUDGET="$dc_budget" ATTNJIT_DC_PACK=1 ATTNJIT_DC_ONLY=lanes \
ATTNJIT_DC_LANES="probes;gpu_forward_examples gpu_forward;gpu_backward;gpu_backward_wgmma;gpu_backward_random gpu_driver;gpu_paged gpu_forward_sm80 gpu_forward_sm90a_cpasync;python_tests;memcheck synccheck;racecheck initcheck" \
  bash tests/device/device_check.sh "$out/dc" > "$out/logs/device_check.out" 2>&1
echo "device check: exit $? ($SECONDS s)"
grep -m1 'result:' "$out/dc/report.md"

t_bench=$SECONDS
left() { echo $(( bench_budget - (SECONDS - t_bench) )); }
export ATTNJIT_CACHE_DIR="$build/kernel-cache"
bench_bin="$build/bench/attnjit_gpu_bench"
common=(--seq 16384 --heads 16 --head-dim 128 --dtype bf16 --batch 1 --no-ttfr)
: > "$out/ab.txt"
if [ -x "$bench_bin" ]; then
  for round in 1 2; do
    for setting in default ATTNJIT_BWD_WGMMA=0 ATTNJIT_LAZY_RESCALE=1 ATTNJIT_POLY_EXP2=1; do
      (( $(left) < 60 )) && { echo "round $round $setting: not run (budget)" >> "$out/ab.txt"; continue; }
      extra=()
      [[ "$setting" == *RESCALE* || "$setting" == *POLY* ]] && extra=(--no-backward)
      env_set=()
      [ "$setting" != default ] && env_set=("$setting")
      echo "## round $round: $setting" >> "$out/ab.txt"
      env "${env_set[@]}" timeout 60 "$bench_bin" "${common[@]}" "${extra[@]}" \
        "$root/bench/patterns/dense.json" "$root/examples/bigbird.json" >> "$out/ab.txt" 2>&1
      echo "exit $?" >> "$out/ab.txt"
    done
  done
fi
echo "ab: done ($SECONDS s)"

if (( $(left) > 120 )); then
  KERNELS=dkdv BUILD_DIR="$build" timeout 90 bash bench/ncu_profile.sh "$out/logs/ncu" "$root/bench/patterns/dense.json" \
    > "$out/logs/ncu.out" 2>&1
  echo "ncu: exit $? ($SECONDS s)"
  { echo; echo "== Nsight Compute, the dK/dV kernel (bench/ncu_profile.sh)"; cat "$out/logs/ncu/summary.txt"; } >> "$out/ab.txt" 2>/dev/null
  rm -f "$out"/logs/ncu/*.ncu-rep  # the text exports stay; the reports are too big to bring back
fi

# The decode benchmark (the paged forward, planned on the host and on the device, against SDPA on a
# contiguous cache and a copy of the same bytes; FlexAttention's compiles do not fit) gets 60 s of it
# where the peers keep at least 90.
decode_budget=0
(( $(left) - 20 - 60 >= 90 )) && decode_budget=60
peers_budget=$(( $(left) - 20 - decode_budget ))
if (( peers_budget >= 40 )) && [ -d "$build/python/attnjit" ]; then
  PYTHONUNBUFFERED=1 PYTHONPATH="$build/python" timeout $(( peers_budget + 15 )) python3 bench/peers.py \
    --out "$out/peers" --budget "$peers_budget" --cases 'dense-d128-s16384,bigbird-s16384,longnet-s32768' \
    > "$out/logs/peers.out" 2>&1
  echo "peers: exit $? ($SECONDS s)"
else
  echo "peers: not run (${peers_budget}s left, or no Python package)"
fi
if (( decode_budget > 0 )) && [ -d "$build/python/attnjit" ]; then
  PYTHONUNBUFFERED=1 PYTHONPATH="$build/python" timeout $(( decode_budget + 15 )) python3 bench/decode_peers.py \
    --out "$out/logs/decode" --budget 8 --systems 'ours*,sdpa*' > "$out/logs/decode.out" 2>&1
  echo "decode: exit $? ($SECONDS s)"
  cp "$out/logs/decode/decode.md" "$out/decode.md" 2>/dev/null
else
  echo "decode: not run (budget, or no Python package)"
fi
mkdir -p "$out/peers"
[ -f "$out/peers/peers.png" ] && mv "$out/peers/peers.png" "$out/logs/"
tar czf "$out/session.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "done ($SECONDS s)"
