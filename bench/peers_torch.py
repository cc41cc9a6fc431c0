"""The peers of bench/peers.py, in PyTorch: the attention contract (docs/spec.md, "What it means") read
from a spec, a PyTorch implementation of it as dilated-attention-pytorch computes it (gather each branch,
flash attention, merge by LSE; exact gradients), FlexAttention's masks for the same patterns, and
an fp64 reference on sampled rows from attnjit's own mask. Imported by bench/peers.py after it has
pointed the kernel caches where it wants them."""
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention


# ---------------------------------------------------------------------------------------------
# The pattern, read as docs/spec.md's "What it means" defines it.

def dilated_terms(spec, H):
    """[(segment, dilation, off)] per branch: off[h] is the residue head h selects, -1 where the branch
    does not apply to h. Offsets: head_mod h % r, head_block h*r // H, torchscale h // ceil(H / r), group branch % r, or the integer
    (default head_mod under softmax, group under head_groups); head_groups: group g runs branch g only."""
    branches = spec["branches"]
    for key, none in (("causal", False), ("window", [-1, -1]), ("layout", None)):
        if any(x.get(key, none) != none for x in [spec, *branches]):
            raise NotImplementedError(f"the PyTorch and Flex dilated implementations here take no '{key}'")
    groups = spec.get("combine", "softmax") == "head_groups"
    group_of = head_groups(len(branches), H) if groups else None
    terms = []
    for b, br in enumerate(branches):
        r = int(br.get("dilation", 1))
        rule = br.get("offset", "group" if groups else "head_mod")
        off = []
        for h in range(H):
            applies = group_of[h] == b if groups else h in br.get("heads", range(H))
            if not applies:
                off.append(-1)
            else:
                off.append({"head_mod": h % r, "head_block": h * r // H, "torchscale": h // -(-H // r), "group": b % r}.get(rule, rule))
        terms.append((br["segment"], r, [int(o) for o in off]))
    return terms


def head_groups(k, H):
    """Group of each head: k contiguous groups, sizes floor(H/k), the first H mod k one larger."""
    sizes = [H // k + (g < H % k) for g in range(k)]
    return [g for g, n in enumerate(sizes) for _ in range(n)]


def group_divisor(spec):
    combine, scale = spec.get("combine", "softmax"), spec.get("group_scale", "mean")
    return len(spec["branches"]) if combine == "head_groups" and scale == "mean" else 1


def softmax_scale(spec, D):
    return float(spec.get("scale", 1.0 / math.sqrt(D)))


def segment_length(w, S):
    return S if w == "full" else int(w)


def mask_rows(pattern, rows, H, S):
    """uint8 [H, len(rows), S]: attnjit's own mask for a few query rows (seq_q = 1 at q_offset = row)."""
    return np.stack([pattern.mask(1, H, seq_k=S, q_offset=int(i))[:, 0] for i in rows], axis=1)


def reference_rows(q, k, v, counts, heads, rows, scale, divisor):
    """fp64 O [B, len(heads), len(rows), D] of the contract from mask counts (q, k, v [B, H, S, D]):
    each key weighted by how many branches attend it; rows that attend nothing give 0."""
    qs = q[:, heads][:, :, rows].double()
    ks, vs = k[:, heads].double(), v[:, heads].double()
    c = torch.as_tensor(counts[heads]).to(q.device, torch.float64)
    s = (qs @ ks.transpose(-1, -2)) * scale
    s = s.masked_fill(c == 0, -math.inf)
    m = s.amax(-1, keepdim=True).clamp_min(-1e300)
    p = c * torch.exp(s - m)
    den = p.sum(-1, keepdim=True)
    return torch.where(den > 0, (p @ vs) / den.clamp_min(1e-300), 0.0) / divisor


def reference_grads(q, k, v, dout, pattern, heads, rows, scale, divisor, chunk_elems=2**27, keys=True, counts_fn=None):
    """fp64 (dQ, dK, dV) of the contract, each [B, len(heads), len(rows), D] (q, k, v, dout [B, H, S, D]):
    dQ of the sampled query rows (from attnjit's mask of those rows), dK and dV of the same positions
    taken as key rows. dK and dV need every query row's probabilities: one pass over all query rows of
    the sampled heads, in chunks; counts_fn(start, n) gives the chunk's counts [len(heads), n, S]
    (default attnjit's `Pattern.mask` at q_offset, exact but slow at long S: bench/peers.py passes a
    PyTorch count function that --smoke checks equal to it). keys=False skips the pass (dK, dV None).
    Rows that attend nothing contribute nothing."""
    H, S = q.shape[1], q.shape[2]
    dev = q.device
    k64, v64 = k[:, heads].double(), v[:, heads].double()
    do64 = dout[:, heads].double() / divisor

    def probs(q_rows, c):
        c = torch.as_tensor(c).to(dev, torch.float64)
        s = (q_rows @ k64.transpose(-1, -2)) * scale
        s = s.masked_fill(c == 0, -math.inf)
        m = s.amax(-1, keepdim=True).clamp_min(-1e300)
        p = c * torch.exp(s - m)
        den = p.sum(-1, keepdim=True)
        return torch.where(den > 0, p / den.clamp_min(1e-300), 0.0)

    def dscores(p, do_rows):
        dp = do_rows @ v64.transpose(-1, -2)
        o = p @ v64
        return p * (dp - (do_rows * o).sum(-1, keepdim=True))

    qr, dor = q[:, heads][:, :, rows].double(), do64[:, :, rows]
    p = probs(qr, mask_rows(pattern, rows, H, S)[heads])
    dq = (dscores(p, dor) @ k64) * scale
    if not keys:
        return dq, None, None
    dk = torch.zeros(q.shape[0], len(heads), len(rows), q.shape[3], dtype=torch.float64, device=dev)
    dv = torch.zeros_like(dk)
    if counts_fn is None:
        def counts_fn(start, n):
            return pattern.mask(n, H, seq_k=S, q_offset=start)[heads]
    step = max(1, chunk_elems // (len(heads) * S))
    for start in range(0, S, step):
        n = min(step, S - start)
        qc, doc = q[:, heads, start:start + n].double(), do64[:, :, start:start + n]
        p = probs(qc, counts_fn(start, n))
        ds = dscores(p, doc)
        dk += ds[..., rows].transpose(-1, -2) @ qc * scale
        dv += p[..., rows].transpose(-1, -2) @ doc
    return dq, dk, dv


def max_err(x, ref):
    """max |x - ref| / (1 + |ref|), in fp64."""
    x, ref = x.double(), ref.double()
    return ((x - ref).abs() / (1 + ref.abs())).max().item() if ref.numel() else 0.0


# ---------------------------------------------------------------------------------------------
# torch-dilated: the contract in PyTorch (gather, flash, LSE merge), with an exact backward.

# The CUDA flash ops take any non-CPU tensor here, so --smoke runs their argument plumbing on meta tensors.
def _flash_fwd(q, k, v, scale):
    if q.device.type != "cpu":
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
        return r[0], r[1], tuple(r[2:8])
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)
    return o, lse, ()


def _flash_bwd(do, q, k, v, o, lse, extra, scale):
    if q.device.type != "cpu":
        cum_q, cum_k, max_q, max_k, seed, offset = extra
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            do, q, k, v, o, lse, cum_q, cum_k, max_q, max_k, 0.0, False, seed, offset, scale=scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, False,
                                                                               scale=scale)


def dilated_pieces(terms, H, S, device):
    """One piece per (branch, offset): the heads that select that residue and, per run of equal-length
    segments (the whole ones, then the shorter last one), the selected rows [nseg, n]."""
    pieces = []
    for w, r, off in terms:
        w = segment_length(w, S)
        nfull, rem = divmod(S, w)
        for o in sorted(set(off) - {-1}):
            heads = torch.tensor([h for h in range(H) if off[h] == o], device=device)
            n, n_tail = len(range(o, w, r)), len(range(o, rem, r))
            if nfull and n:
                rows = torch.arange(nfull, device=device)[:, None] * w + o + r * torch.arange(n, device=device)
                pieces.append((heads, rows))
            if n_tail:
                pieces.append((heads, nfull * w + o + r * torch.arange(n_tail, device=device)[None, :]))
    return pieces


def _gather(x, heads, rows):
    """[B, H, S, ...] -> [B * nseg, len(heads), n, ...]: one batch entry per segment."""
    B, nseg, n = x.shape[0], rows.shape[0], rows.shape[1]
    g = x[:, heads[:, None], rows.reshape(1, -1)]
    return g.view(B, len(heads), nseg, n, *x.shape[3:]).transpose(1, 2).reshape(B * nseg, len(heads), n, *x.shape[3:])


def _ungather(y, B):
    """Inverse of _gather's reshaping: [B * nseg, h, n, ...] -> [B, h, nseg * n, ...]."""
    return y.view(B, -1, *y.shape[1:]).transpose(1, 2).flatten(2, 3)


class DilatedSDPA(torch.autograd.Function):
    """Every piece by the flash kernel on its gathered rows, merged into one softmax by the LSEs.

    Backward: each piece's flash backward given the *merged* O and LSE. With the merged LSE the kernel
    recomputes the merged probabilities, with the merged O its row term D = rowsum(dO * O), so the sum
    over pieces is the exact gradient of the single softmax (the ring-attention identity). Autograd
    through the flash op alone would not do: its LSE output has no derivative."""

    @staticmethod
    def forward(ctx, q, k, v, pieces, scale):
        B = q.shape[0]
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        o = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full(q.shape[:3], -math.inf, dtype=acc, device=q.device)
        extras = []
        for heads, rows in pieces:
            at = (slice(None), heads[:, None], rows.reshape(1, -1))
            op, lp, extra = _flash_fwd(_gather(q, heads, rows), _gather(k, heads, rows), _gather(v, heads, rows), scale)
            extras.append((extra, lp.shape))
            lp = _ungather(lp[..., :rows.shape[1]].to(acc), B)
            old = lse[at]
            new = torch.logaddexp(old, lp)
            o[at] = o[at] * torch.exp(old - new)[..., None] + _ungather(op.to(acc), B) * torch.exp(lp - new)[..., None]
            lse[at] = new
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.pieces, ctx.extras, ctx.scale = pieces, extras, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        acc = lse.dtype
        grads = [torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v)]
        for (heads, rows), (extra, lse_shape) in zip(ctx.pieces, ctx.extras):
            at = (slice(None), heads[:, None], rows.reshape(1, -1))
            lp = _gather(lse[..., None], heads, rows)[..., 0]
            if lp.shape != lse_shape:  # the kernel's LSE may be padded past the rows
                lp = F.pad(lp, (0, lse_shape[-1] - lp.shape[-1]))
            parts = _flash_bwd(_gather(dout, heads, rows), _gather(q, heads, rows), _gather(k, heads, rows),
                               _gather(v, heads, rows), _gather(out, heads, rows), lp.contiguous(),
                               extra, ctx.scale)
            for g, part in zip(grads, parts):
                g[at] += _ungather(part.to(acc), q.shape[0])
        return grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype), None, None


