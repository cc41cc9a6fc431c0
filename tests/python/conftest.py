"""Shared pieces of the Python tests: the examples, the contract (docs/spec.md) written again in
PyTorch, dense, in float64, from the pattern's mask counts, and attnjit.distributed's cases."""
import json
import os
import pathlib

import pytest
import torch

import attnjit

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def example_specs():
    return sorted(p for p in EXAMPLES.glob("*.json") if p.name != "manifest.json")


def output_factor(pattern):
    spec = json.loads(pattern.spec)
    if spec.get("combine") == "head_groups" and spec.get("group_scale", "mean") == "mean":
        return 1.0 / len(spec["branches"])
    return 1.0


def _dense_softmax(q, k, pattern, q_offset, k_offset, scale):
    """(p, m, den): the contract's probabilities [B, H, Sq, Sk] (keys weighted by their branch
    counts; zero rows where nothing is attended), the row max and the denominator."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    counts = torch.from_numpy(pattern.mask(sq, hq, sk, hkv, q_offset, k_offset)).to(torch.float64)  # [H, Sq, Sk]
    spec = json.loads(pattern.spec)
    if scale is None:
        scale = spec.get("scale", 1.0 / d ** 0.5)
    kk = k.to(torch.float64).repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(torch.float64), kk) * scale
    live = counts > 0
    s = s.masked_fill(~live, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = counts * torch.exp(s - m)
    den = w.sum(dim=-1, keepdim=True)
    p = torch.where(den > 0, w / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(w))
    return p, m, den


def dense_attention(q, k, v, pattern, q_offset=0, k_offset=0, scale=None):
    """The contract, dense: one softmax per (head, row) over the keys weighted by how many branches
    attend them; rows that attend nothing give O = 0 and LSE = -inf. Differentiable."""
    p, m, den = _dense_softmax(q, k, pattern, q_offset, k_offset, scale)
    vv = v.to(torch.float64).repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv) * output_factor(pattern)
    lse = torch.where(den[..., 0] > 0, torch.log(torch.where(den[..., 0] > 0, den[..., 0], torch.ones_like(den[..., 0]))) + m[..., 0],
                      torch.full_like(m[..., 0], float("-inf")))
    return o, lse


def dense_weights(q, k, pattern, q_offset=0, k_offset=0, scale=None):
    """The contract's attention weights [B, Hq, Sq, Sk], float64: O = W V."""
    return _dense_softmax(q, k, pattern, q_offset, k_offset, scale)[0] * output_factor(pattern)


def rel_error(got, want):
    got, want = got.detach().to(torch.float64), want.detach().to(torch.float64)
    den = torch.linalg.vector_norm(want)
    return float(torch.linalg.vector_norm(got - want) / (den if den > 0 else 1.0))


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the GPU subset is skipped")


# attnjit.distributed's cases (test_distributed.py over gloo, test_comm_plan.py in one process).
LONGNET = {"attnjit": 1, "branches": [{"segment": 64, "dilation": 1}, {"segment": 256, "dilation": 2},
                                      {"segment": 512, "dilation": 4}]}
CASES = {
    "longnet": (LONGNET, 4, 4),
    "longnet-gqa": (LONGNET, 4, 2),
    "causal": ({"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}, 2, 2),
    "block-sparse local+global": ({"attnjit": 1, "layout": {"block": 16, "union": [{"local": 1}, {"global": [0, 5]}]},
                                   "branches": [{"segment": "full"}]}, 2, 1),
    "sliding window": ({"attnjit": 1, "causal": True, "window": [47, 0], "branches": [{"segment": "full"}]}, 2, 2),
    "head_groups": ({"attnjit": 1, "combine": "head_groups", "branches": [{"segment": 128, "dilation": 1},
                                                                         {"segment": 512, "dilation": 2}]}, 4, 4),
}
SEQ, HEAD_DIM = 512, 16  # ring_inputs: batch 2 of SEQ rows
# A global block (rows [0, 32) attend every key and every row attends them) beside a sliding window:
# its rows attend over 4 times the mean row's keys, so the ring computes them where their keys are.
GLOBAL_ROWS = {"attnjit": 1, "layout": {"block": 16, "union": [{"local": 1}, {"global": [0, 1]}]},
               "branches": [{"segment": "full"}]}


def ring_inputs(hq, hkv, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, SEQ, hq, HEAD_DIM, generator=g)
    k = torch.randn(2, SEQ, hkv, HEAD_DIM, generator=g)
    v = torch.randn(2, SEQ, hkv, HEAD_DIM, generator=g)
    do = torch.randn(2, SEQ, hq, HEAD_DIM, generator=g)
    return [x.to(dtype) for x in (q, k, v, do)]
