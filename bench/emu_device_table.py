#!/usr/bin/env python3
"""The cost of a dynamic table the kernels read in place against the same table given on the host,
in the emulator (time there follows the tiles a kernel visits): union(local 0, dynamic) over 32
blocks of 64 keys, one table block per row, bf16, head dim 64.

    PYTHONPATH=build/python python3 bench/emu_device_table.py [--blocks 32] [--runs 3]

Prints the median seconds of each and checks that both give the same output."""
import argparse
import os
import statistics
import time

os.environ.setdefault("ATTNJIT_CPU_DEVICE", "emu")
import torch  # noqa: E402

import attnjit  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    block, heads = 64, 2
    pattern = attnjit.Pattern.from_json({"attnjit": 1, "layout": {"block": block, "union": [{"local": 0}, {"dynamic": True}]},
                                         "branches": [{"segment": "full"}]})
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, a.blocks * block, heads, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    cols = torch.tensor([(r * 7 + 3) % a.blocks for r in range(a.blocks)], dtype=torch.int32)
    rows = torch.arange(a.blocks + 1)
    tables = {"host": {"row_offsets": rows.tolist(), "col_indices": cols.tolist()},
              "in place": {"row_offsets": rows, "col_indices": cols, "errors": torch.zeros(1, dtype=torch.int32)}}
    out = {}
    for name, table in tables.items():
        out[name] = attnjit.attention(q, k, v, pattern, dynamic_layout=table)  # plans and compiles
        times = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            attnjit.attention(q, k, v, pattern, dynamic_layout=table)
            times.append(time.perf_counter() - t0)
        print(f"{name:9s} {statistics.median(times):.3f} s (median of {a.runs})")
    assert torch.equal(out["host"], out["in place"]), "the two tables gave different outputs"


if __name__ == "__main__":
    main()
