#!/usr/bin/env bash
# Before and after on one GPU machine, in one run: the working tree against a git revision, built
# side by side, the new build's GPU correctness tests, memcheck and the probes, then the same
# benchmark on both.
#
#   bash bench/gpu_ab.sh BASE_REV OUTDIR [SEQ]     (from the repository root, .deps carried along)
#   bash bench/gpu_ab.sh BASE.tgz OUTDIR [SEQ]     (the base as `git archive REV | gzip`, carried along)
#
# BASE_REV is exported with `git archive` into /tmp/attnjit-base (the machine's copy of the tree
# carries .git). Both are Release builds without Python (AB_PYTHON below); the benchmark is attnjit_gpu_bench at SEQ
# (16384) tokens, 16 heads, head dim 128, bf16, forward and backward, no time-to-first-result, over
# bench/patterns/dense*.json and the examples, each build with its own kernel cache. OUTDIR gets
# the logs and bench_base.txt / bench_new.txt (the tables and their JSON lines).
#
# Environment: AB_SKIP (steps left out, space-separated: fwd_tests bwd_tests memcheck probes),
# AB_BENCH_ARGS (more attnjit_gpu_bench arguments, e.g. --no-backward), AB_PYTHON=1 (the new build
# with the Python package too, where nanobind is there, so bench/peers.py can follow on it).
set -u
[ $# -ge 2 ] || { echo "usage: bash bench/gpu_ab.sh BASE_REV OUTDIR [SEQ]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_rev="$1"; mkdir -p "$2" || exit 2; out="$(cd "$2" && pwd)"; seq="${3:-16384}"
base=/tmp/attnjit-base
export PATH="$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer" ATTNJIT_GPU_TESTS_DEVICE=gpu
cd "$root" || exit 2
rm -rf "$base" && mkdir -p "$base" || exit 2
if [ -f "$base_rev" ]; then  # a tarball of the base tree (git archive REV | gzip), for a copy whose .git lacks REV
  tar -xzf "$base_rev" -C "$base" || { echo "gpu_ab: cannot unpack $base_rev" >&2; exit 2; }
else
  git archive "$base_rev" | tar -x -C "$base" || { echo "gpu_ab: cannot export $base_rev" >&2; exit 2; }
fi
[ -d .deps ] && cp -r .deps "$base/"
py_off="-DATTNJIT_PYTHON=OFF"
py_new="$py_off"
[ "${AB_PYTHON:-0}" = 1 ] && python3 -m nanobind --cmake_dir > /dev/null 2>&1 && \
  py_new="-DATTNJIT_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3)"
cfg() { cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DATTNJIT_LIT_TESTS=OFF $3 -DATTNJIT_DEPS_DIR="$1/.deps" > /dev/null; }
cfg "$root" "$root/build-device" "$py_new" && cfg "$base" "$base/build" "$py_off" || exit 1
jobs=$(nproc)
(cmake --build "$root/build-device" -j $(( jobs * 2 / 3 )) > "$out/build_new.log" 2>&1; echo "new build: exit $?") &
(cmake --build "$base/build" -j $(( jobs / 3 + 1 )) --target attnjit_gpu_bench > "$out/build_base.log" 2>&1; echo "base build: exit $?") &
wait
status=0
check() {  # NAME LIMIT COMMAND...
  local name="$1" limit="$2"; shift 2
  if [[ " ${AB_SKIP:-} " == *" $name "* ]]; then echo "$name: left out (AB_SKIP)"; return; fi
  (cd "$root/build-device" && timeout "$limit" "$@" > "$out/$name.log" 2>&1); local rc=$?
  echo "$name: exit $rc ($SECONDS s)"; tail -n 3 "$out/$name.log"
  (( rc != 0 )) && status=1
}
export ATTNJIT_CACHE_DIR="$root/build-device/kernel-cache"
check fwd_tests 150 ./tests/attnjit_gpu_tests 'every example pattern matches the float64 reference on the GPU,random patterns match the float64 reference on the GPU,every tile configuration the autotuner can choose matches the reference'
check bwd_tests 150 ./tests/attnjit_gpu_tests 'backward: every example pattern matches the reference gradients,backward: random patterns match the reference gradients'
check memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 ./tests/attnjit_gpu_tests '[sanitize]'
check probes 60 ./tests/attnjit_probes --device gpu
specs=(bench/patterns/dense*.json); for f in examples/*.json; do grep -q '"attnjit_manifest"' "$f" || specs+=("$f"); done
for side in base new; do
  if [ $side = base ]; then b="$base/build/bench/attnjit_gpu_bench"; export ATTNJIT_CACHE_DIR="$base/kernel-cache"
  else b="$root/build-device/bench/attnjit_gpu_bench"; export ATTNJIT_CACHE_DIR="$root/build-device/kernel-cache"; fi
  # shellcheck disable=SC2086
  timeout 150 "$b" --seq "$seq" --heads 16 --head-dim 128 --dtype bf16 --batch 1 --no-ttfr ${AB_BENCH_ARGS:-} "${specs[@]}" \
    > "$out/bench_$side.txt" 2>&1
  echo "bench $side: exit $? ($SECONDS s)"; grep -v '^JSON ' "$out/bench_$side.txt"
done
exit $status