def torch_dilated(spec, H, S, D, device):
    """fwd(q, k, v) on [B, H, S, D] tensors."""
    pieces = dilated_pieces(dilated_terms(spec, H), H, S, device)
    scale, divisor = softmax_scale(spec, D), group_divisor(spec)

    def fwd(q, k, v):
        o = DilatedSDPA.apply(q, k, v, pieces, scale)
        return o / divisor if divisor != 1 else o
    return fwd


# ---------------------------------------------------------------------------------------------
# torch-longnet: the contract as a user who read torchscale would write it: per branch, one strided
# view over every segment and head (head h takes its dilation residue), one flash call per branch
# over all segments and heads, the branches merged by their LSEs in one softmax; exact gradients.

class _Branch:
    """One branch on the heads h0..h1-1 (a contiguous range: head_groups and head lists that are
    ranges), over segments of w rows (S a multiple of w), dilation r. A segment that r does not
    divide is padded with zero rows to n * r (n = ceil(w / r)); a padded key scores exactly 0, so
    the forward takes it back out of the LSE (Z_real = exp(lse) - padded keys) and rescales O; in
    the backward a zero key adds nothing to dQ and its dK, dV rows are dropped."""

    def __init__(self, w, r, off, S, device):
        heads = [h for h, o in enumerate(off) if o >= 0]
        if heads != list(range(heads[0], heads[-1] + 1)):
            raise NotImplementedError(f"torch-longnet batches a branch over a contiguous head range, not {heads}")
        w = segment_length(w, S)
        if S % w:
            raise NotImplementedError(f"torch-longnet needs S a multiple of every segment ({S} % {w})")
        self.h0, self.h1, self.w, self.r, self.nseg = heads[0], heads[-1] + 1, w, r, S // w
        self.n = -(-w // r)
        self.pad = self.n * r - w
        offs = [off[h] for h in heads]
        if max(offs) >= r:
            raise NotImplementedError(f"offset {max(offs)} >= dilation {r}")
        self.off = torch.tensor(offs, device=device)
        # padded key rows a head's residue selects in each segment: 0 or 1
        self.padded = torch.tensor([float(o + r * (self.n - 1) >= w) for o in offs], device=device)
        self.direct = r == 1 and self.nseg == 1

    def _index(self, B, D):
        return self.off.view(1, 1, -1, 1, 1, 1).expand(B, self.nseg, self.h1 - self.h0, self.n, 1, D)

    def gather(self, x):
        """[B, H, S, D] -> [B * nseg, Hb, n, D] (a copy unless the branch is the whole sequence)."""
        B, D, Hb = x.shape[0], x.shape[-1], self.h1 - self.h0
        x = x[:, self.h0:self.h1]
        if self.direct:
            return x
        x = x.reshape(B, Hb, self.nseg, self.w, D)
        if self.r == 1:
            return x.transpose(1, 2).reshape(B * self.nseg, Hb, self.w, D)
        if self.pad:
            x = F.pad(x, (0, 0, 0, self.pad))
        x = x.view(B, Hb, self.nseg, self.n, self.r, D).permute(0, 2, 1, 3, 4, 5)
        return torch.gather(x, 4, self._index(B, D)).view(B * self.nseg, Hb, self.n, D)

    def scatter(self, y, fill):
        """Inverse of gather: [B * nseg, Hb, n, D] -> [B, Hb, S, D], `fill` where the branch has no row."""
        if self.direct:
            return y
        Hb, D = self.h1 - self.h0, y.shape[-1]
        B = y.shape[0] // self.nseg
        if self.r == 1:
            return y.view(B, self.nseg, Hb, self.w, D).transpose(1, 2).reshape(B, Hb, self.nseg * self.w, D)
        full = torch.full((B, Hb, self.nseg, self.n * self.r, D), fill, dtype=y.dtype, device=y.device)
        view = full.view(B, Hb, self.nseg, self.n, self.r, D).permute(0, 2, 1, 3, 4, 5)
        view.scatter_(4, self._index(B, D), y.view(B, self.nseg, Hb, self.n, 1, D))
        return full[:, :, :, :self.w].reshape(B, Hb, self.nseg * self.w, D)


class LongNetSDPA(torch.autograd.Function):
    """One flash call per branch over all its segments and heads, merged by LSE (as DilatedSDPA,
    whose backward identity this shares: each branch's flash backward given the merged O and LSE)."""

    @staticmethod
    def forward(ctx, q, k, v, branches, scale):
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        o = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full(q.shape[:3], -math.inf, dtype=acc, device=q.device)
        extras = []
        for br in branches:
            op, lp, extra = _flash_fwd(br.gather(q), br.gather(k), br.gather(v), scale)
            extras.append((extra, lp.shape))
            lp = lp[..., :op.shape[2]].to(acc)
            if br.pad:  # the zero keys' exp(0) = 1 each out of the denominator
                real = lp + torch.log1p(-br.padded.to(acc).view(1, -1, 1) * torch.exp(-lp))
                op = op.to(acc) * torch.exp(lp - real)[..., None]
                lp = real
            ob = br.scatter(op.to(acc), 0.0)
            lb = br.scatter(lp[..., None], -math.inf)[..., 0]
            hs = slice(br.h0, br.h1)
            old = lse[:, hs]
            new = torch.logaddexp(old, lb)
            o[:, hs] = (o[:, hs] * torch.exp(old - new).nan_to_num(0.0)[..., None]
                        + ob * torch.exp(lb - new).nan_to_num(0.0)[..., None])
            lse[:, hs] = new
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.branches, ctx.extras, ctx.scale = branches, extras, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        acc = lse.dtype
        grads = [torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v)]
        lse0 = torch.where(torch.isinf(lse), 0.0, lse)  # rows a branch does not reach: any finite value
        for br, (extra, lse_shape) in zip(ctx.branches, ctx.extras):
            lp = br.gather(lse0[..., None])[..., 0]
            if lp.shape != lse_shape:
                lp = F.pad(lp, (0, lse_shape[-1] - lp.shape[-1]))
            parts = _flash_bwd(br.gather(dout), br.gather(q), br.gather(k), br.gather(v), br.gather(out),
                               lp.contiguous(), extra, ctx.scale)
            for g, part in zip(grads, parts):
                g[:, br.h0:br.h1] += br.scatter(part.to(acc), 0.0)
        return grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype), None, None


