"""Head parallelism for attnjit.distributed (DeepSpeed-Ulysses' all_to_all, inside the ring): the
sub-groups of a group, and the all_to_all that trades a rank's rows of every head for its head
group's rows of its share of the heads, and back, as differentiable functions."""
import weakref

import torch
import torch.distributed as dist

from ._ring_transfers import _TRAFFIC

_GROUPS = weakref.WeakKeyDictionary()  # process group -> {u: (head group, ring group)}


def head_parallel_groups(head_parallel: int, group=None):
    """(head group, ring group) of this rank for head parallelism of degree u = `head_parallel` over
    `group` (default: the world): ranks g*u .. g*u + u - 1 of the group form head group g (keep u
    within a node: its all_to_all carries every row), and the ranks with the same place j in their
    head groups form the ring group j. Made once per group and u, then reused. torch.distributed
    makes a group by a call on every process of the job, so the first call with a given group and
    u must be made on every process, members of `group` or not (ring_attention makes it on its
    first call; with a group other than the world, call this first on every process)."""
    g = group if group is not None else dist.group.WORLD
    u = int(head_parallel)
    made = _GROUPS.setdefault(g, {})
    if u not in made:
        ranks = dist.get_process_group_ranks(g)
        w = len(ranks)
        if u < 1 or w % u:
            raise ValueError(f"head_parallel: expected a divisor of the group's size {w}, got {head_parallel}")
        heads, _ = dist.new_subgroups_by_enumeration([ranks[i:i + u] for i in range(0, w, u)])
        rings, _ = dist.new_subgroups_by_enumeration([ranks[j::u] for j in range(u)])
        made[u] = (heads, rings)
    return made[u]


def _exchange(send, group):
    """all_to_all_single of send [u, ...] (piece i to rank i of the group); returns recv [u, ...]
    (piece i from rank i)."""
    send = send.contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    _TRAFFIC["head_bytes"] += send.numel() // send.shape[0] * (send.shape[0] - 1) * send.element_size()
    return recv


def rows_to_heads(x, group, u):
    """x [B, n, H, ...] (this rank's rows, every head) -> [B, u n, H/u, ...]: the rows of the u
    ranks of the head group, in rank order, for this rank's slice of the heads."""
    b, n, h = x.shape[:3]
    rest = tuple(x.shape[3:])
    send = x.reshape((b, n, u, h // u) + rest).movedim(2, 0)  # [u, B, n, H/u, ...]: slice i to rank i
    recv = _exchange(send, group)  # [u, B, n, H/u, ...]: rank i's rows
    return recv.movedim(0, 1).reshape((b, u * n, h // u) + rest)


def heads_to_rows(y, group, u):
    """The inverse of rows_to_heads: y [B, u n, H/u, ...] -> [B, n, H, ...]."""
    b, un, hs = y.shape[:3]
    rest = tuple(y.shape[3:])
    send = y.reshape((b, u, un // u, hs) + rest).movedim(1, 0)  # [u, B, n, H/u, ...]: rank i's rows to it
    recv = _exchange(send, group)  # [u, B, n, H/u, ...]: head slice i from rank i
    return recv.movedim(0, 2).reshape((b, un // u, u * hs) + rest)


class HeadExchange(torch.autograd.Function):
    """rows_to_heads (to_heads) or heads_to_rows, differentiable: the gradient takes the other way."""

    @staticmethod
    def forward(ctx, x, group, u, to_heads):
        ctx.info = (group, u, to_heads)
        return (rows_to_heads if to_heads else heads_to_rows)(x, group, u)

    @staticmethod
    def backward(ctx, g):
        group, u, to_heads = ctx.info
        return (heads_to_rows if to_heads else rows_to_heads)(g, group, u), None, None, None
