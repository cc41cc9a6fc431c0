#!/usr/bin/env bash
# The performance half of a GPU session (tests/device/device_check.sh is the correctness half): tune the
# shipped database, show that prepare() uses it, time the examples with it, and run attnjit against
# PyTorch's SDPA and FlexAttention side by side.
#
#   bash bench/perf_check.sh OUTDIR [BUDGET_SECONDS]   (from the repository root; carry .deps)
#
# Steps, each under `timeout` within BUDGET_SECONDS (default 560):
#   build       Release build with the Python package (build-device/, as device_check.sh)
#   python      the Python package's tests (their GPU subset)
#   tune        bench/tune_gpu.sh into OUTDIR/<gpu>.json (about a third of the budget)
#   shipped     that file copied to autotune_db/; the GPU test "[tuning]" (prepare() hits it) and
#               attnjit_gpu_bench over the examples at 16384 with the tuned tiles
#   peers       bench/peers.py --out OUTDIR (what is left)
# Everything prints to OUTDIR/perf.log; OUTDIR also gets the database, tune.log, the tuning table
# and peers.{json,md,png}.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash bench/perf_check.sh OUTDIR [BUDGET_SECONDS]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
budget="${2:-560}"
build="${BUILD_DIR:-$root/build-device}"
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
export ATTNJIT_CACHE_DIR="$build/kernel-cache" PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
cd "$root" || exit 2
exec > >(tee -a "$out/perf.log") 2>&1
status=0
run() {  # NAME LIMIT COMMAND...
  local name="$1" limit="$2"; shift 2
  (( limit > $(left) )) && limit=$(left)
  if (( limit < 10 )); then echo "== $name: not run (budget spent)"; status=1; return; fi
  echo "== [$(( $(date +%s) - t0 ))s] $name (limit ${limit}s)"
  timeout -k 5 "$limit" "$@"; local rc=$?
  echo "   -> $name exit $rc"
  (( rc != 0 && rc != 77 )) && status=1
  return 0
}

py_opt="-DATTNJIT_PYTHON=OFF"
python3 -m nanobind --cmake_dir > /dev/null 2>&1 && py_opt="-DATTNJIT_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3)"
run build 240 bash -c "cmake -S '$root' -B '$build' -DCMAKE_BUILD_TYPE=Release -DATTNJIT_LIT_TESTS=OFF $py_opt \
  -DATTNJIT_DEPS_DIR='$root/.deps' > /dev/null && cmake --build '$build' -j $(nproc) 2>&1 | tail -n 3"
run python 110 bash -c "cd '$build' && ctest -L python -E python_wheel --output-on-failure --timeout 100 | tail -n 40"

gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | sed 's/[^A-Za-z0-9.-]/_/g')"
if [ -z "$gpu" ]; then echo "no GPU: tuning, the shipped-database check and the benchmarks are skipped"; exit 77; fi
db="$out/$gpu.json"
tune_s=$(( $(left) * 2 / 5 ))
run tune $(( tune_s + 20 )) env BUILD_DIR="$build" TUNE_LOG="$out/tune.log" bash bench/tune_gpu.sh "$db" "$tune_s"
if [ -s "$db" ]; then
  cp "$db" "$root/autotune_db/$gpu.json"
  python3 bench/tuning_table.py "$db" --out "$out/tuning_table.md" > /dev/null 2>&1 || \
    PYTHONPATH="$build/python" python3 bench/tuning_table.py "$db" --out "$out/tuning_table.md" > /dev/null
  run shipped 40 bash -c "cd '$build' && ATTNJIT_GPU_TESTS_DEVICE=gpu ./tests/attnjit_gpu_tests '[tuning]'"
  specs=(); for f in examples/*.json; do grep -q '"attnjit_manifest"' "$f" || specs+=("$f"); done
  run tuned_bench 60 bash -c "'$build/bench/attnjit_gpu_bench' --seq 16384 --heads 16 --head-dim 128 --dtype bf16 --batch 1 \
    ${specs[*]} | grep -v '^JSON '"
fi
run peers $(( $(left) - 5 )) env PYTHONPATH="$build/python" python3 bench/peers.py --out "$out" --budget $(( $(left) - 20 ))
echo "== done in $(( $(date +%s) - t0 ))s, status $status"
exit $status
