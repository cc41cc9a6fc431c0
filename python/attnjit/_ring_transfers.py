"""The transfers of attnjit.distributed's ring: what moves between ranks and when, apart from what
the kernels compute (distributed.py). K/V rows by point-to-point steps started ahead (_RingMoves)
or in one collective (LongNet's scheme, _GatherMoves), the dK/dV rows back, the all_to_all of the
heavy rows (_all_to_all), and the index sets those moves and merges gather by (_Units). Every byte
sent is counted in _TRAFFIC (distributed.traffic())."""
import collections

import numpy as np
import torch
import torch.distributed as dist

_TRAFFIC = {"kv_bytes": 0, "grad_bytes": 0, "query_bytes": 0, "head_bytes": 0, "messages": 0, "steps_in_flight": 0}


class _Exchange:
    """One batch of point-to-point transfers, started together and waited for together."""

    def __init__(self, group, kind):
        self.group, self.kind, self.ops, self.works = group, kind, [], []

    def send(self, t, to, tag):
        t = t.contiguous()
        self.ops.append(dist.P2POp(dist.isend, t, group=self.group, tag=tag, group_peer=to))
        _TRAFFIC[self.kind] += t.numel() * t.element_size()
        _TRAFFIC["messages"] += 1

    def recv(self, t, frm, tag):
        self.ops.append(dist.P2POp(dist.irecv, t, group=self.group, tag=tag, group_peer=frm))

    def start(self):
        if self.ops:
            self.works = dist.batch_isend_irecv(self.ops)
        return self

    def wait(self):
        for w in self.works:
            w.wait()
        self.works = []


class _Units:
    """Some (row, head) units of tensors laid out [B, rows, heads, ...] (K, V, O and gradients) and
    [B, heads, rows] (LSE), chosen by a bool [rows, heads] mask over rows [offset, offset + rows)
    of tensors with `total` rows, as flat indices: gathers, copies and sums go through index_select
    / index_copy_ / index_add_, which (unlike boolean indexing) never wait for the GPU, so the
    transfers queued behind the kernels keep flowing."""

    def __init__(self, mask, device, offset=0, total=None):
        rows, heads = mask.shape
        total = rows if total is None else total
        r, h = np.nonzero(mask)

        def index(a):
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

        self.count = len(r)
        self.local, self.placed = index(r * heads + h), index((r + offset) * heads + h)
        self.local_lse, self.placed_lse = index(h * rows + r), index(h * total + r + offset)

    @staticmethod
    def of(mask, device, offset=0, total=None):
        """The units of `mask`, or None when it holds them all (whole tensors, no indexing)."""
        return None if mask.all() else _Units(mask, device, offset, total)


def _flat(t):
    return t.reshape(t.shape[0], t.shape[1] * t.shape[2], *t.shape[3:])


def _gather(units, t):
    """The units of t [B, rows, heads, D] as [B, count, D] (t itself when units is None)."""
    return t if units is None else _flat(t).index_select(1, units.local)


def _add_gathered(units, acc, buf):
    """acc [B, rows, heads, D] += the gathered `buf` at its units (a whole tensor when None)."""
    if units is None:
        acc += buf.view(acc.shape)
    else:
        _flat(acc).index_add_(1, units.placed, buf.to(acc.dtype))


