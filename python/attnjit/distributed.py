"""attnjit.distributed: attention over a sequence sharded across the ranks of a torch.distributed
group (sequence or context parallelism), with communication that the pattern decides.

    q_l, k_l, v_l = (attnjit.distributed.shard(x, layout="zigzag") for x in (q, k, v))
    o_l = attnjit.distributed.ring_attention(q_l, k_l, v_l, pattern, layout="zigzag")
    o = attnjit.distributed.unshard(o_l, layout="zigzag")  # equals attnjit.attention(q, k, v, pattern)

Rank r of W holds its chunks of the sequence: `contiguous`, one chunk of S/W rows; `zigzag`,
chunks r and 2W-1-r of S/(2W) rows each, which gives every rank the same share of a causal mask;
or a ChunkLayout from balanced_layout(pattern, ...), which cuts the sequence into more equal chunks
and deals them out so that every rank gets the same share of the pattern's attended pairs, for any
mask (block layouts, windows, LongNet; for a causal mask with two chunks per rank it is zigzag).
Positions are global (docs/spec.md), so each step is the ordinary kernel on a chunk pair
with the chunks' global offsets, and partial results merge by their log-sum-exp in fp32.

Before the first step a CommPlan is made from the pattern, the same on every rank (`comm_plan`
prints it): for every (query rank, key rank) the chunk pairs that attend anything, the key rows,
per kv head, that they attend (compiler/plan, plan_key_rows) and the query rows that attend a key
(plan_attending_rows). A step's kernels write only those rows (ForwardOptions::rows_with_work_only)
into one scratch (O, LSE) pair, and the step merges just those rows into the running result; the
rows a rank receives are placed into a staging K/V pair that is zero elsewhere and zeroed again at
those rows after the step. So a forward step costs its rows with work, not its whole chunk. Step
s = 1..W-1 moves K/V straight from its owner r to rank r+s (mod W), as batch_isend_irecv started
ahead so the transfer overlaps the steps before (the forward: as many steps ahead as fit in the
bytes of the local K/V; the backward: a number of steps every rank shares, CommPlan.steps_ahead's
least, since its dK/dV messages interleave with the K/V ones); a rank receives only the rows it reads
(a dilated branch's selected rows, the edge of a window) and nothing when it reads none, so steps
without work cost neither compute nor bytes. Sending from the owner instead of passing chunks
along a ring moves the same bytes per step on a switched fabric (NVSwitch, InfiniBand) and lets a
skipped transfer vanish instead of travelling on to the ranks after it.

The backward uses the final O and LSE at every step, and D = rowsum(dO * O) - dlse computed once.
Each chunk pair's kernels add their gradients into fp32 accumulators at the rows with work only
(Attention::backward_add: nothing zeroed, converted or computed per row of the chunk pair): dQ
where it is computed, the dK/dV of a received chunk into one fp32 pair whose rows read go
straight back to their owner (in fp32) and are zeroed again. The sums are rounded to the inputs'
dtype once, at the end, as a single call's are.

Heavy rows: a query row that attends far more than the rest (over `heavy_rows`, 4 by default,
times the mean row's pairs: BigBird's global rows, which attend every key) would make its rank
read every other rank's K/V and compute those rows' pairs alone. Such rows are computed where
their keys are instead: before the ring, one all_to_all sends them as Q (with dO, LSE and D in
the backward) to every rank whose keys they attend; after it, each rank computes its visitors
against its own K/V and a second all_to_all returns the partial (O, LSE) in fp32, merged like a
step's, or the fp32 dQ, added (their dK/dV are the host's own). CommPlan.away names them.

Head parallelism (`head_parallel` = u, DeepSpeed-Ulysses' all_to_all inside the ring): ranks
g*u .. g*u + u - 1 form a head group (best within a node) and trade rows for heads by one
all_to_all, so each holds the group's rows for 1/u of the heads; the ring then runs over the W/u
ranks holding the same heads (head_parallel_groups), on the pattern those heads follow
(Pattern.head_slice: the offsets, per-head blocks and random blocks of the whole pattern's heads),
with the group's chunks pooled (head_parallel_layout), and the reverse all_to_all returns O. A
step computes u times the pairs for the same bytes moved, which is what a pattern whose K/V
transfers outlast its kernels (BigBird's random blocks reach every rank) needs.

strategy="longnet" is LongNet's own scheme instead (its paper, section 3.2): every rank sends each
other rank the rows it reads in one collective before any kernel, dK/dV back the same way after.

docs/scaling.md models both on 8 to 64 GPUs; bench/ring_bench.py times them. The layouts and the
comm plan live in _comm_plan.py (no torch there), the transfers in _ring_transfers.py; this module
runs the ring's kernels and merges.

Packed documents (`cu_seqlens`, batch 1): the pieces are cut at the documents' boundaries as well,
and each piece's kernels take its document's part of a key chunk with positions counted from the
document's start; a rank reads only the K/V of documents it holds rows of.

Not supported here: float64 (it runs the reference, which cannot take a partial key set) and
dynamic layouts (plain attnjit.attention has them). Tested on CPUs with gloo (world
sizes 2 and 4); NCCL uses the same calls.
"""
import hashlib
import os
import weakref

