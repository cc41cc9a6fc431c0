"""attnjit on CPU tensors (the plan executor) against PyTorch on the same CPU, same inputs, one run.

    PYTHONPATH=build/python python3 bench/cpu_peers.py [--out DIR] [--runs 7] [--cases 'dense*']
    PYTHONPATH=build/python python3 bench/cpu_peers.py --smoke     # tiny shapes: correctness only, no timing

Cases (fp32, batch 1, [B, S, H, D]; `--list` prints them):
  dense            SDPA (PyTorch's CPU flash kernel) against attnjit with bench/patterns/dense.json
  dense-causal     SDPA is_causal=True against bench/patterns/dense_causal.json
  longnet          examples/longnet.json against the contract in PyTorch as dilated-attention-pytorch computes
                   it (bench/peers_torch.py torch_dilated: per branch the dilated rows gathered, SDPA on
                   them, merged by LSE)
  seed_dilated     examples/seed_dilated.json against the same PyTorch implementation
Each has a forward row and a forward+backward row (autograd on both sides).

The bars: dense forward not slower than SDPA (ratio >= 1.0), LongNet at least 3x faster than the
PyTorch implementation. Timing: wall clock, median (and min) of --runs after one warm-up, the two
systems' runs interleaved so that a noisy machine slows both alike. Threads: attnjit's executor
uses one per core; PyTorch gets the same number (torch.set_num_threads(os.cpu_count())).
Writes DIR/cpu_peers.json and DIR/cpu_peers.md.

    PYTHONPATH=build/python python3 bench/cpu_peers.py --alone 3 --cases dense --modes forward

times each system alone instead: every round runs ours, then the peer, each in a process of its
own (--runs calls after a warm-up, the median), and reports the median of the rounds' medians.
Interleaved in one process, the first milliseconds of our call share the cores with PyTorch's
OpenMP threads, which keep spinning after SDPA returns (docs/performance.md, "The CPU device").
"""
import argparse
import fnmatch
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnjit  # noqa: E402
import peers_torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spec_path(name):
    for folder in ("examples", "bench/patterns"):
        p = os.path.join(ROOT, folder, name + ".json")
        if os.path.exists(p):
            return p
    raise FileNotFoundError(name)


def cases(smoke):
    """(name, spec file, S, H, D, peer): peer 'sdpa', 'sdpa-causal' or 'torch-dilated'."""
    if smoke:
        return [("dense", "dense", 96, 2, 16, "sdpa"), ("dense-causal", "dense_causal", 80, 2, 16, "sdpa-causal"),
                ("longnet", "longnet", 256, 4, 16, "torch-dilated"),
                ("seed_dilated", "seed_dilated", 200, 3, 16, "torch-dilated")]
    return [("dense", "dense", 2048, 8, 64, "sdpa"), ("dense-causal", "dense_causal", 2048, 8, 64, "sdpa-causal"),
            ("longnet", "longnet", 16384, 8, 64, "torch-dilated"),
            ("seed_dilated", "seed_dilated", 16384, 8, 64, "torch-dilated")]


def peer_fn(kind, spec, S, H, D):
    """fwd(q, k, v) on [B, H, S, D] tensors."""
    if kind == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
    if kind == "sdpa-causal":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return peers_torch.torch_dilated(spec, H, S, D, "cpu")


def step_fn(fn, mode, q, k, v, do):
    """One timed call of `fn` in `mode`: the forward without autograd, or forward and backward."""
    if mode == "forward":
        def fwd():
            with torch.no_grad():
                fn(q, k, v)
        return fwd

    def fb():
        xs = [x.detach().requires_grad_() for x in (q, k, v)]
        torch.autograd.grad(fn(*xs), xs, do)
    return fb


def alone_rows(todo, runs, rounds, modes, smoke=False):
    """Each system timed in a process of its own, alternating, `rounds` times per case and mode."""
    rows = []
    for name, spec_name, S, H, D, peer in todo:
        run_case(name, spec_name, S, H, D, peer, runs, smoke=True)  # the two agree first (it raises if not)
        pairs = int(attnjit.Pattern.load(spec_path(spec_name)).stats(S, H)["attended_pairs"])
        for mode in modes:
            medians = {"ours": [], "peer": []}
            for _ in range(rounds):
                for system in ("ours", "peer"):
                    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--cases", name, "--modes", mode,
                                          "--runs", str(runs), "--only", system] + (["--smoke"] if smoke else []),
                                         check=True, capture_output=True, text=True).stdout
                    medians[system].append(json.loads(out.strip().splitlines()[-1])["median_ms"])
            ours, theirs = statistics.median(medians["ours"]), statistics.median(medians["peer"])
            rows.append({"case": name, "mode": mode + " (alone)", "S": S, "H": H, "D": D, "peer": peer, "ours_ms": ours,
                         "peer_ms": theirs, "ours_rounds_ms": medians["ours"], "peer_rounds_ms": medians["peer"],
                         "speedup": theirs / ours,
                         "ours_gflops": 4 * D * pairs * (3.5 if mode != "forward" else 1.0) / (ours * 1e-3) / 1e9})
            print(f"{name:13s} {mode + ' alone':17s} ours {ours:8.1f} ms  {peer} {theirs:8.1f} ms  ours faster by "
                  f"{theirs / ours:5.2f}x  (rounds: ours {', '.join(f'{x:.1f}' for x in medians['ours'])}; "
                  f"{peer} {', '.join(f'{x:.1f}' for x in medians['peer'])})", flush=True)
    return rows


