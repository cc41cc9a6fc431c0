"""Times attnjit.distributed.ring_attention: W processes on one machine (gloo on CPU tensors, NCCL
on one GPU per process), forward and forward+backward, median over runs, with the bytes each rank
sent.

    PYTHONPATH=build/python python3 bench/ring_bench.py SPEC [--seq 16384] [--heads 8] [--head-dim 64]
        [--world 4] [--layout contiguous] [--strategy ring] [--heavy-rows 4|none] [--head-parallel 1] [--device cpu] [--runs 5]

SPEC: a pattern file, or "geometric:BASE" for LongNet grown to the whole sequence (segments
BASE * 2^i, dilations 2^i; docs/scaling.md). On a CPU the W processes share its cores: the times
show what a change does to the same work, not what W GPUs would do."""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def pattern_of(spec, seq):
    if spec.startswith("geometric:"):
        from scaling_model import longnet_geometric  # beside this script

        branches = longnet_geometric(seq, base=int(spec.split(":")[1]))
        return {"attnjit": 1, "branches": [{"segment": w, "dilation": r} for w, r in branches]}
    return spec


def worker(rank, args, store, out):
    import attnjit.distributed as ad

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=args.world)
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    dtype = getattr(torch, args.dtype)
    pattern = pattern_of(args.spec, args.seq)
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(1, args.seq, args.heads, args.head_dim, generator=g).to(dev, dtype) for _ in range(4)]
    q, k, v, do = (ad.shard(x, layout=args.layout) for x in full)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def sync():
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    times = {"forward": [], "forward+backward": []}
    for run in range(args.runs + 1):  # the first run plans and compiles: not counted
        for what in times:
            sync()
            t = time.perf_counter()
            o = ad.ring_attention(q, k, v, pattern, layout=args.layout, strategy=args.strategy, heavy_rows=args.heavy_rows,
                                  head_parallel=args.head_parallel)
            if what == "forward+backward":
                o.backward(do)
            sync()
            if run:
                times[what].append(1e3 * (time.perf_counter() - t))
            if what == "forward+backward":
                sent = ad.traffic()
            ad.reset_traffic()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"times": times, "sent": sent}, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--layout", default="contiguous")
    ap.add_argument("--strategy", default="ring")
    ap.add_argument("--heavy-rows", type=lambda x: None if x == "none" else float(x), default=4.0,
                    help="rows over this many times the mean row's pairs computed where their keys are (none: at home)")
    ap.add_argument("--head-parallel", type=int, default=1,
                    help="head parallelism: this many consecutive ranks trade rows for heads, the ring runs over the rest")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args, os.path.join(tmp, "store"), tmp), nprocs=args.world, join=True)
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(args.world)]
    print(f"{args.spec} seq {args.seq} heads {args.heads} d {args.head_dim} {args.dtype} on {args.world} "
          f"{args.device} processes, {args.layout}, {args.strategy}, heavy rows {args.heavy_rows}, head parallel {args.head_parallel}; "
          f"{args.runs} runs")
    for what in ("forward", "forward+backward"):
        slowest = [max(r["times"][what][i] for r in ranks) for i in range(args.runs)]
        print(f"  {what}: median {statistics.median(slowest):.1f} ms (min {min(slowest):.1f}, max {max(slowest):.1f})")
    kv = max(r["sent"]["kv_bytes"] for r in ranks)
    grad = max(r["sent"]["grad_bytes"] for r in ranks)
    query = max(r["sent"]["query_bytes"] for r in ranks)
    heads = max(r["sent"]["head_bytes"] for r in ranks)
    print(f"  sent per forward+backward, busiest rank: K/V {kv / 1e6:.2f} MB, dK/dV {grad / 1e6:.2f} MB, "
          f"heavy rows {query / 1e6:.2f} MB, head all_to_all {heads / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
