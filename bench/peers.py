"""attnjit against its PyTorch peers, side by side, on one GPU, in one run (the peers themselves,
the contract in PyTorch and FlexAttention's masks, are in bench/peers_torch.py; the table, the
plot and the JSON are written by bench/peers_report.py).

    PYTHONPATH=build-device/python python3 bench/peers.py --out DIR [--budget 420] [--cases 'dense*,longnet*']
                                                           [--no-backward] [--runs 20] [--keep-cache] [--list]
    PYTHONPATH=build/python python3 bench/peers.py --smoke        # CPU only: every system's correctness, tiny shapes
    PYTHONPATH=build/python python3 bench/peers.py --merge RUN1 RUN2 --out DIR   # one table from runs split over calls

Systems (the cases are one table, `gpu_cases()`, most important first; --list prints it):
  ours           attnjit.attention on [B, S, H, D] tensors; backward through autograd
  sdpa-flash     torch SDPA, flash backend  (dense cases; "sdpa-flash-dense": dense stand-in for layouts)
  sdpa-cudnn     torch SDPA, cuDNN backend  (dense cases)
  sdpa-fp8       torch's quantized SDPA on e4m3 inputs, cuDNN (per-tensor descales) or FlashAttention-3
                 (per-head) where this PyTorch has either; else recorded with the reason (dense cases)
  torch-longnet  the strong PyTorch LongNet, as a user who read torchscale would write it: per branch one
                 strided view over every segment and head (each head's dilation residue by torch.gather),
                 one flash call per branch, the branches merged by their LSEs; exact gradients
  torch-dilated-pieces  the older, weaker PyTorch implementation (one flash call per branch and
                 dilation offset on advanced-index gathers, fp32 index_put merges), kept and labelled so
                 earlier tables stay comparable
  flex           FlexAttention under torch.compile; a BlockMask built once (not timed), a mask_mod for
                 the union of the branches and a score_mod adding log(number of branches attending)
  flex-autotune  the same, compiled in max-autotune mode (Inductor times its block sizes and stages as it
                 compiles: minutes); with --flex-autotune, after each case's flex

Each case, the method:
  - the same seeded inputs for every system; an fp64 reference of the forward and of dQ, dK, dV on
    sampled heads and rows, built from attnjit's own mask (`Pattern.mask`; dK, dV need a pass over
    every row, done up to --ref-keys-max-s, dQ alone above); every system's forward and gradients
    are checked against it, and a mismatch marks the system's row WRONG (forward, gradients);
  - per system: the first forward call and the first forward + backward timed, with attnjit's
    own JIT counters read around each (kernels compiled by NVRTC, their wall time, cache hits), so
    the time-to-first-result legend says what that call did; the kernel caches start empty unless
    --keep-cache; peak memory (torch.cuda.max_memory_allocated, reset per system);
  - then every system's forward and backward timed in interleaved rounds (A B C A B C ..., after
    warm-ups, L2 flushed and the stream kept busy before each run for 2 ms or 1.5x the system's host
    time per call, whichever is longer, CUDA events), so clock
    and temperature drift hits all alike and the host's enqueueing is not in the GPU time (it is
    reported on its own, host_ms): median, minimum, maximum and spread; GPU clocks, temperature and power read (nvidia-smi,
    torch.cuda) at the start and end of the case, a visible "skipped" where they cannot be;
  - useful TFLOP/s = 4 * D * distinct attended pairs * batch / time (a pair two branches attend
    counts once: `Pattern.stats`' distinct_pairs), backward 2.5x that; per-branch TFLOP/s (pairs
    counted once per branch) in a column of its own;
  - the training step: each round's forward and backward added (run back to back in the round),
    median over the rounds, with its own ours/peer ratio;
  - peers.png: grouped bars per case, one panel each for forward, backward and training step, one
    colour per system everywhere, each peer's bar labelled with ours/peer.
Every system runs in its own try/except; DIR/peers.json and peers.md are rewritten after each system,
peers.png after each case; past --budget seconds the remaining systems are recorded as
"not run: budget" (and no new round starts past it, after at least 3).
--smoke runs all of this on the CPU at tiny sizes (perf_counter timing, clocks skipped), with two
deliberately broken systems that must come out marked wrong; it exits 1 if any check fails
(bench/peers_smoke.py). How runs are timed and described: bench/peers_timing.py.
"""
import argparse
import atexit
import fnmatch
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