def interleaved_times(fns, runs):
    """Median and min seconds of each fn, run in turn (one warm-up each)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [(statistics.median(ts), min(ts)) for ts in times]


def run_case(name, spec_name, S, H, D, peer, runs, smoke, modes=("forward", "forward+backward"), only=None):
    path = spec_path(spec_name)
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    pattern = attnjit.Pattern.load(path)
    pairs = int(pattern.stats(S, H)["attended_pairs"])
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, S, H, D, generator=g) for _ in range(4))
    peer_fwd = peer_fn(peer, spec, S, H, D)
    bhsd = lambda x: x.transpose(1, 2)  # noqa: E731

    def ours(q, k, v):
        return attnjit.attention(q, k, v, pattern)

    def theirs(q, k, v):
        return bhsd(peer_fwd(bhsd(q), bhsd(k), bhsd(v)))

    if only is not None:  # one system timed alone (a child of --alone): no check, no interleaving
        (median, best), = interleaved_times([step_fn(ours if only == "ours" else theirs, modes[0], q, k, v, do)], runs)
        return [{"system": only, "median_ms": median * 1e3, "min_ms": best * 1e3}]
    # Correctness first: the two agree (fp32), forward and gradients.
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ours = ours(*leaves)
    g_ours = torch.autograd.grad(o_ours, leaves, do)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o_theirs = theirs(*leaves)
    g_theirs = torch.autograd.grad(o_theirs, leaves, do)
    err = max(float((a - b).abs().max()) for a, b in zip((o_ours.detach(), *g_ours), (o_theirs.detach(), *g_theirs)))
    if not err < 2e-3:
        raise AssertionError(f"{name}: attnjit and {peer} differ by {err:.3g}")
    rows = []
    if smoke:
        return [{"case": name, "peer": peer, "max_abs_diff": err}]
    for mode in modes:
        (t_ours, min_ours), (t_theirs, min_theirs) = interleaved_times(
            [step_fn(ours, mode, q, k, v, do), step_fn(theirs, mode, q, k, v, do)], runs)
        flop = 4 * D * pairs * (3.5 if mode != "forward" else 1.0)
        rows.append({"case": name, "mode": mode, "S": S, "H": H, "D": D, "peer": peer, "ours_ms": t_ours * 1e3,
                     "ours_min_ms": min_ours * 1e3, "peer_ms": t_theirs * 1e3, "peer_min_ms": min_theirs * 1e3,
                     "ours_gflops": flop / t_ours / 1e9, "speedup": t_theirs / t_ours, "max_abs_diff": err})
        print(f"{name:13s} {mode:17s} ours {t_ours * 1e3:8.1f} ms  {peer} {t_theirs * 1e3:8.1f} ms  "
              f"ours faster by {t_theirs / t_ours:5.2f}x", flush=True)
    return rows


def write(out, rows, meta):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cpu_peers.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"# attnjit on the CPU against PyTorch ({meta['cpu']}, {meta['threads']} threads, torch {meta['torch']}, "
             f"attnjit's {meta['cpu_executor']} executor)",
             "", f"`{meta['command']}`", "",
             "| case | S, H, D | mode | ours ms | peer | peer ms | ours faster by | ours GFLOP/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['S']}, {r['H']}, {r['D']} | {r['mode']} | {r['ours_ms']:.1f} | {r['peer']} | "
                     f"{r['peer_ms']:.1f} | {r['speedup']:.2f}x | {r['ours_gflops']:.0f} |")
    with open(os.path.join(out, "cpu_peers.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cases", default="*")
    ap.add_argument("--modes", default="forward,forward+backward", help="comma separated: forward, forward+backward")
    ap.add_argument("--alone", type=int, default=0, metavar="ROUNDS",
                    help="time each system in a process of its own, ROUNDS times, instead of interleaved")
    ap.add_argument("--only", choices=("ours", "peer"), help=argparse.SUPPRESS)  # a child of --alone
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    todo = [c for c in cases(a.smoke) if fnmatch.fnmatch(c[0], a.cases)]
    modes = tuple(a.modes.split(","))
    if set(modes) - {"forward", "forward+backward"}:
        sys.exit(f"cpu_peers: --modes {a.modes}: expected forward and/or forward+backward")
    if a.list:
        for c in todo:
            print(*c)
        return
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    if a.only:
        print(json.dumps(run_case(*todo[0], runs=a.runs, smoke=False, modes=modes[:1], only=a.only)[0]))
        return
    if a.alone:
        rows = alone_rows(todo, a.runs, a.alone, modes, a.smoke)
        if a.smoke:  # tiny shapes: the children ran and reported, nothing to compare
            print(f"cpu_peers smoke --alone: {len(rows)} rows, every system timed in a process of its own")
            return
    else:
        rows = []
        for c in todo:
            rows += run_case(*c, runs=a.runs, smoke=a.smoke, modes=modes)
    if a.smoke:
        print(f"cpu_peers smoke: {len(rows)} cases agree with their peers "
              f"(max |diff| {max(r['max_abs_diff'] for r in rows):.2g})")
        return
    meta = {"cpu": cpu_name(), "threads": threads, "torch": torch.__version__, "attnjit": attnjit.__version__,
            "cpu_executor": attnjit.info()["cpu_executor"], "command": "python3 bench/cpu_peers.py " + " ".join(sys.argv[1:])}
    if a.out:
        write(a.out, rows, meta)


if __name__ == "__main__":
    main()
