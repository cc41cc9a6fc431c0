"""Decode over a KV cache: attnjit's paged forward against what a PyTorch user runs, side by side on
one GPU, in one run.

    PYTHONPATH=build-device/python python3 bench/decode_peers.py --out DIR [--budget 120] [--cases 'dense*']
    PYTHONPATH=build-device/python python3 bench/decode_peers.py --out DIR --sweep [--cases ...]
    PYTHONPATH=build/python python3 bench/decode_peers.py --smoke     # CPU: every system's correctness, tiny shapes

Systems:
  ours            attnjit.serving.paged_attention: the whole call (the host's plan of the step and the
                  kernel), K/V in shuffled pages of 16 tokens read through the block table
  ours-device-plan  the same call with the lengths in a CUDA int32 tensor: planned on the device
                  (no host work per step, what a CUDA graph replays)
  sdpa-contiguous torch SDPA on a contiguous cache [B, Hkv, L, D] per request (the keys the pattern
                  attends sliced out where they are one range: a sliding window's last W), GQA by
                  enable_gqa; no paging (the layout a user without a paged kernel keeps)
  flex-gathered   FlexAttention (compiled; its decoding kernel for one query) over that contiguous
                  cache with a BlockMask of the pattern's mask for the query (blocks of 128 keys), a
                  key attended by k branches weighted k times by a score_mod
  flex-paged      FlexAttention over a paged cache: torch's PagedAttention (experimental) maps the
                  same logical BlockMask onto pages of 128 tokens (its kernel's block size) in a
                  shuffled order; skipped, saying why, where the installed torch has none
  copy            a device-to-device copy of as many bytes as the pattern's attended K/V rows: the
                  memory's speed in the same run (a copy reads and writes each byte; its GB/s counts
                  each once)
  read            a reduction (the maximum of int32 words) over as many bytes as those rows: each
                  byte read once and nothing written, the read bandwidth that bounds a decode step

The method (that of bench/peers.py): the same seeded inputs for every system; every system's output
checked in the same run against the float64 contract (attnjit.attention on float64 CPU tensors over
each sampled request's gathered tokens at q_offset = L - 1): a mismatch marks the row WRONG; times in
interleaved rounds (A B A B ..., L2 flushed and the stream kept busy before each run, CUDA events:
the GPU's time; the host's enqueueing, attnjit's plan included, reported on its own as host_ms);
median and minimum; useful bandwidth = bytes of the distinct (kv head, token) K and V rows the
pattern attends / time (a decode step is bound by reading them). Launch-bound rows (under 20 us)
are marked and not to be quoted. DIR/decode.json and decode.md are rewritten after each case.
--sweep runs the grid batch 1, 16, 64, 256 x context 4K, 32K, 128K, 1M for dense causal and LongNet
(GQA 32:8, head dim 128, bf16), leaving out shapes of more than 2^22 cached tokens (their caches and
the peers' copies would pass 48 GB).
"""
import argparse
import fnmatch
import json
import os
import random
import statistics
import sys
import time

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnjit  # noqa: E402
from attnjit import serving  # noqa: E402
from peers_timing import gpu_state, interleaved, sync  # noqa: E402  (bench/, beside this script)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example(name):
    with open(os.path.join(REPO, "examples", name), encoding="utf-8") as f:
        return json.load(f)


DENSE_CAUSAL = {"attnjit": 1, "description": "dense causal", "causal": True, "branches": [{"segment": "full"}]}


