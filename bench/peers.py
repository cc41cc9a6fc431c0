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
  torch-longnet  the strong PyTorch LongNet, as a user who read torchscale would write it: per branch one
                 strided view over every segment and head (each head's dilation residue by torch.gather),
                 one flash call per branch, the branches merged by their LSEs; exact gradients
  torch-dilated-pieces  the older, weaker PyTorch implementation (one flash call per branch and
                 dilation offset on advanced-index gathers, fp32 index_put merges), kept and labelled so
                 earlier tables stay comparable
  flex           FlexAttention under torch.compile; a BlockMask built once (not timed), a mask_mod for
                 the union of the branches and a score_mod adding log(number of branches attending)

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
deliberately broken systems that must come out marked wrong; it exits 1 if any check fails.
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
from peers_report import Writer, clocks_text, ttfr_legend  # noqa: E402  (bench/, beside this script)
from peers_torch import (  # noqa: E402  (bench/, beside this script)
    segment_length, dilated_terms, group_divisor, softmax_scale, mask_rows,
    reference_rows, reference_grads, max_err, torch_dilated, torch_longnet, branch_count_fn, dilated_mods,
    dilated_block_layout, layout_block_layout, flex_setup, flex_system)

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


DENSE_SYSTEMS = ["ours", "sdpa-flash", "sdpa-cudnn", "ours-fp8"]
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

    cache = {}

    def fwd(q, k, v):
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        if key not in cache:
            cache.clear()
            cache[key] = attnjit.fp8.quantize(q, k, v)
        x = cache[key]
        return attnjit.attention(x.q, x.k, x.v, pattern, **x.descales)
    return fwd


SYSTEMS = {
    "ours": lambda c, p, dev: (lambda q, k, v: attnjit.attention(q, k, v, p), "bshd", None),
    "ours-fp8": lambda c, p, dev: (ours_fp8(p), "bshd", None),
    "sdpa-flash": lambda c, p, dev: (sdpa_system(SDPBackend.FLASH_ATTENTION, bool(c["spec"].get("causal"))), "bhsd", None),
    "sdpa-cudnn": lambda c, p, dev: (sdpa_system(SDPBackend.CUDNN_ATTENTION, bool(c["spec"].get("causal"))), "bhsd", None),
    "sdpa-flash-dense": lambda c, p, dev: (sdpa_system(SDPBackend.FLASH_ATTENTION, False), "bhsd", c["H"] * c["S"] ** 2),
    "torch-longnet": lambda c, p, dev: (torch_longnet(c["spec"], c["H"], c["S"], c["D"], dev), "bhsd", None),
    "torch-dilated-pieces": lambda c, p, dev: (torch_dilated(c["spec"], c["H"], c["S"], c["D"], dev), "bhsd", None),
    "flex": lambda c, p, dev: (flex_system(c, p, dev), "bhsd", None),
}
# A system is started only with this much of the budget left (half of it for its backward): FlexAttention
# compiles for a minute or so, and a run killed by an outer timeout would leave the cases after it unrecorded.
MIN_SECONDS_LEFT = {"flex": 60}
# Systems with no backward, and systems whose forward is checked at another tolerance: FP8 inputs
# carry e4m3's rounding of q, k and v (2^-4 relative each) against the reference on the unquantised ones.
FORWARD_ONLY = {"ours-fp8"}
TOLERANCE = {"ours-fp8": 0.15}
NOTES = {
    "sdpa-flash-dense": "dense attention on the same shape (a different pattern: no error, TFLOP/s over all pairs)",
    "ours": "peak memory counts PyTorch's allocator only; the backward's workspaces come from the CUDA driver's "
            "stream-ordered pool and are not in it",
    "ours-fp8": "FP8 e4m3 inputs (quantised once, per-(batch, kv head) descales, outside the timed call), bf16 O; "
                "forward only; checked against the fp64 reference on the unquantised inputs at tolerance 0.15",
    "torch-longnet": "the strong PyTorch LongNet: per branch one strided view over every segment and head "
                     "(torch.gather of each head's dilation residue; segments padded to a multiple of the "
                     "dilation, the zero keys taken back out of the LSE), one flash call per branch, the "
                     "branches merged by LSE; exact gradients through each branch's flash backward",
    "torch-dilated-pieces": "the older, weaker PyTorch LongNet (kept to compare with earlier tables): one flash "
                            "call per (branch, dilation offset) on advanced-index gathers, fp32 index_put merges",
}


# ---------------------------------------------------------------------------------------------
# Measurement

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# GPU cycles the stream spins before each timed run, at least (about 2 ms at 2 GHz), and 1.5x the
# system's host time per call as its warm-ups measured it (spin_cycles): the host's work to enqueue
# the run (Python, argument checks, plan lookup, allocations) then happens while the GPU is busy,
# so the events time the GPU's work alone; the host's time per call is reported on its own
# (host_ms). A spin shorter than the host's work would put the GPU's idle wait into the system's time.
SPIN_CYCLES = 4_000_000
SPIN_CYCLES_PER_MS = 2_000_000  # about 2 GHz


def spin_cycles(host_ms):
    """The spin before a system's timed runs, from its host time per call in ms (median of its warm-ups)."""
    return max(SPIN_CYCLES, int(1.5 * host_ms * SPIN_CYCLES_PER_MS))


def timed_call(fn, device, flush, host_times=None, spin=SPIN_CYCLES):
    """One run in ms: CUDA events around it, L2 flushed (a 256 MB write) and the stream kept busy
    (`spin` GPU cycles) before it; perf_counter on the CPU. `host_times` (a list) receives the wall
    time the call took to return on the host (enqueueing only, on CUDA)."""
    if device.type == "cuda":
        flush.zero_()
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(spin)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        fn()
        host = (time.perf_counter() - t) * 1e3
        end.record()
        end.synchronize()
        if host_times is not None:
            host_times.append(host)
        return start.elapsed_time(end)
    t = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t) * 1e3
    if host_times is not None:
        host_times.append(ms)
    return ms


