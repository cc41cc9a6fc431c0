#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test (unit and property tests,
# the lit suite, the contract cross-check). GPU tests say so when they are skipped.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
bash "$root/scripts/setup_deps.sh"
bash "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
