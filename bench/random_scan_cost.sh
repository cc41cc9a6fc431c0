#!/usr/bin/env bash
# Instructions per candidate block in the seek's random scan (compiler/codegen/codegen_mask.cpp,
# NextKeyWriter), as SASS: the scan over every row block of an item (the row hash inside the
# loop) against the scan of an item inside one row block (the row hashed once). The hash
# functions are templates/mask_lib.cuh's own; each form is compiled alone with nvcc and the
# instructions of its loop counted from nvdisasm. Needs nvcc and nvdisasm (no GPU).
# Usage: bash bench/random_scan_cost.sh [sm_80]
set -euo pipefail
arch="${1:-sm_80}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
{
  echo 'typedef unsigned long long aj_u64; typedef long long aj_i64;'
  # aj_splitmix64, aj_random_row and aj_random_col: the first definitions of mask_lib.cuh.
  sed -n '/^__device__ __forceinline__ aj_u64 aj_splitmix64/,/^\/\/ The random layout where/p' "$root/templates/mask_lib.cuh" | sed '$d'
  cat <<'CU'
extern "C" __global__ void every_row_block(aj_i64* out, int head, aj_i64 qbl, aj_i64 qbh, aj_i64 kb) {
  aj_i64 c = -1;
  for (aj_i64 b = kb; b < kb + 64 && c == -1; ++b)
    for (aj_i64 qb = qbl; qb <= qbh; ++qb)
      if (aj_random_col(aj_random_row(2020ull, head, qb), 225179981368525ull, b)) { c = b; break; }
  *out = c;
}
extern "C" __global__ void one_row_block(aj_i64* out, int head, aj_i64 qb, aj_i64 kb) {
  aj_i64 c = -1;
  const aj_u64 row = aj_random_row(2020ull, head, qb);
  for (aj_i64 b = kb; b < kb + 64; ++b)
    if (aj_random_col(row, 225179981368525ull, b)) { c = b; break; }
  *out = c;
}
CU
} > "$dir/scan.cu"
nvcc -cubin -arch="$arch" -O3 "$dir/scan.cu" -o "$dir/scan.cubin"
nvdisasm -c "$dir/scan.cubin" | python3 -c '
import re, sys
fn, rows, labels = None, {}, {}
for line in sys.stdin:
    m = re.match(r"\s*\.text\.(\w+):", line)
    if m: fn = m.group(1); rows[fn] = []; continue
    m = re.match(r"\s*(\.L_x_\d+):", line)
    if m and fn: labels[(fn, m.group(1))] = len(rows[fn]); continue
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m and fn: rows[fn].append(m.group(2))
for fn, ins in rows.items():
    # The innermost loop: the shortest backward branch (a branch to an earlier label; not the
    # one-instruction trap loop after EXIT).
    best = None
    for i, text in enumerate(ins):
        m = re.search(r"BRA\s.*`\((\.L_x_\d+)\)", text)
        if m and (fn, m.group(1)) in labels and labels[(fn, m.group(1))] <= i:
            n = i - labels[(fn, m.group(1))] + 1
            if n > 1: best = n if best is None else min(best, n)
    print(f"{fn}: {best} instructions per candidate block")
'