import numpy as np
import torch
import torch.distributed as dist

# The layouts and the comm plan (no torch in them), exported here. _cached_plan and _check_layout
# are used by the tests and attnjit.nn.
from ._comm_plan import (HEAVY_ROWS, LAYOUTS, ChunkLayout, CommPlan, _cached_plan, _check_layout,  # noqa: F401
                         balanced_layout, best_layout, check_documents, check_heavy_rows, chunks_of, comm_plan,
                         head_parallel_layout, heavy_runs)
from ._head_parallel import HeadExchange, head_parallel_groups, head_slices  # noqa: F401
from ._inputs import check_shapes
from ._pattern import as_pattern
from ._ring_transfers import _TRAFFIC, _all_to_all, _flat, _gather, _GatherMoves, _RingMoves, _Units
from ._torch_ops import backward_add, forward_rows_with_work

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_AGREED = weakref.WeakKeyDictionary()  # process group -> {call signature: the backward's steps in flight}


def traffic() -> dict:
    """Bytes this process has sent through ring_attention since the last reset_traffic(): K/V rows
    (`kv_bytes`), dK/dV rows of the backward (`grad_bytes`), the heavy rows' traffic (`query_bytes`:
    their Q, dO, LSE and D out, partial (O, LSE) and dQ back), head parallelism's all_to_all
    (`head_bytes`: q, k, v and their gradients, o and lse), the number of sends, and the most
    steps' K/V transfers a ring forward or backward had under way at once (`steps_in_flight`)."""
    return dict(_TRAFFIC)


def reset_traffic():
    for key in _TRAFFIC:
        _TRAFFIC[key] = 0


def _check_agreement(group, given, checked, steps_ahead, failure=None):
    """Every rank must call with the same pattern, local shapes, dtype, layout, heavy rows,
    strategy and documents, or the transfers would not pair up (a hang, or a size error deep in the
    backend). `given`: what the caller passed, read before any check (shapes, dtype, layout, ...);
    `checked`: what the checks made of the rest (the pattern's hash, the documents' digest), None
    where this rank's checks failed with `failure`. One all_gather_object; on NCCL it is also the
    group's first full collective, which a batch of point-to-point calls that leaves a rank out
    must not be. A rank whose checks failed still joins it, so every rank stops with an error
    (never the others waiting in a transfer): arguments that differ are named, else the failing
    rank's error. It also agrees on the backward's steps in flight (the least of the ranks'
    `steps_ahead`), which every rank must share: the backward's dK/dV messages interleave with its
    K/V ones, and NCCL pairs the transfers between two ranks in the order they are posted. Returns
    that number.

    A signature this rank has agreed on before is not gathered again (a collective per call would
    cost a host synchronisation on NCCL). So ranks that call differently after each has called
    both ways are not caught, and a rank whose checks fail in a call the others agreed on before
    leaves them waiting; TORCH_DISTRIBUTED_DEBUG=DETAIL, PyTorch's switch for checking
    collectives, gathers on every call."""
    g = group if group is not None else dist.group.WORLD
    seen = _AGREED.setdefault(g, {})
    key = (given, checked)
    every_call = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"
    if failure is None and key in seen and not every_call:
        return seen[key]
    sigs = [None] * dist.get_world_size(group)
    why = None if failure is None else f"{type(failure).__name__}: {failure}"
    dist.all_gather_object(sigs, (given, checked, steps_ahead, why), group=group)
    if any(s[0] != given for s in sigs) or (not any(s[3] for s in sigs) and any(s[1] != checked for s in sigs)):
        raise ValueError("ring_attention: the ranks called with different arguments (q/k/v shapes, dtype, layout, "
                         "heavy_rows, strategy, head_parallel; pattern hash, documents): " +
                         "; ".join(f"rank {i}: {s[:2]}" for i, s in enumerate(sigs)) +
                         "; every rank must pass the same pattern, layout, heavy_rows, strategy and cu_seqlens "
                         "and shards of one shape")
    failed = [(i, s[3]) for i, s in enumerate(sigs) if s[3]]
    if failed:
        if failure is not None:
            return 0  # the caller raises its own error
        raise ValueError("ring_attention: " + "; ".join(f"rank {i} refused the call ({msg})" for i, msg in failed) +
                         "; every rank stops here")
    seen[key] = min(s[2] for s in sigs)
    return seen[key]


