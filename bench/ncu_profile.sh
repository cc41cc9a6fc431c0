#!/usr/bin/env bash
# Nsight Compute profiles of attnjit's kernels, for the "why are we slower" half of a GPU session
# (docs/performance.md keeps what they showed).
#
#   bash bench/ncu_profile.sh OUTDIR SPEC...     (from the repository root, after a build in
#                                                 build-device/: tests/device/device_check.sh makes one)
#
# For each SPEC: attnjit_gpu_bench runs once (--runs 1 --warmup 0) at SEQ tokens (16384), 16 heads,
# head dim 128, bf16, batch 1, with the kernels the runtime picks (the shipped tuning database
# included), under `ncu --set full`, three times: the forward kernel, the backward's dQ kernel and
# its dK/dV kernel (one launch each). Writes OUTDIR/<spec>_<kernel>.ncu-rep and a text export of its
# details page (speed of light, memory and compute workload, occupancy, scheduler and warp-state
# statistics, Nsight's own findings) to OUTDIR/<spec>_<kernel>.txt; OUTDIR/summary.txt has the
# headline lines of every profile.
#
# OUTDIR/<spec>_<kernel>.metrics.txt: the stall reasons (warps per issued instruction), the tensor
# pipe's activity and the instructions issued per HMMA besides it (the sm_80 review's figure).
#
# KERNELS=paged: the paged forward's kernel of decode instead, each SPEC a case of
# bench/decode_peers.py (dense-b32-l8192: 32 requests of 8K tokens, 32 query and 8 KV heads), run
# by that script (its ours-device-plan system, a few runs) with the build's Python package.
#
# Environment: BUILD_DIR (build-device), SEQ (16384), KERNELS ("fwd dq dkdv", or "paged"), NCU (ncu
# on PATH or /usr/local/cuda/bin/ncu).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash bench/ncu_profile.sh OUTDIR SPEC..." >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
shift
build="${BUILD_DIR:-$root/build-device}"
seq="${SEQ:-16384}"
ncu="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
bench="$build/bench/attnjit_gpu_bench"
[ -x "$ncu" ] || { echo "SKIPPED: no Nsight Compute (ncu) on this machine"; exit 77; }
[ -x "$bench" ] || { echo "ncu_profile: $bench is not built (run tests/device/device_check.sh first)" >&2; exit 2; }
export ATTNJIT_CACHE_DIR="${ATTNJIT_CACHE_DIR:-$build/kernel-cache}"

status=0
: > "$out/summary.txt"
args=(--seq "$seq" --heads 16 --head-dim 128 --dtype bf16 --batch 1 --runs 1 --warmup 0 --no-ttfr)
for spec in "$@"; do
  name="$(basename "$spec" .json)"
  # The forward kernel by its name (from a run without ncu): the bench first launches a small
  # warm-up kernel that a name pattern would catch instead.
  fwd_name=""
  [[ " ${KERNELS:-fwd} " == *" fwd "* ]] &&
    fwd_name="$("$bench" "${args[@]}" --no-backward "$spec" 2>/dev/null | sed -n 's/.*"kernel":"\(attnjit_fwd_[0-9a-f]*\)".*/\1/p' | head -n1)"
  for kernel in ${KERNELS:-fwd dq dkdv}; do
    run=("$bench" "${args[@]}" "$spec")
    case "$kernel" in
      fwd) [ -n "$fwd_name" ] || { echo "   $name: the bench named no forward kernel"; status=1; continue; }
           filter="$fwd_name" ;;
      dq) filter='regex:^attnjit_bwd_.*_dq$' ;;
      dkdv) filter='regex:^attnjit_bwd_.*_dkdv$' ;;
      paged) filter='regex:^attnjit_paged_.*_fwd$'
             run=(env PYTHONPATH="$build/python" python3 "$root/bench/decode_peers.py" --out "$out/decode_run" --runs 3
                  --budget 1 --cases "$spec" --systems ours-device-plan) ;;
      *) echo "   unknown kernel '$kernel' (fwd, dq, dkdv or paged)"; status=1; continue ;;
    esac
    rep="$out/${name}_$kernel"
    echo "== $name $kernel"
    if ! "$ncu" --set full --import-source no -k "$filter" -c 1 -f -o "$rep" "${run[@]}" > "$rep.log" 2>&1; then
      echo "   ncu failed: $(tail -n 3 "$rep.log" | tr '\n' ' ')"; status=1; continue
    fi
    "$ncu" -i "$rep.ncu-rep" --page details --print-units base > "$rep.txt" 2>&1 || status=1
    # Where the warps wait (stall reasons per issued instruction) and the executed instruction mix
    # (HMMA against everything else: the sm_80 review's figure).
    "$ncu" -i "$rep.ncu-rep" --page raw --print-units base \
      | grep -E '^ +(smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active\.ratio|smsp__inst_executed\.sum|sm__ops_path_tensor_op_hmma_src_[a-z0-9_]+_sparsity_off\.sum|sm__pipe_tensor_op_hmma_cycles_active\.avg\.pct_of_peak_sustained_active) ' \
      > "$rep.metrics.txt"
    # An m16n8k16 HMMA is 4096 tensor ops: instructions issued per HMMA besides the HMMA itself.
    per_hmma="$(awk '/smsp__inst_executed.sum/ {gsub(",", "", $NF); all = $NF}
         /sm__ops_path_tensor_op_hmma_src/ {gsub(",", "", $NF); ops += $NF}
         END {if (ops > 0) printf "    non-MMA instructions per HMMA: %.2f\n", (all - ops / 4096) / (ops / 4096)}' \
      "$rep.metrics.txt")"
    echo "$per_hmma" >> "$rep.metrics.txt"
    {
      echo "## $name $kernel"
      grep -E 'non-MMA|hmma_cycles_active|stalled_(wait|math_pipe_throttle|short_scoreboard|long_scoreboard|barrier)_' "$rep.metrics.txt"
      grep -E '^\s+(attnjit_|  Section: )|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Registers Per Thread|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|Executed Instructions  ' "$rep.txt"
      echo
    } >> "$out/summary.txt"
  done
done
cat "$out/summary.txt"
exit $status
