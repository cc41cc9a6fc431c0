"""bench/peers.py --smoke: every system against attnjit and the mask on tiny shapes on the CPU, the
method's helpers on made-up inputs, and the benchmark's own loop with two deliberately broken
systems that must come out marked wrong. Run through `bench/peers.py --smoke` (exit 1 on a failed
check), which hands this file its module: this file imports nothing of it."""
import argparse
import importlib.util
import json
import os
import tempfile
import time
import traceback

import numpy as np
import torch
from torch.nn.attention import SDPBackend
from torch.nn.attention.flex_attention import flex_attention

import attnjit
from peers_report import clocks_text, ttfr_legend
from peers_timing import JIT_KEYS, interleaved, jit_counters, jit_delta, parse_smi, summary
from peers_torch import (branch_count_fn, dilated_block_layout, dilated_mods, dilated_terms, flex_setup, flex_system,
                         fp8_quantize, group_divisor, layout_block_layout, mask_rows, max_err, reference_grads,
                         reference_rows, softmax_scale, torch_dilated, torch_longnet)

# The benchmark script's module (bench/peers.py): its cases, systems and run loop, handed over by
# smoke() rather than imported (this file is what peers.py --smoke runs).
P = None


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

    (q, k, v, dout), (qh, kh, vh, douth) = P.make_inputs(case, dev, torch.float32, seed=3)
    ref = reference_rows(qh, kh, vh, counts, list(range(H)), rows, scale, divisor)
    ours = attnjit.attention(q, k, v, pattern).transpose(1, 2)
    check(f"{name}: ours (plan executor, fp32) vs fp64 reference from the mask", max_err(ours, ref) < 1e-4, f"{max_err(ours, ref):.1e}")
    a64 = [x.double().requires_grad_() for x in (q, k, v)]
    g_a = [g.transpose(1, 2) for g in torch.autograd.grad(attnjit.attention(*a64, pattern), a64, dout.double())]
    heads, srows = P.sample_positions(H, S)
    refg = reference_grads(qh, kh, vh, douth, pattern, heads, srows, scale, divisor, chunk_elems=H * S * 37)
    err = max(max_err(r, P.sampled(g, heads, srows)) for r, g in zip(refg, g_a))
    check(f"{name}: fp64 reference grads (chunked pass over the mask) vs attnjit fp64 autograd", err < 1e-10, f"{err:.1e}")
    tc = P.torch_counts(case, pattern, heads, dev)
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
                  "that is no range)", name in P.SMOKE_UNBATCHED, str(e))
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
        o = P.sdpa_system(SDPBackend.FLASH_ATTENTION, bool(spec.get("causal")))(qh, kh, vh)
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
    spec, S, H, D = P.SMOKE_LONGNET, 512, 8, 32
    case = {"name": "longnet-small", "family": "longnet", "spec": spec, "S": S, "H": H, "D": D, "B": 1}
    pattern = attnjit.Pattern.from_json(spec)
    (q, k, v, _), (qh, kh, vh, _) = P.make_inputs(case, torch.device("cpu"), torch.float32, seed=5)
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
    H, D = 8, 64

    def shapes_hold(system, spec, S):
        q, k, v, dout = (torch.empty(2, H, S, D, device="meta", dtype=torch.bfloat16) for _ in range(4))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        o = system(spec, H, S, D, torch.device("meta"))(q, k, v)
        grads = torch.autograd.grad(o, (q, k, v), dout)
        return o.shape == q.shape and all(g.shape == q.shape and g.dtype == q.dtype for g in grads)

    check("torch-dilated: CUDA flash op plumbing on meta tensors (fwd + bwd)", shapes_hold(torch_dilated, P.SMOKE_LONGNET, 512))
    check("torch-longnet: CUDA flash op plumbing on meta tensors (fwd + bwd, a padded branch)",
          shapes_hold(torch_longnet, P.SMOKE_LONGNET_BATCHED, 768))


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
    # sdpa-fp8's quantiser: per tensor and per (batch, head), each group's largest |x| at 448, and the
    # codes times their descale within e4m3's rounding of x (2^-4 relative; 2^-9 of a descale near zero).
    x = torch.randn(2, 3, 40, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[1, 2] *= 1000.0  # one head far larger: per-head descales differ, a per-tensor one does not
    for per, shape in (("tensor", (1, 1, 1, 1)), ("head", (2, 3))):
        codes, descale = fp8_quantize(x, per)
        d = descale.double().reshape(1, 1, 1, 1) if per == "tensor" else descale.double().reshape(2, 3, 1, 1)
        back = codes.double() * d
        top = codes.double().abs().amax(dim=(0, 1, 2, 3) if per == "tensor" else (2, 3))
        check(f"units: FP8 quantiser per {per}: codes e4m3, descales {shape}, within e4m3's rounding, maximum at 448",
              codes.dtype == torch.float8_e4m3fn and tuple(descale.shape) == shape and descale.dtype == torch.float32
              and bool(((back - x).abs() <= x.abs() / 16 + d / 512).all()) and bool((top == 448.0).all()),
              f"{tuple(descale.shape)} {(back - x).abs().max().item():.3g}")


def smoke_pipeline(check, args):
    """The benchmark's own loop (rounds, references, correctness marks, files) on tiny CPU cases,
    with two broken systems that must come out marked wrong."""
    P.SYSTEMS.update(_broken_systems())
    P.MIN_SECONDS_LEFT["flex-autotune"] = 0  # eager on the CPU: no minutes of autotuning to keep time for
    cases = [P._case("dense-tiny", "dense", P.DENSE, 128, 2, 16, P.DENSE_SYSTEMS),
             P._case("longnet-tiny", "longnet", P.SMOKE_LONGNET_PIPELINE, 384, 4, 16,
                   P.DILATED_SYSTEMS + ["broken-fwd", "broken-grad"]),
             P.with_flex_autotune(P._case("bigbird-tiny", "layout", P.SMOKE_BIGBIRD, 256, 2, 16, P.LAYOUT_SYSTEMS)),
             P._case("window-tiny", "layout", P.SMOKE_WINDOW, 256, 2, 16, P.LAYOUT_SYSTEMS)]
    out = tempfile.mkdtemp(prefix="peers-smoke-")
    a = argparse.Namespace(**{**vars(args), "out": out, "runs": 3, "warmup": 1, "budget": 120.0})
    writer = P.run_cases(cases, a, torch.device("cpu"), torch.float32, 1e-4, 1e-4)
    with open(os.path.join(out, "peers.json"), encoding="utf-8") as f:
        data = json.load(f)
    with open(os.path.join(out, "peers.md"), encoding="utf-8") as f:
        md = f.read()
    ok = len(data["cases"]) == 4
    bigbird = next(c for c in data["cases"] if c["name"] == "bigbird-tiny")
    names = list(bigbird["systems"])
    good = "flex-autotune" in names and names.index("flex-autotune") == names.index("flex") + 1
    check("pipeline: --flex-autotune runs FlexAttention's autotuned mode right after its default", good, str(names))
    ok = ok and good
    jit_present = jit_counters() is not None
    for c in data["cases"]:
        for name, s in c["systems"].items():
            if name.startswith("broken"):
                what = "forward" if name == "broken-fwd" else "gradients"  # O * 1.01 has wrong gradients too
                good = (s.get("wrong") and s.get("wrong_what", [None])[0] == what and f"**{name} (WRONG)**" in md
                        and (name == "broken-fwd" or s["wrong_what"] == ["gradients"]))
                check(f"pipeline: {c['name']} {name} marked wrong ({what}) in the JSON and the table", good, P._line(s))
                ok = ok and good
                continue
            expect_ok = name not in ("sdpa-cudnn", "flex", "flex-autotune")  # no cuDNN, no flex backward on the CPU
            good = "fwd" in s and not s.get("wrong") and (s.get("status") == "ok" or not expect_ok)
            good = good or (name == "sdpa-cudnn" and s.get("status") == "error")
            if name == "sdpa-fp8" and s.get("status") == "error":  # no FP8 SDPA on the CPU: recorded with its reason
                msg = s["error"]["message"]
                good = "quantized SDPA" in msg or "cuda" in msg.lower() or "float8" in msg.lower()
                check(f"pipeline: {c['name']} sdpa-fp8 recorded with why it could not run", good, msg[:200])
                ok = ok and good
                continue
            if good and name in P.FORWARD_ONLY:  # timed forward, checked at its tolerance, no backward
                f = s["fwd"]
                good = (s.get("status") == "ok" and f["runs"] == 3 and f["min_ms"] <= f["median_ms"] <= f["max_ms"]
                        and s.get("bwd_status") == "not run: forward only" and "bwd" not in s
                        and s["max_err"] <= P.TOLERANCE[name] and s["ttfr_first"]["attnjit"])
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
            check(f"pipeline: {c['name']} {name}", good, P._line(s))
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
          and not ln["systems"]["torch-longnet"].get("wrong"), P._line(ln["systems"]["torch-longnet"]))
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
    P.merge([old_run], merged)
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
        P.SYSTEMS.pop(name)
    return writer


def smoke(args, peers):
    """Every check; `peers` is bench/peers.py's module. Returns the exit status (1 if a check failed)."""
    global P
    P = peers
    import warnings
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    t0 = time.time()
    check = Checks()
    torch.manual_seed(0)
    for name, family, spec, S, H, D in P.smoke_cases():
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