def _group_rank(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("attnjit.distributed: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first")
    return dist.get_world_size(group), dist.get_rank(group)


def shard(x: torch.Tensor, *, group=None, layout: str = "contiguous") -> torch.Tensor:
    """This rank's rows of x [B, S, ...] (the whole sequence, the same on every rank), cut along S
    by `layout`; differentiable (the gradient flows to x's rows)."""
    w, r = _group_rank(group)
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError("x: expected a [batch, seq, ...] torch.Tensor")
    pieces = [x[:, s:s + n] for s, n in chunks_of(x.shape[1], w, r, layout)]
    return (pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)).contiguous()


class _Unshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, layout):
        w, r = _group_rank(group)
        parts = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for _ in range(w)]  # contiguous, as all_gather needs
        dist.all_gather(parts, x.contiguous(), group=group)
        out = x.new_empty((x.shape[0], x.shape[1] * w) + tuple(x.shape[2:]))
        for rr in range(w):
            a = 0
            for s, n in chunks_of(out.shape[1], w, rr, layout):
                out[:, s:s + n] = parts[rr][:, a:a + n]
                a += n
        ctx.info = (group, layout, w, r)
        return out

    @staticmethod
    def backward(ctx, g):
        group, layout, w, r = ctx.info
        g = g.contiguous().clone()
        dist.all_reduce(g, group=group)  # every rank's loss reads the whole output
        pieces = [g[:, s:s + n] for s, n in chunks_of(g.shape[1], w, r, layout)]
        return (pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)), None, None


def unshard(x_local: torch.Tensor, *, group=None, layout: str = "contiguous") -> torch.Tensor:
    """The whole sequence [B, S, ...] from every rank's rows (all_gather), on every rank. Its
    gradient is the sum over ranks of each rank's gradient, cut back to this rank's rows."""
    if not isinstance(x_local, torch.Tensor) or x_local.dim() < 2:
        raise ValueError("x_local: expected a [batch, seq, ...] torch.Tensor")
    return _Unshard.apply(x_local, group, layout)


