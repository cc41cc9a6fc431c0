#!/usr/bin/env python3
"""A static report of the backward's dK/dV kernels, no GPU needed: for each example pattern and head
dim (bf16), the kernels a Hopper GPU can run for the backward (the sm_80 kernel compiled for sm_90,
the warpgroup-MMA kernel with cp.async, the one with TMA and a producer warpgroup) and, per
kernel:

  registers at launch (the TMA kernel's consumers take 240 with setmaxnreg), spill bytes, shared
  memory per block, threads, blocks per SM (registers, shared memory and threads), and in _dkdv's
  SASS: the matrix work (m16n8k16 equivalents a warp issues: HMMA 1, HGMMA.64xN N / 8), TMA
  loads, bulk reduces, global reductions (REDG/RED) and all instructions (every path: the rare
  exact sums included, so an upper bound); and Q + dO bytes read per thousand FLOP of a full query
  entry (the products' FLOPs against one key tile: fewer keys per tile, more reloads).

    python3 bench/static_backward.py --attnjit build/attnjit [--patterns longnet,bigbird] [--head-dims 64,128] [--out FILE.md]
"""
import argparse
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_mainloop  # noqa: E402

H100 = dict(regs=65536, smem=233472, threads=2048, blocks=32)
# (label, arch, environment): what a compute capability 9.0 GPU runs for each setting.
KINDS = [
    ("sm_80 mma.sync", "sm_90", {}),
    ("wgmma, cp.async", "sm_90a", {"ATTNJIT_BWD_WGMMA": "1", "ATTNJIT_TMA": "0"}),
    ("wgmma, TMA + producer", "sm_90a", {"ATTNJIT_BWD_WGMMA": "1"}),
]


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if r.returncode != 0:
        sys.exit(f"static_backward: {' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def dkdv_line(a, spec, arch, d, env):
    out = run([a, "compile", spec, "--backward", "--arch", arch, "--head-dim", str(d), "--dtype", "bf16"],
              {**env, "ATTNJIT_ALWAYS_COMPILE": "1"})
    for line in out.splitlines():
        m = re.search(r"_dkdv .*registers=(\d+) spills=(\d+)B shared=(\d+)B\+(\d+)B threads=(\d+) tile=(\d+)x(\d+)", line)
        if m:
            return dict(registers=int(m.group(1)), spills=int(m.group(2)), shared=int(m.group(3)) + int(m.group(4)),
                        threads=int(m.group(5)), tile_q=int(m.group(6)), tile_k=int(m.group(7)))
    sys.exit(f"static_backward: no _dkdv line for {spec} {arch} d={d}:\n{out}")


def dkdv_sass(a, spec, arch, d, env):
    sass = run([a, "dump", spec, "--stage", "sass", "--backward", "--arch", arch, "--head-dim", str(d), "--dtype", "bf16"], env)
    ins, _ = sass_mainloop.parse(sass_mainloop.kernel_lines(sass.splitlines(), "_dkdv"))
    ops = [op for _, op, _ in ins]
    return dict(instructions=len(ops), mma=sum(sass_mainloop.mma_weight(op) for op in ops),
                tma=sum(op.startswith("UTMALDG") for op in ops), bulk=sum(op.startswith("UBLKRED") for op in ops),
                red=sum(op.startswith("REDG") or op.startswith("RED.") for op in ops),
                local=sum(op in ("STL", "LDL") or op.startswith("STL.") or op.startswith("LDL.") for op in ops))


def blocks_per_sm(k):
    per_warp = math.ceil(k["registers"] * 32 / 256) * 256
    by_regs = (H100["regs"] // per_warp) // (k["threads"] // 32)
    return min(by_regs, H100["smem"] // (k["shared"] + 1024), H100["threads"] // k["threads"], H100["blocks"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attnjit", default="build/attnjit")
    ap.add_argument("--examples", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    ap.add_argument("--patterns", default="longnet,bigbird,causal_local")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--out", help="also write the table here (markdown)")
    args = ap.parse_args()
    rows = ["| pattern | head dim | kernel | tile | threads | registers | spills | shared B | blocks/SM | MMA (m16n8k16/warp) "
            "| TMA | bulk reduce | red | instructions | Q+dO B/kFLOP |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in args.patterns.split(","):
        spec = os.path.join(args.examples, name + ".json")
        for d in (int(x) for x in args.head_dims.split(",")):
            for label, arch, env in KINDS:
                k = dkdv_line(args.attnjit, spec, arch, d, env)
                s = dkdv_sass(args.attnjit, spec, arch, d, env)
                # A query entry: Q and dO (64 rows each) read for 5 products of tile_q x tile_k x d.
                bytes_per_kflop = 2 * k["tile_q"] * d * 2 / (5 * 2 * k["tile_q"] * k["tile_k"] * d / 1000)
                regs = f"{k['registers']} (240 consumers)" if k["threads"] == 384 else str(k["registers"])
                rows.append(f"| {name} | {d} | {label} | {k['tile_q']}x{k['tile_k']} | {k['threads']} | {regs} | {k['spills']} "
                            f"| {k['shared']} | {blocks_per_sm(k)} | {s['mma']} | {s['tma']} | {s['bulk']} | {s['red']} "
                            f"| {s['instructions']} | {bytes_per_kflop:.2f} |")
    table = "\n".join(rows) + "\n"
    print(table, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
