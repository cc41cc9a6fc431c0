"""torchscale's LongNet attention (torchscale/component/dilated_attention.py, GitHub master) on
attnjit: `DilatedAttention(args, embed_dim, num_heads, dropout=0.0, self_attention=False,
encoder_decoder_attention=False, subln=False)`, the state-dict keys q_proj, k_proj, v_proj,
out_proj and inner_attn_ln (subln), torchscale's initialisation (torch.nn.Linear's own;
reset_parameters() as torchscale's), and forward(query, key, value, incremental_state=None,
key_padding_mask=None, attn_mask=None, rel_pos=None, is_first_step=False, is_causal=False) ->
(attn, None).

The answer is LongNet's: one softmax over every branch's keys (the mixing of the branches by their
softmax denominators, with its exact gradient), head h selecting the residue
floor(h / ceil(H / r)) (offset rule "torchscale"), keys outside the sequence never attended, every
row in its own place. docs/longnet-compat.md lists where torchscale's code departs from that.

From `args` it reads segment_length, dilated_ratio (lists of equal length), layernorm_eps (subln)
and, when present, multiway, xpos_rel_pos and seq_parallel; flash_attention may be either value
(attnjit's kernels are fused whichever). Inputs it cannot honour raise NotImplementedError naming
them: incremental_state, rel_pos, an attn_mask that is not causal, a key_padding_mask that is not
padding at the end of each sequence, dropout > 0 in training (the kernels have no dropout on the
probabilities), args.multiway, args.xpos_rel_pos, args.seq_parallel across several ranks.
"""
import math

import torch
from torch import nn

from .. import nn as ann
from .._attention import attention
from .._inputs import int_arg
from .._pattern import Pattern
from ._common import check_batch_first, to_nn_module

__all__ = ["DilatedAttention", "from_torchscale", "spec_of"]


def _branches(args):
    seg, dil = getattr(args, "segment_length", None), getattr(args, "dilated_ratio", None)
    if seg is None or dil is None:
        raise ValueError("args.segment_length and args.dilated_ratio: torchscale's DilatedAttention needs both "
                         "(lists of segment lengths and dilation rates)")
    seg, dil = ann.positive_ints("args.segment_length", seg), ann.positive_ints("args.dilated_ratio", dil)
    if len(seg) != len(dil) or not seg:
        raise ValueError(f"args.segment_length and args.dilated_ratio: expected equal, non-empty lists, got {seg} and {dil}")
    return seg, dil


def spec_of(segment_lengths, dilation_rates, *, causal=False):
    """The attnjit spec of torchscale's DilatedAttention with these segment lengths and dilation
    rates: one softmax over the branches, offset rule "torchscale"."""
    return ann.dilated_spec(segment_lengths, dilation_rates, combine="softmax", offset="torchscale", causal=causal)


def _causal_mask(attn_mask, tgt_len, src_len):
    """Whether attn_mask masks exactly the keys after each query (a bool mask, or an additive one
    with large negative values above the diagonal and zeros elsewhere)."""
    if attn_mask.dim() != 2 or tuple(attn_mask.shape) != (tgt_len, src_len):
        return False
    above = torch.ones(tgt_len, src_len, dtype=torch.bool, device=attn_mask.device).triu(1)
    if attn_mask.dtype == torch.bool:
        return bool(torch.equal(attn_mask, above))
    m = attn_mask.detach()
    return bool((m[~above] == 0).all() and (m[above] <= -1e4).all())


def _kept_keys(key_padding_mask, bsz, src_len):
    """The number of keys each batch entry keeps, where key_padding_mask [B, S] (True or nonzero =
    padding) pads the end of each sequence; None if it masks anything else."""
    if key_padding_mask.dim() != 2 or tuple(key_padding_mask.shape) != (bsz, src_len):
        return None
    pad = key_padding_mask.detach().to(torch.bool)
    kept = (~pad).sum(dim=1)
    positions = torch.arange(src_len, device=pad.device)
    if not torch.equal(pad, positions[None, :] >= kept[:, None]):
        return None
    return [int(n) for n in kept.cpu()]