class _Ring:
    """One ring_attention call on this rank: the chunk-pair kernels, and the K/V they need moved
    by `strategy` ("ring": point to point, a step at a time; "longnet": one all_to_all up front)."""

    def __init__(self, plan: CommPlan, spec: str, rank: int, group, strategy: str):
        self.plan, self.spec, self.rank, self.group, self.strategy = plan, spec, rank, group, strategy
        self.w = plan.world_size
        # The index tensors of this rank's rows, made once per plan, rank and device (a copy to the
        # GPU from ordinary host memory waits for the GPU: never in the middle of the steps).
        self._cache = plan._units.setdefault((rank, strategy), {})
        self._stage = None  # received K/V placed at their rows (unpack)
        self._scratch = None  # one chunk pair's (O, LSE), its rows with work only (attend)
        self._partial = None  # dK/dV of a received chunk (partial)
        self.steps_ahead = 1  # the backward's steps in flight, the same on every rank (_check_agreement)

    def rows(self, qr, kr, device):
        """The K/V units rank qr reads of rank kr's (None: all)."""
        key = ("rows", qr, kr, str(device))
        if key not in self._cache:
            self._cache[key] = _Units.of(np.ascontiguousarray(self.plan.pair(qr, kr)[1].T), device)
        return self._cache[key]

    def count(self, qr, kr, like):
        """How many (row, kv head) units of `like` rank qr reads of rank kr."""
        units = self.rows(qr, kr, like.device)
        return like.shape[1] * like.shape[2] if units is None else units.count

    def chunk(self, r, i):
        """(local start, length, global start) of chunk i of rank r."""
        s, n = self.plan.chunks[r][i]
        return self.plan.local_start(i), n, s

    def chunk_pairs(self, kr, device):
        """(home piece, its kernel call (CommPlan.call), query units computed) of this rank's queries
        and rank kr's keys; the units sit at the piece's place in the local tensors (None: every
        row)."""
        key = ("pairs", kr, str(device))
        if key not in self._cache:
            got = self.plan.pair(self.rank, kr)
            out, total = [], self.plan.local_len
            for qi, ki in (got[0] if got else ()):
                computed, call = got[2][(qi, ki)], self.plan.call(self.rank, qi, kr, ki)
                out.append((qi, call, None if computed is None else _Units(computed, device, call[0], total)))
            self._cache[key] = out
        return self._cache[key]

    def unpack(self, src, bufs, k, v):
        """Rank src's K/V, local-sized, from the rows this rank received (zero elsewhere: unread).
        They are placed into this call's staging pair, zero but for the rows of the step in use, which
        release(src) zeroes again: a step costs the rows it receives, not a local-sized memset."""
        units = self.rows(self.rank, src, k.device)
        if units is None:
            return bufs[0].view(k.shape), bufs[1].view(v.shape)
        if self._stage is None:  # contiguous whatever k's and v's strides: _flat must be a view of it
            self._stage = (torch.zeros(k.shape, dtype=k.dtype, device=k.device),
                           torch.zeros(v.shape, dtype=v.dtype, device=v.device))
        for stage, buf in zip(self._stage, bufs):
            _flat(stage).index_copy_(1, units.local, buf)
        return self._stage

    def release(self, src, device):
        """Zeroes the staging rows unpack(src, ...) filled, once that step's kernels are queued."""
        units = self.rows(self.rank, src, device)
        if units is not None and self._stage is not None:
            for stage in self._stage:
                _flat(stage).index_fill_(1, units.local, 0)

    def scratch(self, q, n, dv):
        """One (O, LSE) pair of n rows for a kernel's output, kept while the length stays."""
        if self._scratch is None or self._scratch[0].shape[1] != n:
            b, _, hq, _ = q.shape
            self._scratch = (torch.empty((b, n, hq, dv), dtype=q.dtype, device=q.device),
                             torch.empty((b, hq, n), dtype=torch.float32, device=q.device))
        return self._scratch

    # The kernels of the piece pairs of (this rank's home queries, rank kr's keys). Each writes only
    # the rows that attend a key into one scratch pair, and the merge reads just those rows; the
    # first merge into a piece (its rows still (0, -inf)) is a copy.
    def attend(self, q, kr, kk, vv, acc_o, acc_lse, merged):
        for qi, (qa, qn, qs, ka, kn, ks), computed in self.chunk_pairs(kr, q.device):
            o, lse = self.scratch(q, qn, vv.shape[3])
            forward_rows_with_work(q[:, qa:qa + qn], kk[:, ka:ka + kn], vv[:, ka:ka + kn], o, lse, self.spec, qs, ks)
            _merge(acc_o, acc_lse, qa, o, lse, computed, fresh=qi not in merged)
            merged.add(qi)

    # The backward kernels of the piece pairs of (this rank's home queries, rank kr's keys): each
    # adds its gradients into the fp32 accumulators at the rows with work only (backward_add), with D
    # computed once per backward (delta, per piece): a step costs its attended pairs, and the
    # gradients are rounded once, at the end.
    def attend_backward(self, q, lse, do, delta, kr, kk, vv, dq, dkk, dvv):
        for qi, (qa, qn, qs, ka, kn, ks), _ in self.chunk_pairs(kr, q.device):
            rows, keys = slice(qa, qa + qn), slice(ka, ka + kn)
            _backward_add(self.spec, qs, ks, q[:, rows], kk[:, keys], vv[:, keys], lse[qi], do[:, rows], delta[qi],
                          dq[:, rows], dkk[:, keys], dvv[:, keys])

    def partial(self, src, dk, dv):
        """fp32 dK/dV of rank src's rows for one step. Where this rank reads some of them, one pair
        kept across the steps, zero but for the rows of the step in use: give_back gathers those
        rows (a copy) and zeroes them again. Where it reads every row, a fresh pair (the whole pair
        is the message then, still in flight during the next step)."""
        if self.rows(self.rank, src, dk.device) is None:
            return torch.zeros_like(dk), torch.zeros_like(dv)
        if self._partial is None:
            self._partial = torch.zeros_like(dk), torch.zeros_like(dv)
        return self._partial

    def gather_partial(self, src, partial):
        """The rows of rank src this rank read, from `partial` (its dK/dV), as the message back; the
        kept pair is zeroed at those rows for the next step."""
        units = self.rows(self.rank, src, partial[0].device)
        out = [_gather(units, t) for t in partial]
        if units is not None:
            for t in partial:
                _flat(t).index_fill_(1, units.local, 0)
        return out

    def moves(self, k, v, ahead_bytes=None, ahead_steps=1):
        return _RingMoves(self, k, v, ahead_bytes, ahead_steps) if self.strategy == "ring" else _GatherMoves(self, k, v)

    def prepare(self, device):
        """Every index this rank's steps use, made before the first kernel runs."""
        for other in range(self.w):
            for qr, kr in ((self.rank, other), (other, self.rank)):
                if self.plan.pair(qr, kr) is not None:
                    self.rows(qr, kr, device)
            self.chunk_pairs(other, device)
            if self.plan.has_away:
                self.visit_pairs(other, device)
        if self.plan.has_away:
            self.away_rows(device)

    def away_rows(self, device):
        """This rank's away rows (its heavy rows, CommPlan.away) as local row indices, in the order
        they are sent."""
        key = ("away", str(device))
        if key not in self._cache:
            rows = [np.arange(a, a + n) for a, n, _ in self.plan.away[self.rank]]
            self._cache[key] = torch.from_numpy(np.concatenate(rows) if rows else np.zeros(0, np.int64)).to(device)
        return self._cache[key]

    def visit_pairs(self, src, device):
        """(offset in src's away block, rows, global start, key chunk, query units computed) of rank
        src's away pieces against this rank's keys; the units sit at the piece's place in src's
        block of away rows (None: every row)."""
        key = ("visits", src, str(device))
        if key not in self._cache:
            offsets, total = self.plan.away_offsets(src)
            out = []
            for ai, ki, computed in self.plan.visit(src, self.rank):
                _, n, gs = self.plan.away[src][ai]
                units = None if computed is None else _Units(computed, device, offsets[ai], total)
                out.append((offsets[ai], n, gs, ki, units))
            self._cache[key] = out
        return self._cache[key]

    def forward(self, q, k, v):
        b, n, hq, _ = q.shape
        acc_o = torch.zeros((b, n, hq, v.shape[3]), dtype=torch.float32, device=q.device)
        acc_lse = torch.full((b, hq, n), float("-inf"), dtype=torch.float32, device=q.device)
        self.prepare(q.device)
        # The first transfers start here, before the local kernels: as many steps ahead as fit in
        # the bytes of the local K/V (one step where each moves whole chunks, all of them where a
        # pattern moves a few rows), so a step's rows are there however short the steps before.
        # The heavy rows' Q goes out first (one collective, under way during the ring).
        visits = _Visits(self, q.device, (q,), ()) if self.plan.has_away else None
        moves = self.moves(k, v, ahead_bytes=k.nbytes + v.nbytes)
        merged = set()  # the home pieces merged into so far
        self.attend(q, self.rank, k, v, acc_o, acc_lse, merged)
        for src, kv in moves.sources():
            if kv is not None:
                self.attend(q, src, *kv, acc_o, acc_lse, merged)
        if visits is not None:
            visits.forward(k, v, acc_o, acc_lse)
        return acc_o.to(q.dtype), acc_lse

    def backward(self, q, k, v, o, lse, do, dlse=None):
        # D = rowsum(dO * O) - dlse per query row, once: dlse, the gradient through the global lse,
        # enters every chunk pair's dS as P dlse (P from the global lse, as the chunks compute it).
        # A row that attends nothing (lse -inf) takes none of it. D and the LSE per query chunk,
        # contiguous [B, Hq, rows], as the kernels read them.
        delta = (do.float() * o.float()).sum(-1).transpose(1, 2)
        if dlse is not None:
            delta = delta - torch.where(lse == float("-inf"), 0.0, dlse.float())
        pieces = self.plan.home[self.rank]
        delta_of = [delta[:, :, a:a + n].contiguous() for a, n, _ in pieces]
        lse_of = [lse[:, :, a:a + n].contiguous() for a, n, _ in pieces]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        self.prepare(q.device)
        # The heavy rows' Q, dO, LSE and D go out first (one collective, under way during the ring).
        visits = _Visits(self, q.device, (q, do), (lse, delta)) if self.plan.has_away else None
        moves = self.moves(k, v, ahead_steps=self.steps_ahead)
        self.attend_backward(q, lse_of, do, delta_of, self.rank, k, v, dq, dk, dv)
        for src, kv in moves.sources():
            partial = None
            if kv is not None:
                partial = self.partial(src, dk, dv)
                self.attend_backward(q, lse_of, do, delta_of, src, *kv, dq, *partial)
            moves.give_back(src, partial, dk, dv)
        moves.finish(dk, dv)
        if visits is not None:
            visits.backward(k, v, dq, dk, dv)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _backward_add(spec, qs, ks, q, k, v, lse, do, delta, dq, dk, dv):
    """backward_add over views of the call's tensors: one call where the accumulators' views are
    contiguous (batch 1, or whole), else one per batch entry."""
    args = (q, k, v, lse, do, delta, dq, dk, dv)
    batches = [slice(None)] if all(t.is_contiguous() for t in args[6:]) else [slice(b, b + 1) for b in range(q.shape[0])]
    for b in batches:
        backward_add(*(t[b] for t in args), spec, qs, ks)


