"""Drop-in attention modules: LongNet's dilated attention (as dilated-attention-pytorch and
torchscale name them) and block-sparse attention, on attnjit.attention. Inputs are batch-first [B, S, H, D] (the
attention modules) or [B, S, E] (the multi-head module)."""
import json

import numpy as np
import torch
from torch import nn

from ._attention import attention
from ._inputs import documents_arg, int_arg, scale_arg
from ._pattern import SCALE_HINT, Pattern, as_pattern

_POSITIVE = (1, 2**63 - 1)


def positive_ints(name, values, limits=_POSITIVE):
    """A list (tuple, array, 1-D tensor) of integers as Python ints, each checked by int_arg and
    named by its index (`segment_lengths[1]`): a float, a bool or a string is a TypeError."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or getattr(values, "ndim", 1) != 1:
        raise TypeError(f"{name}: expected a list of integers, got {type(values).__name__} {values!r}")
    out = []
    for i, x in enumerate(values):
        if isinstance(x, str) and x == "full":
            raise TypeError(f'{name}[{i}]: expected an integer, got "full"; a segment over the whole sequence is a '
                            'spec\'s {"segment": "full"}: build the module with from_pattern(spec)')
        out.append(int_arg(f"{name}[{i}]", x, limits))
    return out


def dilated_spec(segment_lengths, dilation_rates, *, combine="softmax", offset=None, causal=False, scale=None) -> dict:
    """The spec of LongNet dilated attention: one branch per (segment length, dilation rate)."""
    segment_lengths = positive_ints("segment_lengths", segment_lengths)
    dilation_rates = positive_ints("dilation_rates", dilation_rates)
    if len(segment_lengths) != len(dilation_rates) or not segment_lengths:
        raise ValueError(f"segment_lengths and dilation_rates: expected equal, non-empty lists, got "
                         f"{len(segment_lengths)} and {len(dilation_rates)}")
    spec = {"attnjit": 1, "combine": combine,
            "branches": [{"segment": w, "dilation": r} for w, r in zip(segment_lengths, dilation_rates)]}
    if offset is not None:
        for b in spec["branches"]:
            b["offset"] = offset
    if causal:
        spec["causal"] = True
    if scale is not None:
        spec["scale"] = scale_arg("scale", scale, SCALE_HINT)
    return spec


def _causal_variant(p: Pattern) -> Pattern:
    d = json.loads(p.spec)
    d["causal"] = True
    return Pattern.from_json(d)


@torch.compiler.assume_constant_result
def _causal_text(op_spec: str) -> str:
    """The causal variant's spec as JSON text, which attention() takes as a pattern: what a
    compiled call with is_causal=True passes (building a Pattern is not traceable; this runs when
    traced and its text is a constant of the graph)."""
    return _causal_variant(Pattern.from_json(json.loads(op_spec))).op_spec


class _PatternAttention(nn.Module):
    """Attention of a fixed pattern over q, k, v [B, S, H, D]; `is_causal=True` at call time adds a
    causal mask to a pattern that has none."""

    def __init__(self, pattern):
        super().__init__()
        self.pattern = as_pattern(pattern)
        self._causal = None
        self._parallel = None
        self._layouts = {}  # layout="auto": best_layout's answer per (pattern, length, heads, ranks)

    @classmethod
    def from_pattern(cls, pattern):
        m = _PatternAttention.__new__(cls)
        _PatternAttention.__init__(m, pattern)
        return m

    def sequence_parallel(self, group=None, *, layout="contiguous", strategy="ring", head_parallel: int = 1):
        """From now on q, k, v are this rank's shard of a sequence split across `group` (as
        attnjit.distributed.shard cuts it with the same `layout`), and so is the output:
        attnjit.distributed.ring_attention does the rest. layout="auto": the layout under which
        this pattern's work is shared out most evenly at the call's length and head counts
        (attnjit.distributed.best_layout); sequence_layout() says which, to shard with.
        `head_parallel`: ring_attention's head parallelism (u consecutive ranks trade heads for rows
        by an all_to_all; u divides the group's size and the head counts). Returns the module."""
        from . import distributed

        if layout != "auto":
            distributed._check_layout(layout)
        if strategy not in distributed.STRATEGIES:
            raise ValueError(f"strategy: expected one of {', '.join(distributed.STRATEGIES)}, got {strategy!r}")
        if isinstance(head_parallel, bool) or not isinstance(head_parallel, int) or head_parallel < 1:
            raise ValueError(f"head_parallel: expected a positive int, got {head_parallel!r}")
        self._parallel = (group, layout, strategy, head_parallel)
        return self

    def _pattern_for(self, is_causal, as_spec=False):
        """The pattern of a call; `as_spec`: a dict will do (attention's pattern argument)."""
        if not is_causal:
            return self.pattern
        if self._causal is None:
            if as_spec and torch.compiler.is_compiling():
                return _causal_text(self.pattern.op_spec)
            self._causal = _causal_variant(self.pattern)
        return self._causal

    def sequence_layout(self, seq_len: int, heads_q: int, heads_kv: int = None, *, is_causal=None, cu_seqlens=None):
        """The layout the sequence-parallel calls over `seq_len` tokens use (shard q, k, v with it):
        the one given to sequence_parallel, or for "auto" best_layout's for this pattern (with the
        causal mask when is_causal), these head counts, the group's size and the packed documents
        `cu_seqlens` if given."""
        if self._parallel is None:
            raise RuntimeError("sequence_layout: the module is not sequence-parallel; call sequence_parallel() first")
        group, layout = self._parallel[:2]
        if layout != "auto":
            return layout
        from . import distributed

        p, w = self._pattern_for(is_causal), distributed._group_rank(group)[0]
        docs = distributed.check_documents(cu_seqlens, seq_len)
        key = (p.hash, seq_len, heads_q, heads_q if heads_kv is None else heads_kv, w,
               None if docs is None else tuple(int(x) for x in docs))
        if key not in self._layouts:
            self._layouts[key] = distributed.best_layout(p, seq_len, heads_q, heads_kv, world_size=w, cu_seqlens=docs)
        return self._layouts[key]

    def forward(self, q, k, v, is_causal=None, cu_seqlens=None):
        """q [B, S, Hq, D], k and v [B, S, Hkv, D] (a rank's shard when sequence-parallel);
        `cu_seqlens`: packed documents (batch 1), as attnjit.attention takes them, over the whole
        sequence when sequence-parallel."""
        p = self._pattern_for(is_causal, as_spec=self._parallel is None)
        if self._parallel is not None:
            from . import distributed

            group, _, strategy, head_parallel = self._parallel
            layout = self.sequence_layout(q.shape[1] * distributed._group_rank(group)[0], q.shape[2], k.shape[2],
                                          is_causal=is_causal, cu_seqlens=cu_seqlens)
            return distributed.ring_attention(q, k, v, p, group=group, layout=layout, strategy=strategy,
                                              head_parallel=head_parallel, cu_seqlens=cu_seqlens)
        return attention(q, k, v, p, cu_seqlens=cu_seqlens)

    def extra_repr(self):
        return f"pattern={self.pattern.hash}" + (f", sequence_parallel={self._parallel[1:]}" if self._parallel else "")