import attnjit  # noqa: E402
from peers_report import Writer  # noqa: E402  (bench/, beside this script)
from peers_timing import first_call, gpu_state, interleaved, peak_mb, summary, wall  # noqa: E402  (bench/)
from peers_torch import (  # noqa: E402  (bench/, beside this script)
    dilated_terms, group_divisor, softmax_scale, mask_rows, reference_rows, reference_grads, max_err, torch_dilated,
    torch_longnet, branch_count_fn, layout_block_layout, flex_system, window_bounds, once_per_inputs, sdpa_fp8,
    FLEX_AUTOTUNE_MODE)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DENSE = {"attnjit": 1, "description": "dense", "branches": [{"segment": "full"}]}
DENSE_CAUSAL = {**DENSE, "description": "dense causal", "causal": True}
# A causal window of 1,638 keys: about 10% of the pairs at 16384 tokens.
SLIDING_WINDOW_10 = {"attnjit": 1, "description": "causal sliding window, 10% at 16384", "causal": True,
                     "window": [1637, 0], "branches": [{"segment": "full"}]}
LOCAL_GLOBAL = {"attnjit": 1, "description": "local (4 blocks each side) + 2 global blocks, 128x128: ~10% at 16384",
                "layout": {"block": 128, "union": [{"local": 4}, {"global": [0, 1]}]}, "branches": [{"segment": "full"}]}


def _example(name):
    with open(os.path.join(REPO, "examples", name), encoding="utf-8") as f:
        return json.load(f)


def _case(name, family, spec, S, H, D, systems, B=1):
    return {"name": name, "family": family, "spec": spec, "S": S, "H": H, "D": D, "B": B, "systems": systems}


def with_flex_autotune(case):
    """The case with flex-autotune right after its flex (--flex-autotune), where it has flex."""
    systems = list(case["systems"])
    if "flex" in systems and "flex-autotune" not in systems:
        systems.insert(systems.index("flex") + 1, "flex-autotune")
    return {**case, "systems": systems}


DENSE_SYSTEMS = ["ours", "sdpa-flash", "sdpa-cudnn", "ours-fp8", "sdpa-fp8"]
DILATED_SYSTEMS = ["ours", "torch-longnet", "torch-dilated-pieces", "flex", "ours-fp8"]
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
    cases += [_case("sliding_window-s16384", "layout", SLIDING_WINDOW_10, 16384, 16, 128, LAYOUT_SYSTEMS),
              _case("dense-d256-s16384", "dense", DENSE, 16384, 16, 256, DENSE_SYSTEMS)]
    return cases


# Small specs in the same families, for --smoke (CPU, fp32). Lengths that are no multiple of a
# segment, a segment longer than the sequence, a dilation that does not divide its segment, every
# offset rule, a head subset and rows that attend nothing are all in here on purpose.
SMOKE_LONGNET = {"attnjit": 1, "branches": [{"segment": 64, "dilation": 1}, {"segment": 128, "dilation": 2},
                                            {"segment": 256, "dilation": 4}, {"segment": 320, "dilation": 6}]}
SMOKE_OFFSETS = {"attnjit": 1, "branches": [{"segment": 128, "dilation": 4, "offset": "head_block"},
                                            {"segment": 256, "dilation": 2, "offset": 1, "heads": [0, 2, 3]},
                                            {"segment": "full", "dilation": 3}, {"segment": 1024, "dilation": 8}]}
# What the batched PyTorch LongNet takes at S = 768 (every segment divides S); dilation 6 does not
# divide its 256-row segment, which is padded with zero rows.
SMOKE_LONGNET_BATCHED = {"attnjit": 1, "branches": [{"segment": 64, "dilation": 1}, {"segment": 128, "dilation": 2},
                                                    {"segment": 256, "dilation": 6}, {"segment": "full", "dilation": 12}]}
SMOKE_LONGNET_PIPELINE = {"attnjit": 1, "branches": [{"segment": 64, "dilation": 1}, {"segment": 128, "dilation": 2},
                                                     {"segment": "full", "dilation": 5}]}  # 384 rows: 5 pads
SMOKE_SEED = {"attnjit": 1, "combine": "head_groups", "group_scale": "mean",
              "branches": [{"segment": 64, "dilation": 1}, {"segment": 128, "dilation": 2},
                           {"segment": 256, "dilation": 4}]}
