"""dilated-attention-pytorch 0.2.0's modules on attnjit: `DilatedAttention(segment_lengths,
dilation_rates, softmax_scale=None, attention_dropout=0.0, op=None)` with forward(query, key,
value, is_causal=False) -> Tensor [b, n, h, d], and `MultiheadDilatedAttention(embed_dim,
num_heads, dilation_rates, segment_lengths, dropout=0.0, bias=True, layer_norm=True,
layer_norm_eps=1e-5, gamma_init=1.0, device=None, dtype=None, op=None)` (note the order: dilation
rates first) with the state-dict keys q_proj, k_proj, v_proj, norm (layer_norm) and out_proj, its
initialisation (xavier_normal_, gain gamma_init for v_proj and out_proj, zero biases) and
forward(query, key, value, is_causal=False) -> (x, None).

The answer is LongNet's head-group form: the heads cut into one contiguous group per branch (the
first heads mod branches one larger), group i attending in branch i with the residue i mod r, the
output divided by the number of groups (attnjit combine "head_groups", group_scale "mean"); any
sequence length (the last segment shorter). docs/longnet-compat.md lists where the package's code
departs from that (it divides each branch's output by its sum over the sequence, and slices heads
by the group size, so with unequal groups some heads attend nothing).

Accepted and without effect, as in the package: `op` (an xformers operator choice),
`attention_dropout` / `dropout` (stored, never applied by the package either). `softmax_scale` is
honoured (the package stores it but always uses 1/sqrt(d)). The package's head-dim limits (a
multiple of 8, at most 128; xformers') do not apply.
"""
import torch
from torch import nn

from .. import nn as ann
from .._attention import attention
from .._inputs import int_arg, scale_arg
from .._pattern import SCALE_HINT, Pattern
from ._common import check_batch_first, to_nn_module

__all__ = ["DilatedAttention", "MultiheadDilatedAttention", "from_dilated_attention_pytorch", "spec_of"]


def spec_of(segment_lengths, dilation_rates, *, softmax_scale=None, causal=False):
    """The attnjit spec of dilated-attention-pytorch's DilatedAttention: head groups, one per
    branch, offsets by branch index, the output divided by the number of groups."""
    return ann.dilated_spec(segment_lengths, dilation_rates, combine="head_groups", causal=causal, scale=softmax_scale)


def _checked(segment_lengths, dilation_rates, softmax_scale):
    """The segment lengths and dilation rates as ints and the softmax scale as a float (or None),
    each checked: TypeError or ValueError naming it (segment_lengths[1], softmax_scale)."""
    scale = None if softmax_scale is None else scale_arg("softmax_scale", softmax_scale, SCALE_HINT)
    return ann.positive_ints("segment_lengths", segment_lengths), ann.positive_ints("dilation_rates", dilation_rates), scale


class DilatedAttention(nn.Module):
    """Dilated scaled dot-product attention over query, key, value [b, n, h, d] -> [b, n, h, d]."""

    def __init__(self, segment_lengths, dilation_rates, softmax_scale=None, attention_dropout=0.0, op=None):
        super().__init__()
        _checked(segment_lengths, dilation_rates, softmax_scale)
        if len(segment_lengths) != len(dilation_rates):
            raise ValueError("segment_lengths and dilation_rates must have the same length")
        self.segment_lengths = segment_lengths
        self.dilation_rates = dilation_rates
        self.softmax_scale = softmax_scale
        self.dropout_p = attention_dropout
        self.op = op
        self._patterns = {}

    def pattern(self, is_causal=False) -> Pattern:
        """The attnjit pattern of the current segment lengths, dilation rates and softmax scale."""
        seg, dil, scale = _checked(self.segment_lengths, self.dilation_rates, self.softmax_scale)
        key = (tuple(seg), tuple(dil), scale, bool(is_causal))
        if key not in self._patterns:
            self._patterns[key] = Pattern.from_json(spec_of(key[0], key[1], softmax_scale=key[2], causal=key[3]))
        return self._patterns[key]

    def forward(self, query, key, value, is_causal=False):
        return attention(query, key, value, self.pattern(is_causal))


class MultiheadDilatedAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, dilation_rates, segment_lengths, dropout=0.0, bias=True, layer_norm=True,
                 layer_norm_eps=1e-5, gamma_init=1.0, device=None, dtype=None, op=None):
        super().__init__()
        embed_dim = int_arg("embed_dim", embed_dim, ann._POSITIVE)
        self.num_heads = num_heads = int_arg("num_heads", num_heads, ann._POSITIVE)
        self.layer_norm = layer_norm
        self.gamma_init = gamma_init
        _checked(segment_lengths, dilation_rates, None)
        if not embed_dim % self.num_heads == 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if len(dilation_rates) != len(segment_lengths):
            raise ValueError(f"len(dilation_rates) ({len(dilation_rates)}) must be equal to "
                             f"len(segment_lengths) ({len(segment_lengths)})")
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.attention = DilatedAttention(segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                          attention_dropout=dropout, op=op)
        self.norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps, **kw) if layer_norm else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self._reset_parameters()

    def _reset_parameters(self):
        for lin, gain in ((self.q_proj, 1.0), (self.k_proj, 1.0), (self.v_proj, self.gamma_init),
                          (self.out_proj, self.gamma_init)):
            nn.init.xavier_normal_(lin.weight, gain=gain)
            if lin.bias is not None:
                nn.init.constant_(lin.bias, 0)

    def forward(self, query, key, value, is_causal=False):
        check_batch_first(query, key, value)
        b, n, e = query.shape
        q = self.q_proj(query).view(b, n, self.num_heads, e // self.num_heads)
        k = self.k_proj(key).view(b, key.shape[1], self.num_heads, e // self.num_heads)
        v = self.v_proj(value).view(b, value.shape[1], self.num_heads, e // self.num_heads)
        x = self.attention(q, k, v, is_causal=is_causal).reshape(b, n, e)
        if self.layer_norm:
            x = self.norm(x)
        x = self.out_proj(x)
        return x, None


def from_dilated_attention_pytorch(module):
    """attnjit.nn.MultiheadDilatedAttention with the weights of a dilated-attention-pytorch
    MultiheadDilatedAttention (or of this module's): the same projections and norm, combine
    "head_groups". Call it with is_causal=True where the package's forward had is_causal=True."""
    att = module.attention
    spec = spec_of(att.segment_lengths, att.dilation_rates, softmax_scale=att.softmax_scale)
    norm = module.norm if module.layer_norm else None
    return to_nn_module(module.q_proj.in_features, module.num_heads, spec,
                        (module.q_proj, module.k_proj, module.v_proj, module.out_proj), norm,
                        bias=module.q_proj.bias is not None, like=module)
