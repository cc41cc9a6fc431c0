#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test (unit and property tests,
# the lit suite, the contract cross-check). GPU tests say so when they are skipped. The full
# sweeps, which CI runs a covering part of, run with --sweep.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
bash "$root/scripts/setup_deps.sh"
bash "$root/scripts/build.sh"
cd "$build"
# The full sweeps (ctest label "sweep") run on request: tests/run.sh --sweep runs them alone.
if [[ "${1:-}" == "--sweep" ]]; then
  shift
  exec ctest --output-on-failure -j "${JOBS:-$(nproc)}" -L sweep "$@"
fi
ctest --output-on-failure -j "${JOBS:-$(nproc)}" -LE sweep "$@"