class _Visits:
    """The heavy rows of one call (CommPlan.away): a rank's away rows go, as Q (with dO, LSE and D in
    the backward), to every rank whose keys they attend, in one all_to_all started before the ring;
    after the ring each rank computes its visitors against its own K/V, and a second all_to_all
    returns the partial (O, LSE), merged by their log-sum-exp in fp32, or the fp32 dQ, added. In the
    backward a visitor's dK/dV are the host rank's own, added into its accumulators. A rank's own
    away rows against its own keys take the same path without a transfer. Collectives posted at the
    same point of the call on every rank keep NCCL's ordering against the ring's transfers."""

    def __init__(self, ring, device, rows, per_head):
        """rows: tensors [B, S/W, Hq, ...] (q; q, dO); per_head: fp32 [B, Hq, S/W] (none; LSE, D)."""
        self.ring, self.device = ring, device
        plan, r, w = ring.plan, ring.rank, ring.w
        idx = ring.away_rows(device)
        mine = [t.index_select(1, idx) for t in rows] + [t.index_select(2, idx) for t in per_head]
        self.mine = mine
        self.hosts = [k for k in range(w) if k != r and plan.visit(r, k)]  # ranks my away rows visit
        self.guests = [s for s in range(w) if s != r and plan.visit(s, r)]  # ranks whose away rows visit me
        self.exchanges = []
        for group, start in ((rows, 0), (per_head, len(rows))):
            if not group:
                continue
            send = [mine[start:start + len(group)] if dst in self.hosts else [] for dst in range(w)]
            shapes = [[self._shape(t, src, per_row=start == 0) for t in group] if src in self.guests else []
                      for src in range(w)]
            self.exchanges.append(_all_to_all(ring.group, send, shapes, group[0].dtype, "query_bytes", device,
                                              async_op=True))

    def _shape(self, t, src, per_row):
        n = self.ring.plan.away_offsets(src)[1]
        return (t.shape[0], n) + tuple(t.shape[2:]) if per_row else (t.shape[0], t.shape[1], n)

    def visitors(self):
        """(src, its away block's tensors) for every rank whose away rows this rank computes,
        itself included, once the first all_to_all is done."""
        got = []
        for work, views in self.exchanges:
            if work is not None:
                work.wait()
            got.append(views())
        r = self.ring.rank
        out = []
        for src in range(self.ring.w):
            if src == r:
                if self.ring.plan.visit(r, r):
                    out.append((src, self.mine))
            elif src in self.guests:
                out.append((src, [t for g in got for t in g[src]]))
        return out

    def give_back(self, parts, shapes):
        """Sends each visitor's part (a list of fp32 tensors) back to its rank; returns what came
        back for this rank's away rows (`shapes`: the part's, for its block of away rows), one list
        per host (itself included when it hosts its own)."""
        ring, r, w = self.ring, self.ring.rank, self.ring.w
        send = [parts.get(dst, []) if dst != r else [] for dst in range(w)]
        got = _all_to_all(ring.group, send, [shapes if src in self.hosts else [] for src in range(w)], torch.float32,
                          "query_bytes", self.device)[1]()
        back = [got[h] for h in self.hosts]
        if r in parts:
            back.append(parts[r])
        return back

    def forward(self, k, v, acc_o, acc_lse):
        parts = {}
        for src, (qv,) in self.visitors():
            _, total = self.ring.plan.away_offsets(src)
            b, _, hq, _ = qv.shape
            part_o = torch.zeros((b, total, hq, v.shape[3]), dtype=torch.float32, device=self.device)
            part_l = torch.full((b, hq, total), float("-inf"), dtype=torch.float32, device=self.device)
            for a, n, gs, ki, computed in self.ring.visit_pairs(src, self.device):
                ka, kn, ks = self.ring.chunk(self.ring.rank, ki)
                o, lse = self.ring.scratch(qv, n, v.shape[3])
                forward_rows_with_work(qv[:, a:a + n], k[:, ka:ka + kn], v[:, ka:ka + kn], o, lse, self.ring.spec, gs,
                                       ks)
                _merge(part_o, part_l, a, o, lse, computed)
            # (O, LSE) travel as one fp32 message: O flat, then LSE.
            parts[src] = [part_o, part_l]
        plan, r = self.ring.plan, self.ring.rank
        b, rows, hq, _ = self.mine[0].shape  # this rank's away block: O and LSE come back for it
        for part_o, part_l in self.give_back(parts, [(b, rows, hq, v.shape[3]), (b, hq, rows)]):
            for (la, n, _), a in zip(plan.away[r], plan.away_offsets(r)[0]):
                _merge(acc_o, acc_lse, la, part_o[:, a:a + n], part_l[:, :, a:a + n], None)

    def backward(self, k, v, dq, dk, dv):
        parts = {}
        for src, (qv, dov, lsev, deltav) in self.visitors():
            dq_part = torch.zeros(qv.shape, dtype=torch.float32, device=self.device)
            for a, n, gs, ki, _ in self.ring.visit_pairs(src, self.device):
                ka, kn, ks = self.ring.chunk(self.ring.rank, ki)
                rows, keys = slice(a, a + n), slice(ka, ka + kn)
                _backward_add(self.ring.spec, gs, ks, qv[:, rows], k[:, keys], v[:, keys],
                              lsev[:, :, rows].contiguous(), dov[:, rows], deltav[:, :, rows].contiguous(),
                              dq_part[:, rows], dk[:, keys], dv[:, keys])
            parts[src] = [dq_part]
        idx = self.ring.away_rows(self.device)
        for (dq_part,) in self.give_back(parts, [tuple(self.mine[0].shape)]):
            dq.index_add_(1, idx, dq_part)


