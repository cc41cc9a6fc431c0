#!/usr/bin/env bash
# Configures and builds attnjit into build/ (override with BUILD_DIR). Used by the quick start,
# the test script and CI. Arguments, if any, are the targets to build (default: all).
#   ATTNJIT_BUILD_TESTS=OFF  configure without the tests (the quick start; default ON)
#   ATTNJIT_PYTHON=ON|OFF    the Python extension (default: ON where nanobind is installed,
#                            scripts/setup_deps.sh installs it)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
python_ext="${ATTNJIT_PYTHON:-}"
if [ -z "$python_ext" ]; then
  python_ext=OFF
  python3 -c "import nanobind" 2>/dev/null && python_ext=ON
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DATTNJIT_PYTHON="$python_ext" \
  -DATTNJIT_BUILD_TESTS="${ATTNJIT_BUILD_TESTS:-ON}" ${CMAKE_ARGS:-} >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}"