def gpu_cases():
    """(name, pattern, batch, kv_len, Hq, Hkv, D, window or None: the peer's slice)."""
    return [
        dict(name="dense-b32-l8192", pattern=DENSE_CAUSAL, B=32, L=8192, Hq=32, Hkv=8, D=128, window=None),
        dict(name="dense-b8-l65536", pattern=DENSE_CAUSAL, B=8, L=65536, Hq=32, Hkv=8, D=128, window=None),
        dict(name="window4096-b32-l32768", pattern=_example("sliding_window.json"), B=32, L=32768, Hq=32, Hkv=8, D=128,
             window=4096),
        dict(name="longnet-b16-l32768", pattern=_example("longnet.json"), B=16, L=32768, Hq=16, Hkv=16, D=128, window=None),
        # FP8 e4m3 caches (per-head scales): half the bytes of the bf16 row above it; ours alone
        dict(name="dense-b32-l8192-fp8", pattern=DENSE_CAUSAL, B=32, L=8192, Hq=32, Hkv=8, D=128, window=None, fp8=True),
    ]


MAX_SWEEP_TOKENS = 1 << 22


def sweep_cases():
    """Batch x context for dense causal and LongNet, GQA 32:8, head dim 128."""
    out = []
    for name, pattern in (("dense", DENSE_CAUSAL), ("longnet", _example("longnet.json"))):
        for L in (4096, 32768, 131072, 1048576):
            for B in (1, 16, 64, 256):
                if B * L <= MAX_SWEEP_TOKENS:
                    out.append(dict(name=f"{name}-b{B}-l{L}", pattern=pattern, B=B, L=L, Hq=32, Hkv=8, D=128, window=None))
    return out


def smoke_cases():
    return [
        dict(name="dense-smoke", pattern=DENSE_CAUSAL, B=3, L=150, Hq=4, Hkv=2, D=32, window=None),
        dict(name="window-smoke", pattern={**DENSE_CAUSAL, "window": [63, 0]}, B=3, L=200, Hq=4, Hkv=2, D=32, window=64),
        dict(name="longnet-smoke", pattern=_example("longnet.json"), B=2, L=2300, Hq=2, Hkv=2, D=32, window=None),
        dict(name="dense-smoke-fp8", pattern=DENSE_CAUSAL, B=3, L=150, Hq=4, Hkv=2, D=32, window=None, fp8=True),
    ]