def _merge(acc_o, acc_lse, at, o, lse, computed, fresh=False):
    """acc <- the softmax over both key sets, from each part's (O, LSE); in place, fp32. The part
    covers local rows [at, at + rows); `computed`: its units that attend something (None: all),
    the others leave acc as it is. A row that neither part attends stays (0, -inf); never NaN.
    `fresh`: acc's rows are still (0, -inf), so the merge is the part itself (a copy; the same
    values, NaN included)."""
    n = o.shape[1]
    if computed is None:
        acc_o_rows, acc_l = acc_o[:, at:at + n], acc_lse[:, :, at:at + n].transpose(1, 2)
        new_o, new_l = (o, lse.transpose(1, 2)) if fresh else _merged(acc_o_rows, acc_l, o, lse.transpose(1, 2))
        acc_o_rows.copy_(new_o)
        acc_l.copy_(new_l)
        return
    b = acc_o.shape[0]
    flat_o, flat_l = _flat(acc_o), acc_lse.view(b, -1)
    part_o, part_l = _flat(o).index_select(1, computed.local), lse.reshape(b, -1).index_select(1, computed.local_lse)
    new_o, new_l = (part_o.float(), part_l) if fresh else _merged(flat_o.index_select(1, computed.placed),
                                                                  flat_l.index_select(1, computed.placed_lse), part_o, part_l)
    flat_o.index_copy_(1, computed.placed, new_o)
    flat_l.index_copy_(1, computed.placed_lse, new_l)


