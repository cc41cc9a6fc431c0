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
    # causal=True with a pattern is that pattern with a causal mask; the arguments that describe
    # LongNet branches are refused beside one (once they were dropped without a word).
    spec = {"attnjit": 1, "branches": [{"segment": 8, "dilation": 1}]}
    plain = ann.MultiheadDilatedAttention.from_pattern(32, 2, spec)
    causal = ann.MultiheadDilatedAttention.from_pattern(32, 2, spec, causal=True)
    causal.load_state_dict(plain.state_dict())
    x = torch.randn(1, 32, 32)
    assert torch.equal(causal(x, x, x)[0], plain(x, x, x, is_causal=True)[0])
    assert not torch.equal(causal(x, x, x)[0], plain(x, x, x)[0])
    for kw, named in (({"combine": "head_groups"}, "combine"), ({"offset": 3}, "offset")):
        with pytest.raises(TypeError, match=f"^{named}: describe LongNet branches, but pattern= gives the whole"):
            ann.MultiheadDilatedAttention.from_pattern(32, 2, spec, **kw)
    with pytest.raises(TypeError, match="^segment_lengths, dilation_rates: describe LongNet branches"):
        ann.MultiheadDilatedAttention(32, 2, [8], [1], pattern=spec)


def test_a_compiled_module_traces_is_causal():
    # is_causal=True builds the causal pattern on first use, which Dynamo cannot trace: a compiled
    # module's first causal call failed under fullgraph unless an eager call had come first.
    m = ann.DilatedAttention([8], [1])
    q, k, v = (torch.randn(1, 32, 2, 16) for _ in range(3))
    got = torch.compile(m, fullgraph=True, backend="eager")(q, k, v, is_causal=True)
    assert torch.equal(got, m(q, k, v, is_causal=True))
    assert not torch.equal(got, m(q, k, v))


def test_block_sparse_layout_must_be_boolean():
    layout = np.array([[1, 0], [1, 1]])
    want = ann.BlockSparseAttention(layout.astype(bool), block=16).pattern
    assert ann.BlockSparseAttention(layout, block=16).pattern == want  # 0s and 1s are booleans
    assert ann.BlockSparseAttention(torch.tensor(layout, dtype=torch.float32), block=16).pattern == want
    with pytest.raises(TypeError, match=r"^layout: expected a boolean array \(or one of 0s and 1s\), got 0.5 at \(0, 1\)"):
        ann.BlockSparseAttention(np.array([[1, 0.5], [0, 1]]), block=16)
    with pytest.raises(TypeError, match=r"^layout: .* got 2 at \(1, 0, 0\)"):
        ann.BlockSparseAttention(np.stack([layout, 2 * layout]), block=16)
    with pytest.raises(TypeError, match=r"^layout: .* got nan at \(1, 1\)"):
        ann.BlockSparseAttention(np.array([[1.0, 0.0], [0.0, np.nan]]), block=16)
    with pytest.raises(TypeError, match="^layout: expected a boolean array .* got dtype <U1"):
        ann.BlockSparseAttention(np.array([["1", "0"], ["0", "1"]]), block=16)


def test_multihead_bad_sizes_name_the_argument():
    with pytest.raises(ValueError, match="^num_heads: 0 is out of range; must be >= 1"):
        ann.MultiheadDilatedAttention(32, 0, [8], [1])
    with pytest.raises(ValueError, match="^embed_dim: -32 is out of range; must be >= 1"):
        ann.MultiheadDilatedAttention(-32, 4, [8], [1])
    with pytest.raises(ValueError, match="^num_kv_heads: 0 is out of range; must be >= 1"):
        ann.MultiheadDilatedAttention(32, 4, [8], [1], num_kv_heads=0)
    with pytest.raises(TypeError, match="^num_heads: expected an integer, got float 4.0"):
        ann.MultiheadDilatedAttention(32, 4.0, [8], [1])
    layer = ann.MultiheadDilatedAttention(32, 4, [8], [1])
    x, short = torch.randn(1, 8, 32), torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match=r"^query: expected a \[batch, seq, embed_dim=32\] tensor, got shape \(1, 8, 16\)"):
        layer(short, short, short)
    with pytest.raises(ValueError, match=r"^value: expected a \[batch, seq, embed_dim=32\] tensor, got shape \(1, 8, 16\)"):
        layer(x, x, short)
    with pytest.raises(ValueError, match=r"^key: expected a \[batch, seq, embed_dim=32\] tensor, got shape \(8, 32\)"):
        layer(x, x[0], x)
    with pytest.raises(ValueError, match="^query, key, value: batch sizes or key and value lengths differ"):
        layer(x, x, torch.randn(1, 9, 32))


def test_modules_on_empty_batches_and_sequences():
    layer = ann.MultiheadDilatedAttention(32, 4, [8, 16], [1, 2])
    for shape in ((0, 16, 32), (2, 0, 32)):
        x = torch.randn(shape, requires_grad=True)
        out, _ = layer(x, x, x)
        assert out.shape == shape
        out.sum().backward()
        assert x.grad.shape == shape


def test_packed_documents_attend_only_themselves():
    # One call over documents packed along the sequence equals a call per document.
    torch.manual_seed(0)
    layer = ann.MultiheadDilatedAttention(32, 4, [16, 64], [1, 2], num_kv_heads=2)
    docs = [0, 37, 37, 100, 128]
    x = torch.randn(1, 128, 32)
    out, _ = layer(x, x, x, cu_seqlens=docs)
    for a, b in zip(docs, docs[1:]):
        if a < b:
            alone, _ = layer(x[:, a:b], x[:, a:b], x[:, a:b])
            torch.testing.assert_close(out[:, a:b], alone, atol=1e-5, rtol=1e-5)
    plain, _ = layer(x, x, x)
    assert not torch.allclose(out, plain, atol=1e-3)  # the documents change the result
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer.attention(x.view(1, 128, 4, 8)[..., :8], x.view(1, 128, 4, 8)[:, :, :2], x.view(1, 128, 4, 8)[:, :, :2],
                        cu_seqlens=[0, 5, 100])


