"""attnjit.compat: the modules of torchscale and dilated-attention-pytorch (neither installed
here) by their signatures and state-dict layouts written down below, their answers in float64
against brute-force implementations of the semantics they intend (LongNet's), written here from the
definitions; and the "torchscale" offset rule on the reference, the plan executor and the emulator."""
import inspect
import math
import types

import pytest
import torch

import attnjit
import attnjit.nn as ann
from attnjit.compat import dilated_attention_pytorch as dap
from attnjit.compat import from_dilated_attention_pytorch, from_torchscale
from attnjit.compat import torchscale as ts
from conftest import rel_error

E = inspect.Parameter.empty

# The peers' signatures: torchscale/component/dilated_attention.py (GitHub master; the constructor is
# MultiheadAttention's) and dilated_attention_pytorch/dilated_attention.py (0.2.0).
TORCHSCALE_INIT = [("args", E), ("embed_dim", E), ("num_heads", E), ("dropout", 0.0), ("self_attention", False),
                   ("encoder_decoder_attention", False), ("subln", False)]
TORCHSCALE_FORWARD = [("query", E), ("key", E), ("value", E), ("incremental_state", None), ("key_padding_mask", None),
                      ("attn_mask", None), ("rel_pos", None), ("is_first_step", False), ("is_causal", False)]
DAP_ATTENTION_INIT = [("segment_lengths", E), ("dilation_rates", E), ("softmax_scale", None),
                      ("attention_dropout", 0.0), ("op", None)]
DAP_FORWARD = [("query", E), ("key", E), ("value", E), ("is_causal", False)]
DAP_MULTIHEAD_INIT = [("embed_dim", E), ("num_heads", E), ("dilation_rates", E), ("segment_lengths", E),
                      ("dropout", 0.0), ("bias", True), ("layer_norm", True), ("layer_norm_eps", 1e-5),
                      ("gamma_init", 1.0), ("device", None), ("dtype", None), ("op", None)]


def torchscale_keys(e, subln):
    """torchscale's DilatedAttention state dict (no multiway): k, v, q, out projections in that
    order, then inner_attn_ln under subln."""
    keys = []
    for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
        keys += [(f"{name}.weight", (e, e)), (f"{name}.bias", (e,))]
    if subln:
        keys += [("inner_attn_ln.weight", (e,)), ("inner_attn_ln.bias", (e,))]
    return keys


def dap_keys(e, bias, layer_norm):
    """dilated-attention-pytorch's MultiheadDilatedAttention state dict."""
    keys = []
    for name in ("q_proj", "k_proj", "v_proj", "norm", "out_proj"):
        if name == "norm":
            if layer_norm:
                keys += [("norm.weight", (e,)), ("norm.bias", (e,))]
            continue
        keys.append((f"{name}.weight", (e, e)))
        if bias:
            keys.append((f"{name}.bias", (e,)))
    return keys


