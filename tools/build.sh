#!/usr/bin/env bash
# Configures and builds attnjit into build/ (override with BUILD_DIR). Used by the quick start,
# the test script and CI.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
# The Python extension is built (and tested) where nanobind is installed (tools/setup_deps.sh).
python_ext=OFF
python3 -c "import nanobind" 2>/dev/null && python_ext=ON
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DATTNJIT_PYTHON="$python_ext" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}"
