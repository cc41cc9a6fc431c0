#!/usr/bin/env python3
"""A static report of the tensor-core forward kernels, no GPU needed (issue: the sm_80 kernel at
FlashAttention-2's structure). For every example pattern, head dims 64 and 128 (bf16), on an A100
(sm_80) and an H100 (sm_90, the portable mma.sync kernel), it compiles every configuration the
autotuner times and reports, for the default configuration and the best candidate:

  registers, spill bytes, shared memory per block, blocks per SM (from the register file, shared
  memory and thread limits), the main loop's instructions and HMMA from the SASS (both sides of
  every branch in it: an upper bound per tile, see sass_mainloop.py), shared-memory and global
  bytes moved per MMA FLOP (from the plan at --seq tokens and the tile), and the model's TFLOP/s.

    python3 bench/static_report.py --attnjit build/attnjit [--seq 16384] [--out FILE.md] [--patterns longnet,...]

Before and after a template change: write every candidate's figures with --json at each side, then
`--diff BEFORE.json AFTER.json` lists the candidates that began or stopped spilling (tiles at 255
registers flip on small changes; the autotuner skips those whose main loop reloads spills), the ones
whose spill bytes or main loop changed, and the spilling counts and the defaults' loops on each side.

The model ("best" is the candidate it ranks first among those the autotuner times: no spill, or none
its main loop reloads): each visited tile costs every warp
of its block max(HMMA x cycles per HMMA, instructions) issue cycles of the main loop, four warp
schedulers per SM, or its shared-memory bytes at 128 per clock, whichever is longer, all SMs busy;
the kernel takes the longer of that and its global bytes at the memory's bandwidth. Useful FLOP/s count 4 x D x attended pairs. It ignores latency, bank
conflicts and occupancy beyond the issue bound, so it ranks shapes; it does not time them.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_mainloop  # noqa: E402

# Resource limits per SM and the model's figures per GPU (public data sheets). hmma_cycles: issue
# cycles of one m16n8k16 HMMA (4096 FLOP) on a warp scheduler's tensor core: A100 2048 dense fp16
# FLOP/clk/SM (312 TFLOP/s); H100's mma.sync reaches about two thirds of its 989 (wgmma's) peak.
# smem_bytes_per_clk: shared-memory bandwidth per SM.
GPUS = {
    "sm_80": dict(name="A100", sms=108, regs=65536, smem=167936, threads=2048, blocks=32, clock_ghz=1.41,
                  hbm_gbs=2039, hmma_cycles=8, smem_bytes_per_clk=128),
    "sm_90": dict(name="H100", sms=132, regs=65536, smem=233472, threads=2048, blocks=32, clock_ghz=1.83,
                  hbm_gbs=3350, hmma_cycles=6, smem_bytes_per_clk=128),
}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"static_report: {' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def compile_candidates(a, spec, arch, d):
    # Compiled anew every time, so each line has ptxas' spill count (a cached kernel has none).
    out = run(["env", "ATTNJIT_ALWAYS_COMPILE=1", a, "compile", spec, "--arch", arch, "--head-dim", str(d), "--dtype", "bf16", "--kernel-tile",
               "candidates", "-j", str(os.cpu_count() or 1)])
    kernels = []
    for line in out.splitlines():
        m = re.search(r"registers=(\d+) spills=(\S+) shared=(\d+)B\+(\d+)B threads=(\d+) tile=(\d+)x(\d+)w(\d+) stages=(\d+)",
                      line)
        if not m:
            continue
        spills = m.group(2)
        kernels.append(dict(registers=int(m.group(1)), spills=int(spills[:-1]) if spills.endswith("B") else None,
                            shared=int(m.group(3)) + int(m.group(4)), threads=int(m.group(5)), tile_q=int(m.group(6)),
                            tile_k=int(m.group(7)), warps=int(m.group(8)), stages=int(m.group(9))))
    if not kernels:
        sys.exit(f"static_report: no kernels reported for {spec} {arch} d={d}:\n{out}")
    return kernels


def main_loop(a, spec, arch, d, k):
    sass = run([a, "dump", spec, "--stage", "sass", "--arch", arch, "--head-dim", str(d), "--dtype", "bf16",
                "--kernel-tile", f"{k['tile_q']}x{k['tile_k']}w{k['warps']}", "--stages", str(k["stages"])])
    ins, labels = sass_mainloop.parse(sass.splitlines())
    loop = sass_mainloop.main_loop(ins, labels)
    if loop is None:
        return None
    j, i, hmma = loop
    # HMMA: m16n8k16-equivalents (the work); hmma_ops: the MMA instructions (not "others").
    return dict(instructions=i - j + 1, hmma=hmma, hmma_ops=sum(1 for x in ins[j:i + 1] if sass_mainloop.mma_weight(x[1])),
                loop_local=sass_mainloop.local_accesses(ins[j:i + 1]))


def plan_stats(a, spec, seq, heads, d, tq, tk):
    out = run([a, "dump", spec, "--stage", "plan", "--seq", str(seq), "--heads-q", str(heads), "--head-dim", str(d),
               "--tile", f"{tq}x{tk}"])
    visited = int(re.search(r"tiles: (\d+) visited", out).group(1))
    pairs = re.search(r"pairs: attended=(\d+) computed=(\d+)", out)
    return dict(visited=visited, attended=int(pairs.group(1)), computed=int(pairs.group(2)))


def blocks_per_sm(k, gpu):
    warps = k["threads"] // 32
    per_warp = math.ceil(k["registers"] * 32 / 256) * 256
    by_regs = (gpu["regs"] // per_warp) // warps
    by_smem = gpu["smem"] // (k["shared"] + 1024)
    return min(by_regs, by_smem, gpu["threads"] // k["threads"], gpu["blocks"])


def figures(k, loop, plan, d, seq, heads, gpu):
    dv = d
    warps = k["threads"] // 32
    mma_flop = plan["computed"] * 2 * (d + dv)
    # Global: Q read and O written once per row; K and V once per visited tile of a block.
    global_bytes = seq * heads * (d + dv) * 2 + plan["visited"] * k["tile_k"] * (d + dv) * 2
    # Shared: cp.async writes K and V once per tile; every warp reads all of both (ldmatrix), and
    # Q too where it does not stay in registers (codegen's rule: at most 128 values per thread).
    q_in_regs = k["tile_q"] // (16 * warps) * d <= 128
    per_tile = (1 + warps) * k["tile_k"] * (d + dv) * 2 + (0 if q_in_regs else k["tile_q"] * d * 2)
    smem_bytes = plan["visited"] * per_tile
    issue = plan["visited"] * warps * max(loop["hmma"] * gpu["hmma_cycles"], loop["instructions"]) / 4
    cycles = max(issue, smem_bytes / gpu["smem_bytes_per_clk"]) / gpu["sms"]
    seconds = max(cycles / (gpu["clock_ghz"] * 1e9), global_bytes / (gpu["hbm_gbs"] * 1e9))
    return dict(smem_per_flop=smem_bytes / mma_flop, global_per_flop=global_bytes / mma_flop,
                others_per_hmma=(loop["instructions"] - loop["hmma_ops"]) / loop["hmma"],
                model_tflops=4 * d * plan["attended"] / seconds / 1e12)


def candidate_key(e):
    return (e["pattern"], e["arch"], e["head_dim"], f"{e['tile_q']}x{e['tile_k']}w{e['warps']} s{e['stages']}")


def diff(before_path, after_path):
    """The changes between two --json reports, one line each; returns them as text."""
    def load(path):
        try:
            with open(path) as f:
                entries = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"static_report: --diff: cannot read {path}: {e}")
        if not isinstance(entries, list) or any(not isinstance(e, dict) or "spills" not in e for e in entries):
            sys.exit(f"static_report: --diff: {path} is not a --json report of this script")
        return {candidate_key(e): e for e in entries}

    before, after = load(before_path), load(after_path)
    lines = []
    for key in sorted(set(before) | set(after)):
        name = " ".join(str(k) for k in key)
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            lines.append(f"{name}: only in {'the second' if b is None else 'the first'} report")
            continue
        sb, sa = b["spills"] or 0, a["spills"] or 0
        what = []
        if (sb == 0) != (sa == 0):
            where = ""
            if sa and "loop_local" in a:
                where = f"; {a['loop_local']} local loads and stores in the main loop" if a["loop_local"] else \
                    "; none in the main loop"
            what.append(f"{'now spills' if sa else 'no longer spills'} ({sb} -> {sa} B{where})")
        elif sb != sa:
            what.append(f"spills {sb} -> {sa} B")
        if b["instructions"] != a["instructions"]:
            what.append(f"loop {b['instructions']} -> {a['instructions']} instructions "
                        f"({b['others_per_hmma']:.2f} -> {a['others_per_hmma']:.2f} others per HMMA)")
        if what:
            lines.append(f"{name}: " + ", ".join(what))
    common = set(before) & set(after)
    spilling = [sum(1 for k in common if side[k]["spills"]) for side in (before, after)]
    # A report without loop_local (older) counts every spill as one the loop reloads.
    in_loop = [sum(1 for k in common if side[k]["spills"] and side[k].get("loop_local", 1)) for side in (before, after)]
    lines.append(f"spilling candidates (of {len(common)} in both): {spilling[0]} -> {spilling[1]}; "
                 f"with spills in the main loop (the autotuner skips them): {in_loop[0]} -> {in_loop[1]}")
    for k in sorted(common):
        if before[k].get("default") and after[k].get("default"):
            lines.append(f"default {' '.join(str(x) for x in k)}: {before[k]['others_per_hmma']:.2f} -> "
                         f"{after[k]['others_per_hmma']:.2f} others per HMMA")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attnjit", default="build/attnjit")
    ap.add_argument("--examples", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--archs", default="sm_80,sm_90")
    ap.add_argument("--patterns", help="only these examples (file stems, comma separated)")
    ap.add_argument("--out", help="also write the table here (markdown)")
    ap.add_argument("--json", help="also write every candidate's figures here")
    ap.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="compare two --json reports (compiles nothing) and exit")
    args = ap.parse_args()
    if args.diff:
        print(diff(*args.diff))
        return

    specs = []
    for f in sorted(os.listdir(args.examples)):
        path = os.path.join(args.examples, f)
        if args.patterns and os.path.splitext(f)[0] not in args.patterns.split(","):
            continue
        if f.endswith(".json") and '"attnjit_manifest"' not in open(path).read():
            specs.append(path)
    if not specs:
        sys.exit(f"static_report: no example pattern in {args.examples} matches --patterns {args.patterns}")
    rows, everything = [], []
    header = ("| pattern | GPU | d | config | tile | registers | spills | shared B | blocks/SM | loop instr | HMMA | "
              "others/HMMA | smem B/FLOP | global B/FLOP | model TFLOP/s |")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["ATTNJIT_CACHE_DIR"] = cache  # compile and dump share it
        for spec in specs:
            name = os.path.splitext(os.path.basename(spec))[0]
            plans = {}
            for arch in args.archs.split(","):
                gpu = GPUS[arch]
                for d in (int(x) for x in args.head_dims.split(",")):
                    kernels = compile_candidates(args.attnjit, spec, arch, d)
                    scored = []
                    for n, k in enumerate(kernels):
                        loop = main_loop(args.attnjit, spec, arch, d, k)
                        if loop is None:
                            continue
                        tile = (k["tile_q"], k["tile_k"])
                        if tile not in plans:
                            plans[tile] = plan_stats(args.attnjit, spec, args.seq, args.heads, d, *tile)
                        f = figures(k, loop, plans[tile], d, args.seq, args.heads, gpu)
                        entry = dict(pattern=name, gpu=gpu["name"], arch=arch, head_dim=d, default=n == 0,
                                     blocks_per_sm=blocks_per_sm(k, gpu), **k, **loop, **f)
                        scored.append(entry)
                        everything.append(entry)
                    default = next(e for e in scored if e["default"])
                    clean = [e for e in scored if e["spills"] == 0 or e["loop_local"] == 0] or scored
                    best = max(clean, key=lambda e: (round(e["model_tflops"], 1), -e["others_per_hmma"]))
                    for label, e in (("default", default), ("best", best)):
                        rows.append(
                            f"| {name} | {e['gpu']} | {d} | {label} | {e['tile_q']}x{e['tile_k']}w{e['warps']} s{e['stages']} | "
                            f"{e['registers']} | {e['spills']} | {e['shared']} | {e['blocks_per_sm']} | {e['instructions']} | "
                            f"{e['hmma']} | {e['others_per_hmma']:.2f} | {e['smem_per_flop']:.4f} | "
                            f"{e['global_per_flop']:.5f} | {e['model_tflops']:.0f} |")
                    print(rows[-2] + "\n" + rows[-1], flush=True)
    table = "\n".join([header, "|" + " --- |" * (header.count("|") - 1)] + rows) + "\n"
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"Static report (`bench/static_report.py --seq {args.seq} --heads {args.heads}`), bf16:\n\n" + table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