def params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def ts_args(segments, rates, **kw):
    base = dict(segment_length=list(segments), dilated_ratio=list(rates), layernorm_eps=1e-5, multiway=False,
                xpos_rel_pos=False, xpos_scale_base=512, flash_attention=True, seq_parallel=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


def torchscale_offset(h, heads, r):
    """torchscale pads the heads to a multiple of r and gives each residue ceil(H/r) heads."""
    return h // math.ceil(heads / r)


def branch_mask(sq, sk, w, r, off, causal):
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    m = (i // w == j // w) & ((i % w) % r == off) & ((j % w) % r == off)
    return m & (j <= i) if causal else m


def softmax_over_counts(q, k, v, counts, scale):
    """O [B, S, H, D]: per head and row, one softmax over the keys weighted by counts [H, Sq, Sk]
    (a key two branches attend counts twice); rows with no keys 0."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = s.masked_fill(counts == 0, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = counts * torch.exp(s - m)
    den = w.sum(dim=-1, keepdim=True)
    p = torch.where(den > 0, w / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(w))
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def longnet_torchscale(q, k, v, segments, rates, causal=False, kept=None):
    """LongNet's dilated attention with torchscale's head offsets, by the definition."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    counts = torch.zeros(h, sq, sk, dtype=torch.float64)
    for hh in range(h):
        for w, r in zip(segments, rates):
            counts[hh] += branch_mask(sq, sk, w, r, torchscale_offset(hh, h, r), causal).to(torch.float64)
    if kept is None:
        return softmax_over_counts(q, k, v, counts, d ** -0.5)
    outs = []
    for n in range(b):
        c = counts.clone()
        c[:, :, kept[n]:] = 0
        outs.append(softmax_over_counts(q[n:n + 1], k[n:n + 1], v[n:n + 1], c, d ** -0.5))
    return torch.cat(outs)


def longnet_head_groups(q, k, v, segments, rates, causal=False, scale=None):
    """LongNet's head-group form as dilated-attention-pytorch intends it: contiguous groups (the
    first heads mod k one larger, placed by a running total), group g in branch g with residue
    g mod r, the output divided by the number of groups."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    groups = len(segments)
    sizes = [h // groups + (1 if g < h % groups else 0) for g in range(groups)]
    counts = torch.zeros(h, sq, sk, dtype=torch.float64)
    start = 0
    for g, (w, r, size) in enumerate(zip(segments, rates, sizes)):
        for hh in range(start, start + size):
            counts[hh] = branch_mask(sq, sk, w, r, g % r, causal).to(torch.float64)
        start += size
    return softmax_over_counts(q, k, v, counts, d ** -0.5 if scale is None else scale) / groups


def rand(*shape, seed, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(requires_grad)


# The offset rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("heads,r", [(6, 4), (4, 8), (5, 3), (8, 4), (7, 2)])
def test_torchscale_offset_rule_mask(heads, r):
    w = 2 * r
    spec = {"attnjit": 1, "branches": [{"segment": w, "dilation": r, "offset": "torchscale"}]}
    p = attnjit.Pattern.from_json(spec)
    assert "offset=torchscale" in p.canonical
    seq = 2 * w + 3
    got = torch.from_numpy(p.mask(seq, heads))
    for h in range(heads):
        want = branch_mask(seq, seq, w, r, torchscale_offset(h, heads, r), False)
        assert torch.equal(got[h] > 0, want), f"head {h}"
    if (heads, r) in ((6, 4), (4, 8)):  # not head_block's floor(h * r / H) (which it equals where r divides H)
        hb = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": w, "dilation": r, "offset": "head_block"}]})
        assert not (torch.from_numpy(hb.mask(seq, heads)) == got).all()


@pytest.mark.parametrize("device", ["reference", "cpu", "emu"])
def test_torchscale_offset_rule_on_every_path(device, monkeypatch):
    segments, rates = [8, 12, 20], [1, 4, 8]
    p = attnjit.Pattern.from_json(ts.spec_of(segments, rates))
    for heads in (6, 4):
        q, k, v = (rand(1, 45, heads, 32, seed=heads * 10 + n) for n in range(3))
        want = longnet_torchscale(q, k, v, segments, rates)
        if device == "reference":
            got, tol = attnjit.attention(q, k, v, p), 1e-12
        else:
            if device == "emu":
                monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
            got, tol = attnjit.attention(q.float(), k.float(), v.float(), p), 1e-5
        assert rel_error(got, want) <= tol, f"H={heads}"


# torchscale ------------------------------------------------------------------------------------


def test_torchscale_signatures_and_state_dict_layout():
    assert params(ts.DilatedAttention.__init__)[1:] == TORCHSCALE_INIT
    assert params(ts.DilatedAttention.forward)[1:] == TORCHSCALE_FORWARD
    for subln in (False, True):
        m = ts.DilatedAttention(ts_args([8, 16], [1, 2]), 32, 4, self_attention=True, subln=subln)
        assert [(n, tuple(t.shape)) for n, t in m.state_dict().items()] == torchscale_keys(32, subln)
        checkpoint = {n: torch.randn(s) for n, s in torchscale_keys(32, subln)}
        m.load_state_dict(checkpoint, strict=True)
    m = ts.DilatedAttention(ts_args([8], [1]), 32, 4, self_attention=True, subln=True)
    assert m.inner_attn_ln.eps == 1e-5 and m.scaling == 8 ** -0.5 and m.head_dim == 8
    m.reset_parameters()
    assert (m.out_proj.bias == 0).all()
    assert ts.DilatedAttention(ts_args([8], [1]), 32, 4, encoder_decoder_attention=True, subln=True).inner_attn_ln is None
    with pytest.raises(ValueError, match="self_attention, encoder_decoder_attention"):
        ts.DilatedAttention(ts_args([8], [1]), 32, 4)


@pytest.mark.parametrize("causal", [False, True])
def test_torchscale_module_is_longnet(causal):
    # H = 6 heads at rates 4 and 8 (r does not divide H), 45 tokens: not a multiple of any segment.
    segments, rates = [8, 12, 24], [1, 4, 8]
    m = ts.DilatedAttention(ts_args(segments, rates), 48, 6, self_attention=True, subln=True).double().eval()
    x = rand(2, 45, 48, seed=1)
    out, weights = m(x, x, x, is_causal=causal)
    assert weights is None
    q = m.q_proj(x).view(2, 45, 6, 8)
    k = m.k_proj(x).view(2, 45, 6, 8)
    v = m.v_proj(x).view(2, 45, 6, 8)
    want = m.out_proj(m.inner_attn_ln(longnet_torchscale(q, k, v, segments, rates, causal).reshape(2, 45, 48)))
    assert rel_error(out, want) <= 1e-12


def test_torchscale_module_as_an_encoder_layer_calls_it():
    # The call torchscale's EncoderLayer makes: keyword arguments, an all-False padding mask.
    m = ts.DilatedAttention(ts_args([8, 16], [1, 2]), 32, 4, self_attention=True, subln=True).double().eval()
    x = rand(2, 40, 32, seed=2)
    pad = torch.zeros(2, 40, dtype=torch.bool)
    out, _ = m(query=x, key=x, value=x, key_padding_mask=pad, attn_mask=None, rel_pos=None, incremental_state=None)
    assert torch.equal(out, m(x, x, x)[0])


def test_torchscale_masks_it_can_honour():
    segments, rates = [8, 16], [1, 2]
    m = ts.DilatedAttention(ts_args(segments, rates), 32, 4, self_attention=True).double().eval()
    x = rand(2, 40, 32, seed=3)
    # A causal attn_mask (as torchscale's layers build it: -1e8 above the diagonal) is is_causal.
    causal = torch.zeros(40, 40, dtype=torch.float64).masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), -1e8)
    assert torch.equal(m(x, x, x, attn_mask=causal)[0], m(x, x, x, is_causal=True)[0])
    assert torch.equal(m(x, x, x, attn_mask=torch.ones(40, 40, dtype=torch.bool).triu(1))[0], m(x, x, x, is_causal=True)[0])
    # Padding at the end of each sequence: the padded keys are never attended.
    kept = [40, 29]
    pad = torch.arange(40)[None, :] >= torch.tensor(kept)[:, None]
    out, _ = m(x, x, x, key_padding_mask=pad)
    q, k, v = (proj(x).view(2, 40, 4, 8) for proj in (m.q_proj, m.k_proj, m.v_proj))
    want = m.out_proj(longnet_torchscale(q, k, v, segments, rates, kept=kept).reshape(2, 40, 32))
    assert rel_error(out, want) <= 1e-12


def test_torchscale_what_it_cannot_honour_is_refused_by_name():
    m = ts.DilatedAttention(ts_args([8], [2]), 32, 4, self_attention=True).double().eval()
    x = rand(1, 16, 32, seed=4)
    cases = [({"incremental_state": {}}, "incremental_state"), ({"rel_pos": torch.zeros(4, 16, 16)}, "rel_pos"),
             ({"attn_mask": torch.zeros(16, 16).masked_fill(torch.eye(16, dtype=torch.bool), -1e8)}, "attn_mask"),
             ({"key_padding_mask": torch.eye(16, dtype=torch.bool)[:1]}, "key_padding_mask")]
    for kwargs, name in cases:
        with pytest.raises(NotImplementedError, match=name):
            m(x, x, x, **kwargs)
    d = ts.DilatedAttention(ts_args([8], [2]), 32, 4, dropout=0.1, self_attention=True).double()
    with pytest.raises(NotImplementedError, match="dropout"):
        d(x, x, x)
    d.eval()(x, x, x)  # dropout has no effect in eval, as torchscale's
    with pytest.raises(NotImplementedError, match="args.multiway"):
        ts.DilatedAttention(ts_args([8], [2], multiway=True), 32, 4, self_attention=True)
    with pytest.raises(NotImplementedError, match="args.xpos_rel_pos"):
        ts.DilatedAttention(ts_args([8], [2], xpos_rel_pos=True), 32, 4, self_attention=True)


def test_torchscale_gradients():
    m = ts.DilatedAttention(ts_args([4, 8], [1, 4]), 12, 6, self_attention=True, subln=True).double().eval()
    x = rand(1, 11, 12, seed=5, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: m(t, t, t, is_causal=True)[0], (x,))


def test_torchscale_checkpoint_loads_and_converts():
    segments, rates = [8, 16], [2, 4]
    m = ts.DilatedAttention(ts_args(segments, rates, layernorm_eps=1e-6), 48, 6, self_attention=True, subln=True)
    g = torch.Generator().manual_seed(6)
    m.load_state_dict({n: torch.randn(s, generator=g) for n, s in torchscale_keys(48, True)}, strict=True)
    m = m.double().eval()
    n = from_torchscale(m)
    assert isinstance(n, ann.MultiheadDilatedAttention) and n.norm.eps == 1e-6
    x = rand(2, 37, 48, seed=7)
    for causal in (False, True):
        assert rel_error(n(x, x, x, is_causal=causal)[0], m(x, x, x, is_causal=causal)[0]) <= 1e-13


def test_torchscale_departures_get_the_longnet_answer():
    # The minimal inputs of docs/longnet-compat.md, against closed forms.
    def run(q, k, v, segments, rates, causal=False):
        return attnjit.attention(q, k, v, attnjit.Pattern.from_json(ts.spec_of(segments, rates, causal=causal)))

    def scores(q, k, i, js):
        return torch.stack([q[0, i, 0] @ k[0, j, 0] for j in js]) / q.shape[-1] ** 0.5

    # A last partial segment: row 8 of 10 attends keys 8 and 9 only (no zero-padding keys).
    q, k, v = (rand(1, 10, 1, 64, seed=20 + n) for n in range(3))
    w = torch.exp(scores(q, k, 8, [8, 9]))
    assert rel_error(run(q, k, v, [8], [1])[0, 8, 0], (w[0] * v[0, 8, 0] + w[1] * v[0, 9, 0]) / w.sum()) <= 1e-14
    # A segment (6) not a multiple of its rate (4): row 6 attends keys 6 and 10; row 8 is not selected.
    q, k, v = (rand(1, 12, 1, 64, seed=23 + n) for n in range(3))
    o = run(q, k, v, [6], [4])
    w = torch.exp(scores(q, k, 6, [6, 10]))
    assert rel_error(o[0, 6, 0], (w[0] * v[0, 6, 0] + w[1] * v[0, 10, 0]) / w.sum()) <= 1e-14
    assert (o[0, 8, 0] == 0).all()
    # A log-sum-exp of exactly 0 (q0 . k0 = 0, the first branch's only key): the key counts twice.
    q, k, v = (rand(1, 2, 1, 64, seed=26 + n) for n in range(3))
    q[0, 0, 0] = 0
    q[0, 0, 0, 0] = 1.0
    k[0, 0, 0, 0] = 0.0
    e = torch.exp(scores(q, k, 0, [1]))[0]
    want = (2 * v[0, 0, 0] + e * v[0, 1, 0]) / (2 + e)
    assert rel_error(run(q, k, v, [1, 2], [1, 1])[0, 0, 0], want) <= 1e-14


# dilated-attention-pytorch ---------------------------------------------------------------------


def test_dap_signatures_and_state_dict_layout():
    assert params(dap.DilatedAttention.__init__)[1:] == DAP_ATTENTION_INIT
    assert params(dap.DilatedAttention.forward)[1:] == DAP_FORWARD
    assert params(dap.MultiheadDilatedAttention.__init__)[1:] == DAP_MULTIHEAD_INIT
    assert params(dap.MultiheadDilatedAttention.forward)[1:] == DAP_FORWARD
    for bias in (True, False):
        for layer_norm in (True, False):
            m = dap.MultiheadDilatedAttention(64, 8, [1, 2], [16, 32], bias=bias, layer_norm=layer_norm)
            assert [(n, tuple(t.shape)) for n, t in m.state_dict().items()] == dap_keys(64, bias, layer_norm)
            m.load_state_dict({n: torch.randn(s) for n, s in dap_keys(64, bias, layer_norm)}, strict=True)
    m = dap.MultiheadDilatedAttention(64, 8, [1, 2], [16, 32], layer_norm_eps=1e-6, gamma_init=0.0)
    # Positional order: dilation rates, then segment lengths.
    assert m.attention.dilation_rates == [1, 2] and m.attention.segment_lengths == [16, 32]
    assert m.norm.eps == 1e-6 and m.gamma_init == 0.0 and m.layer_norm
    # xavier_normal_ with gain gamma_init on v_proj and out_proj, gain 1 on q_proj and k_proj; zero biases.
    assert (m.v_proj.weight == 0).all() and (m.out_proj.weight == 0).all() and (m.q_proj.weight != 0).all()
    assert all((lin.bias == 0).all() for lin in (m.q_proj, m.k_proj, m.v_proj, m.out_proj))
    torch.manual_seed(0)
    big = dap.MultiheadDilatedAttention(512, 8, [1], [16])
    assert abs(float(big.q_proj.weight.detach().std()) - (2 / 1024) ** 0.5) < 2e-3
    with pytest.raises(ValueError, match="embed_dim"):
        dap.MultiheadDilatedAttention(30, 8, [1], [16])
    with pytest.raises(ValueError, match="len"):
        dap.MultiheadDilatedAttention(64, 8, [1, 2], [16])
    with pytest.raises(ValueError, match="same length"):
        dap.DilatedAttention([16], [1, 2])


@pytest.mark.parametrize("causal", [False, True])
def test_dap_attention_is_longnet_head_groups(causal):
    # 8 heads, 3 branches (groups of 3, 3, 2: the package's slicing misses heads 6-7), 50 tokens (not a
    # multiple of the segments), a segment not a multiple of its rate.
    segments, rates = [8, 15, 32], [1, 2, 4]
    q, k, v = (rand(2, 50, 8, 16, seed=10 + n) for n in range(3))
    got = dap.DilatedAttention(segments, rates)(q, k, v, is_causal=causal)
    assert rel_error(got, longnet_head_groups(q, k, v, segments, rates, causal)) <= 1e-12
    assert got[:, :, 6:].abs().sum() > 0
    # No division by a branch's sum over the sequence: v all ones gives ones over the number of groups.
    ones = dap.DilatedAttention([8], [1])(q[:, :16, :1], k[:, :16, :1], torch.ones_like(v[:, :16, :1]))
    assert rel_error(ones, torch.ones_like(ones)) <= 1e-14
    scaled = dap.DilatedAttention(segments, rates, softmax_scale=0.3)(q, k, v, is_causal=causal)
    assert rel_error(scaled, longnet_head_groups(q, k, v, segments, rates, causal, scale=0.3)) <= 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_dap_multihead_is_longnet_and_converts(causal):
    segments, rates = [8, 16, 24], [1, 2, 3]
    m = dap.MultiheadDilatedAttention(64, 8, rates, segments, dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for t in m.parameters():
            t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float64))
    x = rand(2, 41, 64, seed=12)
    out, none = m(x, x, x, is_causal=causal)
    assert none is None
    q, k, v = (proj(x).view(2, 41, 8, 8) for proj in (m.q_proj, m.k_proj, m.v_proj))
    want = m.out_proj(m.norm(longnet_head_groups(q, k, v, segments, rates, causal).reshape(2, 41, 64)))
    assert rel_error(out, want) <= 1e-12
    n = from_dilated_attention_pytorch(m)
    assert isinstance(n, ann.MultiheadDilatedAttention)
    assert rel_error(n(x, x, x, is_causal=causal)[0], out) <= 1e-13
    # A checkpoint of the package's layout loads strictly and gives the same answer.
    fresh = dap.MultiheadDilatedAttention(64, 8, rates, segments, dtype=torch.float64).eval()
    fresh.load_state_dict(m.state_dict(), strict=True)
    assert torch.equal(fresh(x, x, x, is_causal=causal)[0], out)


def test_dap_gradients():
    m = dap.MultiheadDilatedAttention(16, 4, [1, 2], [4, 6], dtype=torch.float64).eval()
    x = rand(1, 13, 16, seed=13, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: m(t, t, t, is_causal=True)[0], (x,))


def test_bad_arguments_are_named_not_truncated():
    # Segment lengths and dilation rates are integers (8.5 was truncated to 8; torchscale's module
    # took the string "[8]" as the list of its characters and failed only at forward); a head count
    # of 0 is named (it was a ZeroDivisionError); a softmax scale is a positive finite number.
    with pytest.raises(TypeError, match=r"^args.segment_length: expected a list of integers, got str '\[8\]'"):
        ts.DilatedAttention(ts_args([8], [1], segment_length="[8]"), 16, 2, self_attention=True)
    with pytest.raises(TypeError, match=r"^args.segment_length\[0\]: expected an integer, got float 8.5"):
        ts.DilatedAttention(ts_args([8.5], [1]), 16, 2, self_attention=True)
    with pytest.raises(ValueError, match=r"^args.dilated_ratio\[1\]: 0 is out of range; must be >= 1"):
        ts.DilatedAttention(ts_args([8, 16], [1, 0]), 16, 2, self_attention=True)
    with pytest.raises(ValueError, match=r"^num_heads: 0 is out of range; must be >= 1"):
        ts.DilatedAttention(ts_args([8], [1]), 16, 0, self_attention=True)
    with pytest.raises(TypeError, match=r"^embed_dim: expected an integer, got float 16.0"):
        ts.DilatedAttention(ts_args([8], [1]), 16.0, 2, self_attention=True)
    with pytest.raises(TypeError, match=r"^segment_lengths\[0\]: expected an integer, got float 8.5"):
        dap.DilatedAttention([8.5], [1])
    with pytest.raises(TypeError, match=r"^dilation_rates\[0\]: expected an integer, got True"):
        dap.MultiheadDilatedAttention(16, 2, [True], [8])
    with pytest.raises(ValueError, match=r"^num_heads: 0 is out of range; must be >= 1"):
        dap.MultiheadDilatedAttention(16, 0, [1], [8])
    with pytest.raises(ValueError, match=r"^softmax_scale: must be a positive finite number, got nan"):
        dap.DilatedAttention([8], [1], softmax_scale=float("nan"))
    with pytest.raises(TypeError, match=r"^softmax_scale: expected a positive finite number, got bool True"):
        dap.DilatedAttention([8], [1], softmax_scale=True)
    # The package's attributes may be changed after construction: checked when the pattern is made.
    m = dap.DilatedAttention([8], [1])
    m.segment_lengths = [8.5]
    with pytest.raises(TypeError, match=r"^segment_lengths\[0\]: expected an integer, got float 8.5"):
        m(rand(1, 8, 2, 4, seed=9), rand(1, 8, 2, 4, seed=10), rand(1, 8, 2, 4, seed=11))
    m.segment_lengths, m.softmax_scale = [8], float("inf")
    with pytest.raises(ValueError, match=r"^softmax_scale: must be a positive finite number, got inf"):
        m.pattern()


def test_multihead_modules_name_inputs_that_are_not_batch_first():
    # [batch, seq, embed_dim] in both packages' multi-head modules: a 2-D input was "not enough
    # values to unpack" from inside the forward.
    dm = dap.MultiheadDilatedAttention(16, 2, [1], [8])
    tm = ts.DilatedAttention(ts_args([8], [1]), 16, 2, self_attention=True)
    x = rand(1, 8, 16, seed=12)
    for m in (dm, tm):
        with pytest.raises(ValueError, match=r"^query: expected a batch-first \[batch, seq, embed_dim\] tensor, got \(8, 16\)"):
            m(x[0], x, x)
        with pytest.raises(ValueError, match=r"^value: expected a batch-first"):
            m(x, x, x[None])
