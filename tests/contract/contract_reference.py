"""Independent dense float64 reference for the attnjit pattern contract.

Written only from the contract text (docs/spec.md and the spec-format
description in the project issue); it deliberately shares no code with the C++
implementation, so the two can cross-check each other.

Public functions:
  mask_counts(spec, seq_q, seq_k, heads_q, heads_kv=None, q_offset=0, k_offset=0,
              dynamic=None) -> uint8/int64 array [Hq, Sq, Sk]: how many times
              query i counts key j (for head_groups: 0/1 from the head's branch).
  attention(spec, q, k, v, q_offset=0, k_offset=0, dynamic=None)
              -> (O [B, Sq, Hq, Dv] float64, LSE [B, Hq, Sq] float64)
  splitmix64(z) / random_keep(...) : the documented layout hash.

Only meant for small shapes: everything is dense.
"""

import math

import numpy as np

DEFAULT_BLOCK = 128

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_M1 = _U64(0xBF58476D1CE4E5B9)
_M2 = _U64(0x94D049BB133111EB)


class SpecError(ValueError):
    pass


# --------------------------------------------------------------------------
# random layout hash
# --------------------------------------------------------------------------
def splitmix64(z):
    """Standard splitmix64 finaliser on a uint64 array (all arithmetic mod 2^64)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> _U64(30))) * _M1
        z = (z ^ (z >> _U64(27))) * _M2
        z = z ^ (z >> _U64(31))
    return z


def random_keep(seed, density, heads, n_qb, n_kb):
    """bool [heads, n_qb, n_kb]: block (h, qb, kb) kept iff u < density where
    x = seed; for v in (h, qb, kb): x = splitmix64(x ^ v); u = (x >> 11) * 2^-53."""
    h = np.arange(heads, dtype=np.uint64)[:, None, None]
    qb = np.arange(n_qb, dtype=np.uint64)[None, :, None]
    kb = np.arange(n_kb, dtype=np.uint64)[None, None, :]
    x = np.full((heads, n_qb, n_kb), int(seed) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
    x = splitmix64(x ^ h)
    x = splitmix64(x ^ qb)
    x = splitmix64(x ^ kb)
    u = (x >> _U64(11)).astype(np.float64) * (2.0 ** -53)
    return u < float(density)


# --------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------
def _block_of(layout, inherited):
    if "block" in layout:
        b = layout["block"]
        if isinstance(b, list):
            if len(b) != 2:
                raise SpecError("block must be an integer or [bq, bk]")
            return int(b[0]), int(b[1])
        return int(b), int(b)
    return inherited


_GENERATORS = ("local", "global", "strided", "offsets", "random", "explicit",
               "union", "intersect", "dynamic")


class _Ctx:
    def __init__(self, seq_q, seq_k, heads_q, q_offset, k_offset, dynamic):
        self.seq_q = seq_q
        self.seq_k = seq_k
        self.heads_q = heads_q
        self.qpos = q_offset + np.arange(seq_q, dtype=np.int64)
        self.kpos = k_offset + np.arange(seq_k, dtype=np.int64)
        self.q_end = q_offset + seq_q  # one past the last global query position
        self.k_end = k_offset + seq_k
        self.dynamic = dynamic


def layout_mask(layout, ctx, inherited_block=(DEFAULT_BLOCK, DEFAULT_BLOCK)):
    """bool array broadcastable to [Hq, Sq, Sk]."""
    bq, bk = _block_of(layout, inherited_block)
    if bq <= 0 or bk <= 0:
        raise SpecError("block sizes must be positive")
    kinds = [g for g in _GENERATORS if g in layout]
    if len(kinds) != 1:
        raise SpecError("layout needs exactly one generator, got %r" % (kinds,))
    kind = kinds[0]
    qb = ctx.qpos // bq  # [Sq]
    kb = ctx.kpos // bk  # [Sk]
    n_qb = -(-ctx.q_end // bq)  # ceil
    n_kb = -(-ctx.k_end // bk)
    Q = qb[:, None]
    K = kb[None, :]

    if kind == "local":
        m = np.abs(K - Q) <= int(layout["local"])
        return m[None]
    if kind == "global":
        g = np.asarray(layout["global"], dtype=np.int64).reshape(-1)
        m = np.isin(qb, g)[:, None] | np.isin(kb, g)[None, :]
        return m[None]
    if kind == "strided":
        st = layout["strided"]
        stride, phase = int(st["stride"]), int(st.get("phase", 0))
        m = np.broadcast_to((kb % stride == phase)[None, :], (ctx.seq_q, ctx.seq_k))
        return m[None]
    if kind == "offsets":
        offs = np.asarray(layout["offsets"], dtype=np.int64).reshape(-1)
        m = np.isin(K - Q, offs)
        return m[None]
    if kind == "random":
        r = layout["random"]
        keep = random_keep(r["seed"], r["density"], ctx.heads_q, n_qb, n_kb)
        return keep[:, qb[:, None], kb[None, :]]
    if kind == "explicit":
        e = layout["explicit"]
        if "blocks" in e:
            tab = np.zeros((1, n_qb, n_kb), dtype=bool)
            for a, b in e["blocks"]:
                tab[0, int(a), int(b)] = True
        else:
            per = e["per_head"]
            if len(per) != ctx.heads_q:
                raise SpecError("per_head needs one list per query head")
            tab = np.zeros((ctx.heads_q, n_qb, n_kb), dtype=bool)
            for h, lst in enumerate(per):
                for a, b in lst:
                    tab[h, int(a), int(b)] = True
        return tab[:, qb[:, None], kb[None, :]]
    if kind in ("union", "intersect"):
        children = layout[kind]
        if not children:
            raise SpecError("empty %s" % kind)
        acc = None
        for c in children:
            cm = np.broadcast_to(layout_mask(c, ctx, (bq, bk)),
                                 (ctx.heads_q, ctx.seq_q, ctx.seq_k))
            if acc is None:
                acc = cm.copy()
            elif kind == "union":
                acc = acc | cm
            else:
                acc = acc & cm
        return acc
    if kind == "dynamic":
        t = ctx.dynamic
        if t is None:
            raise SpecError("dynamic layout needs a run-time table")
        th = int(t["heads"])
        ro = np.asarray(t["row_offsets"], dtype=np.int64)
        ci = np.asarray(t["col_indices"], dtype=np.int64)
        if th not in (1, ctx.heads_q):
            raise SpecError("dynamic table heads must be 1 or Hq")
        if len(ro) != th * n_qb + 1:
            raise SpecError("dynamic row_offsets has %d entries, want %d"
                            % (len(ro), th * n_qb + 1))
        tab = np.zeros((th, n_qb, n_kb), dtype=bool)
        for h in range(th):
            for r in range(n_qb):
                row = h * n_qb + r
                for c in ci[ro[row]:ro[row + 1]]:
                    tab[h, r, int(c)] = True
        return tab[:, qb[:, None], kb[None, :]]
    raise SpecError("unknown layout")  # pragma: no cover


# --------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------
def _offset_per_head(rule, r, b_index, heads_q):
    h = np.arange(heads_q, dtype=np.int64)
    if isinstance(rule, bool):
        raise SpecError("bad offset")
    if isinstance(rule, int):
        if not (0 <= rule < r):
            raise SpecError("integer offset must be in [0, dilation)")
        return np.full(heads_q, rule, dtype=np.int64)
    if rule == "head_mod":
        return h % r
    if rule == "head_block":
        return (h * r) // heads_q
    if rule == "torchscale":
        return h // -(-heads_q // r)
    if rule == "group":
        return np.full(heads_q, b_index % r, dtype=np.int64)
    raise SpecError("unknown offset rule %r" % (rule,))


def _window_ok(window, qpos, kpos):
    left, right = int(window[0]), int(window[1])
    Q = qpos[:, None]
    K = kpos[None, :]
    m = np.ones((len(qpos), len(kpos)), dtype=bool)
    if left != -1:
        m &= K >= Q - left
    if right != -1:
        m &= K <= Q + right
    return m


def branch_mask(spec, b_index, ctx):
    """bool [Hq, Sq, Sk] for branch b (ignoring head_groups head assignment;
    includes the softmax `heads` subset)."""
    br = spec["branches"][b_index]
    combine = spec.get("combine", "softmax")
    Hq = ctx.heads_q
    qpos, kpos = ctx.qpos, ctx.kpos

    seg = br["segment"]
    r = int(br.get("dilation", 1))
    if seg == "full":
        segq = np.zeros_like(qpos)
        segk = np.zeros_like(kpos)
        lq, lk = qpos, kpos
    else:
        w = int(seg)
        if w <= 0:
            raise SpecError("segment must be positive")
        if not (1 <= r <= w):
            raise SpecError("need 1 <= dilation <= segment")
        segq, segk = qpos // w, kpos // w
        lq, lk = qpos - segq * w, kpos - segk * w
    if r < 1:
        raise SpecError("dilation must be >= 1")

    default_off = "group" if combine == "head_groups" else "head_mod"
    off = _offset_per_head(br.get("offset", default_off), r, b_index, Hq)  # [Hq]
    selq = (lq[None, :] % r) == off[:, None]  # [Hq, Sq]
    selk = (lk[None, :] % r) == off[:, None]  # [Hq, Sk]
    m = (segq[:, None] == segk[None, :])[None] & selq[:, :, None] & selk[:, None, :]

    causal = br.get("causal", spec.get("causal", False))
    if causal:
        m &= (kpos[None, :] <= qpos[:, None])[None]
    window = br.get("window", spec.get("window", None))
    if window is not None:
        m &= _window_ok(window, qpos, kpos)[None]
    layout = br["layout"] if "layout" in br else spec.get("layout", None)
    if layout is not None:
        m &= layout_mask(layout, ctx)

    if "heads" in br:
        if combine != "softmax":
            raise SpecError("heads is only for softmax combine")
        keep = np.zeros(Hq, dtype=bool)
        for h in br["heads"]:
            if not (0 <= int(h) < Hq):
                raise SpecError("head index out of range")
            keep[int(h)] = True
        m &= keep[:, None, None]
    return m


def head_groups(heads_q, k):
    """group index of each query head: k contiguous groups, sizes floor(Hq/k),
    the first Hq mod k one larger."""
    base, extra = divmod(heads_q, k)
    g = []
    for gi in range(k):
        g += [gi] * (base + (1 if gi < extra else 0))
    return np.asarray(g, dtype=np.int64)


def mask_counts(spec, seq_q, seq_k, heads_q, heads_kv=None, q_offset=0, k_offset=0,
                dynamic=None):
    if spec.get("attnjit") != 1:
        raise SpecError("missing or wrong attnjit version")
    branches = spec.get("branches", [])
    if len(branches) < 1:
        raise SpecError("need at least one branch")
    combine = spec.get("combine", "softmax")
    ctx = _Ctx(seq_q, seq_k, heads_q, q_offset, k_offset, dynamic)
    counts = np.zeros((heads_q, seq_q, seq_k), dtype=np.int64)
    if combine == "softmax":
        for b in range(len(branches)):
            counts += branch_mask(spec, b, ctx)
    elif combine == "head_groups":
        k = len(branches)
        if k > heads_q:
            raise SpecError("head_groups with more branches than heads")
        grp = head_groups(heads_q, k)
        for b in range(k):
            m = branch_mask(spec, b, ctx)
            counts[grp == b] = m[grp == b]
    else:
        raise SpecError("unknown combine %r" % (combine,))
    return counts


# --------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------
def attention(spec, q, k, v, q_offset=0, k_offset=0, dynamic=None):
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Sq, Hq, D = q.shape
    Bk, Sk, Hkv, Dk = k.shape
    if Bk != B or Dk != D or v.shape[:3] != (B, Sk, Hkv) or Hq % Hkv:
        raise SpecError("inconsistent shapes")
    counts = mask_counts(spec, Sq, Sk, Hq, Hkv, q_offset, k_offset, dynamic)
    scale = float(spec["scale"]) if "scale" in spec else 1.0 / math.sqrt(D)
    rep = Hq // Hkv
    kk = np.repeat(k, rep, axis=2)  # query head h reads kv head h // rep
    vv = np.repeat(v, rep, axis=2)
    s = scale * np.einsum("bqhd,bkhd->bhqk", q, kk)  # [B, Hq, Sq, Sk]
    c = counts[None].astype(np.float64)  # [1, Hq, Sq, Sk]
    has = (counts > 0).any(axis=-1)[None]  # [1, Hq, Sq]
    s_m = np.where(c > 0, s, -np.inf)
    mx = s_m.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    p = c * np.exp(np.where(c > 0, s - mx, -np.inf))
    den = p.sum(axis=-1)  # [B, Hq, Sq]
    num = np.einsum("bhqk,bkhd->bhqd", p, vv)  # [B, Hq, Sq, Dv]
    safe = np.where(den > 0, den, 1.0)
    o = np.where((den > 0)[..., None], num / safe[..., None], 0.0)
    lse = np.where(den > 0, np.log(safe) + mx[..., 0], -np.inf)
    has_b = np.broadcast_to(has, lse.shape)
    o = np.where(has_b[..., None], o, 0.0)
    lse = np.where(has_b, lse, -np.inf)
    if spec.get("combine", "softmax") == "head_groups" and spec.get("group_scale", "mean") == "mean":
        o = o / len(spec["branches"])
    return o.transpose(0, 2, 1, 3).copy(), lse


# --------------------------------------------------------------------------
# gradients (docs/backward.md), dense, from the same counts
# --------------------------------------------------------------------------
def attention_grad(spec, q, k, v, dout, q_offset=0, k_offset=0, dynamic=None):
    """dQ, dK, dV of attention() given dO: P = counts * exp(S) / sum, O = f P V; the exact
    gradient, dK/dV of a kv head summed over the query heads that read it."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    do = np.asarray(dout, dtype=np.float64)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    counts = mask_counts(spec, Sq, Sk, Hq, Hkv, q_offset, k_offset, dynamic)
    scale = float(spec["scale"]) if "scale" in spec else 1.0 / math.sqrt(D)
    f = 1.0
    if spec.get("combine", "softmax") == "head_groups" and spec.get("group_scale", "mean") == "mean":
        f = 1.0 / len(spec["branches"])
    rep = Hq // Hkv
    kk = np.repeat(k, rep, axis=2)
    vv = np.repeat(v, rep, axis=2)
    c = counts[None].astype(np.float64)
    s = scale * np.einsum("bqhd,bkhd->bhqk", q, kk)
    s_m = np.where(c > 0, s, -np.inf)
    mx = s_m.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = c * np.exp(np.where(c > 0, s - mx, -np.inf))
    den = e.sum(axis=-1, keepdims=True)
    p = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)  # [B, Hq, Sq, Sk]
    dob = do.transpose(0, 2, 1, 3)  # [B, Hq, Sq, Dv]
    dp = f * np.einsum("bhqd,bkhd->bhqk", dob, vv)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * scale
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk)
    dk_rep = np.einsum("bhqk,bqhd->bkhd", ds, q)
    dv_rep = f * np.einsum("bhqk,bhqd->bkhd", p, dob)
    dk = dk_rep.reshape(B, Sk, Hkv, rep, D).sum(axis=3)
    dv = dv_rep.reshape(B, Sk, Hkv, rep, -1).sum(axis=3)
    return dq, dk, dv
