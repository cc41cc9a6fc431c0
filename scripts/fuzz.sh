#!/usr/bin/env bash
# Builds and runs attnjit's libFuzzer targets (fuzz/): one per reader of outside bytes.
#
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]   run one target for SECONDS on its corpus
#   scripts/fuzz.sh all SECONDS [libFuzzer flags...]      every target in turn
#   scripts/fuzz.sh build                                 only build them
#
# TARGET: spec, npy, kernel_cache, tuning_db, dynamic_layout. The targets are a clang build of
# their own (-DATTNJIT_FUZZ=ON, address + undefined sanitizers) in FUZZ_BUILD_DIR (default
# build-fuzz/). Each run starts from the seeds fuzz/make_corpus.py writes from the repository and
# keeps what it finds in FUZZ_BUILD_DIR/corpus/TARGET; a crashing input lands in
# FUZZ_BUILD_DIR/artifacts/TARGET/ and is replayed with `FUZZ_BUILD_DIR/fuzz/fuzz_TARGET FILE`.
# Exit status: 0 no finding, 1 a finding (crash, sanitizer report, timeout, out of memory) or a
# failed build, 77 skipped (no clang with libFuzzer; scripts/setup_deps.sh installs it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
targets=(spec npy kernel_cache tuning_db dynamic_layout)
cc="${FUZZ_CC:-clang}"
cxx="${FUZZ_CXX:-clang++}"

usage() {
  echo "usage: scripts/fuzz.sh {${targets[*]// /|}|all} SECONDS [libFuzzer flags...] | scripts/fuzz.sh build" >&2
  exit 2
}
[ $# -ge 1 ] || usage
what="$1"
shift
if [ "$what" != build ]; then
  [ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]] || usage
  seconds="$1"
  shift
  [ "$what" = all ] || [[ " ${targets[*]} " == *" $what "* ]] || usage
fi

# libFuzzer ships with clang (Debian: libclang-rt-*-dev); without it there is nothing to run.
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe_dir/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" >"$probe_dir/log" 2>&1; then
  echo "SKIPPED: fuzzing needs clang with libFuzzer and the sanitizers ('$cxx -fsanitize=fuzzer,address,undefined' fails:" \
       "$(head -c 300 "$probe_dir/log")); run scripts/setup_deps.sh" >&2
  exit 77
fi

# Configure, build and write the seeds under a lock: ctest runs the targets side by side.
mkdir -p "$build"
(
  flock 9
  cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release \
        -DATTNJIT_FUZZ=ON -DATTNJIT_BUILD_TESTS=OFF -DATTNJIT_PYTHON=OFF >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
  cmake --build "$build" --target attnjit_fuzz_all -j "${JOBS:-$(nproc)}" >"$build/build.log" 2>&1 ||
    { tail -n 60 "$build/build.log" >&2; echo "fuzz: the build failed (log: $build/build.log)" >&2; exit 1; }
  python3 "$root/fuzz/make_corpus.py" "$build/seeds" >/dev/null
) 9>"$build/.lock"
[ "$what" != build ] || { echo "fuzz: built ${targets[*]} in $build/fuzz"; exit 0; }

# Longest input per target: room for every seed, small enough to keep executions fast.
max_len() {
  case "$1" in
    tuning_db) echo 16384 ;;
    *) echo 4096 ;;
  esac
}

run_one() {
  local t="$1" corpus="$build/corpus/$1" artifacts="$build/artifacts/$1/" log="$build/logs/$1.log"
  mkdir -p "$corpus" "$artifacts" "$build/logs"
  local dict=()
  [ -f "$root/fuzz/$t.dict" ] && dict=(-dict="$root/fuzz/$t.dict")
  echo "fuzz: $t for ${seconds}s (corpus $corpus, log $log)"
  local status=0
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
    -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$artifacts" "${dict[@]}" \
    "${extra[@]}" "$corpus" "$build/seeds/$t" >"$log" 2>&1 || status=$?
  local runs took
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  took="$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)"
  if [ "$status" -ne 0 ]; then
    tail -n 80 "$log" >&2
    echo "fuzz: $t: FINDING after ${runs:-?} executions (exit $status); the input is in $artifacts" >&2
    return 1
  fi
  echo "fuzz: $t: ${runs:-?} executions in ${took:-?}s, no finding; corpus $(find "$corpus" -type f | wc -l) inputs"
}

extra=("$@")
if [ "$what" = all ]; then
  failed=()
  for t in "${targets[@]}"; do run_one "$t" || failed+=("$t"); done
  if ((${#failed[@]})); then
    echo "fuzz: findings in: ${failed[*]}" >&2
    exit 1
  fi
else
  run_one "$what"
fi
