"""FP8 inputs for attnjit.attention: quantising torch tensors to e4m3 codes with descale factors,
and incoherent processing (FlashAttention-3's): q and k rotated by one random orthogonal matrix
before they are quantised, which leaves every score q . k unchanged and spreads a channel's
outliers over all channels, so e4m3's few mantissa bits lose less.

    import attnjit.fp8
    x = attnjit.fp8.quantize(q, k, v, incoherent=True)          # codes and descales
    o = attnjit.attention(x.q, x.k, x.v, pattern, **x.descales)  # bf16 O
    o = attnjit.fp8.attention(q, k, v, pattern, incoherent=True) # the same, in one call
"""
from typing import NamedTuple

import torch

from ._attention import attention as _attention

E4M3_MAX = 448.0


class Fp8Inputs(NamedTuple):
    q: torch.Tensor  # torch.float8_e4m3fn, [B, Sq, Hq, D]
    k: torch.Tensor  # [B, Sk, Hkv, D]
    v: torch.Tensor  # [B, Sk, Hkv, Dv]
    q_descale: torch.Tensor  # fp32 [B, Hkv]: the input a code stands for is code x its factor
    k_descale: torch.Tensor
    v_descale: torch.Tensor

    @property
    def descales(self):
        """The keyword arguments attnjit.attention takes them as."""
        return {"q_descale": self.q_descale, "k_descale": self.k_descale, "v_descale": self.v_descale}


def rotation(d, seed=0, device=None):
    """A random orthogonal d x d matrix (float64; the Q factor of a seeded normal matrix, its columns'
    signs fixed so that the distribution is uniform over rotations)."""
    g = torch.Generator().manual_seed(seed)
    qr, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (qr * torch.sign(torch.diagonal(r))).to(device)


def _quantize(x, heads_kv):
    """x [B, S, H, D] as e4m3 codes of x / f with one factor f per (batch, kv head): the group's
    largest finite magnitude over 448 (1 where it is 0), so that nothing saturates. NaN and +-inf
    become the NaN code where they are (e4m3fn has no infinity; torch's conversion would saturate
    inf to 448), so only what attends them is non-finite, and the rest of their group keeps its factor."""
    b, s, h, d = x.shape
    group = x.detach().to(torch.float32).reshape(b, s, heads_kv, h // heads_kv, d)
    finite = torch.isfinite(group)
    amax = torch.where(finite, group.abs(), 0.0).amax(dim=(1, 3, 4))  # [B, Hkv]
    # (amax / 448 underflows below float32's smallest normal: the factor stays positive there)
    f = torch.where(amax > 0, (amax / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny), torch.ones_like(amax))
    scaled = torch.where(finite, group / f[:, None, :, None, None], float("nan"))
    return scaled.reshape(b, s, h, d).to(torch.float8_e4m3fn), f.contiguous()


def quantize(q, k, v, *, incoherent=False, seed=0):
    """q, k, v (any float dtype, [B, S, H, D]) as FP8 e4m3 codes with per-(batch, kv head) descale
    factors (Fp8Inputs), from each group's largest finite magnitude; NaN and +-inf become the NaN
    code in their own places. `incoherent`: q and k are first multiplied by one random orthogonal
    matrix (rotation(D, seed)), which changes no score and cuts the quantisation error of inputs
    whose magnitude sits in a few channels (a non-finite channel then makes its whole row NaN)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point torch tensor [batch, seq, heads, head_dim]")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q, k: head dims differ ({q.shape[3]} and {k.shape[3]})")
    heads_kv = k.shape[2]
    if heads_kv == 0 or q.shape[2] % heads_kv or v.shape[2] != heads_kv:
        raise ValueError(f"q, k, v: heads {q.shape[2]}, {heads_kv}, {v.shape[2]} do not make query groups over kv heads")
    if incoherent:
        r = rotation(q.shape[3], seed, q.device)
        q = (q.to(torch.float64) @ r).to(torch.float32)
        k = (k.to(torch.float64) @ r).to(torch.float32)
    q8, qf = _quantize(q, heads_kv)
    k8, kf = _quantize(k, heads_kv)
    v8, vf = _quantize(v, heads_kv)
    return Fp8Inputs(q8, k8, v8, qf, kf, vf)


def attention(q, k, v, pattern, *, incoherent=False, seed=0, out_dtype=None, **kwargs):
    """attnjit.attention on q, k, v quantised to FP8 (quantize): forward only, O in out_dtype
    (bfloat16 by default). Other keyword arguments are attnjit.attention's."""
    x = quantize(q, k, v, incoherent=incoherent, seed=seed)
    return _attention(x.q, x.k, x.v, pattern, out_dtype=out_dtype, **x.descales, **kwargs)