def _all_to_all(group, send, recv_shapes, dtype, kind, device, async_op=False):
    """all_to_all of send[dst] (lists of tensors) into recv_shapes[src] (lists of shapes), in one
    flat buffer of `dtype`. Returns (work or None, a function that gives got[src], the received
    tensors as views of the buffer, once the work is done)."""
    w = len(send)
    flat = [t.reshape(-1).to(dtype) for dst in range(w) for t in send[dst]]
    inp = torch.cat(flat) if flat else torch.empty(0, dtype=dtype, device=device)
    in_splits = [sum(t.numel() for t in send[dst]) for dst in range(w)]
    out_splits = [sum(int(np.prod(sh)) for sh in recv_shapes[src]) for src in range(w)]
    out = torch.empty(sum(out_splits), dtype=dtype, device=device)
    work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)
    _TRAFFIC[kind] += inp.numel() * inp.element_size()
    _TRAFFIC["messages"] += sum(1 for n in in_splits if n)

    def got():
        views, at = [], 0
        for src in range(w):
            views.append([])
            for sh in recv_shapes[src]:
                n = int(np.prod(sh))
                views[-1].append(out[at:at + n].view(sh))
                at += n
        return views

    return work, got


class _RingMoves:
    """Step s = 1..W-1: this rank's K/V rows to rank+s, rank-s's to this rank, started ahead of
    their step: in the forward (`ahead_bytes`) as many steps as fit in that many bytes sent and
    received, at least one; in the backward `ahead_steps` steps, a number every rank shares. Every
    rank starts them in step order, so the transfers between any two ranks pair up in order (NCCL
    needs that; gloo has the tags). In the backward the dK/dV of a received chunk go back to its
    owner after its step, and those messages keep their order against the K/V ones because every
    rank posts both kinds in the same sequence of steps."""

    def __init__(self, ring, k, v, ahead_bytes=None, ahead_steps=1):
        self.ring, self.k, self.v = ring, k, v
        self.grads = None
        self.budget, self.ahead, self.in_flight = ahead_bytes, ahead_steps, 0
        self.pending, self.next = collections.deque(), 1
        self.top_up()  # overlaps the local step's kernels

    def step_bytes(self, step):
        """Bytes step `step` sends and receives on this rank (K and V rows)."""
        ring, k, v = self.ring, self.k, self.v
        r, w = ring.rank, ring.w
        row = k.shape[0] * (k.shape[3] + v.shape[3]) * k.element_size()
        dst, src = (r + step) % w, (r - step) % w
        sent = ring.count(dst, r, k) if ring.plan.pair(dst, r) is not None else 0
        received = ring.count(r, src, k) if ring.plan.pair(r, src) is not None else 0
        return (sent + received) * row

    def top_up(self):
        w = self.ring.w
        while self.next < w:
            b = self.step_bytes(self.next)
            if self.pending and (len(self.pending) >= self.ahead if self.budget is None else self.in_flight + b > self.budget):
                break
            self.pending.append(self.start_kv(self.next) + (b,))
            self.in_flight += b
            self.next += 1
        _TRAFFIC["steps_in_flight"] = max(_TRAFFIC["steps_in_flight"], len(self.pending))

    def start_kv(self, step):
        ring, k, v = self.ring, self.k, self.v
        r, w = ring.rank, ring.w
        dst, src = (r + step) % w, (r - step) % w
        ex = _Exchange(ring.group, "kv_bytes")
        if ring.plan.pair(dst, r) is not None:
            units = ring.rows(dst, r, k.device)
            for t, tag in ((k, 0), (v, 1)):
                ex.send(_gather(units, t), dst, 4 * step + tag)
        bufs = None
        if ring.plan.pair(r, src) is not None:
            n = ring.count(r, src, k)
            bufs = [torch.empty((k.shape[0], n, t.shape[3]), dtype=t.dtype, device=t.device) for t in (k, v)]
            ex.recv(bufs[0], src, 4 * step)
            ex.recv(bufs[1], src, 4 * step + 1)
        return ex.start(), src, bufs

    def sources(self):
        """(src, (k, v) or None) for each step, in step order."""
        for step in range(1, self.ring.w):
            ex, src, bufs, b = self.pending.popleft()
            ex.wait()
            self.in_flight -= b
            self.top_up()
            self.step = step
            yield src, (None if bufs is None else self.ring.unpack(src, bufs, self.k, self.v))
            if bufs is not None:
                self.ring.release(src, self.k.device)

    def give_back(self, src, partial, dk, dv):
        # The dK/dV of rank src's rows go back to it; rank+step sends this rank's.
        ring, step = self.ring, self.step
        r, w = ring.rank, ring.w
        dst = (r + step) % w
        ex = _Exchange(ring.group, "grad_bytes")
        if partial is not None:
            for t, tag in zip(ring.gather_partial(src, partial), (2, 3)):
                ex.send(t, src, 4 * step + tag)
        bufs = None
        if ring.plan.pair(dst, r) is not None:
            n = ring.count(dst, r, dk)
            bufs = [torch.empty((dk.shape[0], n, t.shape[3]), dtype=torch.float32, device=t.device) for t in (dk, dv)]
            ex.recv(bufs[0], dst, 4 * step + 2)
            ex.recv(bufs[1], dst, 4 * step + 3)
        self.finish(dk, dv)
        self.grads = ex.start(), dst, bufs

    def finish(self, dk, dv):
        """Waits for the dK/dV rows sent to this rank last and adds them."""
        if self.grads is None:
            return
        ex, dst, bufs = self.grads
        self.grads = None
        ex.wait()
        if bufs is not None:
            units = self.ring.rows(dst, self.ring.rank, dk.device)
            _add_gathered(units, dk, bufs[0])
            _add_gathered(units, dv, bufs[1])


