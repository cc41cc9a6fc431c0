#!/usr/bin/env python3
"""Cross-check the attnjit CLI (`attnjit mask`, `attnjit run`) against the
independent numpy reference in contract_reference.py.

  python3 tests/contract/check_cli.py --attnjit build/attnjit --cases 300 --seed 1

Generates random valid specs + shapes (+ dynamic tables), writes them and float32
inputs into a temp dir, runs the tool, and compares:
  masks exactly (uint8 counts), O and LSE within 1e-5 relative + 1e-6 absolute,
  -inf LSE exactly, no NaN anywhere.
A handful of fixed hand-written cases run first. Prints `N passed, M failed` and
exits 0 only if everything passed.
"""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract_reference as ref  # noqa: E402

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


# --------------------------------------------------------------------------
# random spec generation
# --------------------------------------------------------------------------
SMALL_BLOCKS = [4, 8, 16, 32, 64, 12, 24]


class Gen:
    def __init__(self, rng, shape):
        self.rng = rng
        self.shape = shape
        self.dynamic_block = None  # effective (bq, bk) of the single dynamic node
        self.allow_dynamic = True

    def block_field(self):
        r = self.rng
        if r.random() < 0.6:
            return r.choice(SMALL_BLOCKS)
        return [r.choice(SMALL_BLOCKS), r.choice(SMALL_BLOCKS)]

    @staticmethod
    def eff(block_field, inherited):
        if block_field is None:
            return inherited
        if isinstance(block_field, list):
            return tuple(block_field)
        return (block_field, block_field)

    def n_blocks(self, blk):
        s = self.shape
        return (-(-(s["q_offset"] + s["seq_q"]) // blk[0]),
                -(-(s["k_offset"] + s["seq_k"]) // blk[1]))

    def layout(self, inherited=None, depth=0, top=True):
        """Returns a layout dict. `inherited` is the effective block of the
        parent (None at top level -> default 128 unless set)."""
        r = self.rng
        lay = {}
        # top-level layouts usually set a small block (so structure is visible),
        # sometimes rely on the 128 default; children often inherit.
        if top:
            if r.random() < 0.85:
                lay["block"] = self.block_field()
            blk = self.eff(lay.get("block"), (ref.DEFAULT_BLOCK, ref.DEFAULT_BLOCK))
        else:
            if r.random() < 0.4:
                lay["block"] = self.block_field()
            blk = self.eff(lay.get("block"), inherited)
        nq, nk = self.n_blocks(blk)
        kinds = ["local", "global", "strided", "offsets", "random", "explicit_blocks",
                 "explicit_per_head"]
        if depth < 2:
            kinds += ["union", "intersect", "union", "intersect"]
        if self.allow_dynamic and self.dynamic_block is None:
            kinds += ["dynamic", "dynamic"]
        kind = r.choice(kinds)
        if kind == "local":
            lay["local"] = r.randint(0, 3)
        elif kind == "global":
            n = max(nq, nk)
            lay["global"] = sorted(r.sample(range(n), r.randint(1, min(3, n))))
        elif kind == "strided":
            stride = r.randint(1, 4)
            lay["strided"] = {"stride": stride, "phase": r.randrange(stride)}
        elif kind == "offsets":
            lay["offsets"] = sorted(r.sample(range(-3, 4), r.randint(1, 3)))
        elif kind == "random":
            dens = r.choice([0.0, 0.25, 0.5, 0.5, 0.7, 0.9, 1.0, round(r.random(), 3)])
            seed = r.choice([0, 1, 42, r.randrange(1 << 32), r.randrange(1 << 62)])
            lay["random"] = {"density": dens, "seed": seed}
        elif kind == "explicit_blocks":
            lay["explicit"] = {"blocks": self.block_list(nq, nk)}
        elif kind == "explicit_per_head":
            lay["explicit"] = {"per_head": [self.block_list(nq, nk)
                                            for _ in range(self.shape["heads_q"])]}
        elif kind in ("union", "intersect"):
            lay[kind] = [self.layout(blk, depth + 1, top=False)
                         for _ in range(r.randint(2, 3))]
        elif kind == "dynamic":
            lay["dynamic"] = True
            self.dynamic_block = blk
        return lay

    def block_list(self, nq, nk):
        r = self.rng
        total = nq * nk
        n = r.randint(0, min(total, max(1, total // 3)))
        cells = r.sample(range(total), n)
        return [[c // nk, c % nk] for c in sorted(cells)]

    def window(self):
        r = self.rng
        return [r.choice([-1, 0, r.randint(0, 8), r.randint(0, 60)]),
                r.choice([-1, 0, r.randint(0, 8), r.randint(0, 60)])]

    def branch(self, combine, b_index, n_branches):
        r = self.rng
        Hq = self.shape["heads_q"]
        br = {}
        u = r.random()
        if u < 0.15:
            br["segment"] = "full"
            dil = r.choice([1, 1, 2, 3, 4])
        else:
            seg = r.choice([r.randint(1, 16), r.randint(4, 64), r.randint(4, 64),
                            r.randint(64, 300), 1000])
            br["segment"] = seg
            dil = r.randint(1, min(seg, 6))
        if dil != 1 or r.random() < 0.3:
            br["dilation"] = dil
        o = r.random()
        if o < 0.3:
            pass  # default rule
        elif o < 0.5:
            br["offset"] = "head_mod"
        elif o < 0.58:
            br["offset"] = "head_block"
        elif o < 0.65:
            br["offset"] = "torchscale"
        elif o < 0.8:
            br["offset"] = "group"
        else:
            br["offset"] = r.randrange(dil)
        if combine == "softmax" and r.random() < 0.25:
            br["heads"] = sorted(r.sample(range(Hq), r.randint(1, Hq)))
        if r.random() < 0.25:
            br["causal"] = r.random() < 0.6
        if r.random() < 0.2:
            br["window"] = self.window()
        if r.random() < 0.3:
            br["layout"] = self.layout()
        return br

    def spec(self):
        r = self.rng
        Hq = self.shape["heads_q"]
        spec = {"attnjit": 1}
        combine = "softmax" if r.random() < 0.6 else "head_groups"
        if combine == "head_groups" or r.random() < 0.3:
            spec["combine"] = combine
        if combine == "head_groups":
            nb = r.randint(1, min(4, Hq))
            gs = r.random()
            if gs < 0.35:
                spec["group_scale"] = "none"
            elif gs < 0.6:
                spec["group_scale"] = "mean"
        else:
            nb = r.randint(1, 4)
        if r.random() < 0.35:
            spec["causal"] = r.random() < 0.8
        if r.random() < 0.25:
            spec["window"] = self.window()
        if r.random() < 0.2:
            spec["scale"] = r.choice([0.05, 0.125, 0.3, 1.0, round(r.uniform(0.01, 0.5), 4)])
        if r.random() < 0.4:
            spec["layout"] = self.layout()
        spec["branches"] = [self.branch(combine, b, nb) for b in range(nb)]
        return spec


# Extra arguments for `attnjit run`, from --run-arg (which executor, which tile).
EXTRA_RUN_ARGS = []

def random_shape(rng):
    r = rng
    hkv = r.choice([1, 1, 2, 3, 4])
    rep = r.choice([1, 1, 2, 3]) if hkv < 4 else r.choice([1, 2])
    d = r.choice([1, 3, 8, 16, 32, 64, r.randint(1, 64)])
    dv = d if r.random() < 0.5 else r.choice([1, 5, 16, 32, 48, 64])

    def length():
        return r.choice([1, r.randint(1, 20), r.randint(1, 300), r.randint(100, 300), 256, 257])

    def offset():
        return r.choice([0, 0, r.randint(0, 300), r.randint(0, 40)])

    q_offset, k_offset = offset(), offset()
    if r.random() < 0.5 and k_offset > q_offset:
        # usual chunked-prefill / ring geometry: keys start at or before the queries
        q_offset, k_offset = k_offset, q_offset
    seq_q, seq_k = length(), length()
    if r.random() < 0.4:
        # keys cover the queries' range (self-attention over a prefix, chunked prefill)
        k_offset = r.randint(0, q_offset)
        if q_offset + seq_q - k_offset <= 300:
            seq_k = q_offset + seq_q - k_offset
    return {"batch": r.randint(1, 2), "seq_q": seq_q, "seq_k": seq_k,
            "heads_q": hkv * rep, "heads_kv": hkv, "head_dim": d, "head_dim_v": dv,
            "q_offset": q_offset, "k_offset": k_offset}


def dynamic_table(rng, shape, blk):
    nq = -(-(shape["q_offset"] + shape["seq_q"]) // blk[0])
    nk = -(-(shape["k_offset"] + shape["seq_k"]) // blk[1])
    heads = 1 if rng.random() < 0.5 else shape["heads_q"]
    ro = [0]
    ci = []
    for _ in range(heads * nq):
        if rng.random() < 0.1:
            cols = []
        else:
            cols = sorted(rng.sample(range(nk), rng.randint(0, min(nk, rng.choice([4, max(1, nk // 2)])))))
        ci += cols
        ro.append(len(ci))
    return {"heads": heads, "row_offsets": ro, "col_indices": ci}


def spec_has_dynamic(obj):
    if isinstance(obj, dict):
        if obj.get("dynamic") is True:
            return True
        return any(spec_has_dynamic(v) for v in obj.values())
    if isinstance(obj, list):
        return any(spec_has_dynamic(v) for v in obj)
    return False


def random_case(rng):
    shape = random_shape(rng)
    g = Gen(rng, shape)
    spec = g.spec()
    table = None
    # a table is given only when some branch actually uses the dynamic layout
    # (a pattern-level layout that every branch overrides is not used)
    used = [b["layout"] if "layout" in b else spec.get("layout") for b in spec["branches"]]
    if g.dynamic_block is not None and spec_has_dynamic(used):
        table = dynamic_table(rng, shape, g.dynamic_block)
    return spec, shape, table


# --------------------------------------------------------------------------
# running the tool and comparing
# --------------------------------------------------------------------------
class Failure(Exception):
    pass


def first_mismatch(bad):
    idx = np.argwhere(bad)
    return tuple(int(x) for x in idx[0]), int(len(idx))


def run_tool(cmd):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:  # e.g. the binary is being rebuilt right now
        raise Failure("could not start %s: %s" % (cmd[0], e))
    if p.returncode != 0:
        raise Failure("command failed (rc=%d): %s\nstdout: %s\nstderr: %s"
                      % (p.returncode, " ".join(cmd), p.stdout.strip(), p.stderr.strip()))
    return p


def check_case(attnjit, workdir, spec, shape, table, inputs_rng, expect_o=None,
               expect_lse=None, stats=None):
    """Returns None on success, raises Failure with a description otherwise."""
    os.makedirs(workdir, exist_ok=True)
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    dyn_args = []
    if table is not None:
        tpath = os.path.join(workdir, "table.json")
        with open(tpath, "w") as f:
            json.dump(table, f)
        dyn_args = ["--dynamic", tpath]
    s = shape
    # ---------- mask ----------
    want_mask = ref.mask_counts(spec, s["seq_q"], s["seq_k"], s["heads_q"], s["heads_kv"],
                                s["q_offset"], s["k_offset"], table)
    mpath = os.path.join(workdir, "mask.npy")
    run_tool([attnjit, "mask", spec_path, "--seq-q", str(s["seq_q"]), "--seq-k", str(s["seq_k"]),
              "--heads-q", str(s["heads_q"]), "--heads-kv", str(s["heads_kv"]),
              "--q-offset", str(s["q_offset"]), "--k-offset", str(s["k_offset"])]
             + dyn_args + ["--out", mpath])
    got_mask = np.load(mpath)
    if got_mask.dtype != np.uint8:
        raise Failure("mask dtype %s, want uint8" % got_mask.dtype)
    if got_mask.shape != want_mask.shape:
        raise Failure("mask shape %s, want %s" % (got_mask.shape, want_mask.shape))
    if stats is not None:
        stats["mask_entries"] += want_mask.size
        stats["mask_nonzero"] += int((want_mask > 0).sum())
        stats["mask_count>1"] += int((want_mask > 1).sum())
        stats["rows"] += want_mask.shape[0] * want_mask.shape[1]
        stats["empty_rows"] += int((~(want_mask > 0).any(axis=-1)).sum())
        stats["cases_all_zero"] += int(not want_mask.any())
        stats["cases_partial"] += int(want_mask.any() and not (want_mask > 0).all())
    bad = got_mask.astype(np.int64) != want_mask
    if bad.any():
        (h, i, j), n = first_mismatch(bad)
        raise Failure("MASK mismatch at [h=%d, i=%d, j=%d] (qpos=%d, kpos=%d): tool=%d ref=%d; "
                      "%d mismatching entries; tool total=%d ref total=%d"
                      % (h, i, j, s["q_offset"] + i, s["k_offset"] + j, got_mask[h, i, j],
                         want_mask[h, i, j], n, int(got_mask.astype(np.int64).sum()),
                         int(want_mask.sum())))
    # ---------- run ----------
    r = inputs_rng
    q = r.standard_normal((s["batch"], s["seq_q"], s["heads_q"], s["head_dim"])).astype(np.float32)
    k = r.standard_normal((s["batch"], s["seq_k"], s["heads_kv"], s["head_dim"])).astype(np.float32)
    v = r.standard_normal((s["batch"], s["seq_k"], s["heads_kv"], s["head_dim_v"])).astype(np.float32)
    paths = {}
    for name, arr in (("q", q), ("k", k), ("v", v)):
        paths[name] = os.path.join(workdir, name + ".npy")
        np.save(paths[name], arr)
    opath = os.path.join(workdir, "o.npy")
    lpath = os.path.join(workdir, "lse.npy")
    run_tool([attnjit, "run", spec_path, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
              "--out", opath, "--lse", lpath, "--q-offset", str(s["q_offset"]),
              "--k-offset", str(s["k_offset"])] + dyn_args + EXTRA_RUN_ARGS)
    got_o = np.load(opath)
    got_l = np.load(lpath)
    want_o, want_l = ref.attention(spec, q, k, v, s["q_offset"], s["k_offset"], table)
    for name, got, want in (("O", got_o, want_o), ("LSE", got_l, want_l)):
        if got.shape != want.shape:
            raise Failure("%s shape %s, want %s" % (name, got.shape, want.shape))
        if got.dtype != np.float32:
            raise Failure("%s dtype %s, want float32" % (name, got.dtype))
        if np.isnan(got).any():
            c, n = first_mismatch(np.isnan(got))
            raise Failure("%s has NaN at %s (%d NaNs); ref=%r" % (name, c, n, want[c]))
    for name, got, want in (("O", got_o, want_o), ("LSE", got_l, want_l),
                            ("O(expected)", got_o, expect_o), ("LSE(expected)", got_l, expect_lse)):
        if want is None:
            continue
        g64 = got.astype(np.float64)
        ninf_w = np.isneginf(want)
        ninf_g = np.isneginf(g64)
        bad = ninf_w != ninf_g
        fin = ~ninf_w & ~ninf_g
        with np.errstate(invalid="ignore"):
            bad |= fin & ~(np.abs(g64 - want) <= TOLERANCE["atol"] + TOLERANCE["rtol"] * np.abs(want))
        bad |= np.isposinf(g64) != np.isposinf(want)
        if stats is not None and fin.any():
            ratio = np.abs(g64[fin] - want[fin]) / (TOLERANCE["atol"] + TOLERANCE["rtol"] * np.abs(want[fin]))
            key = "worst_err/tol_" + name
            stats[key] = max(stats.get(key, 0.0), float(ratio.max()))
        if bad.any():
            c, n = first_mismatch(bad)
            raise Failure("%s mismatch at %s: tool=%r ref=%r (%d mismatching entries, "
                          "max abs err on finite=%g)"
                          % (name, c, float(got[c]), float(want[c]), n,
                             float(np.abs(g64[fin] - want[fin]).max()) if fin.any() else 0.0))


def features(spec, table):
    """Feature tags of one spec, for the --stats coverage summary."""
    tags = set()
    combine = spec.get("combine", "softmax")
    tags.add("combine=" + combine)
    if combine == "head_groups":
        tags.add("group_scale=" + spec.get("group_scale", "mean(default)"))
    for key in ("causal", "window", "scale", "layout"):
        if key in spec:
            tags.add("pattern." + key)
    for br in spec["branches"]:
        tags.add("segment=full" if br["segment"] == "full" else "segment=int")
        if br.get("dilation", 1) > 1:
            tags.add("dilation>1")
        off = br.get("offset", "default")
        tags.add("offset=" + ("int" if isinstance(off, int) else off))
        for key in ("heads", "causal", "window", "layout"):
            if key in br:
                tags.add("branch." + key)

    def walk(lay, depth):
        for g in ("local", "global", "strided", "offsets", "random", "dynamic"):
            if g in lay:
                tags.add("layout." + g)
        if "explicit" in lay:
            tags.add("layout.explicit." + next(iter(lay["explicit"])))
        if isinstance(lay.get("block"), list):
            tags.add("block=[bq,bk]")
        if "block" not in lay:
            tags.add("block inherited/default")
        for g in ("union", "intersect"):
            if g in lay:
                tags.add("layout." + g)
                if depth >= 1:
                    tags.add("nested union/intersect")
                for c in lay[g]:
                    walk(c, depth + 1)
    for lay in [spec.get("layout")] + [b.get("layout") for b in spec["branches"]]:
        if lay is not None:
            walk(lay, 0)
    if table is not None:
        tags.add("dynamic table heads=%s" % ("1" if table["heads"] == 1 else "Hq"))
    return tags


def describe(spec, shape, table):
    out = "spec: " + json.dumps(spec) + "\nshape: " + json.dumps(shape)
    if table is not None:
        out += "\ndynamic table: " + json.dumps(table)
    return out


# --------------------------------------------------------------------------
# fixed hand-written cases
# --------------------------------------------------------------------------
def inline_softmax(q, k, v, allowed, scale):
    """Straightforward per-(b, h, i) loop over a bool mask allowed[h, i, j]."""
    B, Sq, Hq, D = q.shape
    Hkv = k.shape[2]
    Dv = v.shape[3]
    o = np.zeros((B, Sq, Hq, Dv))
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            for i in range(Sq):
                js = np.nonzero(allowed[h, i])[0]
                if len(js) == 0:
                    continue
                s = scale * (k[b, js, kh].astype(np.float64) @ q[b, i, h].astype(np.float64))
                m = s.max()
                p = np.exp(s - m)
                o[b, i, h] = p @ v[b, js, kh].astype(np.float64) / p.sum()
                lse[b, h, i] = m + math.log(p.sum())
    return o, lse


def fixed_cases():
    """(name, spec, shape, table, expected_mask or None, expected (o, lse) fn or None)"""
    cases = []

    def shp(B, Sq, Sk, Hq, Hkv, D, Dv, qo=0, ko=0):
        return {"batch": B, "seq_q": Sq, "seq_k": Sk, "heads_q": Hq, "heads_kv": Hkv,
                "head_dim": D, "head_dim_v": Dv, "q_offset": qo, "k_offset": ko}

    # 1. plain full attention == ordinary softmax attention
    s = shp(2, 37, 53, 4, 2, 16, 8)
    cases.append(("full attention", {"attnjit": 1, "branches": [{"segment": "full"}]}, s, None,
                  lambda S: np.ones((S["heads_q"], S["seq_q"], S["seq_k"]), bool)))
    # 2. causal with offsets (prefill chunk): key kpos <= qpos
    s = shp(1, 40, 70, 2, 1, 8, 8, qo=30, ko=0)
    cases.append(("causal chunk", {"attnjit": 1, "causal": True,
                                   "branches": [{"segment": "full"}]}, s, None,
                  lambda S: np.broadcast_to(
                      (np.arange(S["k_offset"], S["k_offset"] + S["seq_k"])[None, :]
                       <= np.arange(S["q_offset"], S["q_offset"] + S["seq_q"])[:, None])[None],
                      (S["heads_q"], S["seq_q"], S["seq_k"]))))
    # 3. causal where early queries see nothing (k_offset > q_offset): -inf rows, O=0
    s = shp(1, 20, 20, 2, 2, 4, 4, qo=0, ko=10)
    cases.append(("causal empty rows", {"attnjit": 1, "causal": True,
                                        "branches": [{"segment": "full"}]}, s, None,
                  lambda S: np.broadcast_to(
                      (np.arange(10, 30)[None, :] <= np.arange(0, 20)[:, None])[None], (2, 20, 20))))
    # 4. sliding window [2, 0]
    s = shp(1, 16, 16, 1, 1, 8, 8)
    cases.append(("window", {"attnjit": 1, "window": [2, 0], "branches": [{"segment": "full"}]},
                  s, None,
                  lambda S: (lambda d: ((d >= 0) & (d <= 2))[None])(
                      np.arange(16)[:, None] - np.arange(16)[None, :])))
    # 5. one branch segment 4 dilation 2 head_mod, 2 heads, hand-written mask
    s = shp(1, 8, 8, 2, 2, 4, 4)

    def seg_mask(S):
        m = np.zeros((2, 8, 8), bool)
        for h in range(2):
            for i in range(8):
                for j in range(8):
                    m[h, i, j] = (i // 4 == j // 4) and (i % 4) % 2 == h % 2 and (j % 4) % 2 == h % 2
        return m
    cases.append(("segment+dilation", {"attnjit": 1,
                                       "branches": [{"segment": 4, "dilation": 2}]}, s, None,
                  seg_mask))
    # 6. two identical branches count twice -> mask 2 everywhere, output == full attention
    s = shp(1, 9, 11, 2, 1, 8, 3)
    cases.append(("double branch", {"attnjit": 1, "branches": [{"segment": "full"},
                                                              {"segment": "full"}]}, s, None,
                  lambda S: np.full((2, 9, 11), 2)))
    # 7. head_groups with two groups over 3 heads -> sizes 2, 1; mean divides by 2
    s = shp(1, 6, 6, 3, 3, 4, 4)
    cases.append(("head_groups", {"attnjit": 1, "combine": "head_groups",
                                  "branches": [{"segment": "full"},
                                               {"segment": 3, "dilation": 1}]}, s, None,
                  lambda S: np.stack([np.ones((6, 6), bool), np.ones((6, 6), bool),
                                      (np.arange(6)[:, None] // 3 == np.arange(6)[None, :] // 3)])))
    # 8. local block layout with block 4
    s = shp(1, 16, 16, 1, 1, 4, 4)
    cases.append(("local layout", {"attnjit": 1, "layout": {"block": 4, "local": 0},
                                   "branches": [{"segment": "full"}]}, s, None,
                  lambda S: (np.arange(16)[:, None] // 4 == np.arange(16)[None, :] // 4)[None]))
    return cases


def edge_cases():
    """Hand-picked corners, checked against the reference only: (name, spec, shape)."""
    def shp(B, Sq, Sk, Hq, Hkv, D, Dv, qo=0, ko=0):
        return {"batch": B, "seq_q": Sq, "seq_k": Sk, "heads_q": Hq, "heads_kv": Hkv,
                "head_dim": D, "head_dim_v": Dv, "q_offset": qo, "k_offset": ko}
    full = {"segment": "full"}
    return [
        ("random seed 2^64-1", {"attnjit": 1, "layout": {"block": 4, "random": {
            "density": 0.5, "seed": 2 ** 64 - 1}}, "branches": [full]}, shp(1, 64, 64, 3, 1, 8, 8)),
        ("random seed > 2^63", {"attnjit": 1, "layout": {"block": 4, "random": {
            "density": 0.5, "seed": 2 ** 63 + 12345}}, "branches": [full]}, shp(1, 64, 64, 3, 1, 8, 8)),
        ("full dilation 4, one token", {"attnjit": 1, "branches": [
            {"segment": "full", "dilation": 4}]}, shp(2, 1, 1, 5, 1, 4, 4)),
        ("segment 1", {"attnjit": 1, "branches": [{"segment": 1}]}, shp(1, 7, 9, 2, 2, 4, 4, 3, 1)),
        ("window [0,0] + head_block, Hq=7 r=3", {"attnjit": 1, "window": [0, 0], "branches": [
            {"segment": 5, "dilation": 3, "offset": "head_block"}]}, shp(1, 40, 40, 7, 7, 4, 4, 2, 0)),
        ("head_groups 7 heads / 3 groups", {"attnjit": 1, "combine": "head_groups", "branches": [
            {"segment": 4, "dilation": 2}, {"segment": 8, "dilation": 4},
            {"segment": "full", "dilation": 3}]}, shp(1, 50, 50, 7, 7, 4, 4, 13, 5)),
        ("branch overrides causal; heads subset", {"attnjit": 1, "causal": True, "branches": [
            {"segment": "full", "causal": False, "window": [3, -1]},
            {"segment": 16, "heads": [1]}]}, shp(1, 30, 30, 2, 1, 4, 4, 10, 10)),
        ("nested blocks", {"attnjit": 1, "layout": {"block": [4, 8], "union": [
            {"local": 0}, {"block": 2, "intersect": [{"strided": {"stride": 3, "phase": 1}},
                                                     {"block": [6, 5], "global": [0, 3]}]}]},
            "branches": [full]}, shp(1, 60, 60, 2, 2, 4, 4, 7, 3)),
        ("default block 128 over 400 positions", {"attnjit": 1, "layout": {"offsets": [-1, 1]},
                                                  "branches": [full]}, shp(1, 150, 300, 2, 2, 4, 4, 250, 100)),
    ]


def expected_fixed(name, spec, S, allowed_fn, q, k, v):
    allowed = np.asarray(allowed_fn(S))
    scale = 1.0 / math.sqrt(S["head_dim"])
    o, lse = inline_softmax(q, k, v, allowed > 0, scale)
    if spec.get("combine") == "head_groups":
        o = o / len(spec["branches"])
    # duplicate-count branches do not change O; LSE gains log(count) when uniform
    if name == "double branch":
        lse = lse + math.log(2.0)
    return allowed, o, lse


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnjit", required=True, help="path to the attnjit binary")
    ap.add_argument("--cases", type=int, default=100, help="random cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--no-fixed", action="store_true", help="skip the hand-written cases")
    ap.add_argument("--keep-going", action="store_true",
                    help="do not stop at the first failure")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--rtol", type=float, default=TOLERANCE["rtol"], help="relative tolerance for O and LSE")
    ap.add_argument("--atol", type=float, default=TOLERANCE["atol"], help="absolute tolerance for O and LSE")
    ap.add_argument("--run-arg", action="append", default=[],
                    help="extra argument for every `attnjit run` (e.g. --run-arg=--executor --run-arg=plan)")
    ap.add_argument("--stats", action="store_true",
                    help="print a coverage summary of the random cases")
    args = ap.parse_args()

    attnjit = os.path.abspath(args.attnjit)
    EXTRA_RUN_ARGS.extend(args.run_arg)
    TOLERANCE.update(rtol=args.rtol, atol=args.atol)
    tmp = tempfile.mkdtemp(prefix="attnjit_contract_")
    passed = failed = 0
    t0 = time.time()
    try:
        if not args.no_fixed:
            for n, (name, spec, S, table, allowed_fn) in enumerate(fixed_cases()):
                irng = np.random.default_rng(1000 + n)
                # regenerate the same inputs check_case will use, for the inline expectation
                r2 = np.random.default_rng(1000 + n)
                q = r2.standard_normal((S["batch"], S["seq_q"], S["heads_q"], S["head_dim"])).astype(np.float32)
                k = r2.standard_normal((S["batch"], S["seq_k"], S["heads_kv"], S["head_dim"])).astype(np.float32)
                v = r2.standard_normal((S["batch"], S["seq_k"], S["heads_kv"], S["head_dim_v"])).astype(np.float32)
                allowed, eo, el = expected_fixed(name, spec, S, allowed_fn, q, k, v)
                try:
                    # the reference itself must agree with the hand-written expectation
                    rm = ref.mask_counts(spec, S["seq_q"], S["seq_k"], S["heads_q"], S["heads_kv"],
                                         S["q_offset"], S["k_offset"], table)
                    if not np.array_equal(rm, allowed.astype(np.int64)):
                        raise Failure("REFERENCE mask disagrees with the hand-written mask")
                    check_case(attnjit, os.path.join(tmp, "fixed%d" % n), spec, S, table, irng,
                               expect_o=eo, expect_lse=el)
                    passed += 1
                except Failure as e:
                    failed += 1
                    print("FAIL fixed case %d (%s): %s\n%s" % (n, name, e, describe(spec, S, table)))
                    if not args.keep_going:
                        break
        if not args.no_fixed and (failed == 0 or args.keep_going):
            for n, (name, spec, S) in enumerate(edge_cases()):
                try:
                    check_case(attnjit, os.path.join(tmp, "edge%d" % n), spec, S, None,
                               np.random.default_rng(2000 + n))
                    passed += 1
                except Failure as e:
                    failed += 1
                    print("FAIL edge case %d (%s): %s\n%s" % (n, name, e, describe(spec, S, None)))
                    if not args.keep_going:
                        break
        rng = random.Random(args.seed)
        stats = {"mask_entries": 0, "mask_nonzero": 0, "mask_count>1": 0, "rows": 0,
                 "empty_rows": 0, "cases_all_zero": 0, "cases_partial": 0}
        tag_counts = {}
        if failed == 0 or args.keep_going:
            for n in range(args.cases):
                spec, S, table = random_case(rng)
                irng = np.random.default_rng([args.seed, n])
                for t in features(spec, table):
                    tag_counts[t] = tag_counts.get(t, 0) + 1
                try:
                    try:
                        check_case(attnjit, os.path.join(tmp, "case%d" % n), spec, S, table,
                                   irng, stats=stats)
                    except Failure:
                        raise
                    except Exception as e:  # a bug in this checker or its reference
                        raise Failure("checker error: %r" % (e,))
                    passed += 1
                    if not args.quiet and (n + 1) % 50 == 0:
                        print("... %d random cases done (%.1fs)" % (n + 1, time.time() - t0))
                except Failure as e:
                    failed += 1
                    print("FAIL random case %d (seed %d): %s\n%s"
                          % (n, args.seed, e, describe(spec, S, table)))
                    if not args.keep_going:
                        break
    finally:
        if args.keep:
            print("temp dir kept:", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.stats and failed == 0:
        print("coverage (random cases containing each feature):")
        for t in sorted(tag_counts):
            print("  %-28s %d" % (t, tag_counts[t]))
        print("mask stats: " + ", ".join("%s=%g" % kv for kv in stats.items()))
    if not args.quiet:
        print("elapsed %.1fs" % (time.time() - t0))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