@pytest.mark.parametrize("segments, rates, error, message", [
    ([8.7], [2], TypeError, r"^segment_lengths\[0\]: expected an integer, got float 8.7"),
    ([8], [2.9], TypeError, r"^dilation_rates\[0\]: expected an integer, got float 2.9"),
    ([8, True], [1, 1], TypeError, r"^segment_lengths\[1\]: expected an integer, got True"),
    (["8"], [1], TypeError, r"^segment_lengths\[0\]: expected an integer, got str '8'"),
    (["full"], [1], TypeError, r'^segment_lengths\[0\]: expected an integer, got "full"; .* from_pattern\(spec\)'),
    (torch.tensor([8.5]), [2], TypeError, r"^segment_lengths\[0\]: expected an integer, got Tensor"),
    (8, [2], TypeError, r"^segment_lengths: expected a list of integers, got int 8"),
    ("[8]", [2], TypeError, r"^segment_lengths: expected a list of integers, got str '\[8\]'"),
    ([8, 0], [1, 1], ValueError, r"^segment_lengths\[1\]: 0 is out of range; must be >= 1"),
])
def test_segment_lengths_and_dilation_rates_are_integers(segments, rates, error, message):
    # They were truncated (8.7 -> 8, True -> 1, "8" -> 8); now named, with their index.
    with pytest.raises(error, match=message):
        ann.DilatedAttention(segments, rates)
    with pytest.raises(error, match=message):
        ann.MultiheadDilatedAttention(16, 2, segments, rates)
    m = ann.DilatedAttention(torch.tensor([8, 16]), np.array([1, 2]))  # integer tensors and arrays are integers
    assert m.pattern == ann.DilatedAttention([8, 16], [1, 2]).pattern


@pytest.mark.parametrize("scale, error, message", [
    (float("nan"), ValueError, r"^scale: must be a positive finite number, got nan"),
    (float("inf"), ValueError, r"^scale: must be a positive finite number, got inf"),
    (True, TypeError, r"^scale: expected a positive finite number, got bool True"),
    ("0.5", TypeError, r"^scale: expected a positive finite number, got str '0.5'"),
])
def test_dilated_attention_scale_is_a_positive_finite_number(scale, error, message):
    with pytest.raises(error, match=message):
        ann.DilatedAttention([8], [2], scale=scale)


@pytest.mark.parametrize("block, error, message", [
    (16.5, TypeError, r"^block: expected an integer, got float 16.5"),
    (True, TypeError, r"^block: expected an integer, got True"),
    ("16", TypeError, r"^block: expected an integer, got str '16'"),
    ([16, 8], TypeError, r"^block: expected an integer, got list \[16, 8\]"),
    (0, ValueError, r"^block: 0 is out of range; must be >= 1"),
])
def test_block_sparse_block_is_an_integer(block, error, message):
    with pytest.raises(error, match=message):
        ann.BlockSparseAttention(np.ones((2, 2), dtype=bool), block=block)


def test_block_sparse_layout_must_cover_the_sequence():
    # A layout of fewer blocks than ceil(S / block) was accepted: the rows past it attended nothing
    # (O = 0). A larger one is right: built for the longest sequence, its blocks past a shorter one
    # attend nothing, and the output is the cut layout's.
    small = ann.BlockSparseAttention(torch.ones(2, 2, dtype=torch.bool), block=16)
    x = torch.randn(1, 64, 1, 16)
    with pytest.raises(ValueError, match=r"^layout: \[2, 2\] blocks of 16 tokens do not cover a sequence of 64 queries "
                                         r"and 64 keys, which has 4 x 4 blocks: give a layout of at least \[4, 4\]"):
        small(x, x, x)
    lay = torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(3)) < 0.6
    lay[:, torch.arange(4), torch.arange(4)] = True
    y = torch.randn(1, 40, 2, 16)
    got = ann.BlockSparseAttention(lay, block=16)(y, y, y)
    want = ann.BlockSparseAttention(lay[:, :3, :3], block=16)(y, y, y)
    torch.testing.assert_close(got, want)
    short = torch.randn(1, 20, 1, 16)
    with pytest.raises(ValueError, match=r"which has 2 x 4 blocks: give a layout of at least \[2, 4\]"):
        small(short, x, x)  # queries 20 (2 blocks), keys 64 (4 blocks)
    assert small(x[:, :32], x[:, :32], x[:, :32]).shape == (1, 32, 1, 16)
    assert small(x[:, :25], x[:, :25], x[:, :25]).shape == (1, 25, 1, 16)  # a last block shorter
    assert small(x[:, :0], x[:, :0], x[:, :0]).shape == (1, 0, 1, 16)  # nothing attended: nothing to fit
    # Packed documents start at position 0 each: the layout covers the longest.
    assert small(x, x, x, cu_seqlens=[0, 32, 64]).shape == (1, 64, 1, 16)
    with pytest.raises(ValueError, match=r"^layout: \[2, 2\] blocks of 16 tokens cover 32 query and 32 key positions, "
                                         r"but the longest document has 40 tokens"):
        small(x, x, x, cu_seqlens=[0, 24, 64])