def interleaved(fns, device, rounds, warmup, flush, deadline=None, timeline=None, host_times=None):
    """fns: [(key, fn)]. Warm-ups of each, then `rounds` rounds A B C A B C ..., so that clock and
    temperature drift hit every system alike. Returns ({key: [ms]}, {key: exception}); a key whose
    call raises is dropped from the later rounds. Past `deadline` no new round starts (at least 3 run).
    `timeline` (a list) receives the keys in the order they ran; `host_times` (a dict) each key's
    host-side ms per call."""
    times, errors, live = {key: [] for key, _ in fns}, {}, dict(fns)
    if host_times is not None:
        host_times.update({key: [] for key, _ in fns})
    spins = {}
    for key, fn in fns:
        try:
            warm = []
            for _ in range(warmup):
                sync(device)
                t = time.perf_counter()
                fn()
                warm.append((time.perf_counter() - t) * 1e3)
            spins[key] = spin_cycles(statistics.median(warm) if warm else 0.0)
        except Exception as e:  # noqa: BLE001
            errors[key] = e
            live.pop(key)
    for r in range(rounds):
        if deadline is not None and r >= 3 and time.time() > deadline:
            break
        for key in list(live):
            try:
                times[key].append(timed_call(live[key], device, flush,
                                             None if host_times is None else host_times[key], spins[key]))
            except Exception as e:  # noqa: BLE001
                errors[key] = e
                live.pop(key)
            if timeline is not None:
                timeline.append(key)
    return times, errors


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


JIT_KEYS = ("compiled", "cache_hits", "failed", "compile_seconds", "compile_wall_seconds", "lookup_seconds")


def jit_counters():
    """attnjit's process-wide JIT counters (kernels compiled by NVRTC and their seconds, cache hits), or
    None from an attnjit without them."""
    f = getattr(getattr(attnjit, "_attnjit", None), "jit_counters", None)
    return dict(f()) if f else None


