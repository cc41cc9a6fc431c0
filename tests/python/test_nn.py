"""attnjit.nn: the drop-in modules: shapes, masks, a few training steps, state_dict round trip."""
import numpy as np
import pytest
import torch

import attnjit
import attnjit.nn as ann
from conftest import EXAMPLES, dense_attention, rel_error


def test_dilated_attention_is_the_pattern_it_names():
    m = ann.DilatedAttention([16, 32], [1, 2])
    q, k, v = (torch.randn(2, 70, 4, 8) for _ in range(3))
    want, _ = dense_attention(q, k, v, m.pattern)
    assert rel_error(m(q, k, v), want) <= 1e-5
    # is_causal at call time adds the causal mask.
    causal = attnjit.Pattern.from_json({"attnjit": 1, "causal": True,
                                        "branches": [{"segment": 16, "dilation": 1}, {"segment": 32, "dilation": 2}]})
    want_c, _ = dense_attention(q, k, v, causal)
    assert rel_error(m(q, k, v, is_causal=True), want_c) <= 1e-5
    with pytest.raises(ValueError, match="equal, non-empty lists"):
        ann.DilatedAttention([16, 32], [1])


def test_block_sparse_attention_keeps_the_listed_blocks():
    layout = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=bool)
    m = ann.BlockSparseAttention(layout, block=16)
    mask = m.pattern.mask(48, 2)
    for qb in range(3):
        for kb in range(3):
            assert (mask[:, qb * 16:(qb + 1) * 16, kb * 16:(kb + 1) * 16] == layout[qb, kb]).all()
    q, k, v = (torch.randn(1, 48, 2, 8) for _ in range(3))
    want, _ = dense_attention(q, k, v, m.pattern)
    assert rel_error(m(q, k, v), want) <= 1e-5
    per_head = ann.BlockSparseAttention(np.stack([layout, layout.T]), block=16)
    mask = per_head.pattern.mask(48, 2)
    assert (mask[0, :16, 16:32] == 0).all() and (mask[1, :16, 16:32] == 1).all()  # layout[0, 1] = 0, layout.T[0, 1] = 1


def test_multihead_dilated_attention_trains():
    torch.manual_seed(0)
    layer = ann.MultiheadDilatedAttention(32, 4, [8, 16], [1, 2], num_kv_heads=2)
    x = torch.randn(4, 48, 32)
    target = torch.randn(4, 48, 32)
    out, weights = layer(x, x, x)
    assert out.shape == (4, 48, 32) and weights is None
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(layer(x, x, x)[0], target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_state_dict_round_trip():
    a = ann.MultiheadDilatedAttention(32, 4, [8, 16], [1, 2])
    b = ann.MultiheadDilatedAttention(32, 4, [8, 16], [1, 2])
    b.load_state_dict(a.state_dict())
    assert set(a.state_dict()) >= {"q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "norm.weight"}
    x = torch.randn(2, 40, 32)
    assert torch.equal(a(x, x, x)[0], b(x, x, x)[0])


def test_modules_from_a_pattern():
    p = attnjit.Pattern.load(EXAMPLES / "seed_dilated.json")
    layer = ann.MultiheadDilatedAttention.from_pattern(48, 6, p)
    x = torch.randn(1, 64, 48)
    assert layer(x, x, x)[0].shape == (1, 64, 48)
    assert ann.DilatedAttention.from_pattern(p).pattern == p