def _merged(acc_o, acc_l, o, lse):
    m = torch.maximum(acc_l, lse)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(acc_l - m), torch.exp(lse - m)
    total = w1 + w2
    # Only a row that attends nothing in either part (total 0) is empty; a NaN stays NaN in O and
    # in the LSE, as one call over the whole sequence gives, and so reaches the gradients.
    empty = total == 0
    inv = torch.where(empty, torch.zeros_like(total), 1.0 / total)
    new_o = acc_o * (w1 * inv).unsqueeze(-1) + o.float() * (w2 * inv).unsqueeze(-1)
    return new_o, torch.where(empty, torch.full_like(total, float("-inf")), m + torch.log(total))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring):
        o, lse = ring.forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ring = ring
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:  # o is not in this rank's loss; the other ranks still need its part of the ring
            do = torch.zeros_like(o)
        dq, dk, dv = ctx.ring.backward(q, k, v, o, lse, do if do.stride(3) == 1 else do.contiguous(), dlse)
        return dq, dk, dv, None


STRATEGIES = ("ring", "longnet")


def _digest(docs):
    """A short name for the documents' boundaries in the ranks' agreement check (None: none)."""
    return None if docs is None else hashlib.sha256(np.asarray(docs, dtype=np.int64).tobytes()).hexdigest()[:16]


def ring_attention(q, k, v, pattern, *, group=None, layout: str = "contiguous", scale=None, return_lse: bool = False,
                   strategy: str = "ring", heavy_rows=HEAVY_ROWS, cu_seqlens=None, head_parallel: int = 1):
    """Attention of `pattern` over a sequence sharded across `group` (default: the whole world).

    q [B, S/W, Hq, D], k [B, S/W, Hkv, D], v [B, S/W, Hkv, Dv]: this rank's rows as `shard` cuts
    them with the same `layout`. Returns this rank's rows of o (and lse fp32 [B, Hq, S/W]), equal
    to attnjit.attention on the whole sequence. Differentiable in q, k and v; fp32, fp16, bf16.
    `strategy`: "ring" (point to point, a step at a time, overlapped) or "longnet" (LongNet's
    scheme: the rows each rank reads, all exchanged at once in one collective). `heavy_rows`: query
    rows whose attended pairs are over this many times the mean row's (BigBird's global rows) are
    computed by the ranks that hold their keys, their Q sent out and partial results sent back, so
    no rank carries them alone nor reads every K/V row for them; None keeps every row on its rank.
    `cu_seqlens`: packed documents, as attnjit.attention takes them (batch 1; boundaries 0, e_1,
    ..., S over the whole sequence, the same on every rank): each document attends only itself,
    its positions restarting at 0; a rank reads only the K/V of its documents (no heavy rows then).
    `head_parallel` = u > 1: head parallelism inside the ring (DeepSpeed-Ulysses' all_to_all): the
    ranks g*u .. g*u + u - 1 of the group (keep them within a node) pool their rows by one
    all_to_all, each keeping 1/u of the heads, the ring runs over the W/u ranks that hold the same
    heads, and O goes back by the reverse all_to_all. A ring step then computes u times the pairs for
    the same bytes moved. u must divide W and both head counts (head_parallel_groups says how the
    sub-groups are made)."""
    w, r = _group_rank(group)
    # What the caller passed, read before any check: the ranks agree on it (and on what the checks
    # made of it) even where one rank's checks fail, so that every rank stops with an error.
    given = (tuple(tuple(getattr(x, "shape", ())) for x in (q, k, v)), str(getattr(q, "dtype", type(q).__name__)),
             *(_hashable(a) for a in (layout, heavy_rows, strategy, head_parallel)))
    try:
        p, docs, heavy_rows, plan = _checked_call(q, k, v, pattern, w, layout, scale, strategy, heavy_rows, cu_seqlens,
                                                  head_parallel)
        failure = None
    except (TypeError, ValueError) as e:  # an AttnjitError is a ValueError
        failure = e
    if w > 1:
        steps = _check_agreement(group, given, None if failure else (p.hash, _digest(docs)),
                                 plan.steps_ahead(r) if failure is None and plan is not None else 0, failure)
    if failure is not None:
        raise failure
    if head_parallel != 1:
        return _head_parallel(q, k, v, p, group, layout, strategy, heavy_rows, docs, head_parallel, return_lse)
    ring = _Ring(plan, p.op_spec, r, group, strategy)
    if w > 1:
        ring.steps_ahead = steps
    o, lse = _RingAttention.apply(q, k, v, ring)
    return (o, lse) if return_lse else o