SMOKE_WINDOW = {"attnjit": 1, "causal": True, "window": [40, 0], "branches": [{"segment": "full"}]}
SMOKE_BIGBIRD = {"attnjit": 1, "layout": {"block": 16, "union": [{"local": 1}, {"global": [0]},
                                                                 {"random": {"density": 0.1, "seed": 7}}]},
                 "branches": [{"segment": "full"}]}


SMOKE_UNBATCHED = ("longnet-small", "offsets-small")  # segments 320 and 1024 do not divide S; heads [0, 2, 3]


def smoke_cases():
    """(name, family, spec, S, H, D) for the correctness checks of --smoke."""
    return [("dense", "dense", DENSE, 256, 2, 32), ("dense-causal", "dense", DENSE_CAUSAL, 256, 2, 32),
            ("longnet-small", "longnet", SMOKE_LONGNET, 512, 8, 32), ("offsets-small", "longnet", SMOKE_OFFSETS, 384, 4, 16),
            ("longnet-batched", "longnet", SMOKE_LONGNET_BATCHED, 768, 8, 16),
            ("seed-small", "seed_dilated", SMOKE_SEED, 512, 8, 32), ("bigbird-small", "layout", SMOKE_BIGBIRD, 512, 4, 32)]


# ---------------------------------------------------------------------------------------------
# Systems: build(case, pattern, device) -> (fwd on its layout, layout, attended pairs it computes or None)

