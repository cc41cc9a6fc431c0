"""attnjit against its PyTorch peers, side by side, on one GPU, in one run (the peers themselves,
the contract in PyTorch and FlexAttention's masks, are in bench/peers_torch.py).

    PYTHONPATH=build-device/python python3 bench/peers.py --out DIR [--budget 420] [--cases 'dense*,longnet*']
                                                           [--no-backward] [--runs 20] [--keep-cache] [--list]
    PYTHONPATH=build/python python3 bench/peers.py --smoke        # CPU only: every system's correctness, tiny shapes
    PYTHONPATH=build/python python3 bench/peers.py --merge RUN1 RUN2 --out DIR   # one table from runs split over calls

Systems (the cases are one table, `gpu_cases()`, most important first; --list prints it):
  ours           attnjit.attention on [B, S, H, D] tensors; backward through autograd
  sdpa-flash     torch SDPA, flash backend  (dense cases; "sdpa-flash-dense": dense stand-in for layouts)
  sdpa-cudnn     torch SDPA, cuDNN backend  (dense cases)
  torch-dilated  the contract in PyTorch, as the seed project computes it: per branch the dilated rows
                 of every segment gathered, the flash kernel on them, branches merged by their LSE into
                 one softmax (a key attended by two branches counts twice)
  flex           FlexAttention under torch.compile; a BlockMask built once (not timed), a mask_mod for
                 the union of the branches and a score_mod adding log(number of branches attending)

Each case: the same seeded inputs for every system; correctness first (a few heads and rows against
an fp64 reference built from attnjit's own mask, `Pattern.mask`, and against ours); then CUDA-event
timings (3 warm-ups, L2 flushed before each run, median and min of >= 20 runs), useful TFLOP/s
(4 * D * attended pairs * batch / time; backward 2.5x that), time to first result, peak memory.
Every system runs in its own try/except; DIR/peers.json and peers.md are rewritten after each system,
peers.png after each case; past --budget seconds the remaining systems are recorded as
"not run: budget". Unless --keep-cache, the attnjit kernel cache and Inductor/Triton caches start
empty (temporary directories), so the first call of each new kernel is a cold compile.
"""
import argparse
import atexit
import fnmatch
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback


