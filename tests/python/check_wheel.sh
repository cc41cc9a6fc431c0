#!/usr/bin/env bash
# `pip wheel .` from the repository root builds a wheel (C++ library + extension) that installs on
# its own and imports without a GPU, a CUDA driver or PyTorch; one numpy call runs through it, and
# the shipped tuning databases inside it are the ones the package uses.
# Usage: check_wheel.sh ROOT [PYTHON]
set -euo pipefail
root="$1"
python="${2:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# No build isolation: nanobind and scikit-build-core are installed (scripts/setup_deps.sh), and the
# check must not depend on reaching PyPI.
"$python" -m pip wheel -q --no-build-isolation --no-deps -w "$tmp/dist" "$root"
wheel=$(ls "$tmp"/dist/attnjit-*.whl)
"$python" -m pip install -q --no-deps --target "$tmp/site" "$wheel"
cd "$tmp"
PYTHONPATH="$tmp/site" "$python" - "$root" <<'PY'
import sys, numpy as np, attnjit
assert attnjit.__file__.startswith(sys.path[0]) or "/site/" in attnjit.__file__, attnjit.__file__
p = attnjit.Pattern.load(sys.argv[1] + "/examples/longnet.json")
q = np.random.default_rng(0).standard_normal((1, 64, 2, 16)).astype(np.float32)
o = attnjit.attention(q, q, q, p)
assert o.shape == (1, 64, 2, 16) and np.isfinite(o).all()
# The shipped tuning databases came with the wheel and are the ones in use.
import os
info = attnjit.info()
shipped = os.path.join(os.path.dirname(attnjit.__file__), "autotune_db")
assert info["shipped_db_dir"] == shipped, (info["shipped_db_dir"], shipped)
want = sorted(f for f in os.listdir(sys.argv[1] + "/autotune_db") if f.endswith(".json"))
assert want and sorted(os.listdir(shipped)) == want, (os.listdir(shipped), want)
assert info["cpu_executor"] in ("generic", "avx2", "avx512"), info
# Every module of the package came with the wheel (attnjit.distributed's comm plan needs no torch.distributed run).
import attnjit.distributed, attnjit.nn  # noqa: E401
assert attnjit.distributed.comm_plan(p, 4096, 4, world_size=2).pairs
print("wheel ok:", attnjit.__file__, attnjit.__version__)
PY