def jit_delta(before, after):
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in JIT_KEYS}


def first_call(fn, device, attnjit_system):
    """(result, {seconds, what it compiled}): attnjit's JIT counters (for an attnjit system) and the
    cache directories' files read around one call."""
    jit, files = jit_counters() if attnjit_system else None, cache_files()
    r, seconds = wall(fn, device)
    new_files = cache_files() - files if files is not None else None
    return r, {"s": seconds, "jit": jit_delta(jit, jit_counters()) if attnjit_system else None,
               "attnjit": attnjit_system, "new_cache_files": new_files}


def peak_mb(fn, device):
    """Peak bytes PyTorch's allocator held during fn() above what it held before (MB), and the absolute
    peak; the peak counter is reset right before, so each system's number is its own."""
    if device.type != "cuda":
        return None, None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return (peak - base) / 2**20, peak / 2**20


def summary(times, flop, flop_per_branch=None):
    """Median, minimum, maximum and spread ((max - min) / median, and the interquartile range / median,
    in %); useful TFLOP/s on distinct pairs at the median and the minimum, and per branch where it differs."""
    med, lo, hi = statistics.median(times), min(times), max(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [med, med, med]
    s = {"times_ms": [round(t, 4) for t in times], "runs": len(times), "median_ms": med, "min_ms": lo, "max_ms": hi,
         "spread_pct": 100 * (hi - lo) / med if med else 0.0, "iqr_pct": 100 * (q[2] - q[0]) / med if med else 0.0,
         "tflops": flop / (med * 1e-3) / 1e12 if flop and med else None,
         "tflops_at_min": flop / (lo * 1e-3) / 1e12 if flop and lo else None}
    if flop_per_branch and flop_per_branch != flop:
        s["tflops_per_branch"] = flop_per_branch / (med * 1e-3) / 1e12 if med else None
    return s


# ---------------------------------------------------------------------------------------------
# GPU clocks and temperature, at the start and end of each case

SMI_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "clocks_event_reasons.active")


def parse_smi(text, fields=SMI_FIELDS):
    """One nvidia-smi CSV line (noheader, nounits) -> {field: number or text}."""
    values = [x.strip() for x in text.strip().splitlines()[0].split(",")]
    if len(values) != len(fields):
        raise ValueError(f"nvidia-smi gave {len(values)} values for {len(fields)} fields: {text.strip()[:200]}")
    out = {}
    for f, x in zip(fields, values):
        try:
            out[f] = float(x)
        except ValueError:
            out[f] = x
    return out