def _cold_caches(argv):
    """Empty kernel caches for this process (set before torch and attnjit are imported)."""
    if "--smoke" in argv or "--keep-cache" in argv or "--list" in argv:
        return {}
    root = tempfile.mkdtemp(prefix="attnjit-peers-")
    dirs = {var: os.path.join(root, var.lower()) for var in
            ("ATTNJIT_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    previous = {var: os.environ.get(var) for var in dirs}
    os.environ.update(dirs)
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return {"cold": dirs, "replaced": previous}


CACHE_INFO = _cold_caches(sys.argv)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

import attnjit  # noqa: E402
from peers_torch import (  # noqa: E402  (bench/, beside this script)
    dilated_terms, group_divisor, softmax_scale, mask_rows,
    reference_rows, max_err, torch_dilated, branch_count_fn, dilated_mods,
    dilated_block_layout, layout_block_layout, flex_setup, flex_system)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DENSE = {"attnjit": 1, "description": "dense", "branches": [{"segment": "full"}]}
DENSE_CAUSAL = {**DENSE, "description": "dense causal", "causal": True}
LOCAL_GLOBAL = {"attnjit": 1, "description": "local (4 blocks each side) + 2 global blocks, 128x128: ~10% at 16384",
                "layout": {"block": 128, "union": [{"local": 4}, {"global": [0, 1]}]}, "branches": [{"segment": "full"}]}


def _example(name):
    with open(os.path.join(REPO, "examples", name), encoding="utf-8") as f:
        return json.load(f)


def _case(name, family, spec, S, H, D, systems, B=1):
    return {"name": name, "family": family, "spec": spec, "S": S, "H": H, "D": D, "B": B, "systems": systems}


DENSE_SYSTEMS = ["ours", "sdpa-flash", "sdpa-cudnn"]
DILATED_SYSTEMS = ["ours", "torch-dilated", "flex"]
LAYOUT_SYSTEMS = ["ours", "flex", "sdpa-flash-dense"]


def gpu_cases():
    """The benchmark, most important first."""
    longnet, bigbird, seed = _example("longnet.json"), _example("bigbird.json"), _example("seed_dilated.json")
    cases = [
        _case("dense-d128-s16384", "dense", DENSE, 16384, 16, 128, DENSE_SYSTEMS),
        _case("longnet-s32768", "longnet", longnet, 32768, 16, 128, DILATED_SYSTEMS),
        _case("bigbird-s16384", "layout", bigbird, 16384, 16, 128, LAYOUT_SYSTEMS),
        _case("local_global-s16384", "layout", LOCAL_GLOBAL, 16384, 16, 128, LAYOUT_SYSTEMS),
        _case("seed_dilated-s32768", "seed_dilated", seed, 32768, 16, 128, DILATED_SYSTEMS),
        _case("dense-causal-d128-s16384", "dense", DENSE_CAUSAL, 16384, 16, 128, DENSE_SYSTEMS),
        _case("longnet-s131072", "longnet", longnet, 131072, 16, 128, DILATED_SYSTEMS),
    ]
    for D, S, spec in ((64, 16384, DENSE), (64, 16384, DENSE_CAUSAL), (128, 4096, DENSE), (128, 4096, DENSE_CAUSAL),
                       (64, 4096, DENSE), (64, 4096, DENSE_CAUSAL)):
        causal = "-causal" if spec.get("causal") else ""
        cases.append(_case(f"dense{causal}-d{D}-s{S}", "dense", spec, S, 16, D, DENSE_SYSTEMS))
    return cases


# Small specs in the same families, for --smoke (CPU, fp32). Lengths that are no multiple of a
# segment, a segment longer than the sequence, a dilation that does not divide its segment, every
# offset rule, a head subset and rows that attend nothing are all in here on purpose.
SMOKE_LONGNET = {"attnjit": 1, "branches": [{"segment": 64, "dilation": 1}, {"segment": 128, "dilation": 2},
                                            {"segment": 256, "dilation": 4}, {"segment": 320, "dilation": 6}]}
SMOKE_OFFSETS = {"attnjit": 1, "branches": [{"segment": 128, "dilation": 4, "offset": "head_block"},
                                            {"segment": 256, "dilation": 2, "offset": 1, "heads": [0, 2, 3]},
                                            {"segment": "full", "dilation": 3}, {"segment": 1024, "dilation": 8}]}
SMOKE_SEED = {"attnjit": 1, "combine": "head_groups", "group_scale": "mean",
              "branches": [{"segment": 64, "dilation": 1}, {"segment": 128, "dilation": 2},
                           {"segment": 256, "dilation": 4}]}
SMOKE_BIGBIRD = {"attnjit": 1, "layout": {"block": 16, "union": [{"local": 1}, {"global": [0]},
                                                                 {"random": {"density": 0.1, "seed": 7}}]},
                 "branches": [{"segment": "full"}]}


def smoke_cases():
    """(name, family, spec, S, H, D) for the correctness checks of --smoke."""
    return [("dense", "dense", DENSE, 256, 2, 32), ("dense-causal", "dense", DENSE_CAUSAL, 256, 2, 32),
            ("longnet-small", "longnet", SMOKE_LONGNET, 512, 8, 32), ("offsets-small", "longnet", SMOKE_OFFSETS, 384, 4, 16),
            ("seed-small", "seed_dilated", SMOKE_SEED, 512, 8, 32), ("bigbird-small", "layout", SMOKE_BIGBIRD, 512, 4, 32)]


# ---------------------------------------------------------------------------------------------
# Systems: build(case, pattern, device) -> (fwd on its layout, layout, attended pairs it computes or None)

def sdpa_system(backend, causal):
    def fwd(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fwd


SYSTEMS = {
    "ours": lambda c, p, dev: (lambda q, k, v: attnjit.attention(q, k, v, p), "bshd", None),
    "sdpa-flash": lambda c, p, dev: (sdpa_system(SDPBackend.FLASH_ATTENTION, bool(c["spec"].get("causal"))), "bhsd", None),
    "sdpa-cudnn": lambda c, p, dev: (sdpa_system(SDPBackend.CUDNN_ATTENTION, bool(c["spec"].get("causal"))), "bhsd", None),
    "sdpa-flash-dense": lambda c, p, dev: (sdpa_system(SDPBackend.FLASH_ATTENTION, False), "bhsd", c["H"] * c["S"] ** 2),
    "torch-dilated": lambda c, p, dev: (torch_dilated(c["spec"], c["H"], c["S"], c["D"], dev), "bhsd", None),
    "flex": lambda c, p, dev: (flex_system(c, p, dev), "bhsd", None),
}
# A system is started only with this much of the budget left (half of it for its backward): FlexAttention
# compiles for a minute or so, and a run killed by an outer timeout would leave the cases after it unrecorded.
MIN_SECONDS_LEFT = {"flex": 60}
NOTES = {
    "sdpa-flash-dense": "dense attention on the same shape (a different pattern: no error, TFLOP/s over all pairs)",
    "ours": "peak memory counts PyTorch's allocator only; the backward's workspaces come from the CUDA driver's "
            "stream-ordered pool and are not in it",
}


# ---------------------------------------------------------------------------------------------
# Measurement

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(fn, device, runs, warmup, flush):
    """Times in ms: CUDA events around each run, L2 flushed (a 256 MB write) before it; perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return times


def wall(fn, device):
    sync(device)
    t = time.perf_counter()
    r = fn()
    sync(device)
    return r, time.perf_counter() - t


def cache_files():
    """Files in the cold cache directories (None with --keep-cache): more after a call means it compiled."""
    if not CACHE_INFO:
        return None
    return sum(len(files) for d in CACHE_INFO["cold"].values() for _, _, files in os.walk(d))


def peak_mb(fn, device):
    """Peak bytes PyTorch's allocator held during fn() above what it held before (MB), and the absolute peak."""
    if device.type != "cuda":
        return None, None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return (peak - base) / 2**20, peak / 2**20


def summary(times, flop):
    med = statistics.median(times)
    return {"times_ms": [round(t, 4) for t in times], "median_ms": med, "min_ms": min(times),
            "tflops": flop / (med * 1e-3) / 1e12 if flop else None}


def make_inputs(case, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (case["B"], case["S"], case["H"], case["D"])
    bshd = [torch.randn(shape, generator=g).to(device, dtype) for _ in range(4)]  # q, k, v, dout
    bhsd = [x.transpose(1, 2).contiguous() for x in bshd]
    return bshd, bhsd


def sample_positions(H, S, seed=1):
    heads = sorted({0, 1 % H, (H // 2 + 1) % H, H - 1})
    rng = np.random.default_rng(seed)
    rows = sorted({0, 1 % S, S // 2 + 3 if S > 8 else 0, S - 2, S - 1, *rng.integers(0, S, 3).tolist()})
    return heads, rows


def run_system(name, case, pattern, ctx, rec):
    """Fills rec (a dict) for one system; raises on the first failure, keeping what was measured."""
    fwd, layout, own_pairs = SYSTEMS[name](case, pattern, ctx["device"])
    pairs = own_pairs or ctx["pairs"]
    rec.update({"layout": layout, "attended_pairs": pairs, "note": NOTES.get(name, "")})
    tensors = ctx["bshd"] if layout == "bshd" else ctx["bhsd"]
    to_bhsd = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    checked = own_pairs is None  # a system computing another pattern is timed, not compared
    flop = 4 * case["D"] * pairs * case["B"]
    measure_forward(name, fwd, tensors, to_bhsd, checked, flop, ctx, rec)
    if ctx["args"].no_backward:
        return
    if time.time() > ctx["deadline"] - MIN_SECONDS_LEFT.get(name, 0) / 2:
        rec["bwd_status"] = "not run: budget"
        return
    measure_backward(name, fwd, tensors, to_bhsd, checked, 2.5 * flop, ctx, rec)


def measure_forward(name, fwd, tensors, to_bhsd, checked, flop, ctx, rec):
    """Time to first result, error on the sampled rows, timings and peak memory of the forward."""
    dev, args = ctx["device"], ctx["args"]
    q, k, v, _ = tensors
    files = cache_files()
    with torch.no_grad():
        out, rec["ttfr_first_s"] = wall(lambda: fwd(q, k, v), dev)
        rec["ttfr_new_cache_files"] = cache_files() - files if files is not None else None
        out, rec["ttfr_second_s"] = wall(lambda: fwd(q, k, v), dev)
        heads, rows = ctx["sample"]
        got = to_bhsd(out)[:, heads][:, :, rows].clone()
        del out
        if checked:
            rec["max_err"] = max_err(got, ctx["ref"])
            rec["wrong"] = rec["max_err"] > ctx["tol"]
            if name == "ours":
                ctx["ours_sample"] = got
            elif ctx.get("ours_sample") is not None:
                rec["diff_vs_ours"] = max_err(got, ctx["ours_sample"])
        rec["fwd"] = summary(time_runs(lambda: fwd(q, k, v), dev, args.runs, args.warmup, ctx["flush"]), flop)
        rec["peak_fwd_mb"], rec["peak_fwd_abs_mb"] = peak_mb(lambda: fwd(q, k, v), dev)


def measure_backward(name, fwd, tensors, to_bhsd, checked, flop, ctx, rec):
    """First forward + backward, gradients against ours, timings of the backward alone
    (autograd.grad on a retained graph) and peak memory of forward + backward."""
    dev, args = ctx["device"], ctx["args"]
    q, k, v, dout = tensors
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    files = cache_files()
    o, t_fwd = wall(lambda: fwd(*inputs), dev)

    def backward():
        return torch.autograd.grad(o, inputs, dout, retain_graph=True)
    grads, t_bwd = wall(backward, dev)
    rec["ttfr_bwd_first_s"] = t_fwd + t_bwd
    rec["ttfr_bwd_new_cache_files"] = cache_files() - files if files is not None else None
    grads = [to_bhsd(g) for g in grads]
    if name == "ours":
        ctx["ours_grads"] = grads
    elif checked and ctx.get("ours_grads") is not None:
        rec["grad_diff_vs_ours"] = max(max_err(g[:, h], ref[:, h]) for g, ref in zip(grads, ctx["ours_grads"])
                                       for h in range(g.shape[1]))
    grads = None
    rec["bwd"] = summary(time_runs(backward, dev, args.runs, args.warmup, ctx["flush"]), flop)
    o = None  # frees the graph before the memory measurement
    rec["peak_fwdbwd_mb"], rec["peak_fwdbwd_abs_mb"] = peak_mb(lambda: torch.autograd.grad(fwd(*inputs), inputs, dout), dev)


def run_case(case, ctx, writer):
    """Every system of one case, each in its own try/except; rewrites the outputs after each."""
    dev, dtype = ctx["device"], ctx["dtype"]
    rec = {k: case[k] for k in ("name", "family", "S", "H", "D", "B")}
    rec.update({"spec": case["spec"], "dtype": str(dtype).replace("torch.", ""), "systems": {}})
    writer.cases.append(rec)
    if time.time() > ctx["deadline"]:
        rec["systems"] = {name: {"status": "not run: budget"} for name in case["systems"]}
        writer.write()
        return
    ctx.pop("ours_sample", None)
    ctx.pop("ours_grads", None)
    try:
        pattern = attnjit.Pattern.from_json(case["spec"])
        rec["stats"] = pattern.stats(case["S"], case["H"])
        ctx["pairs"] = rec["attended_pairs"] = rec["stats"]["attended_pairs"]
        ctx["bshd"], ctx["bhsd"] = make_inputs(case, dev, dtype)
        ctx["sample"] = heads, rows = sample_positions(case["H"], case["S"])
        q, k, v, _ = ctx["bhsd"]
        counts = mask_rows(pattern, rows, case["H"], case["S"])
        ctx["ref"] = reference_rows(q, k, v, counts, heads, rows, softmax_scale(case["spec"], case["D"]),
                                    group_divisor(case["spec"]))
        rec["sample"] = {"heads": heads, "rows": rows}
    except Exception as e:  # noqa: BLE001 -- the case is recorded as failed, the run goes on
        rec["error"] = _error(e)
        print(f"{case['name']}: setup failed: {rec['error']['message']}", flush=True)
        writer.write()
        return
    for name in case["systems"]:
        srec = rec["systems"][name] = {}
        if time.time() > ctx["deadline"] - MIN_SECONDS_LEFT.get(name, 0):
            srec["status"] = "not run: budget"
            continue
        t = time.time()
        try:
            run_system(name, case, pattern, ctx, srec)
            srec["status"] = "ok"
        except Exception as e:  # noqa: BLE001 -- recorded, and the next system runs
            srec["status"] = "error"
            srec["error"] = _error(e)
        srec["wall_s"] = time.time() - t
        print(f"{case['name']:28s} {name:18s} {_line(srec)}", flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        writer.write()
    writer.write(plot=True)


def _error(e):
    return {"type": type(e).__name__, "message": str(e).strip().splitlines()[0][:400] if str(e).strip() else "",
            "traceback": traceback.format_exc()[-3000:]}


def _line(s):
    f, b = s.get("fwd", {}), s.get("bwd", {})
    parts = [s.get("status", "")]
    if f:
        parts.append(f"fwd {f['median_ms']:.3f} ms {f['tflops'] or 0:.1f} TF/s")
    if b:
        parts.append(f"bwd {b['median_ms']:.3f} ms {b['tflops'] or 0:.1f} TF/s")
    if "max_err" in s:
        parts.append(f"err {s['max_err']:.2e}" + (" WRONG" if s.get("wrong") else ""))
    if "error" in s:
        parts.append(f"{s['error']['type']}: {s['error']['message'][:160]}")
    return "  ".join(parts)


# ---------------------------------------------------------------------------------------------
# Outputs

class Writer:
    def __init__(self, out, meta):
        self.out, self.meta, self.cases = out, meta, []
        os.makedirs(out, exist_ok=True)

    def write(self, plot=False):
        data = {**self.meta, "cases": self.cases}
        tmp = os.path.join(self.out, "peers.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, os.path.join(self.out, "peers.json"))
        with open(os.path.join(self.out, "peers.md"), "w", encoding="utf-8") as f:
            f.write(markdown(data))
        if plot:
            plot_png(self.cases, os.path.join(self.out, "peers.png"))


def _fmt(x, spec=".3f"):
    return "" if x is None else format(x, spec)


def markdown(data):
    lines = [f"# attnjit against its peers: {data.get('device', '')}", "",
             f"torch {data.get('torch')}, triton {data.get('triton')}, attnjit {data.get('attnjit')}, "
             f"driver {data.get('driver')}. {data.get('method')}", "",
             "ours/peer: peer ms / ours ms (> 1: ours faster), forward / backward. max err: forward, "
             "max |x - ref| / (1 + |ref|) on the sampled heads and rows against an fp64 reference from attnjit's mask; "
             "(grad: max over dQ, dK, dV against ours). peak MB: PyTorch allocator peak above the inputs, forward "
             "(forward + backward). "
             "Ours' backward workspaces come from the CUDA driver's stream-ordered pool, outside PyTorch's allocator.", ""]
    families = []
    for c in data["cases"]:
        if c["family"] not in families:
            families.append(c["family"])
    for fam in families:
        lines += [f"## {fam}", "", "| case | system | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | ours/peer | max err | peak MB |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in (c for c in data["cases"] if c["family"] == fam):
            if "error" in c:
                lines.append(f"| {c['name']} | (setup) | error: {c['error']['message'][:120]} | | | | | | |")
            ours = c["systems"].get("ours", {})
            for name, s in c["systems"].items():
                if s.get("status") != "ok" and "fwd" not in s:
                    why = s.get("status", "") if "error" not in s else f"{s['error']['type']}: {s['error']['message'][:120]}"
                    lines.append(f"| {c['name']} | {name} | {why.replace('|', '/')} | | | | | | |")
                    continue
                f, b = s.get("fwd", {}), s.get("bwd", {})
                ratio = ""
                if name != "ours":
                    rf = _ratio(f, ours.get("fwd"))
                    rb = _ratio(b, ours.get("bwd"))
                    ratio = " / ".join(x for x in (rf, rb) if x)
                err = "n/a (dense)" if "max_err" not in s else _fmt(s["max_err"], ".1e") + (" **wrong**" if s.get("wrong") else "")
                if "grad_diff_vs_ours" in s:
                    err += f" (grad {s['grad_diff_vs_ours']:.1e})"
                if "error" in s:
                    err += f"; error: {s['error']['message'][:80].replace('|', '/')}"
                if "bwd_status" in s:
                    err += f"; backward {s['bwd_status']}"
                mem = _fmt(s.get("peak_fwd_mb"), ".0f") + (f" ({s['peak_fwdbwd_mb']:.0f})" if s.get("peak_fwdbwd_mb") is not None else "")
                lines.append(f"| {c['name']} | {name} | {_fmt(f.get('median_ms'))} | {_fmt(f.get('tflops'), '.1f')} | "
                             f"{_fmt(b.get('median_ms'))} | {_fmt(b.get('tflops'), '.1f')} | {ratio} | {err} | {mem} |")
        lines.append("")
    lines += ["## Time to first result", "", "first: the first forward call of the system in this case; second: the "
              "next one; bwd: the first forward + backward. new files: files the call added to the kernel caches, "
              "which started empty (attnjit's, Inductor's, Triton's): > 0 means it compiled (ours: NVRTC; flex: "
              "torch.compile); 0 means a kernel built earlier in the run served it.", "",
              "| case | system | first s | new files | second s | first bwd s | new files |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in data["cases"]:
        for name, s in c["systems"].items():
            if "ttfr_first_s" in s:
                lines.append(f"| {c['name']} | {name} | {s['ttfr_first_s']:.3f} | {_fmt(s.get('ttfr_new_cache_files'), 'd')} | "
                             f"{s['ttfr_second_s']:.4f} | {_fmt(s.get('ttfr_bwd_first_s'))} | "
                             f"{_fmt(s.get('ttfr_bwd_new_cache_files'), 'd')} |")
    notes = sorted({f"{n}: {s['note']}" for c in data["cases"] for n, s in c["systems"].items() if s.get("note")})
    lines += ["", "## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _ratio(peer, ours):
    if not peer or not ours:
        return ""
    return f"{peer['median_ms'] / ours['median_ms']:.2f}"


def plot_png(cases, path):
    """Forward TFLOP/s against sequence length, one panel per family (skipped, saying so, without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"peers: {path} not written: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return
    families = sorted({c["family"] for c in cases})
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4), squeeze=False)
    for ax, fam in zip(axes[0], families):
        series = {}
        for c in (c for c in cases if c["family"] == fam):
            variant = f" d{c['D']}" + (" causal" if c["spec"].get("causal") else "") if fam == "dense" else ""
            variant += f" {c['name'].split('-s')[0]}" if fam == "layout" else ""
            for name, s in c["systems"].items():
                for pas, style in (("fwd", "-o"), ("bwd", "--x")):
                    if s.get(pas, {}).get("tflops"):
                        series.setdefault((f"{name}{variant} {pas}", style), []).append((c["S"], s[pas]["tflops"]))
        for (label, style), pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(fam)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("useful TFLOP/s")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def metadata(device, args):
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "attnjit": attnjit.__version__, "attnjit_info": attnjit.info(),
            "python": sys.version.split()[0], "args": vars(args), "caches": CACHE_INFO,
            "method": f"median (and min) of {args.runs} runs after {args.warmup} warm-ups, L2 flushed before each run; "
                      "useful TFLOP/s = 4 D pairs B / time, backward 2.5x."}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    try:
        meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        meta["driver"] = f"unknown ({e})"
    return meta


def run_cases(cases, args, device, dtype, tol):
    ctx = {"device": device, "dtype": dtype, "tol": tol, "args": args,
           "deadline": time.time() + args.budget,
           "flush": torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if device.type == "cuda" else None}
    writer = Writer(args.out, metadata(device, args))
    for case in cases:
        run_case(case, ctx, writer)
    return writer


# ---------------------------------------------------------------------------------------------
# --smoke: every system against attnjit and the mask on tiny shapes, on the CPU

class Checks:
    def __init__(self):
        self.failed = 0

    def __call__(self, name, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        self.failed += not ok


def smoke_family(check, name, family, spec, S, H, D):
    pattern = attnjit.Pattern.from_json(spec)
    counts = pattern.mask(S, H)
    rows = list(range(S))
    check(f"{name}: mask rows by q_offset == mask", np.array_equal(mask_rows(pattern, rows, H, S), counts))
    case = {"name": name, "family": family, "spec": spec, "S": S, "H": H, "D": D, "B": 2}
    scale, divisor = softmax_scale(spec, D), group_divisor(spec)
    dev = torch.device("cpu")
    block = spec.get("layout", {}).get("block", 64)
    blocks = torch.as_tensor(counts > 0).view(H, S // block, block, S // block, block)
    if family in ("longnet", "seed_dilated"):
        terms = dilated_terms(spec, H)
        idx = torch.arange(S)
        count = branch_count_fn(terms, H, S, dev)(0, torch.arange(H)[:, None, None], idx[None, :, None], idx[None, None, :])
        check(f"{name}: flex count(b, h, q, kv) == Pattern.mask", np.array_equal(count.numpy(), counts))
        mask_mod, score_mod = dilated_mods(terms, H, S, dev)
        if score_mod is not None:
            w = torch.exp(score_mod(torch.zeros(()), 0, torch.arange(H)[:, None, None], idx[None, :, None], idx[None, None, :]))
            check(f"{name}: exp(score_mod(0)) == count inside the mask", torch.allclose(w[count > 0], count[count > 0].float()))
        touched, full = dilated_block_layout(terms, H, S, block)
        check(f"{name}: flex block layout == blocks of the mask",
              np.array_equal(touched, blocks.any(4).any(2).numpy()) and not (full & ~blocks.all(4).all(2).numpy()).any(),
              f"{int(full.sum())} full, {int((touched & ~full).sum())} partial blocks")
    if family == "layout":
        layout, _ = layout_block_layout(pattern, spec, H, S)
        check(f"{name}: layout from sampled mask rows == blocks of the mask", np.array_equal(layout, blocks.any(4).any(2).numpy()))

    (q, k, v, dout), (qh, kh, vh, douth) = make_inputs(case, dev, torch.float32, seed=3)
    ref = reference_rows(qh, kh, vh, counts, list(range(H)), rows, scale, divisor)
    ours = attnjit.attention(q, k, v, pattern).transpose(1, 2)
    check(f"{name}: ours (plan executor, fp32) vs fp64 reference from the mask", max_err(ours, ref) < 1e-4, f"{max_err(ours, ref):.1e}")
    if family == "dense":
        o = sdpa_system(SDPBackend.FLASH_ATTENTION, bool(spec.get("causal")))(qh, kh, vh)
        check(f"{name}: sdpa-flash vs ours", max_err(o, ours) < 1e-4, f"{max_err(o, ours):.1e}")
    if family in ("longnet", "seed_dilated"):
        fwd = torch_dilated(spec, H, S, D, dev)
        o = fwd(qh, kh, vh)
        check(f"{name}: torch-dilated vs ours (fp32)", max_err(o, ours) < 1e-4, f"{max_err(o, ours):.1e}")
        q64, k64, v64 = (x.double().requires_grad_() for x in (qh, kh, vh))
        o64 = fwd(q64, k64, v64)
        check(f"{name}: torch-dilated vs fp64 reference (fp64)", max_err(o64, ref) < 1e-10, f"{max_err(o64, ref):.1e}")
        g_t = torch.autograd.grad(o64, (q64, k64, v64), douth.double())
        a64 = [x.double().requires_grad_() for x in (q, k, v)]
        g_a = torch.autograd.grad(attnjit.attention(*a64, pattern), a64, dout.double())
        err = max(max_err(a, b.transpose(1, 2)) for a, b in zip(g_t, g_a))
        check(f"{name}: torch-dilated grads vs attnjit fp64 reference grads", err < 1e-10, f"{err:.1e}")
        a32 = [x.clone().requires_grad_() for x in (q, k, v)]
        g_o = torch.autograd.grad(attnjit.attention(*a32, pattern), a32, dout)
        t32 = [x.clone().requires_grad_() for x in (qh, kh, vh)]
        g_t = torch.autograd.grad(fwd(*t32), t32, douth)
        err = max(max_err(a, b.transpose(1, 2)) for a, b in zip(g_t, g_o))
        check(f"{name}: torch-dilated grads vs ours (fp32, plan executor)", err < 1e-4, f"{err:.1e}")
    if family != "dense":
        try:
            o = flex_system(case, pattern, dev, block)(qh, kh, vh)
            check(f"{name}: flex (eager) vs ours", max_err(o, ours) < 1e-4, f"{max_err(o, ours):.1e}")
        except Exception as e:  # noqa: BLE001 -- a torch without CPU flex
            print(f"skipped: flex_attention on CPU: {type(e).__name__}: {e}")
    return pattern, case, ours


def smoke_compiled_flex(check):
    """The fused CPU FlexAttention kernel once: the only CPU path that reads the BlockMask's blocks."""
    spec, S, H, D = SMOKE_LONGNET, 512, 8, 32
    case = {"name": "longnet-small", "family": "longnet", "spec": spec, "S": S, "H": H, "D": D, "B": 1}
    pattern = attnjit.Pattern.from_json(spec)
    (q, k, v, _), (qh, kh, vh, _) = make_inputs(case, torch.device("cpu"), torch.float32, seed=5)
    block_mask, score_mod, divisor = flex_setup(case, pattern, torch.device("cpu"), block=64)
    try:
        o = torch.compile(flex_attention, dynamic=False)(qh, kh, vh, score_mod=score_mod, block_mask=block_mask) / divisor
    except Exception as e:  # noqa: BLE001
        print(f"skipped: compiled flex_attention on CPU: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return
    ours = attnjit.attention(q, k, v, pattern).transpose(1, 2)
    check("longnet-small: flex (compiled, BlockMask with full and partial blocks) vs ours", max_err(o, ours) < 1e-4,
          f"{max_err(o, ours):.1e}")


def smoke_meta_plumbing(check):
    """torch-dilated's CUDA branch (the CUDA flash ops' arguments, fwd + bwd) on meta tensors: shapes only."""
    S, H, D = 512, 8, 64
    q, k, v, dout = (torch.empty(2, H, S, D, device="meta", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o = torch_dilated(SMOKE_LONGNET, H, S, D, torch.device("meta"))(q, k, v)
    grads = torch.autograd.grad(o, (q, k, v), dout)
    check("torch-dilated: CUDA flash op plumbing on meta tensors (fwd + bwd)",
          o.shape == q.shape and all(g.shape == q.shape and g.dtype == q.dtype for g in grads))


def smoke_pipeline(check, args):
    """The benchmark's own loop (timing, errors, files) on tiny CPU cases."""
    cases = [_case("dense-tiny", "dense", DENSE, 128, 2, 16, DENSE_SYSTEMS),
             _case("longnet-tiny", "longnet", SMOKE_LONGNET, 384, 4, 16, DILATED_SYSTEMS),
             _case("bigbird-tiny", "layout", SMOKE_BIGBIRD, 256, 2, 16, LAYOUT_SYSTEMS)]
    out = tempfile.mkdtemp(prefix="peers-smoke-")
    a = argparse.Namespace(**{**vars(args), "out": out, "runs": 2, "warmup": 1, "budget": 120.0})
    writer = run_cases(cases, a, torch.device("cpu"), torch.float32, 1e-4)
    with open(os.path.join(out, "peers.json"), encoding="utf-8") as f:
        data = json.load(f)
    ok = len(data["cases"]) == 3 and os.path.exists(os.path.join(out, "peers.md"))
    for c in data["cases"]:
        for name, s in c["systems"].items():
            expect_ok = name not in ("sdpa-cudnn", "flex")  # no cuDNN, no flex backward on the CPU
            good = "fwd" in s and not s.get("wrong") and (s.get("status") == "ok" or not expect_ok)
            good = good or (name == "sdpa-cudnn" and s.get("status") == "error")
            check(f"pipeline: {c['name']} {name}", good, _line(s))
            ok = ok and good
    check("pipeline: peers.json and peers.md written", ok, out)
    if importlib.util.find_spec("matplotlib"):
        check("pipeline: peers.png written", os.path.exists(os.path.join(out, "peers.png")))
    else:
        print("skipped: peers.png: no matplotlib")
    return writer


def smoke(args):
    import warnings
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    t0 = time.time()
    check = Checks()
    torch.manual_seed(0)
    for name, family, spec, S, H, D in smoke_cases():
        try:
            smoke_family(check, name, family, spec, S, H, D)
        except Exception as e:  # noqa: BLE001
            check(f"{name}: ran", False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    smoke_meta_plumbing(check)
    smoke_compiled_flex(check)
    smoke_pipeline(check, args)
    print(f"smoke: {'FAILED ' + str(check.failed) + ' check(s)' if check.failed else 'all checks passed'} "
          f"in {time.time() - t0:.1f} s")
    return 1 if check.failed else 0


def merge(dirs, out):
    """One table from runs on one GPU that split the cases between them: the cases in gpu_cases()
    order (a case in several runs: the last run's), the first run's metadata, each run's arguments."""
    runs = []
    for d in dirs:
        with open(os.path.join(d, "peers.json"), encoding="utf-8") as f:
            runs.append(json.load(f))
    devices = {(r["device"], r["driver"]) for r in runs}
    if len(devices) != 1:
        print(f"--merge: the runs come from different devices or drivers: {sorted(devices)}", file=sys.stderr)
        return 2
    by_name = {}
    for r in runs:
        for c in r["cases"]:
            by_name[c["name"]] = c
    order = [c["name"] for c in gpu_cases()]
    names = sorted(by_name, key=lambda n: order.index(n) if n in order else len(order))
    meta = {k: v for k, v in runs[0].items() if k != "cases"}
    meta["merged_from"] = [{"dir": d, "args": r.get("args")} for d, r in zip(dirs, runs)]
    writer = Writer(out, meta)
    writer.cases = [by_name[n] for n in names]
    writer.write(plot=True)
    print(f"wrote {out}/peers.json, peers.md, peers.png: {len(names)} cases from {len(dirs)} runs")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output directory (peers.json, peers.md, peers.png)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; later systems are recorded as not run")
    ap.add_argument("--cases", help="comma-separated case names or globs (see --list)")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per measurement (at least 20 on the GPU)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--keep-cache", action="store_true", help="use the environment's kernel caches (warm TTFR)")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--smoke", action="store_true", help="CPU correctness checks on tiny shapes (exit 1 on a mismatch)")
    ap.add_argument("--merge", nargs="+", metavar="DIR",
                    help="no runs: the peers.json of these runs (one GPU, cases split over calls) into --out as one table")
    args = ap.parse_args()
    if args.smoke:
        return smoke(args)
    if args.merge:
        if not args.out:
            ap.error("--merge needs --out DIR")
        return merge(args.merge, args.out)
    cases = gpu_cases()
    if args.list:
        print("\n".join(f"{c['name']:28s} {', '.join(c['systems'])}" for c in cases))
        return 0
    if args.cases:
        globs = [g.strip() for g in args.cases.split(",") if g.strip()]
        cases = [c for c in cases if any(fnmatch.fnmatch(c["name"], g) for g in globs)]
    if not args.out:
        ap.error("--out DIR is required (or --smoke, --list)")
    if not torch.cuda.is_available():
        print("no CUDA device: the benchmark needs a GPU (run --smoke on the CPU)", file=sys.stderr)
        return 77
    args.runs = max(args.runs, 20)
    writer = run_cases(cases, args, torch.device("cuda"), torch.bfloat16, 2e-2)
    bad = [f"{c['name']}/{n}" for c in writer.cases for n, s in c["systems"].items() if s.get("wrong")]
    print(f"wrote {args.out}/peers.json, peers.md, peers.png" + (f"; WRONG: {', '.join(bad)}" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