def sdpa_system(backend, causal):
    def fwd(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fwd


def ours_fp8(pattern):
    """attnjit on FP8 inputs: q, k, v quantised to e4m3 once (per-(batch, kv head) descales, outside
    the timed call), then the FP8 forward (bf16 O). Forward only."""
    import attnjit.fp8

    quantised = once_per_inputs(attnjit.fp8.quantize)

    def fwd(q, k, v):
        x = quantised(q, k, v)
        return attnjit.attention(x.q, x.k, x.v, pattern, **x.descales)
    return fwd


SYSTEMS = {
    "ours": lambda c, p, dev: (lambda q, k, v: attnjit.attention(q, k, v, p), "bshd", None),
    "ours-fp8": lambda c, p, dev: (ours_fp8(p), "bshd", None),
    "sdpa-flash": lambda c, p, dev: (sdpa_system(SDPBackend.FLASH_ATTENTION, bool(c["spec"].get("causal"))), "bhsd", None),
    "sdpa-cudnn": lambda c, p, dev: (sdpa_system(SDPBackend.CUDNN_ATTENTION, bool(c["spec"].get("causal"))), "bhsd", None),
    "sdpa-flash-dense": lambda c, p, dev: (sdpa_system(SDPBackend.FLASH_ATTENTION, False), "bhsd", c["H"] * c["S"] ** 2),
    "sdpa-fp8": lambda c, p, dev: (sdpa_fp8(bool(c["spec"].get("causal"))), "bhsd", None),
    "torch-longnet": lambda c, p, dev: (torch_longnet(c["spec"], c["H"], c["S"], c["D"], dev), "bhsd", None),
    "torch-dilated-pieces": lambda c, p, dev: (torch_dilated(c["spec"], c["H"], c["S"], c["D"], dev), "bhsd", None),
    "flex": lambda c, p, dev: (flex_system(c, p, dev), "bhsd", None),
    "flex-autotune": lambda c, p, dev: (flex_system(c, p, dev, mode=FLEX_AUTOTUNE_MODE), "bhsd", None),
}
# A system is started only with this much of the budget left (half of it for its backward): FlexAttention
# compiles for a minute or so, and a run killed by an outer timeout would leave the cases after it unrecorded.
MIN_SECONDS_LEFT = {"flex": 60, "flex-autotune": 240}
# Systems with no backward, and systems whose forward is checked at another tolerance: FP8 inputs
# carry e4m3's rounding of q, k and v (2^-4 relative each) against the reference on the unquantised ones.
FORWARD_ONLY = {"ours-fp8", "sdpa-fp8"}
TOLERANCE = {"ours-fp8": 0.15, "sdpa-fp8": 0.15}
NOTES = {
    "sdpa-flash-dense": "dense attention on the same shape (a different pattern: no error, TFLOP/s over all pairs)",
    "ours": "peak memory counts PyTorch's allocator only; the backward's workspaces come from the CUDA driver's "
            "stream-ordered pool and are not in it",
    "ours-fp8": "FP8 e4m3 inputs (quantised once, per-(batch, kv head) descales, outside the timed call), bf16 O; "
                "forward only; checked against the fp64 reference on the unquantised inputs at tolerance 0.15",
    "sdpa-fp8": "PyTorch's quantized SDPA on e4m3 inputs (quantised once, outside the timed call; bf16 O): cuDNN "
                "with per-tensor descales, or FlashAttention-3 with per-(batch, head) ones where this PyTorch "
                "has no cuDNN FP8 (the error says which it lacks); forward only, tolerance 0.15",
    "torch-longnet": "the strong PyTorch LongNet: per branch one strided view over every segment and head "
                     "(torch.gather of each head's dilation residue; segments padded to a multiple of the "
                     "dilation, the zero keys taken back out of the LSE), one flash call per branch, the "
                     "branches merged by LSE; exact gradients through each branch's flash backward",
    "torch-dilated-pieces": "the older, weaker PyTorch LongNet (kept to compare with earlier tables): one flash "
                            "call per (branch, dilation offset) on advanced-index gathers, fp32 index_put merges",
    "flex": "FlexAttention under torch.compile in its default mode; the BlockMask built once, not timed",
    "flex-autotune": f"FlexAttention under torch.compile(mode='{FLEX_AUTOTUNE_MODE}'): Inductor times its "
                     "block sizes and stages while it compiles (--flex-autotune); the better of the two flex rows "
                     "is the peer",
}


def cache_files():
    """Files in the cold cache directories (None with --keep-cache): more after a call means it compiled."""
    if not CACHE_INFO:
        return None
    return sum(len(files) for d in CACHE_INFO["cold"].values() for _, _, files in os.walk(d))


# ---------------------------------------------------------------------------------------------
# One case

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


def sampled(x, heads, rows):
    return x[:, heads][:, :, rows]


def prepare_system(name, case, pattern, ctx, rec, timed):
    """Correctness and first calls of one system; appends its timed callables ((name, pass), fn) to
    `timed` as each pass passes its first call. Fills rec; raises on a failure, keeping what was measured."""
    dev, args = ctx["device"], ctx["args"]
    fwd, layout, own_pairs = SYSTEMS[name](case, pattern, dev)
    distinct = own_pairs or ctx["pairs"]
    per_branch = own_pairs or ctx["pairs_per_branch"]
    rec.update({"layout": layout, "attended_pairs_distinct": distinct, "attended_pairs_per_branch": per_branch,
                "note": NOTES.get(name, "")})
    rec["flop_fwd"] = 4 * case["D"] * distinct * case["B"]
    rec["flop_fwd_per_branch"] = 4 * case["D"] * per_branch * case["B"]
    q, k, v, dout = ctx["bshd"] if layout == "bshd" else ctx["bhsd"]
    to_bhsd = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    checked = own_pairs is None  # a system computing another pattern is timed, not compared
    is_attnjit = layout == "bshd"  # attnjit's systems, and only they, run on [B, S, H, D]
    heads, rows = ctx["sample"]
    wrong = rec["wrong_what"] = []

    with torch.no_grad():
        out, rec["ttfr_first"] = first_call(lambda: fwd(q, k, v), dev, is_attnjit, cache_files)
        out, rec["ttfr_second_s"] = wall(lambda: fwd(q, k, v), dev)
        got = sampled(to_bhsd(out), heads, rows).clone()
        del out
    if checked:
        rec["max_err"] = max_err(got, ctx["ref"])
        if not rec["max_err"] <= TOLERANCE.get(name, ctx["tol"]):
            wrong.append("forward")
        if name == "ours":
            ctx["ours_sample"] = got
        elif ctx.get("ours_sample") is not None:
            rec["diff_vs_ours"] = max_err(got, ctx["ours_sample"])
    rec["wrong"] = bool(wrong)
    rec["peak_fwd_mb"], rec["peak_fwd_abs_mb"] = peak_mb(lambda: _no_grad(fwd, q, k, v), dev)

    def forward():
        with torch.no_grad():
            fwd(q, k, v)
    timed.append(((name, "fwd"), forward))
    if args.no_backward:
        return
    if name in FORWARD_ONLY:
        rec["bwd_status"] = "not run: forward only"
        return
    if time.time() > ctx["deadline"] - MIN_SECONDS_LEFT.get(name, 0) / 2:
        rec["bwd_status"] = "not run: budget"
        return

    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    grads, rec["ttfr_bwd_first"] = first_call(lambda: torch.autograd.grad(fwd(*inputs), inputs, dout), dev, is_attnjit, cache_files)
    grads = [sampled(to_bhsd(g), heads, rows) for g in grads]
    if checked:
        ref = ctx["ref_grads"]
        errs = {n: max_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, ref) if r is not None}
        rec["grad_err"] = errs
        rec["grad_check"] = ctx["grad_check"]
        if not all(e <= ctx["grad_tol"] for e in errs.values()):
            wrong.append("gradients")
        if name == "ours":
            ctx["ours_grads"] = grads
        elif ctx.get("ours_grads") is not None:
            rec["grad_diff_vs_ours"] = max(max_err(g, r) for g, r in zip(grads, ctx["ours_grads"]))
    rec["wrong"] = bool(wrong)
    grads = None
    rec["peak_fwdbwd_mb"], rec["peak_fwdbwd_abs_mb"] = peak_mb(lambda: torch.autograd.grad(fwd(*inputs), inputs, dout), dev)
    o = fwd(*inputs)  # kept for the timed backward (autograd.grad on the retained graph)

    def backward():
        return torch.autograd.grad(o, inputs, dout, retain_graph=True)
    timed.append(((name, "bwd"), backward))


