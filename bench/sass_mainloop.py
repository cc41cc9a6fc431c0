#!/usr/bin/env python3
"""The main loop of a generated kernel in its SASS: instructions, HMMA, and the others per HMMA.

    build/attnjit dump SPEC --stage sass --arch sm_90 --kernel-tile 128x128 --head-dim 128 \\
        | python3 bench/sass_mainloop.py [--listing] [--max-per-hmma X]

The main loop is the backward branch whose body holds the most HMMA (the shortest such body on a
tie) and no EXIT (a back edge from a cold path at the kernel's end, as ptxas lays out an mbarrier
wait's retry, spans the whole kernel). A static count: both sides of a branch inside the loop are counted (the masked and the
unmasked tile, say), so it bounds what a tile executes from above; Nsight Compute gives the
executed figure on a GPU (bench/ncu_profile.sh). The autotuner finds the loop the same way
(compiler/nvrtc/sass_loop.cpp, to see whether a spilling candidate's loop touches local memory):
change both together. --innermost takes the loop among those that hold no other loop with MMA
(a persistent kernel's loop over one item's tiles rather than its loop over items). --kernel SUFFIX
looks at one kernel of the dump only (a backward module's _dkdv or _dq). With --max-per-hmma X the
exit status is 1 when the loop has more than X other instructions per HMMA (a lit test keeps the
figure from creeping up).

Hopper's warpgroup MMA (HGMMA.64xNx16, the sm_90a path) counts as the m16n8k16 HMMA it equals in
work per warp, N / 8 (each of the warpgroup's 4 warps issues it: 64 x N x 16 / 4 warps /
(16 x 8 x 16)), so the figure compares across the paths; the FP8 forms (k32) twice that: QGMMA.64xNx32
N / 4, QMMA.16832 2.

On sm_90a it also counts the softmax's exponentials (MUFU.EX2) that lie between the loop's wait for
S(j + 1) and its wait for P(j) V(j): those overlap P V on the tensor cores (in the backward's loop,
P^T's exponentials between the waits for S^T and for dP^T). --min-overlap N fails when
fewer than N do (ptxas moves a wgmma wait to the top of its basic block; fwd_sm90.cuh says how the
kernel keeps it below the softmax).
"""
import argparse
import collections
import re
import sys


def parse(lines):
    ins, labels = [], {}
    for line in lines:
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            text = m.group(2).strip()
            bare = re.sub(r"^@!?U?P\w+\s+", "", text)
            ins.append((int(m.group(1), 16), bare.split()[0] if bare else "", text))
        m = re.match(r"^\.(L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(ins)
    return ins, labels


def mma_weight(op):
    """m16n8k16 HMMA-equivalents (in multiply-adds) of one instruction per warp (0: not an MMA); FP8's
    QMMA.16832 counts 2, QGMMA.64xNx32 N / 4."""
    if op.startswith("HMMA"):
        return 1
    if op.startswith("QMMA.16832"):
        return 2
    m = re.match(r"([HQ])GMMA\.64x(\d+)x(16|32)", op)
    return int(m.group(2)) // 8 * (2 if m.group(3) == "32" else 1) if m else 0


def main_loop(ins, labels, innermost=False):
    loops = []
    for i, (_, op, text) in enumerate(ins):
        m = re.search(r"\.(L_x_\d+)", text) if op.startswith("BRA") else None
        if not m or m.group(1) not in labels or labels[m.group(1)] > i:
            continue
        j = labels[m.group(1)]
        # A "loop" spanning an EXIT is a cold retry path laid out at the kernel's end (ptxas puts
        # an mbarrier wait's spin there), whose back edge jumps over the whole kernel: not a loop.
        if any(x[1] == "EXIT" for x in ins[j:i + 1]):
            continue
        hmma = sum(mma_weight(x[1]) for x in ins[j:i + 1])
        if hmma:
            loops.append((j, i, hmma))
    if innermost:  # leave out the loops that hold another loop with MMA (a persistent block's loop over items)
        loops = [a for a in loops if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in loops)]
    best = None
    for loop in loops:
        if best is None or (loop[2], -(loop[1] - loop[0])) > (best[2], -(best[1] - best[0])):
            best = loop
    return best


def local_accesses(body):
    """Loads and stores of local memory in the loop: ptxas' spill traffic that every tile pays.
    A kernel can spill and still have none here (values held across the loop and reloaded once,
    before or after it)."""
    return sum(1 for x in body if x[1].split(".")[0] in ("LDL", "STL"))


