"""Head parallelism for attnjit.distributed (DeepSpeed-Ulysses' all_to_all, inside the ring): the
sub-groups of a group, and the all_to_all that trades a rank's rows of every head for its head
group's rows of its share of the heads, and back, as differentiable functions."""
import functools

import torch
import torch.distributed as dist

from ._ring_transfers import _TRAFFIC

_GROUPS = {}  # (the group's ranks, u) -> (head group, ring group) of this process


def head_parallel_groups(head_parallel: int, group=None):
    """(head group, ring group) of this rank for head parallelism of degree u = `head_parallel` over
    `group` (default: the world): ranks g*u .. g*u + u - 1 of the group form head group g (keep u
    within a node: its all_to_all carries every row), and the ranks with the same place j in their
    head groups form the ring group j. Made once per group and u, by the members of each only
    (`use_local_synchronization`: the group's other processes need not call), then reused."""
    u = int(head_parallel)
    ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    key = (ranks, u)
    if key not in _GROUPS:
        w = len(ranks)
        if u < 1 or w % u:
            raise ValueError(f"head_parallel: expected a divisor of the group's size {w}, got {head_parallel}")
        me = ranks.index(dist.get_rank())
        g, j = me // u, me % u
        heads = dist.new_group(list(ranks[g * u:(g + 1) * u]), use_local_synchronization=True)
        ring = dist.new_group(list(ranks[j::u]), use_local_synchronization=True)
        _GROUPS[key] = (heads, ring)
    return _GROUPS[key]


@functools.lru_cache(maxsize=64)
def head_slices(pattern, u: int, heads_q: int):
    """The patterns of the u slices of `pattern`'s heads_q heads (Pattern.head_slice), made once
    per pattern and shape: a training step calls with the same ones every time."""
    return tuple(pattern.head_slice(i * heads_q // u, heads_q // u, heads_q) for i in range(u))


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
    """rows_to_heads (to_heads) or heads_to_rows of each tensor, differentiable: the gradients take
    the other way. Every output's gradient is exchanged, zeros where a loss did not use it, so the
    ranks of a head group make the same collectives whatever their losses read."""

    @staticmethod
    def forward(ctx, group, u, to_heads, *xs):
        ctx.info = (group, u, to_heads)
        move = rows_to_heads if to_heads else heads_to_rows
        return tuple(move(x, group, u) for x in xs)

    @staticmethod
    def backward(ctx, *gs):
        group, u, to_heads = ctx.info
        move = heads_to_rows if to_heads else rows_to_heads
        return (None, None, None) + tuple(move(g, group, u) for g in gs)
