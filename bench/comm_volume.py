"""How many K/V bytes attnjit.distributed moves, against a plain ring, per example pattern.

    PYTHONPATH=build/python python3 bench/comm_volume.py [--seq 32768] [--heads 16] [--ranks 4,8]

A plain ring moves every K/V chunk to every other rank: W * (W - 1) chunks of S/W rows per kv
head. The comm plan (attnjit.distributed.comm_plan) moves the rows each rank reads, from their
owner; the figure is the same for both strategies and for the backward's K/V (its dK/dV go back
in the same amount). Heavy rows (BigBird's global rows) are computed where their keys are; the
Q they send out is shown against the K/V a plain ring moves too. Also prints how long making the
comm plan takes (done once per shape)."""
import argparse
import pathlib
import time

import attnjit
import attnjit.distributed as ad

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ranks", default="4,8")
    args = ap.parse_args()
    print(f"| spec | S | heads | ranks | layout | K/V moved vs a plain ring | heavy rows' Q sent | comm plan ms |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in sorted(p for p in EXAMPLES.glob("*.json") if p.name != "manifest.json"):
        for w in (int(x) for x in args.ranks.split(",")):
            for layout in ad.LAYOUTS:
                t = time.perf_counter()
                plan = ad.CommPlan(attnjit.Pattern.load(spec).op_spec, args.seq, args.heads, args.heads, w, layout)
                ring = w * (w - 1) * plan.local_len * args.heads
                moved = plan.moved_rows()
                # Q is half a K/V row's bytes (one tensor); units of (row, query head) here.
                sent = plan.visiting_rows() / 2
                ms = 1e3 * (time.perf_counter() - t)
                print(f"| {spec.stem} | {args.seq} | {args.heads} | {w} | {layout} | {100.0 * moved / ring:.1f}% | "
                      f"{100.0 * sent / ring:.1f}% | {ms:.0f} |")


if __name__ == "__main__":
    main()