class _GatherMoves:
    """LongNet's distributed scheme (Ding et al. 2023, section 3.2): before any kernel, every rank
    sends each other rank the K/V rows it reads, in one collective (all_to_all_single, the splits
    from the comm plan): for a dilated branch whose segment spans several ranks, the selected rows
    within the segment's ranks, which is what the paper all-gathers; segments inside one rank
    move nothing. dK/dV go back the same way after the last kernel. No overlap: one exchange."""

    def __init__(self, ring, k, v):
        self.ring, self.k, self.v = ring, k, v
        self.partials = {}

    def _exchange(self, send, recv_shapes, dtype, kind, like):
        """all_to_all of send[dst] (tensors) -> recv_shapes[src] (shapes), flattened into one buffer."""
        return _all_to_all(self.ring.group, send, recv_shapes, dtype, kind, like.device)[1]()

    def sources(self):
        ring, k, v = self.ring, self.k, self.v
        r, w = ring.rank, ring.w
        send, shapes = [[] for _ in range(w)], [[] for _ in range(w)]
        for other in range(w):
            if other == r:
                continue
            if ring.plan.pair(other, r) is not None:
                units = ring.rows(other, r, k.device)
                send[other] = [_gather(units, t) for t in (k, v)]
            if ring.plan.pair(r, other) is not None:
                n = ring.count(r, other, k)
                shapes[other] = [(k.shape[0], n, t.shape[3]) for t in (k, v)]
        got = self._exchange(send, shapes, k.dtype, "kv_bytes", k)
        for src in range(w):
            if src != r:
                yield src, (ring.unpack(src, got[src], k, v) if got[src] else None)
                if got[src]:
                    ring.release(src, k.device)

    def give_back(self, src, partial, dk, dv):
        if partial is not None:
            self.partials[src] = self.ring.gather_partial(src, partial)

    def finish(self, dk, dv):
        ring = self.ring
        r, w = ring.rank, ring.w
        send = [self.partials.get(dst, []) for dst in range(w)]
        shapes = [[] for _ in range(w)]
        for other in range(w):
            if other != r and ring.plan.pair(other, r) is not None:
                n = ring.count(other, r, dk)
                shapes[other] = [(dk.shape[0], n, t.shape[3]) for t in (dk, dv)]
        got = self._exchange(send, shapes, torch.float32, "grad_bytes", dk)
        for other in range(w):
            if got[other]:
                units = ring.rows(other, r, dk.device)
                _add_gathered(units, dk, got[other][0])
                _add_gathered(units, dv, got[other][1])