def gpu_state(device):
    """SM and memory clocks (MHz), temperature (C), power (W) and the clock event reasons now, from
    nvidia-smi (older drivers: clocks_throttle_reasons) and torch.cuda where it reads them; on a
    machine with neither, {"skipped": why}."""
    if device.type != "cuda":
        return {"skipped": f"no GPU ({device.type}): clocks and temperature not read"}
    st = {"t": time.time()}
    ident = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    ident = ("GPU-" + ident if ident and not ident.startswith("GPU-") else ident) or str(device.index or 0)
    for fields in (SMI_FIELDS, SMI_FIELDS[:-1] + ("clocks_throttle_reasons.active",), SMI_FIELDS[:4]):
        try:
            r = subprocess.run(["nvidia-smi", "-i", ident, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20)
            if r.returncode == 0:
                st.update(parse_smi(r.stdout, fields))
                break
            st["nvidia_smi"] = f"rc {r.returncode}: {(r.stdout + r.stderr).strip()[:200]}"
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            st["nvidia_smi"] = f"unavailable: {e}"
            break
    for name in ("clock_rate", "temperature", "power_draw"):
        try:
            st[f"torch.cuda.{name}"] = getattr(torch.cuda, name)(device)
        except Exception:  # noqa: BLE001 -- needs pynvml / amdsmi; nvidia-smi above is the main source
            pass
    if len(st) == 1 or (len(st) == 2 and "nvidia_smi" in st):
        st["skipped"] = "neither nvidia-smi nor torch.cuda could read clocks and temperature"
    return st


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
        out, rec["ttfr_first"] = first_call(lambda: fwd(q, k, v), dev, is_attnjit)
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
    grads, rec["ttfr_bwd_first"] = first_call(lambda: torch.autograd.grad(fwd(*inputs), inputs, dout), dev, is_attnjit)
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
    st = pattern.stats(S, H)
    check(f"{name}: stats distinct_pairs == pairs of the mask (each counted once)",
          st["distinct_pairs"] == int((counts > 0).sum()), f"{st['distinct_pairs']} vs {int((counts > 0).sum())}")
    check(f"{name}: stats attended_pairs == mask counts summed (once per branch)",
          st["attended_pairs"] == int(counts.astype(np.int64).sum()), f"{st['attended_pairs']}")
    if family == "longnet":
        check(f"{name}: overlapping branches: distinct pairs < per-branch pairs",
              st["distinct_pairs"] < st["attended_pairs"], f"{st['distinct_pairs']} < {st['attended_pairs']}")
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
    a64 = [x.double().requires_grad_() for x in (q, k, v)]
    g_a = [g.transpose(1, 2) for g in torch.autograd.grad(attnjit.attention(*a64, pattern), a64, dout.double())]
    heads, srows = sample_positions(H, S)
    refg = reference_grads(qh, kh, vh, douth, pattern, heads, srows, scale, divisor, chunk_elems=H * S * 37)
    err = max(max_err(r, sampled(g, heads, srows)) for r, g in zip(refg, g_a))
    check(f"{name}: fp64 reference grads (chunked pass over the mask) vs attnjit fp64 autograd", err < 1e-10, f"{err:.1e}")
    tc = torch_counts(case, pattern, heads, dev)
    if tc is not None:
        check(f"{name}: PyTorch counts of the reference's row pass == Pattern.mask",
              np.array_equal(tc(37, 91).numpy(), counts[heads][:, 37:128]))
        refc = reference_grads(qh, kh, vh, douth, pattern, heads, srows, scale, divisor, chunk_elems=H * S * 53, counts_fn=tc)
        err = max(max_err(a, b) for a, b in zip(refc, refg))
        check(f"{name}: fp64 reference grads from the PyTorch counts == from Pattern.mask", err < 1e-12, f"{err:.1e}")
    else:
        check(f"{name}: PyTorch counts exist for every smoke family", False)
    dq_only = reference_grads(qh, kh, vh, douth, pattern, heads, srows, scale, divisor, keys=False)
    check(f"{name}: fp64 reference dQ alone == with dK, dV", dq_only[1] is None and max_err(dq_only[0], refg[0]) < 1e-12)
    if family in ("longnet", "seed_dilated"):
        try:
            fwd_b = torch_longnet(spec, H, S, D, dev)
        except NotImplementedError as e:
            fwd_b = None
            check(f"{name}: torch-longnet refuses only what it cannot batch (a segment not dividing S, a head list "
                  "that is no range)", name in SMOKE_UNBATCHED, str(e))
        if fwd_b is not None:
            q64, k64, v64 = (x.double().requires_grad_() for x in (qh, kh, vh))
            o64 = fwd_b(q64, k64, v64)
            check(f"{name}: torch-longnet vs fp64 reference (fp64)", max_err(o64, ref) < 1e-10, f"{max_err(o64, ref):.1e}")
            g_b = torch.autograd.grad(o64, (q64, k64, v64), douth.double())
            err = max(max_err(a, b) for a, b in zip(g_b, g_a))
            check(f"{name}: torch-longnet grads vs attnjit fp64 grads (fp64)", err < 1e-10, f"{err:.1e}")
            o32 = fwd_b(qh, kh, vh)
            check(f"{name}: torch-longnet vs ours (fp32)", max_err(o32, ours) < 1e-4, f"{max_err(o32, ours):.1e}")
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
    S = 768
    q, k, v, dout = (torch.empty(2, H, S, D, device="meta", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o = torch_longnet(SMOKE_LONGNET_BATCHED, H, S, D, torch.device("meta"))(q, k, v)
    grads = torch.autograd.grad(o, (q, k, v), dout)
    check("torch-longnet: CUDA flash op plumbing on meta tensors (fwd + bwd, a padded branch)",
          o.shape == q.shape and all(g.shape == q.shape and g.dtype == q.dtype for g in grads))


def _broken_systems():
    """Two systems the checks must catch: a forward off by 1%, and a right forward whose dQ is wrong."""
    def broken_fwd(c, p, dev):
        return (lambda q, k, v: attnjit.attention(q, k, v, p) * 1.01), "bshd", None

    def broken_grad(c, p, dev):
        def fwd(q, k, v):
            return attnjit.attention(q, k, v, p) + 0.1 * (q - q.detach())  # same values, dQ off by 0.1 dO
        return fwd, "bshd", None
    return {"broken-fwd": broken_fwd, "broken-grad": broken_grad}


def smoke_units(check):
    """The method's helpers on made-up inputs: the summary's spread, the nvidia-smi parser, the time to
    first result's legend (a call that counted compiles says so; one that counted more compile time
    than it took is flagged), and the round order."""
    s = summary([2.0, 1.0, 4.0, 3.0], 8e9, 1.2e10)
    check("units: summary median, min, max, spread, per-branch TFLOP/s",
          s["median_ms"] == 2.5 and s["min_ms"] == 1.0 and s["max_ms"] == 4.0 and abs(s["spread_pct"] - 120) < 1e-9
          and abs(s["tflops"] - 8e9 / 2.5e-3 / 1e12) < 1e-12 and abs(s["tflops_per_branch"] / s["tflops"] - 1.5) < 1e-12
          and abs(s["tflops_at_min"] - 8e9 / 1e-3 / 1e12) < 1e-12, str(s))
    check("units: no per-branch column where the counts agree", "tflops_per_branch" not in summary([1.0], 1e9, 1e9))
    p = parse_smi("1980, 2619, 41, 312.55, 0x0000000000000000\n")
    check("units: nvidia-smi line parsed", p == {"clocks.sm": 1980.0, "clocks.mem": 2619.0, "temperature.gpu": 41.0,
                                                  "power.draw": 312.55, "clocks_event_reasons.active": "0x0000000000000000"}, str(p))
    try:
        parse_smi("1980, 2619")
        check("units: a short nvidia-smi line is refused", False)
    except ValueError:
        check("units: a short nvidia-smi line is refused", True)
    text = clocks_text({"start": {"clocks.sm": 1980.0, "temperature.gpu": 41.0}, "end": {"clocks.sm": 1755.0}})
    check("units: clocks text shows start and end", "SM 1980" in text and "SM 1755" in text, text)
    zero = dict.fromkeys(JIT_KEYS, 0)
    compiled = ttfr_legend({"s": 2.1, "jit": {**zero, "compiled": 2, "compile_wall_seconds": 1.9}})
    hit = ttfr_legend({"s": 0.04, "jit": {**zero, "cache_hits": 2, "lookup_seconds": 0.002}})
    bad = ttfr_legend({"s": 0.04, "jit": {**zero, "compiled": 1, "compile_wall_seconds": 1.4}})
    check("units: time to first result legend from the counters",
          compiled.startswith("compiled 2 kernel(s) in 1.90 s") and "inconsistent" not in compiled
          and hit.startswith("2 kernel(s) from the cache") and "compiled" not in hit and "inconsistent" in bad,
          f"{compiled} | {hit} | {bad}")
    check("units: jit counters delta", jit_delta({**zero, "compiled": 1}, {**zero, "compiled": 3})["compiled"] == 2)
    order = []
    t, e = interleaved([("a", lambda: None), ("b", lambda: 1 / 0), ("c", lambda: None)], torch.device("cpu"), 3, 0,
                       None, timeline=order)
    check("units: rounds run A B C A C A C: a failing system dropped after its error",
          order == ["a", "b", "c", "a", "c", "a", "c"] and len(t["a"]) == 3 and not t["b"] and isinstance(e["b"], ZeroDivisionError), str(order))
    order = []
    interleaved([("a", lambda: None), ("b", lambda: None)], torch.device("cpu"), 4, 1, None, timeline=order)
    check("units: rounds interleave A B A B", order == ["a", "b"] * 4, str(order))


def smoke_pipeline(check, args):
    """The benchmark's own loop (rounds, references, correctness marks, files) on tiny CPU cases,
    with two broken systems that must come out marked wrong."""
    SYSTEMS.update(_broken_systems())
    cases = [_case("dense-tiny", "dense", DENSE, 128, 2, 16, DENSE_SYSTEMS),
             _case("longnet-tiny", "longnet", SMOKE_LONGNET_PIPELINE, 384, 4, 16,
                   DILATED_SYSTEMS + ["broken-fwd", "broken-grad"]),
             _case("bigbird-tiny", "layout", SMOKE_BIGBIRD, 256, 2, 16, LAYOUT_SYSTEMS)]
    out = tempfile.mkdtemp(prefix="peers-smoke-")
    a = argparse.Namespace(**{**vars(args), "out": out, "runs": 3, "warmup": 1, "budget": 120.0})
    writer = run_cases(cases, a, torch.device("cpu"), torch.float32, 1e-4, 1e-4)
    with open(os.path.join(out, "peers.json"), encoding="utf-8") as f:
        data = json.load(f)
    with open(os.path.join(out, "peers.md"), encoding="utf-8") as f:
        md = f.read()
    ok = len(data["cases"]) == 3
    jit_present = jit_counters() is not None
    for c in data["cases"]:
        for name, s in c["systems"].items():
            if name.startswith("broken"):
                what = "forward" if name == "broken-fwd" else "gradients"  # O * 1.01 has wrong gradients too
                good = (s.get("wrong") and s.get("wrong_what", [None])[0] == what and f"**{name} (WRONG)**" in md
                        and (name == "broken-fwd" or s["wrong_what"] == ["gradients"]))
                check(f"pipeline: {c['name']} {name} marked wrong ({what}) in the JSON and the table", good, _line(s))
                ok = ok and good
                continue
            expect_ok = name not in ("sdpa-cudnn", "flex")  # no cuDNN, no flex backward on the CPU
            good = "fwd" in s and not s.get("wrong") and (s.get("status") == "ok" or not expect_ok)
            good = good or (name == "sdpa-cudnn" and s.get("status") == "error")
            if good and name in FORWARD_ONLY:  # timed forward, checked at its tolerance, no backward
                f = s["fwd"]
                good = (s.get("status") == "ok" and f["runs"] == 3 and f["min_ms"] <= f["median_ms"] <= f["max_ms"]
                        and s.get("bwd_status") == "not run: forward only" and "bwd" not in s
                        and s["max_err"] <= TOLERANCE[name] and s["ttfr_first"]["attnjit"])
            elif good and s.get("status") == "ok":
                f, b = s["fwd"], s["bwd"]
                # The training step: each round's forward and backward added (times rounded to 1e-4 ms).
                step = s.get("step", {})
                good = (step.get("runs") == 3 and all(abs(t - x - y) < 2e-4 for t, x, y in
                                                      zip(step["times_ms"], f["times_ms"], b["times_ms"])))
                good = (good and f["runs"] == b["runs"] == 3 and f["min_ms"] <= f["median_ms"] <= f["max_ms"]
                        and "spread_pct" in f and (name == "sdpa-flash-dense" or set(s["grad_err"]) == {"dq", "dk", "dv"})
                        and "peak_fwd_mb" in s and "peak_fwdbwd_mb" in s and "ttfr_first" in s and "ttfr_bwd_first" in s
                        and s["ttfr_first"]["attnjit"] == (name == "ours")
                        and (s["ttfr_first"]["jit"] is not None) == (jit_present and name == "ours"))
            check(f"pipeline: {c['name']} {name}", good, _line(s))
            ok = ok and good
        first_round = list(dict.fromkeys(x.split()[0] for x in c["order"]))
        check(f"pipeline: {c['name']} one round runs every timed system once, in order",
              first_round == [n for n, s in c["systems"].items() if "fwd" in s] and len(c["order"]) == len(set(c["order"])),
              ", ".join(c["order"]))
        check(f"pipeline: {c['name']} clocks read or skipped visibly at start and end",
              "skipped" in c["clocks"]["start"] and "skipped" in c["clocks"]["end"] and "clocks: skipped" in md)
    ln = next(c for c in data["cases"] if c["name"] == "longnet-tiny")
    ours = ln["systems"]["ours"]
    check("pipeline: longnet distinct pairs < per-branch pairs, TFLOP/s on distinct pairs below per-branch",
          ln["attended_pairs_distinct"] < ln["attended_pairs_per_branch"]
          and ours["fwd"]["tflops"] < ours["fwd"]["tflops_per_branch"], f"{ln['attended_pairs_distinct']} < "
          f"{ln['attended_pairs_per_branch']}")
    check("pipeline: torch-longnet ran and matched", ln["systems"]["torch-longnet"].get("status") == "ok"
          and not ln["systems"]["torch-longnet"].get("wrong"), _line(ln["systems"]["torch-longnet"]))
    dense_rows = [l for l in md.split("## Cases")[0].splitlines() if l.startswith("| dense-tiny | sdpa-flash |")]
    check("pipeline: the table has the training step and its ratio",
          "| step ms | step ours/peer |" in md and len(dense_rows) == 1 and float(dense_rows[0].split("|")[13]) > 0,
          dense_rows[0] if dense_rows else "no sdpa-flash row")
    # --merge of a run made before the step column: the step comes back from the stored rounds.
    old_run = tempfile.mkdtemp(prefix="peers-smoke-old-")
    for c in data["cases"]:
        for srec in c["systems"].values():
            srec.pop("step", None)
    with open(os.path.join(old_run, "peers.json"), "w", encoding="utf-8") as f:
        json.dump(data, f)
    merged = os.path.join(old_run, "merged")
    merge([old_run], merged)
    with open(os.path.join(merged, "peers.json"), encoding="utf-8") as f:
        back = json.load(f)
    flash = next(c for c in back["cases"] if c["name"] == "dense-tiny")["systems"]["sdpa-flash"]
    check("pipeline: --merge rebuilds the training step from a run's rounds",
          flash.get("step", {}).get("runs") == 3 and all(abs(t - x - y) < 1e-9 for t, x, y in zip(
              flash["step"]["times_ms"], flash["fwd"]["times_ms"], flash["bwd"]["times_ms"])))
    check("pipeline: peers.json and peers.md written", ok, out)
    if importlib.util.find_spec("matplotlib"):
        check("pipeline: peers.png written", os.path.exists(os.path.join(out, "peers.png")))
    else:
        print("skipped: peers.png: no matplotlib")
    if jit_present:
        check("pipeline: the CPU device compiled nothing (JIT counters around ours' first calls)",
              ours["ttfr_first"]["jit"]["compiled"] == 0 and ours["ttfr_bwd_first"]["jit"]["compiled"] == 0)
    else:
        print("skipped: JIT counters: this attnjit build has no jit_counters (rebuild the extension)")
    for name in _broken_systems():
        SYSTEMS.pop(name)
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
    smoke_units(check)
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
    writer = run_cases(cases, args, torch.device("cuda"), torch.bfloat16, 2e-2, 5e-2)
    bad = [f"{c['name']}/{n}" for c in writer.cases for n, s in c["systems"].items() if s.get("wrong")]
    print(f"wrote {args.out}/peers.json, peers.md, peers.png" + (f"; WRONG: {', '.join(bad)}" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
