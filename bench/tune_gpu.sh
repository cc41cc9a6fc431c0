#!/usr/bin/env bash
# Tunes this machine's GPU for the shipped database (autotune_db/<gpu>.json): the patterns of
# bench/tune_manifest.json (dense, dense causal and the examples) at head dims 128 and 64, bf16 and
# fp16, sequence buckets 4096 and 16384, 16 heads.
#
#   bash bench/tune_gpu.sh DB_FILE [BUDGET_SECONDS]     (from the repository root, after a build)
#
# 1. `attnjit precompile` of every candidate the tuner may time, in parallel, into the kernel
#    cache (so the timing runs below do not wait for NVRTC one kernel at a time);
# 2. `attnjit tune` per (pattern, head dim, dtype), most used first (bf16 at 128, fp16 at 128, then
#    head dim 64), each under a 60 s limit for its two buckets (30 s a key), until BUDGET_SECONDS
#    (default 300) are spent. What was not reached is listed at the end; rerunning with the same
#    DB_FILE adds to it (attnjit tune merges).
# Environment: BUILD_DIR (build-device), ATTNJIT_CACHE_DIR (the kernel cache both steps share),
# TUNE_LOG (every candidate's times, appended; default DB_FILE.log), TUNE_KINDS (the (dtype, head
# dim) pairs in turn, default "bf16 128,fp16 128,bf16 64,fp16 64"), TUNE_PATTERNS (spec files,
# space-separated, default the seven above), TUNE_SEQ (default 4096,16384). With either of the
# first two set, only their candidates are precompiled.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash bench/tune_gpu.sh DB_FILE [BUDGET_SECONDS]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
db="$1"
budget="${2:-300}"
log="${TUNE_LOG:-$db.log}"
build="${BUILD_DIR:-$root/build-device}"
attnjit="$build/attnjit"
t0=$(date +%s)
[ -x "$attnjit" ] || { echo "tune_gpu: $attnjit not built" >&2; exit 2; }
cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')"
[ -n "$cc" ] || { echo "tune_gpu: no GPU (nvidia-smi gave no compute capability)" >&2; exit 77; }
mkdir -p "$(dirname "$db")"

# Compute capability 9.0 runs the Hopper forward (sm_90a) unless ATTNJIT_SM90A=0; its backward is
# the portable kernels' compiled for sm_90a. The tuner times the path the runtime will run.
arch="sm_$cc"
[ "$cc" = 90 ] && [[ "${ATTNJIT_SM90A:-1}" != @(0|false|no|off) ]] && arch=sm_90a
patterns=(bench/patterns/dense.json bench/patterns/dense_causal.json examples/longnet.json examples/bigbird.json
          examples/causal_local.json examples/sliding_window.json examples/seed_dilated.json)
[ -n "${TUNE_PATTERNS:-}" ] && read -r -a patterns <<< "$TUNE_PATTERNS"
IFS=, read -r -a kinds <<< "${TUNE_KINDS:-bf16 128,fp16 128,bf16 64,fp16 64}"
seqs="${TUNE_SEQ:-4096,16384}"
manifest="$root/bench/tune_manifest.json"
if [ -n "${TUNE_PATTERNS:-}${TUNE_KINDS:-}" ]; then  # only what this run tunes
  manifest="$(mktemp --suffix .json)"
  trap 'rm -f "$manifest"' EXIT
  { echo '{"attnjit_manifest": 1, "entries": ['
    sep=""
    for kind in "${kinds[@]}"; do
      set -- $kind
      printf '%s{"patterns": [' "$sep"; psep=""
      for spec in "${patterns[@]}"; do printf '%s"%s"' "$psep" "$root/$spec"; psep=", "; done
      printf '], "head_dims": [%s], "dtypes": ["%s"], "tiles": ["candidates"]}\n' "$2" "$1"
      sep=","
    done
    echo ']}'; } > "$manifest"
fi
echo "== precompile every candidate for $arch"
timeout 240 "$attnjit" precompile "$manifest" --arch "$arch" -j "$(nproc)" 2>&1 | tr '\r' '\n' | tail -n 3

not_reached=()
for kind in "${kinds[@]}"; do
  set -- $kind
  for spec in "${patterns[@]}"; do
    left=$(( budget - ($(date +%s) - t0) ))
    if (( left < 20 )); then not_reached+=("$spec $1 d$2"); continue; fi
    limit=$(( left < 60 ? left : 60 ))
    echo "== tune $spec $1 head dim $2 (limit ${limit}s)"
    timeout "$limit" "$attnjit" tune "$root/$spec" --seq "$seqs" --heads-q 16 --head-dim "$2" --dtype "$1" \
      --db "$db" --seconds 1 --iterations 30 2>&1 | tee -a "$log" | grep -E "^winner|rror"
  done
done
echo "== done in $(( $(date +%s) - t0 ))s; not reached: ${#not_reached[@]}"
for x in "${not_reached[@]}"; do echo "   $x"; done