class DilatedAttention(_PatternAttention):
    """LongNet dilated attention over q, k, v [B, S, H, D] -> [B, S, H, D].

    combine="softmax": one softmax over every branch's keys (LongNet's mixing, with exact
    gradients); "head_groups": heads split into one group per branch, outputs divided by the number
    of groups (dilated-attention-pytorch's DilatedAttention). `offset`: which residue a head selects
    ("head_mod", "head_block", "torchscale", "group" or an integer; default per combine rule).
    """

    def __init__(self, segment_lengths, dilation_rates, *, combine="softmax", offset=None, causal=False, scale=None):
        super().__init__(Pattern.from_json(dilated_spec(segment_lengths, dilation_rates, combine=combine, offset=offset,
                                                        causal=causal, scale=scale)))


class BlockSparseAttention(_PatternAttention):
    """Block-sparse attention over q, k, v [B, S, H, D]: `layout` is a boolean [Qb, Kb] (every head)
    or [H, Qb, Kb] (per head) array of kept (query block, key block) pairs, `block` tokens a side."""

    def __init__(self, layout, *, block=128, causal=False):
        lay = _boolean_layout(layout)
        block = int_arg("block", block, _POSITIVE)
        if lay.ndim == 2:
            explicit = {"blocks": [[int(a), int(b)] for a, b in np.argwhere(lay)]}
        elif lay.ndim == 3:
            explicit = {"per_head": [[[int(a), int(b)] for a, b in np.argwhere(h)] for h in lay]}
        else:
            raise ValueError(f"layout: expected a [Qb, Kb] or [H, Qb, Kb] boolean array, got shape {lay.shape}")
        spec = {"attnjit": 1, "layout": {"block": block, "explicit": explicit}, "branches": [{"segment": "full"}]}
        if causal:
            spec["causal"] = True
        super().__init__(Pattern.from_json(spec))
        self.layout_shape, self.block = tuple(lay.shape), block

    def forward(self, q, k, v, is_causal=None, cu_seqlens=None):
        """As _PatternAttention's, the layout's blocks first checked against the sequence: [Qb, Kb]
        must be at least [ceil(Sq / block), ceil(Sk / block)] (with packed documents: cover the
        longest); blocks past the sequence attend nothing."""
        if getattr(self, "layout_shape", None) is not None and q.dim() == 4 and k.dim() == 4:
            self._check_layout(q.shape[1], k.shape[1], cu_seqlens)
        return super().forward(q, k, v, is_causal=is_causal, cu_seqlens=cu_seqlens)

    def _check_layout(self, seq_q, seq_k, cu_seqlens):
        if self._parallel is not None:  # a rank's shard: the layout covers the whole sequence
            from . import distributed

            w = distributed._group_rank(self._parallel[0])[0]
            seq_q, seq_k = seq_q * w, seq_k * w
        if seq_q == 0 or seq_k == 0:
            return  # nothing is attended
        qb, kb = self.layout_shape[-2:]
        docs = documents_arg(cu_seqlens)
        if docs is not None:  # each document from position 0: the layout must reach the longest's end
            longest = max((b - a for a, b in zip(docs, docs[1:])), default=0)
            need = -(-longest // self.block)
            if qb >= need and kb >= need:
                return
            raise ValueError(f"layout: {list(self.layout_shape)} blocks of {self.block} tokens cover "
                             f"{qb * self.block} query and {kb * self.block} key positions, but the longest document "
                             f"has {longest} tokens: give a layout of at least {need} x {need} blocks")
        need_q, need_k = -(-seq_q // self.block), -(-seq_k // self.block)
        if qb < need_q or kb < need_k:  # larger is fine: blocks past the sequence attend nothing
            want = list(self.layout_shape[:-2]) + [need_q, need_k]
            raise ValueError(f"layout: {list(self.layout_shape)} blocks of {self.block} tokens do not cover a sequence "
                             f"of {seq_q} queries and {seq_k} keys, which has {need_q} x {need_k} blocks: give a layout "
                             f"of at least {want} (one for the longest sequence serves every shorter one)")


def _boolean_layout(layout):
    """`layout` as a numpy bool array: booleans, or numbers that are all 0 or 1 (TypeError otherwise)."""
    lay = np.asarray(layout.cpu() if isinstance(layout, torch.Tensor) else layout)
    if lay.dtype == bool:
        return lay
    if lay.dtype.kind not in "iuf":
        raise TypeError(f"layout: expected a boolean array (or one of 0s and 1s), got dtype {lay.dtype}")
    bad = np.argwhere((lay != 0) & (lay != 1))
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        raise TypeError(f"layout: expected a boolean array (or one of 0s and 1s), got {lay[at].item()!r} at {at}")
    return lay.astype(bool)


class MultiheadDilatedAttention(nn.Module):
    """LongNet's multi-head dilated attention on batch-first [B, S, E] inputs: q/k/v projections,
    DilatedAttention, a sub-layer LayerNorm before the output projection (as in torchscale), the
    output projection. forward(query, key, value, is_causal=None) returns (output, None), as the
    dilated-attention-pytorch's module and torch.nn.MultiheadAttention do.

    `num_kv_heads` < num_heads gives grouped-query attention. `dropout` applies to the attention
    output in training (the fused kernels have no dropout on the probabilities).
    """

    def __init__(self, embed_dim, num_heads, segment_lengths, dilation_rates, *, dropout=0.0, bias=True,
                 layer_norm=True, causal=False, num_kv_heads=None, combine="softmax", offset=None, device=None,
                 dtype=None, pattern=None):
        super().__init__()
        embed_dim, num_heads = int_arg("embed_dim", embed_dim, _POSITIVE), int_arg("num_heads", num_heads, _POSITIVE)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        num_kv_heads = num_heads if num_kv_heads is None else int_arg("num_kv_heads", num_kv_heads, _POSITIVE)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=bias, **kw)
        if pattern is None:
            self.attention = DilatedAttention(segment_lengths, dilation_rates, combine=combine, offset=offset, causal=causal)
        else:
            # The pattern is the whole attention: arguments that describe another would be dropped
            # without a word. causal=True is the one that composes: the pattern with a causal mask.
            given = [name for name, value in (("segment_lengths", segment_lengths), ("dilation_rates", dilation_rates))
                     if value is not None and len(value)]
            given += [name for name, value, default in (("combine", combine, "softmax"), ("offset", offset, None))
                      if not (value is default or value == default)]
            if given:
                raise TypeError(f"{', '.join(given)}: describe LongNet branches, but pattern= gives the whole attention; "
                                "put them in the pattern's spec (a branch's \"segment\", \"dilation\", \"offset\"; "
                                "\"combine\"), or leave pattern out")
            p = as_pattern(pattern)
            self.attention = _PatternAttention.from_pattern(_causal_variant(p) if causal else p)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(embed_dim, **kw) if layer_norm else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_normal_(lin.weight)
        nn.init.xavier_normal_(self.out_proj.weight, gain=0.5)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    @classmethod
    def from_pattern(cls, embed_dim, num_heads, pattern, **kwargs):
        return cls(embed_dim, num_heads, [], [], pattern=pattern, **kwargs)

    def sequence_parallel(self, group=None, *, layout="contiguous", strategy="ring", head_parallel: int = 1):
        """Inputs and outputs become this rank's shard [B, S/W, E] of a sequence split across
        `group` (attnjit.distributed.shard with the same `layout`, or with sequence_layout()'s for
        layout="auto"); the projections and the norm are per token, the attention runs
        attnjit.distributed.ring_attention (with `head_parallel`, its head parallelism). Returns the
        module."""
        self.attention.sequence_parallel(group, layout=layout, strategy=strategy, head_parallel=head_parallel)
        return self

    def sequence_layout(self, seq_len: int, *, is_causal=None, cu_seqlens=None):
        """The layout to shard inputs of `seq_len` tokens with (see sequence_parallel)."""
        return self.attention.sequence_layout(seq_len, self.num_heads, self.num_kv_heads, is_causal=is_causal,
                                              cu_seqlens=cu_seqlens)

    def forward(self, query, key, value, is_causal=None, cu_seqlens=None):
        """query, key, value [B, S, E] (a rank's shard when sequence-parallel); `cu_seqlens`:
        packed documents (batch 1) as attnjit.attention takes them: each attends only itself.
        Returns (output, None), as torch.nn.MultiheadAttention without weights."""
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 3 or x.shape[2] != self.embed_dim:
                raise ValueError(f"{name}: expected a [batch, seq, embed_dim={self.embed_dim}] tensor, got shape "
                                 f"{tuple(x.shape)}")
        if not query.shape[0] == key.shape[0] == value.shape[0] or key.shape[1] != value.shape[1]:
            raise ValueError(f"query, key, value: batch sizes or key and value lengths differ ({tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)})")
        b, s, _ = query.shape
        q = self.q_proj(query).view(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(key).view(b, key.shape[1], self.num_kv_heads, self.head_dim)
        v = self.v_proj(value).view(b, value.shape[1], self.num_kv_heads, self.head_dim)
        x = self.attention(q, k, v, is_causal=is_causal, cu_seqlens=cu_seqlens).reshape(b, s, self.embed_dim)
        x = self.dropout(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.out_proj(x), None