def make_case(case, device, dtype, page_size=16, seed=0):
    """Contiguous caches [B, L, Hkv, D], the same rows in shuffled pages, the block table, one query
    per request (the request's last token)."""
    g = torch.Generator(device).manual_seed(seed)  # made where they run: the sweep's caches reach 16 GB
    B, L, Hq, Hkv, D = case["B"], case["L"], case["Hq"], case["Hkv"], case["D"]
    k = torch.randn(B, L, Hkv, D, generator=g, device=device).to(dtype)
    v = torch.randn(B, L, Hkv, D, generator=g, device=device).to(dtype)
    q = torch.randn(B, Hq, D, generator=g, device=device).to(dtype)
    per = -(-L // page_size)
    order = list(range(B * per))
    random.Random(seed).shuffle(order)
    table = torch.tensor(order, dtype=torch.int32, device=device).reshape(B, per)
    k_cache = torch.empty(B * per, page_size, Hkv, D, dtype=dtype, device=device)
    v_cache = torch.empty_like(k_cache)
    pad = per * page_size - L
    kp = torch.cat([k, k.new_zeros(B, pad, Hkv, D)], 1).reshape(B * per, page_size, Hkv, D)
    vp = torch.cat([v, v.new_zeros(B, pad, Hkv, D)], 1).reshape(B * per, page_size, Hkv, D)
    k_cache[table.reshape(-1).long()] = kp
    v_cache[table.reshape(-1).long()] = vp
    lens = [L] * B  # on the host, as a server keeps them: reading a CUDA tensor's values would synchronise
    k_scale = v_scale = None
    if case.get("fp8"):  # e4m3 codes, a scale per kv head from its largest value; k and v become what they hold
        fp8 = torch.float8_e4m3fn
        k_scale = k.float().abs().amax((0, 1, 3)) / 448
        v_scale = v.float().abs().amax((0, 1, 3)) / 448
        k_cache = (k_cache.float() / k_scale[:, None]).to(fp8)
        v_cache = (v_cache.float() / v_scale[:, None]).to(fp8)
        k = ((k.float() / k_scale[:, None]).to(fp8).float() * k_scale[:, None]).to(torch.float64)
        v = ((v.float() / v_scale[:, None]).to(fp8).float() * v_scale[:, None]).to(torch.float64)
        k_scale, v_scale = k_scale.to(device), v_scale.to(device)
    on = lambda x: x.to(device)  # noqa: E731
    if case.get("fp8"):  # the float64 values only feed the reference, on the host
        on_k = lambda x: x  # noqa: E731
    else:
        on_k = on
    return dict(q=on(q), k=on_k(k), v=on_k(v), k_cache=on(k_cache), v_cache=on(v_cache), table=on(table), lens=lens,
                lens_device=torch.tensor(lens, dtype=torch.int32, device=device), k_scale=k_scale, v_scale=v_scale)


def key_counts(case, device):
    """int [Hq, L]: how many branches attend each key from the decode query (position L - 1)."""
    p = attnjit.Pattern.from_json(case["pattern"])
    m = p.mask(1, case["Hq"], seq_k=case["L"], heads_kv=case["Hkv"], q_offset=case["L"] - 1)
    return torch.as_tensor(m[:, 0]).to(device, torch.int32)


def flex_systems(case, x, device):
    """FlexAttention's decoding over the contiguous cache and over pages (torch's PagedAttention):
    {name: fn} and {name: why it is skipped}."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        return {}, {"flex-gathered": f"no FlexAttention: {e}", "flex-paged": f"no FlexAttention: {e}"}
    B, L, Hq, Hkv, D = case["B"], case["L"], case["Hq"], case["Hkv"], case["D"]
    counts = key_counts(case, device)
    twice = bool((counts > 1).any())

    def count(h, kv):  # Flex asks for keys past L too (its blocks are padded): none attended there
        return torch.where(kv < L, counts[h, kv.clamp(0, L - 1)], 0)

    def mask_mod(b, h, q, kv):
        return count(h, kv) > 0

    def score_mod(score, b, h, q, kv):  # a key that k branches attend counts k times
        return score + torch.log(count(h, kv).clamp(min=1).to(score.dtype))
    run = flex_attention if device.type != "cuda" else torch.compile(flex_attention, dynamic=False)
    block = 128
    logical = create_block_mask(mask_mod, None, Hq, 1, L, device=device, BLOCK_SIZE=block)
    kt = x["k"].transpose(1, 2).contiguous()
    vt = x["v"].transpose(1, 2).contiguous()
    sm = score_mod if twice else None
    out, skipped = {}, {}

    def gathered():
        return run(x["q"][:, :, None], kt, vt, score_mod=sm, block_mask=logical, enable_gqa=True)[:, :, 0]
    out["flex-gathered"] = gathered
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
    except ImportError as e:
        skipped["flex-paged"] = f"no torch PagedAttention: {e}"
        return out, skipped
    per = -(-L // block)
    pages = B * per
    order = list(range(pages))
    random.Random(1).shuffle(order)
    table = torch.tensor(order, dtype=torch.int64, device=device).reshape(B, per)
    paged = PagedAttention(pages, block, B, device=str(device))
    paged.page_table[:, :per] = table  # the pages set directly (reserve() reads values on the host)
    for b in range(B):
        paged.physical_to_logical[b, table[b]] = torch.arange(per, device=device)
    paged.capacity[:] = per * block
    # Flex's paged layout [1, Hkv, pages x 128, D], rows written through the table.
    kf = torch.zeros(1, Hkv, pages * block, D, dtype=kt.dtype, device=device)
    vf = torch.zeros_like(kf)
    slots = (table[:, :, None] * block + torch.arange(block, device=device)).reshape(B, -1)[:, :L]
    for b in range(B):
        kf[0, :, slots[b]] = kt[b]
        vf[0, :, slots[b]] = vt[b]
    physical = paged.convert_logical_block_mask(
        create_block_mask(mask_mod, B, Hq, 1, L, device=device, BLOCK_SIZE=block))
    psm = paged.get_score_mod(sm) if twice else None

    def flex_paged():  # one cache for the batch (its batch dimension 1), the pages its mask maps
        return run(x["q"][:, :, None], kf, vf, score_mod=psm, block_mask=physical, enable_gqa=True)[:, :, 0]
    out["flex-paged"] = flex_paged
    return out, skipped


def systems(case, x, with_flex=True):
    pattern, L, W = case["pattern"], case["L"], case["window"]

    def ours():
        return serving.paged_attention(x["q"], x["k_cache"], x["v_cache"], x["table"], x["lens"], pattern,
                                       k_scale=x["k_scale"], v_scale=x["v_scale"])

    # The contiguous layout a user without a paged kernel keeps, heads first for SDPA.
    kt = x["k"].transpose(1, 2).contiguous()
    vt = x["v"].transpose(1, 2).contiguous()

    def sdpa():
        k, v = (kt, vt) if W is None else (kt[:, :, L - W:], vt[:, :, L - W:])
        o = F.scaled_dot_product_attention(x["q"][:, :, None], k, v, enable_gqa=True)
        return o[:, :, 0]

    def ours_device_plan():
        return serving.paged_attention(x["q"], x["k_cache"], x["v_cache"], x["table"], x["lens_device"], pattern,
                                       k_scale=x["k_scale"], v_scale=x["v_scale"], plan_on_device=True)

    out, skipped = {"ours": ours, "ours-device-plan": ours_device_plan}, {}
    if case.get("fp8"):
        return out, skipped
    # SDPA has no dilated or block-sparse mask: LongNet's decode has no such peer.
    if "segment" in pattern["branches"][0] and pattern["branches"][0]["segment"] == "full" and len(pattern["branches"]) == 1:
        out["sdpa-contiguous"] = sdpa
    if not with_flex:
        return out, skipped
    try:
        flex, why = flex_systems(case, x, x["q"].device)
        out.update(flex)
        skipped.update(why)
    except Exception as e:  # noqa: BLE001  (a peer that cannot be set up is reported, not fatal)
        skipped["flex"] = f"{type(e).__name__}: {e}"
    return out, skipped


def copy_baseline(nbytes, device):
    """A device-to-device copy of `nbytes`: the memory's speed beside the systems."""
    src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def read_baseline(nbytes, device):
    """A reduction over `nbytes` (int32 words): each byte read once, nothing written back."""
    src = torch.zeros((max(nbytes, 4) + 3) // 4, dtype=torch.int32, device=device)
    return lambda: torch.amax(src)


BASELINES = {"copy": (copy_baseline, "baseline: a copy of the attended bytes"),
             "read": (read_baseline, "baseline: one read of the attended bytes")}


def reference(case, x, requests):
    """The float64 contract for the sampled requests' queries: [len(requests), Hq, D]."""
    out = []
    for b in requests:
        q = x["q"][b].to("cpu", torch.float64)[None, None]
        k = x["k"][b].to("cpu", torch.float64)[None]
        v = x["v"][b].to("cpu", torch.float64)[None]
        out.append(attnjit.attention(q, k, v, case["pattern"], q_offset=case["L"] - 1)[0, 0])
    return torch.stack(out)


def attended_bytes(case, elem_bytes):
    """Bytes of the distinct (kv head, token) K and V rows the last query of each request attends."""
    p = attnjit.Pattern.from_json(case["pattern"])
    L, Hq, Hkv, D = case["L"], case["Hq"], case["Hkv"], case["D"]
    rows = 0
    mask = p.mask(1, Hq, seq_k=L, heads_kv=Hkv, q_offset=L - 1)  # [Hq, 1, L]
    group = Hq // Hkv
    for h in range(Hkv):
        rows += int(mask[h * group:(h + 1) * group, 0].any(0).sum())
    return case["B"] * rows * 2 * D * elem_bytes


def run_case(case, args, device, dtype, tol, out):
    rec = {"case": {k: v for k, v in case.items() if k != "pattern"}, "description": case["pattern"].get("description", ""),
           "clocks": {"start": gpu_state(device)}, "systems": {}}
    x = make_case(case, device, dtype)
    sample = sorted({0, case["B"] - 1, case["B"] // 2})
    want = reference(case, x, sample)
    globs = [g.strip() for g in (args.systems or "*").split(",") if g.strip()]
    wanted = lambda name: any(fnmatch.fnmatch(name, g) for g in globs)  # noqa: E731
    # Only the systems asked for (the baselines run always); Flex not even set up.
    fns, skipped = systems(case, x, with_flex=wanted("flex-gathered") or wanted("flex-paged"))
    fns = {k: f for k, f in fns.items() if wanted(k)}
    nbytes = attended_bytes(case, 1 if case.get("fp8") else torch.tensor([], dtype=dtype).element_size())
    rec["attended_bytes"] = nbytes
    rec["skipped"] = skipped
    for name, why in skipped.items():
        print(f"{case['name']}: {name} skipped: {why}", flush=True)
    for name, fn in fns.items():
        got = fn()
        sync(device)
        err = (got[sample].to("cpu", torch.float64) - want).abs().max().item()
        rec["systems"][name] = {"max_err": err, "wrong": not err <= tol}
    for name, (make, _) in BASELINES.items():
        fns[name] = make(nbytes, device)
        rec["systems"][name] = {"max_err": 0.0, "wrong": False, "baseline": True}
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if device.type == "cuda" else None
    host = {}
    deadline = time.time() + args.budget if args.budget else None
    times, errors = interleaved(list(fns.items()), device, args.runs, 3, flush, deadline, host_times=host)
    for name in fns:
        s = rec["systems"][name]
        if name in errors:
            s["error"] = f"{type(errors[name]).__name__}: {errors[name]}"
            continue
        t = times[name]
        med, lo = statistics.median(t), min(t)
        s.update({"times_ms": [round(v, 4) for v in t], "median_ms": med, "min_ms": lo,
                  "host_ms": statistics.median(host[name]) if host.get(name) else None,
                  "gb_s": nbytes / (med * 1e-3) / 1e9, "gb_s_at_min": nbytes / (lo * 1e-3) / 1e9,
                  "launch_bound": med < 0.02})
    rec["clocks"]["end"] = gpu_state(device)
    out.append(rec)
    return rec


def write(out, dirname, meta):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "decode.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "cases": out}, f, indent=1)
    lines = [f"# Decode, one query per request ({meta['device']}, {meta['dtype']})", "",
             f"Command: `{meta['command']}`", "",
             "| case | system | median ms (min) | host ms | useful GB/s (at min) | max error | |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for rec in out:
        c = rec["case"]
        for name, s in rec["systems"].items():
            if "median_ms" not in s:
                lines.append(f"| {c['name']} | {name} | {s.get('error', 'not run')} | | | {s['max_err']:.2e} | |")
                continue
            flags = ("WRONG " if s["wrong"] else "") + ("launch-bound, not quoted" if s["launch_bound"] else "")
            if s.get("baseline"):
                flags = BASELINES[name][1] + (", launch-bound" if s["launch_bound"] else "")
            lines.append(f"| {c['name']} | {name} | {s['median_ms']:.4f} ({s['min_ms']:.4f}) | "
                         f"{s['host_ms']:.3f} | {s['gb_s']:.0f} ({s['gb_s_at_min']:.0f}) | {s['max_err']:.2e} | {flags} |")
        for name, why in rec.get("skipped", {}).items():
            lines.append(f"| {c['name']} | {name} | skipped: {why} | | | | |")
    with open(os.path.join(dirname, "decode.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def smoke(args):
    """The CPU, tiny shapes: every system's output against the contract, the table written; a
    deliberately wrong system must come out WRONG."""
    os.environ.setdefault("ATTNJIT_CPU_DEVICE", "emu")
    ok = True
    out = []
    args.runs, args.budget, args.systems = 3, None, None
    for case in smoke_cases():
        rec = run_case(case, args, torch.device("cpu"), torch.float32, 2e-4, out)
        for name, s in rec["systems"].items():
            good = not s["wrong"] and "median_ms" in s
            what = "timed (a baseline, no output to check)" if s.get("baseline") else f"max error {s['max_err']:.2e}"
            print(f"{'ok  ' if good else 'FAIL'} {case['name']} {name}: {what}", flush=True)
            ok &= good
        # Every system of the GPU run took part (FlexAttention's too, eager on the CPU), or the case
        # says why not (FP8 caches: ours alone).
        want = {"ours", "ours-device-plan", *BASELINES} | (set() if case.get("fp8") else {"flex-gathered", "flex-paged"})
        missing = want - set(rec["systems"])
        if missing:
            print(f"FAIL {case['name']}: {sorted(missing)} did not run ({rec.get('skipped')})", flush=True)
            ok = False
    # A system one position late must be caught.
    case = smoke_cases()[1]
    x = make_case(case, torch.device("cpu"), torch.float32)
    late = serving.paged_attention(x["q"], x["k_cache"], x["v_cache"], x["table"], [n - 1 for n in x["lens"]], case["pattern"])
    err = (late - reference(case, x, list(range(case["B"])))).abs().max().item()
    caught = not err <= 2e-4
    print(f"{'ok  ' if caught else 'FAIL'} a system one position late is WRONG (max error {err:.2e})", flush=True)
    ok &= caught
    if args.out:
        write(out, args.out, {"device": "cpu (smoke)", "dtype": "float32", "command": " ".join(sys.argv)})
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--budget", type=float, default=120, help="seconds of timed rounds per case (at least 3 rounds)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--cases", help="comma-separated globs of case names")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="the batch x context grid (sweep_cases) instead of the short list")
    ap.add_argument("--systems", help="comma-separated globs of system names (default: all; the baselines run always)")
    ap.add_argument("--keep-cache", action="store_true", help="(accepted for bench/peers.py's argument parsing)")
    args = ap.parse_args()
    if args.smoke:
        return smoke(args)
    if not args.out:
        ap.error("--out DIR is required (or --smoke)")
    if not torch.cuda.is_available():
        print("no CUDA device: the benchmark needs a GPU (run --smoke on the CPU)", file=sys.stderr)
        return 77
    cases = sweep_cases() if args.sweep else gpu_cases()
    if args.cases:
        globs = [g.strip() for g in args.cases.split(",") if g.strip()]
        cases = [c for c in cases if any(fnmatch.fnmatch(c["name"], g) for g in globs)]
    device = torch.device("cuda")
    meta = {"device": torch.cuda.get_device_name(device), "dtype": "bfloat16", "command": " ".join(sys.argv),
            "torch": torch.__version__}
    out = []
    for case in cases:
        try:
            rec = run_case(case, args, device, torch.bfloat16, 2e-2, out)
            for name, s in rec["systems"].items():
                print(f"{case['name']:24s} {name:16s} {s.get('median_ms', float('nan')):.4f} ms  "
                      f"{s.get('gb_s', float('nan')):.0f} GB/s  err {s['max_err']:.1e}{'  WRONG' if s['wrong'] else ''}", flush=True)
        except Exception as e:  # noqa: BLE001
            out.append({"case": {"name": case["name"]}, "error": f"{type(e).__name__}: {e}", "systems": {}})
            print(f"{case['name']}: {type(e).__name__}: {e}", flush=True)
        write(out, args.out, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
