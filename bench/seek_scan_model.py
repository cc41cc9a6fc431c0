"""How many random blocks the kernels' seek hashes for a BigBird-like layout (local band, global
blocks, random blocks): a model of the generated aj_layout_next_key (compiler/codegen/codegen_mask.cpp,
NextKeyWriter) walked by the tile cursor (templates/mask_lib.cuh, aj_layout_seek), one key tile per
layout block, one query block per work item. A random block's keep is drawn with the layout's
density instead of the kernels' hash (the count depends on the density, not on the bits).

    python3 bench/seek_scan_model.py [--blocks 128,512] [--density 0.025] [--local 1] [--heads 16]

Prints, per length, the candidate blocks hashed with the random scan unbounded (it runs up to 64
blocks ahead, past a band or a global block that already answers) and bounded by the union's
earlier answers (the scan stops where a sibling's next key is), per visited tile. docs/performance.md
multiplies them by the instructions per candidate of bench/random_scan_cost.sh.
"""
import argparse
import random

NEVER = 1 << 62


def count(blocks, bounded, density, local, heads, globals_=(0, 1), seed=1):
    rng = random.Random(seed)
    checks = tiles = 0
    for _ in range(heads):
        kept = [[rng.random() < density for _ in range(blocks)] for _ in range(blocks)]
        for r in range(blocks):
            def next_key(kb):
                nonlocal checks
                best = kb if r in globals_ else min([g for g in globals_ if g >= kb], default=NEVER)
                a = max(kb, r - local)
                best = min(best, a if a <= r + local else NEVER)
                lim = kb + 64
                if bounded and best != NEVER:
                    lim = min(lim, best)
                c, b = NEVER, kb
                while b < lim and c == NEVER:
                    checks += 1
                    if b < blocks and kept[r][b]:
                        c = b
                    b += 1
                return min(best, lim if c == NEVER else c)
            kb = 0
            while kb < blocks:
                n = next_key(kb)
                if n >= blocks:
                    break
                if n > kb:
                    kb = n
                    continue
                tiles += 1
                kb += 1
    return checks, tiles


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", default="128,512", help="key blocks per row (sequence / block size), comma separated")
    ap.add_argument("--density", type=float, default=0.025)
    ap.add_argument("--local", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    a = ap.parse_args()
    print("blocks  visited tiles  hashed (unbounded)  hashed (bounded)  fewer  per tile")
    for blocks in (int(x) for x in a.blocks.split(",")):
        u, tiles = count(blocks, False, a.density, a.local, a.heads)
        b, _ = count(blocks, True, a.density, a.local, a.heads)
        print(f"{blocks:6d}  {tiles:13d}  {u:18d}  {b:16d}  {u / b:4.2f}x  {u / tiles:.1f} -> {b / tiles:.1f}")


if __name__ == "__main__":
    main()