class DilatedAttention(nn.Module):
    def __init__(self, args, embed_dim, num_heads, dropout=0.0, self_attention=False, encoder_decoder_attention=False,
                 subln=False):
        super().__init__()
        self.args = args
        self.embed_dim = embed_dim = int_arg("embed_dim", embed_dim, ann._POSITIVE)
        self.num_heads = num_heads = int_arg("num_heads", num_heads, ann._POSITIVE)
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.dropout = dropout
        self.self_attention = self_attention
        self.encoder_decoder_attention = encoder_decoder_attention
        if not (bool(self_attention) ^ bool(encoder_decoder_attention)):
            raise ValueError("self_attention, encoder_decoder_attention: exactly one must be true (as torchscale asserts)")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if getattr(args, "multiway", False):
            raise NotImplementedError("args.multiway: multiway projections (q_proj.A / q_proj.B) are not supported "
                                      "by attnjit.compat.torchscale")
        if getattr(args, "xpos_rel_pos", False) and self_attention:
            raise NotImplementedError("args.xpos_rel_pos: xPos rotary positions are not supported by "
                                      "attnjit.compat.torchscale; apply them to q and k and call attnjit.attention")
        self.segment_lengths, self.dilation_rates = _branches(args)
        # torchscale's order of registration, so state_dict() lists the keys as torchscale's does.
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.inner_attn_ln = (nn.LayerNorm(embed_dim, eps=getattr(args, "layernorm_eps", 1e-5))
                              if subln and self_attention else None)
        self.dropout_module = nn.Dropout(dropout)
        self.xpos = None
        self._patterns = {}

    def reset_parameters(self):
        nn.init.xavier_uniform_(self.k_proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.v_proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.q_proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.constant_(self.out_proj.bias, 0.0)

    def pattern(self, is_causal=False) -> Pattern:
        """The attnjit pattern this module computes (is_causal: the causal one)."""
        key = bool(is_causal)
        if key not in self._patterns:
            self._patterns[key] = Pattern.from_json(spec_of(self.segment_lengths, self.dilation_rates, causal=key))
        return self._patterns[key]

    def forward(self, query, key, value, incremental_state=None, key_padding_mask=None, attn_mask=None, rel_pos=None,
                is_first_step=False, is_causal=False):
        if incremental_state is not None:
            raise NotImplementedError("incremental_state: incremental decoding is not supported by "
                                      "attnjit.compat.torchscale; pass the whole sequence")
        if rel_pos is not None:
            raise NotImplementedError("rel_pos: a relative position bias is not supported by attnjit.compat.torchscale "
                                      "(torchscale's DilatedAttention refuses it too)")
        if self.training and self.dropout > 0:
            raise NotImplementedError(f"dropout={self.dropout}: attnjit's kernels have no dropout on the attention "
                                      "probabilities; construct with dropout=0.0 or call eval()")
        if getattr(self.args, "seq_parallel", False) and torch.distributed.is_available() \
                and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise NotImplementedError("args.seq_parallel: torchscale's sequence parallelism is not supported by "
                                      "attnjit.compat.torchscale; use attnjit.nn's sequence_parallel()")
        check_batch_first(query, key, value)
        bsz, tgt_len, embed_dim = query.size()
        if embed_dim != self.embed_dim:
            raise ValueError(f"query dim {embed_dim} != {self.embed_dim}")
        key_bsz, src_len, _ = key.size()
        if key_bsz != bsz or value.shape[:2] != key.shape[:2]:
            raise ValueError(f"query, key, value: batch sizes or key and value lengths differ ({tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)})")
        causal = bool(is_causal)
        if attn_mask is not None:
            if not _causal_mask(attn_mask, tgt_len, src_len):
                raise NotImplementedError("attn_mask: only a causal mask (True or a large negative value above the "
                                          "diagonal) is supported by attnjit.compat.torchscale; express other masks "
                                          "as an attnjit pattern")
            causal = True
        kept = None
        if key_padding_mask is not None:
            kept = _kept_keys(key_padding_mask, bsz, src_len)
            if kept is None:
                raise NotImplementedError("key_padding_mask: only padding at the end of each sequence is supported by "
                                          "attnjit.compat.torchscale (a [batch, src_len] mask, True at the padded keys)")
        h, d = self.num_heads, self.head_dim
        q = self.q_proj(query).view(bsz, tgt_len, h, d)
        k = self.k_proj(key).view(bsz, src_len, h, d)
        v = self.v_proj(value).view(bsz, src_len, h, d)
        p = self.pattern(causal)
        if kept is None or all(n == src_len for n in kept):
            o = attention(q, k, v, p)
        else:  # each sequence attends its own keys only: the padded ones are outside it
            o = torch.cat([attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], p) for b, n in enumerate(kept)], dim=0)
        attn = o.reshape(bsz, tgt_len, embed_dim)
        if self.inner_attn_ln is not None:
            attn = self.inner_attn_ln(attn)
        attn = self.out_proj(attn)
        return attn, None

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, segment_length={self.segment_lengths}, "
                f"dilated_ratio={self.dilation_rates}")


def from_torchscale(module):
    """attnjit.nn.MultiheadDilatedAttention with the weights of a torchscale DilatedAttention (or
    of this module's): the same projections, inner_attn_ln as its `norm`, offset rule "torchscale".
    Call it with is_causal=True where torchscale's forward had is_causal=True."""
    if hasattr(module.q_proj, "A"):
        raise NotImplementedError("args.multiway: multiway projections (q_proj.A / q_proj.B) are not supported")
    if getattr(module, "xpos", None) is not None:
        raise NotImplementedError("args.xpos_rel_pos: xPos rotary positions are not supported")
    seg, dil = _branches(module.args)
    return to_nn_module(module.embed_dim, module.num_heads, spec_of(seg, dil),
                        (module.q_proj, module.k_proj, module.v_proj, module.out_proj),
                        getattr(module, "inner_attn_ln", None), bias=True, like=module)