def _no_grad(fwd, *args):
    with torch.no_grad():
        return fwd(*args)


def torch_counts(case, pattern, heads, device):
    """counts(start, n) -> [len(heads), n, S] int: how many branches attend each pair, computed in
    PyTorch on `device` from the spec (dense, causal, dilated branches, uniform block layouts), for
    the fp64 reference's pass over every row (attnjit's Pattern.mask is exact but slow at long S;
    --smoke checks these equal to it). None for a spec it does not read."""
    spec, S, H = case["spec"], case["S"], case["H"]
    hs = torch.tensor(heads, device=device)[:, None, None]
    kv = torch.arange(S, device=device)[None, None, :]
    if case["family"] == "dense" and len(spec["branches"]) == 1 and spec["branches"][0].get("segment") == "full" \
            and set(spec) <= {"attnjit", "description", "branches", "causal"}:
        causal = bool(spec.get("causal"))
        return lambda start, n: ((kv <= torch.arange(start, start + n, device=device)[None, :, None]) if causal
                                 else torch.ones(1, n, S, dtype=torch.bool, device=device)).expand(len(heads), n, S).int()
    if case["family"] in ("longnet", "seed_dilated"):
        count = branch_count_fn(dilated_terms(spec, H), H, S, device)
        return lambda start, n: count(0, hs, torch.arange(start, start + n, device=device)[None, :, None], kv)
    if window_bounds(spec) is not None:
        lo, hi = window_bounds(spec)

        def window(start, n):
            d = torch.arange(start, start + n, device=device)[None, :, None] - kv
            return ((d >= lo) & (d <= hi)).expand(len(heads), n, S).int()
        return window
    if case["family"] == "layout":
        layout, block = layout_block_layout(pattern, spec, H, S)
        lay = torch.as_tensor(layout, device=device)
        return lambda start, n: lay[hs, torch.arange(start, start + n, device=device)[None, :, None] // block,
                                    kv // block].int()
    return None


def case_reference(case, pattern, ctx, rec):
    """The sampled heads and rows, and the fp64 forward and gradients of the contract on them."""
    heads, rows = ctx["sample"] = sample_positions(case["H"], case["S"])
    q, k, v, dout = ctx["bhsd"]
    scale, divisor = softmax_scale(case["spec"], case["D"]), group_divisor(case["spec"])
    counts = mask_rows(pattern, rows, case["H"], case["S"])
    ctx["ref"] = reference_rows(q, k, v, counts, heads, rows, scale, divisor)
    rec["sample"] = {"heads": heads, "rows": rows}
    if ctx["args"].no_backward:
        return
    t = time.time()
    keys = case["S"] <= ctx["args"].ref_keys_max_s
    counts = torch_counts(case, pattern, heads, q.device) if keys else None
    keys = keys and counts is not None
    ctx["ref_grads"] = reference_grads(q, k, v, dout, pattern, heads, rows, scale, divisor, keys=keys, counts_fn=counts)
    ctx["grad_check"] = ("dQ, dK, dV" if keys else
                         f"dQ only (the dK, dV reference passes over every row: skipped above S = "
                         f"{ctx['args'].ref_keys_max_s} and for specs the PyTorch count function does not read)")
    rec["reference_grads_s"] = time.time() - t


def run_case(case, ctx, writer):
    """One case: the fp64 reference, each system's correctness, first calls and memory (each in its
    own try/except), then every system's forward and backward timed in interleaved rounds, with the
    GPU's clocks read before and after; rewrites the outputs after each step."""
    dev, dtype = ctx["device"], ctx["dtype"]
    rec = {k: case[k] for k in ("name", "family", "S", "H", "D", "B")}
    rec.update({"spec": case["spec"], "dtype": str(dtype).replace("torch.", ""), "systems": {}})
    writer.cases.append(rec)
    if time.time() > ctx["deadline"]:
        rec["systems"] = {name: {"status": "not run: budget"} for name in case["systems"]}
        writer.write()
        return
    for key in ("ours_sample", "ours_grads", "ref_grads"):
        ctx.pop(key, None)
    rec["clocks"] = {"start": gpu_state(dev)}
    if "skipped" in rec["clocks"]["start"]:
        print(f"{case['name']}: {rec['clocks']['start']['skipped']}", flush=True)
    try:
        pattern = attnjit.Pattern.from_json(case["spec"])
        rec["stats"] = pattern.stats(case["S"], case["H"])
        ctx["pairs"] = rec["attended_pairs_distinct"] = rec["stats"]["distinct_pairs"]
        ctx["pairs_per_branch"] = rec["attended_pairs_per_branch"] = rec["stats"]["attended_pairs"]
        ctx["bshd"], ctx["bhsd"] = make_inputs(case, dev, dtype)
        case_reference(case, pattern, ctx, rec)
    except Exception as e:  # noqa: BLE001 -- the case is recorded as failed, the run goes on
        rec["error"] = _error(e)
        print(f"{case['name']}: setup failed: {rec['error']['message']}", flush=True)
        writer.write()
        return
    timed = []
    for name in case["systems"]:
        srec = rec["systems"][name] = {}
        if time.time() > ctx["deadline"] - MIN_SECONDS_LEFT.get(name, 0):
            srec["status"] = "not run: budget"
            continue
        t = time.time()
        try:
            prepare_system(name, case, pattern, ctx, srec, timed)
            srec["status"] = "ok"
        except Exception as e:  # noqa: BLE001 -- recorded, and the next system runs
            srec["status"] = "error"
            srec["error"] = _error(e)
        srec["prepare_s"] = time.time() - t
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        writer.write()
    args = ctx["args"]
    ctx["timeline"] = []
    host = {}
    times, errors = interleaved(timed, dev, args.runs, args.warmup, ctx["flush"],
                                deadline=ctx["deadline"], timeline=ctx["timeline"], host_times=host)
    rec["order"] = [f"{n} {p}" for n, p in ctx["timeline"][:len(timed)]]
    for (name, pas), ts in times.items():
        srec = rec["systems"][name]
        flop = srec["flop_fwd"] * (2.5 if pas == "bwd" else 1)
        flop_b = srec["flop_fwd_per_branch"] * (2.5 if pas == "bwd" else 1)
        if (name, pas) in errors:
            srec["status"] = "error"
            srec["error"] = _error(errors[(name, pas)], f"timed {pas}: ")
        if ts:
            srec[pas] = summary(ts, flop, flop_b)
            if host.get((name, pas)):
                srec[pas]["host_ms"] = statistics.median(host[(name, pas)])
    for srec in rec["systems"].values():
        add_training_step(srec)
    rec["clocks"]["end"] = gpu_state(dev)
    for name, srec in rec["systems"].items():
        print(f"{case['name']:28s} {name:20s} {_line(srec)}", flush=True)
    timed = None
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    writer.write(plot=True)


def add_training_step(srec):
    """srec["step"]: a system's training step per round, its forward and backward of the same round
    added (the two run back to back in each round, so a round's sum is one step under that round's
    clocks), where both passes ran in every round without an error."""
    f, b = srec.get("fwd", {}).get("times_ms"), srec.get("bwd", {}).get("times_ms")
    if srec.get("status") == "ok" and f and b and len(f) == len(b):
        srec["step"] = summary([x + y for x, y in zip(f, b)], srec["flop_fwd"] * 3.5, srec["flop_fwd_per_branch"] * 3.5)


def _error(e, prefix=""):
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
    return {"type": type(e).__name__, "message": prefix + (str(e).strip().splitlines()[0][:400] if str(e).strip() else ""),
            "traceback": tb}


def _line(s):
    f, b = s.get("fwd", {}), s.get("bwd", {})
    parts = [s.get("status", "")]
    if f:
        parts.append(f"fwd {f['median_ms']:.3f} ms (min {f['min_ms']:.3f}, spread {f['spread_pct']:.0f}%) "
                     f"{f['tflops'] or 0:.1f} TF/s")
    if b:
        parts.append(f"bwd {b['median_ms']:.3f} ms (min {b['min_ms']:.3f}) {b['tflops'] or 0:.1f} TF/s")
    if s.get("step"):
        parts.append(f"step {s['step']['median_ms']:.3f} ms")
    if f.get("host_ms") is not None:
        parts.append(f"host {f['host_ms']:.3f}" + (f"/{b['host_ms']:.3f}" if b.get("host_ms") is not None else "") + " ms")
    if "max_err" in s:
        parts.append(f"err {s['max_err']:.2e}")
    if "grad_err" in s:
        parts.append(f"grad err {max(s['grad_err'].values()):.2e}")
    if s.get("wrong"):
        parts.append("WRONG: " + ", ".join(s["wrong_what"]))
    if "error" in s:
        parts.append(f"{s['error']['type']}: {s['error']['message'][:160]}")
    return "  ".join(parts)


def metadata(device, args):
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "attnjit": attnjit.__version__, "attnjit_info": attnjit.info(),
            "python": sys.version.split()[0], "args": vars(args), "caches": CACHE_INFO,
            "method": f"each case's systems interleaved in {args.runs} rounds (A B C A B C ...) after {args.warmup} "
                      "warm-ups each, L2 flushed and the stream kept busy before each run (GPU time; the host's "
                      "time per call apart); median, min and spread; GPU clocks and temperature "
                      "read before and after each case; useful TFLOP/s = 4 D distinct pairs B / time (backward 2.5x), "
                      "per-branch pairs alongside; forward and gradients checked against an fp64 reference on "
                      "sampled heads and rows."}
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