def torch_longnet(spec, H, S, D, device):
    """fwd(q, k, v) on [B, H, S, D] tensors: the batched-per-branch PyTorch LongNet (LongNetSDPA).
    Raises NotImplementedError for what it does not batch (a head list that is no range, a sequence
    that is no multiple of a segment)."""
    branches = [_Branch(w, r, off, S, device) for w, r, off in dilated_terms(spec, H) if max(off) >= 0]
    scale, divisor = softmax_scale(spec, D), group_divisor(spec)

    def fwd(q, k, v):
        o = LongNetSDPA.apply(q, k, v, branches, scale)
        return o / divisor if divisor != 1 else o
    return fwd


# ---------------------------------------------------------------------------------------------
# FlexAttention: mask_mod / score_mod from the branches, BlockMasks built once.

def branch_count_fn(terms, H, S, device):
    """count(b, h, q, kv): how many branches attend (q, kv) for head h, from the indices alone."""
    terms = [(segment_length(w, S), r, torch.tensor(off, device=device)) for w, r, off in terms if max(off) >= 0]

    def count(b, h, q, kv):
        n = None
        for w, r, off in terms:
            o = off[h]
            hit = o >= 0
            if w < S:
                hit = hit & (q // w == kv // w)
            if r > 1:
                hit = hit & ((q % w) % r == o) & ((kv % w) % r == o)
            n = hit.to(torch.int32) if n is None else n + hit.to(torch.int32)
        return n
    return count


def dilated_mods(terms, H, S, device):
    """(mask_mod, score_mod): the union of the branches, and log(count) added to the score so that a
    key attended by k branches counts k times; score_mod is None where no pair counts twice."""
    count = branch_count_fn(terms, H, S, device)

    def mask_mod(b, h, q, kv):
        return count(b, h, q, kv) > 0

    def score_mod(score, b, h, q, kv):
        return score + torch.log(count(b, h, q, kv).clamp(min=1).to(score.dtype))
    overlapping = any(sum(off[h] >= 0 for _, _, off in terms) > 1 for h in range(H))
    return mask_mod, (score_mod if overlapping else None)


def dilated_block_layout(terms, H, S, block):
    """bool [H, Qb, Kb] (any pair attended, full: every pair attended), computed from the branches:
    a block pair is touched by a branch when both blocks hold selected rows of one segment; it is full
    when a dilation-1 branch holds both blocks whole inside one segment."""
    nb = -(-S // block)
    pos = np.arange(S)
    first, last = np.arange(nb) * block, np.minimum(np.arange(nb) * block + block, S) - 1
    touched, full = np.zeros((H, nb, nb), bool), np.zeros((H, nb, nb), bool)
    for w, r, off in terms:
        w = segment_length(w, S)
        seg = pos // w
        for o in set(off) - {-1}:
            heads = [h for h in range(H) if off[h] == o]
            sel = (pos % w) % r == o
            a = np.zeros((nb, seg[-1] + 1), np.float32)
            a[pos[sel] // block, seg[sel]] = 1
            touched[heads] |= (a @ a.T) > 0
            if r == 1:
                inside = seg[first] == seg[last]
                full[heads] |= inside[:, None] & inside[None, :] & (seg[first][:, None] == seg[first][None, :])
    return touched, full & touched


def layout_block_layout(pattern, spec, H, S):
    """bool [H, Qb, Kb] of a layout pattern from attnjit's mask: one query row per block row, every
    block-th key. Exact only when the mask is uniform per block (no causal/window/dilation), which is
    checked: kept blocks x block area must equal the attended pairs."""
    block = spec["layout"].get("block", 128)
    if not isinstance(block, int) or S % block:
        raise NotImplementedError(f"layout block {block} at S={S}: square blocks dividing S only")
    layout = mask_rows(pattern, range(0, S, block), H, S)[:, :, ::block] > 0
    pairs = pattern.stats(S, H)["attended_pairs"]
    if int(layout.sum()) * block * block != pairs:
        raise ValueError(f"the layout is not uniform per {block}x{block} block ({pairs} attended pairs)")
    return layout, block


def window_bounds(spec):
    """(lo, hi): a pair is kept where lo <= qpos - kpos <= hi, for a pattern of one full branch with
    the pattern-level causal and window masks alone (a sliding window); None for anything else. An
    unbounded side is 2^62 away (the spec's largest position), so the bounds stay integers."""
    if "window" not in spec or "layout" in spec or len(spec["branches"]) != 1 or spec["branches"][0] != {"segment": "full"}:
        return None
    left, right = spec["window"]
    hi = left if left >= 0 else 2 ** 62
    lo = -right if right >= 0 else -2 ** 62
    if spec.get("causal"):
        lo = max(lo, 0)
    return lo, hi


def window_block_layout(spec, H, S, block):
    """(touched, full) bool [H, Qb, Kb] of a sliding window per block: a block is touched where some
    pair in it is kept and full where every pair is (q - k spans (qb - kb) block +- (block - 1))."""
    lo, hi = window_bounds(spec)
    nb = S // block
    d = (np.arange(nb)[:, None] - np.arange(nb)[None, :]) * block
    dmin, dmax = d - (block - 1), d + (block - 1)
    touched = (dmax >= lo) & (dmin <= hi)
    full = (dmin >= lo) & (dmax <= hi)
    return np.broadcast_to(touched, (H, nb, nb)).copy(), np.broadcast_to(full, (H, nb, nb)).copy()


def _ordered(dense):
    """bool [H, Qb, Kb] -> (int32 [1, H, Qb] counts, int32 [1, H, Qb, Kb] kept key blocks first, ascending)."""
    dense = torch.as_tensor(dense)
    num = dense.sum(-1, dtype=torch.int32)
    idx = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[None].contiguous(), idx[None].contiguous()


def make_block_mask(partial, full, block, S, mask_mod, device):
    num, idx = (t.to(device) for t in _ordered(partial))
    fnum, fidx = (t.to(device) for t in _ordered(full))
    try:
        return BlockMask.from_kv_blocks(num, idx, fnum, fidx, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(S, S))
    except TypeError:  # a torch without seq_lengths
        return BlockMask.from_kv_blocks(num, idx, fnum, fidx, BLOCK_SIZE=block, mask_mod=mask_mod)


_COMPILED_FLEX = {}
# FlexAttention's autotuned mode: Inductor times its kernels' block sizes and stages when it
# compiles (minutes); no CUDA graphs, so that every system's rounds time the same kind of call.
FLEX_AUTOTUNE_MODE = "max-autotune-no-cudagraphs"


def flex_fn(device, mode=None):
    """Compiled FlexAttention on CUDA (torch.compile's default mode, or `mode`); eager on the CPU
    (--smoke: a fused CPU compile takes ~15 s)."""
    if device.type != "cuda":
        return flex_attention
    if mode not in _COMPILED_FLEX:
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 256)
        # The timed backward runs autograd.grad on one retained graph (retain_graph=True), as for
        # every system; a compiled backward that donates its saved buffers refuses that ("compiled
        # with non-empty donated buffers"). Donation only lets the backward reuse the saved
        # tensors' memory in place; it does not change the kernels that are timed.
        if hasattr(torch, "_functorch") and hasattr(torch._functorch.config, "donated_buffer"):
            torch._functorch.config.donated_buffer = False
        _COMPILED_FLEX[mode] = torch.compile(flex_attention, dynamic=False, **({"mode": mode} if mode else {}))
    return _COMPILED_FLEX[mode]


def flex_setup(case, pattern, device, block=128):
    """(block_mask, score_mod, divisor) for a case; the block mask exact per block."""
    spec, S, H = case["spec"], case["S"], case["H"]
    if window_bounds(spec) is not None:
        if S % block:
            raise NotImplementedError(f"a sliding window at S={S}: blocks of {block} dividing S only")
        lo, hi = window_bounds(spec)
        touched, full = window_block_layout(spec, H, S, block)

        def mask_mod(b, h, q, kv):
            return (q - kv >= lo) & (q - kv <= hi)
        return make_block_mask(touched & ~full, full, block, S, mask_mod, device), None, 1
    if case["family"] == "layout":
        layout, block = layout_block_layout(pattern, spec, H, S)
        lay = torch.as_tensor(layout, device=device)

        def mask_mod(b, h, q, kv):
            return lay[h, q // block, kv // block]
        return make_block_mask(np.zeros_like(layout), layout, block, S, mask_mod, device), None, 1
    terms = dilated_terms(spec, H)
    mask_mod, score_mod = dilated_mods(terms, H, S, device)
    touched, full = dilated_block_layout(terms, H, S, block)
    return make_block_mask(touched & ~full, full, block, S, mask_mod, device), score_mod, group_divisor(spec)


def flex_system(case, pattern, device, block=128, mode=None):
    block_mask, score_mod, divisor = flex_setup(case, pattern, device, block)
    run, scale = flex_fn(device, mode), softmax_scale(case["spec"], case["D"])

    def fwd(q, k, v):
        o = run(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        return o / divisor if divisor != 1 else o
    return fwd


# ---------------------------------------------------------------------------------------------
# sdpa-fp8: PyTorch's own FP8 attention, where this PyTorch has one.

E4M3_MAX = 448.0


def once_per_inputs(quantise):
    """quantise(q, k, v) run once per set of inputs (the timed calls reuse the same tensors), its
    result kept until other inputs come: the FP8 systems' quantisation stays outside the timed call."""
    cache = {}

    def get(q, k, v):
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        if key not in cache:
            cache.clear()
            cache[key] = quantise(q, k, v)
        return cache[key]
    return get


def fp8_quantize(x, per):
    """x ([B, H, S, D], any float dtype) as float8_e4m3fn codes and the descales that undo them: one
    for the tensor (per="tensor", shape (1, 1, 1, 1)) or one per (batch, head) (per="head", shape
    (B, H)), each group's largest |x| mapped to e4m3's largest value, 448."""
    dims = (0, 1, 2, 3) if per == "tensor" else (2, 3)
    amax = x.float().abs().amax(dim=dims, keepdim=True).clamp(min=1e-12)
    codes = (x.float() * (E4M3_MAX / amax)).to(torch.float8_e4m3fn)
    descale = amax / E4M3_MAX
    return codes, descale.reshape(1, 1, 1, 1) if per == "tensor" else descale.reshape(x.shape[0], x.shape[1])


def sdpa_fp8(causal):
    """Forward on [B, H, S, D]: PyTorch's experimental quantized SDPA (2.11+) on e4m3 codes of q, k, v
    (quantised once per input, outside the timed call; bf16 O). cuDNN with per-tensor descales where
    this PyTorch has them (DescaleType.PER_TENSOR); else the flash backend's FlashAttention-3 with
    per-(batch, head) descales, where a provider registered it (activated for each call and
    restored after, so the sdpa-flash peer keeps PyTorch's default); else a RuntimeError naming
    what is missing."""
    try:
        from torch.nn.attention.experimental._scaled_dot_product_attention_quantized import (
            DescaleType, _scaled_dot_product_attention_quantized as quantized)
    except ImportError as e:
        raise RuntimeError(f"PyTorch {torch.__version__} has no quantized SDPA "
                           f"(torch.nn.attention.experimental, 2.11 and later): {e}") from None
    import torch.nn.attention as attention
    if hasattr(DescaleType, "PER_TENSOR"):
        per, kind, fa3 = "tensor", DescaleType.PER_TENSOR, False
    elif "FA3" in getattr(attention, "list_flash_attention_impls", lambda: [])():
        per, kind, fa3 = "head", DescaleType.PER_HEAD, True
        try:  # registered is not installed: its provider's module loads when it is activated
            attention.activate_flash_attention_impl("FA3")
            attention.restore_flash_attention_impl()
        except Exception as e:  # noqa: BLE001 -- any failure to load is the reason to report
            raise RuntimeError(f"PyTorch {torch.__version__}'s quantized SDPA has no cuDNN per-tensor descales "
                               f"(DescaleType.PER_TENSOR), and its FlashAttention-3 does not load: "
                               f"{type(e).__name__}: {e}") from None
    else:
        raise RuntimeError(f"PyTorch {torch.__version__}'s quantized SDPA has neither cuDNN's per-tensor descales "
                           "(DescaleType.PER_TENSOR) nor a registered FlashAttention-3 (list_flash_attention_impls: "
                           f"{getattr(attention, 'list_flash_attention_impls', lambda: [])()})")
    quantised = once_per_inputs(lambda q, k, v: [fp8_quantize(x, per) for x in (q, k, v)])

    def fwd(q, k, v):
        (qc, qd), (kc, kd), (vc, vd) = quantised(q, k, v)
        kw = dict(is_causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                  q_descale_type=kind, k_descale_type=kind, v_descale_type=kind)
        if not fa3:
            return quantized(qc, kc, vc, **kw)
        attention.activate_flash_attention_impl("FA3")
        try:
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return quantized(qc, kc, vc, **kw)
        finally:
            attention.restore_flash_attention_impl()
    return fwd
