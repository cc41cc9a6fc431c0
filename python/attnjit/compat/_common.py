"""Pieces the compat modules share."""
import torch

from .. import nn as ann


def check_batch_first(query, key, value):
    """ValueError naming the tensor unless query, key and value are [batch, seq, embed_dim] tensors."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name}: expected a batch-first [batch, seq, embed_dim] tensor, got {got}")


def copy_linear(dst, src):
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if (dst.bias is None) != (src.bias is None):
            raise ValueError("a projection's bias: one module has it, the other not")
        if dst.bias is not None:
            dst.bias.copy_(src.bias)


def to_nn_module(embed_dim, num_heads, spec, proj, norm, *, bias, like):
    """attnjit.nn.MultiheadDilatedAttention of `spec` with the projections in `proj`
    (q, k, v, out) and the LayerNorm `norm` (or None) copied from another module."""
    w = proj[0].weight
    m = ann.MultiheadDilatedAttention.from_pattern(embed_dim, num_heads, spec, bias=bias, layer_norm=norm is not None,
                                                   device=w.device, dtype=w.dtype)
    for dst, src in zip((m.q_proj, m.k_proj, m.v_proj, m.out_proj), proj):
        copy_linear(dst, src)
    if norm is not None:
        m.norm.eps = norm.eps
        with torch.no_grad():
            m.norm.weight.copy_(norm.weight)
            m.norm.bias.copy_(norm.bias)
    m.train(like.training)
    return m