def _hashable(x):
    """x, or its text where it cannot be a dict key (a wrong argument, refused by the checks)."""
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


def _checked_call(q, k, v, pattern, w, layout, scale, strategy, heavy_rows, cu_seqlens, head_parallel):
    """ring_attention's arguments checked: (pattern with the scale, documents, heavy_rows, the
    CommPlan or None with head parallelism, whose ring plans its own), or a TypeError/ValueError."""
    heavy_rows = check_heavy_rows(heavy_rows)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    check_shapes(q.shape, k.shape, v.shape)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q, k: local sequence lengths differ ({q.shape[1]} and {k.shape[1]}); ring_attention shards "
                         f"queries and keys alike (self-attention)")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPES:
        raise TypeError(f"q, k, v: expected one dtype of float32, float16, bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v: devices differ ({q.device}, {k.device}, {v.device})")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(3) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1); call .contiguous()")
    p = as_pattern(pattern)
    if scale is not None:
        p = p.with_scale(scale)
    if "dynamic<" in p.canonical:  # a dynamic layout anywhere in the tree (its canonical text)
        raise ValueError("pattern: a dynamic layout is not supported by ring_attention; use attnjit.attention")
    docs = check_documents(cu_seqlens, q.shape[1] * w)
    if docs is not None and q.shape[0] != 1:
        raise ValueError(f"cu_seqlens: packed documents need batch 1 (the documents are packed along the sequence), "
                         f"got batch {q.shape[0]}")
    if isinstance(head_parallel, bool) or not isinstance(head_parallel, int) or head_parallel < 1:
        raise ValueError(f"head_parallel: expected a positive int (the ranks of a head group), got {head_parallel!r}")
    plan = None if head_parallel != 1 else comm_plan(p, q.shape[1] * w, q.shape[2], k.shape[2], world_size=w,
                                                     layout=layout, heavy_rows=heavy_rows, cu_seqlens=docs)
    return p, docs, heavy_rows, plan


def _head_parallel(q, k, v, p, group, layout, strategy, heavy_rows, docs, head_parallel, return_lse):
    """ring_attention with head parallelism of degree head_parallel: o (and lse) of this rank's rows."""
    w, r = _group_rank(group)
    u = head_parallel
    _check_layout(layout)
    # u dividing W, and a length the layout cannot cut: refused here, before any transfer.
    ring_layout = head_parallel_layout(q.shape[1] * w, w, u, layout)
    hq, hkv = q.shape[2], k.shape[2]
    if hq % u or hkv % u:
        raise ValueError(f"head_parallel: {u} must divide the query heads ({hq}) and the key/value heads ({hkv}); "
                         f"pick a divisor of both")
    # Every slice on every rank, before any collective: a slice that cannot be made fails on every
    # rank alike instead of leaving its head group's other ranks in an all_to_all.
    parts = head_slices(p, u, hq)
    heads, ring = head_parallel_groups(u, group)
    qh, kh, vh = HeadExchange.apply(heads, u, True, q, k, v)
    o, lse = ring_attention(qh, kh, vh, parts[r % u], group=ring, layout=ring_layout, return_lse=True,
                            strategy=strategy, heavy_rows=heavy_rows, cu_seqlens=docs)
    if not return_lse:  # the ring's backward keeps its own LSE: this one only goes back when asked for
        return HeadExchange.apply(heads, u, False, o)[0]
    o, lse = HeadExchange.apply(heads, u, False, o, lse.transpose(1, 2))
    return o, lse.transpose(1, 2).contiguous()  # [B, H, n], as the rows' own call gives