def softmax_overlap(body):
    """MUFU.EX2 laid out between the first wgmma wait that leaves one group in flight (S done, P V
    running) and the next wait for none (P V done): the exponentials that run while P V does. None
    where the loop has no such wait (not the sm_90a kernel)."""
    start = next((k for k, x in enumerate(body) if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1\b", x[2])), None)
    if start is None:
        return None
    count = 0
    for _, op, text in body[start + 1:]:
        if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0\b", text):
            break
        count += op.startswith("MUFU.EX2")
    return count


def kernel_lines(lines, suffix):
    """The lines of the one kernel whose name ends with `suffix`: from its '.text.<name>:' label to
    the next kernel's."""
    out, inside = [], False
    for line in lines:
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            inside = m.group(1).endswith(suffix)
        if inside:
            out.append(line)
    return out


def main():
    ap = argparse.ArgumentParser(description="the main loop of a kernel's SASS (attnjit dump --stage sass on stdin)")
    ap.add_argument("--listing", action="store_true", help="print the loop's instructions too")
    ap.add_argument("--innermost", action="store_true",
                    help="the loop among those holding no other loop with MMA (a persistent kernel's loop over "
                         "a work item's tiles, not the loop over its items)")
    ap.add_argument("--max-per-hmma", type=float, help="fail when the loop has more other instructions per HMMA")
    ap.add_argument("--min-overlap", type=int,
                    help="sm_90a: fail when fewer MUFU.EX2 lie between the loop's wait for S (WARPGROUP.DEPBAR.LE "
                         "gsb0, 0x1) and its wait for P V (0x0), i.e. when the softmax no longer overlaps P V")
    ap.add_argument("--no-local", action="store_true",
                    help="fail when the loop loads or stores local memory (spills reloaded every tile)")
    ap.add_argument("--kernel", metavar="SUFFIX",
                    help="only the kernel whose name ends with SUFFIX (a backward module holds _dq and _dkdv: "
                         "--kernel _dkdv, --kernel _dq); by default every kernel of the dump")
    args = ap.parse_args()
    lines = sys.stdin.read().splitlines()
    if args.kernel:
        lines = kernel_lines(lines, args.kernel)
        if not lines:
            sys.exit(f"sass_mainloop: no kernel whose name ends with {args.kernel} in this SASS")
    ins, labels = parse(lines)
    loop = main_loop(ins, labels, args.innermost)
    if loop is None:
        sys.exit("sass_mainloop: no loop with HMMA in this SASS (is it the tensor-core path? --stage sass)")
    j, i, hmma = loop
    body = ins[j:i + 1]
    mix = collections.Counter(x[1].split(".")[0] for x in body)
    mma_ops = sum(1 for x in body if mma_weight(x[1]))
    per_hmma = (len(body) - mma_ops) / hmma
    gmma = mix.get("HGMMA", 0) + mix.get("QGMMA", 0) + mix.get("QMMA", 0)
    kinds = "/".join(k for k in ("HGMMA", "QGMMA", "QMMA") if mix.get(k))
    what = f"{hmma} HMMA" if not gmma else f"{gmma} {kinds} = {hmma} HMMA-equivalents per warp"
    print(f"main loop: {len(body)} instructions, {what}, {per_hmma:.2f} others per HMMA")
    print(" ".join(f"{k}:{v}" for k, v in mix.most_common()))
    overlap = softmax_overlap(body)
    if overlap is not None:
        print(f"softmax overlap: {overlap} MUFU.EX2 between the wait for S and the wait for P V")
    if args.listing:
        for addr, _, text in body:
            print(f"{addr:06x}  {text}")
    if args.min_overlap is not None and (overlap or 0) < args.min_overlap:
        sys.exit(f"sass_mainloop: {overlap or 0} MUFU.EX2 overlap P V, fewer than --min-overlap {args.min_overlap}")
    if args.no_local and local_accesses(body):
        sys.exit(f"sass_mainloop: {local_accesses(body)} local-memory loads and stores (spills) in the main loop")
    if args.max_per_hmma is not None and per_hmma > args.max_per_hmma:
        sys.exit(f"sass_mainloop: {per_hmma:.2f} other instructions per HMMA, more than --max-per-hmma {args.max_per_hmma}")


if __name__ == "__main__":
    main()