def run_cases(cases, args, device, dtype, tol, grad_tol):
    ctx = {"device": device, "dtype": dtype, "tol": tol, "grad_tol": grad_tol, "args": args,
           "deadline": time.time() + args.budget,
           "flush": torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if device.type == "cuda" else None}
    writer = Writer(args.out, metadata(device, args))
    for case in cases:
        run_case(case, ctx, writer)
    return writer


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
    for c in by_name.values():  # runs made before the training-step column: the step from their rounds
        for srec in c["systems"].values():
            if "step" not in srec:
                add_training_step(srec)
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
    ap.add_argument("--ref-keys-max-s", type=int, default=131072,
                    help="largest S whose dK, dV are checked against the fp64 reference (a pass over every row); "
                         "above it dQ only")
    ap.add_argument("--keep-cache", action="store_true", help="use the environment's kernel caches (warm TTFR)")
    ap.add_argument("--flex-autotune", action="store_true",
                    help="also FlexAttention compiled in max-autotune mode (flex-autotune) after each case's flex "
                         "(its compile takes minutes)")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--smoke", action="store_true", help="CPU correctness checks on tiny shapes (exit 1 on a mismatch)")
    ap.add_argument("--merge", nargs="+", metavar="DIR",
                    help="no runs: the peers.json of these runs (one GPU, cases split over calls) into --out as one table")
    args = ap.parse_args()
    if args.smoke:
        import peers_smoke  # noqa: PLC0415 (bench/, beside this script)
        return peers_smoke.smoke(args, sys.modules[__name__])
    if args.merge:
        if not args.out:
            ap.error("--merge needs --out DIR")
        return merge(args.merge, args.out)
    cases = gpu_cases()
    if args.flex_autotune:
        cases = [with_flex_autotune(c) for c in cases]
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
    writer = run_cases(cases, args, torch.device("cuda"), torch.bfloat16, 2e-2, 5e-2)
    bad = [f"{c['name']}/{n}" for c in writer.cases for n, s in c["systems"].items() if s.get("wrong")]
    print(f"wrote {args.out}/peers.json, peers.md, peers.png" + (f"; WRONG: {', '.join(bad)}" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
