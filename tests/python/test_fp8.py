"""FP8 inputs through attnjit.attention: torch.float8_e4m3fn q, k, v with descales, against the
float64 contract (conftest.dense_attention) on the values the codes stand for, within the bound
docs/spec.md states ("FP8 inputs"); the emulated kernels (ATTNJIT_CPU_DEVICE=emu) alike; every
refusal a clear error."""
import numpy as np
import pytest
import torch

import attnjit
from conftest import dense_attention, example_specs, needs_gpu

FP8 = getattr(torch, "float8_e4m3fn", None)
pytestmark = pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn: FP8 inputs not run")


def quantised(shape, descale, seed):
    """(codes, values): normal inputs as e4m3 codes of value / descale, and code x descale in float64.
    `descale` is a number or a [B, Hkv] tensor (broadcast over rows, query heads of a group, dims)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    d = torch.as_tensor(descale, dtype=torch.float64)
    if d.dim() == 2:  # [B, Hkv] -> [B, 1, H, 1]
        d = d.repeat_interleave(shape[2] // d.shape[1], dim=1)[:, None, :, None]
    codes = (x / d).to(FP8)
    return codes, codes.to(torch.float64) * d


def check_within(o, lse, want_o, want_lse, v_values, lse_slack=None):
    """O within 2^-4 max|v| plus its own rounding, mean error under 2^-8 max|v|; the LSE as fp32,
    plus `lse_slack` ([B, H, S]) where the scores' sums are the tensor cores' (docs/spec.md)."""
    bound = v_values.abs().max().item() / 16
    err = (o.to(torch.float64) - want_o).abs()
    assert (err <= bound + want_o.abs() / 128).all(), err.max().item()
    assert err.mean().item() <= v_values.abs().max().item() / 256
    check_lse(lse, want_lse, lse_slack)


def check_lse(lse, want_lse, lse_slack=None):
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    got, want = lse.to(torch.float64), want_lse
    tol = 1e-4 + 1e-4 * want.abs() + (lse_slack if lse_slack is not None else 0)
    assert ((got - want).abs() <= tol)[finite].all(), (got - want)[finite].abs().max().item()


def tensor_core_lse_slack(q_values, k_values, bits=10):
    """The LSE's allowance for FP8 tensor cores that sum q . k at reduced precision: 2^-bits of the
    row's largest sum of |q_d k_d| over the keys, times the softmax scale (docs/spec.md, "FP8
    inputs"). [B, H, S] for q [B, S, H, D] and k [B, S, Hkv, D]."""
    k = k_values.repeat_interleave(q_values.shape[2] // k_values.shape[2], dim=2)
    sums = torch.einsum("bihd,bjhd->bhij", q_values.abs(), k.abs())
    return sums.amax(dim=-1) * q_values.shape[-1] ** -0.5 * 2.0 ** -bits


@pytest.mark.parametrize("path", example_specs(), ids=lambda p: p.stem)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_fp8_examples_on_the_cpu(path, out_dtype):
    pattern = attnjit.Pattern.load(path)
    b, s, hq, hkv, d = 2, 96, 4, 2, 16
    qd = torch.tensor([[0.5, 2.0], [1.0, 0.25]])  # per (batch, kv head)
    q, qv = quantised((b, s, hq, d), qd, 1)
    k, kv = quantised((b, s, hkv, d), 0.5, 2)
    v, vv = quantised((b, s, hkv, d), 3.0, 3)
    o, lse = attnjit.attention(q, k, v, pattern, q_descale=qd, k_descale=0.5, v_descale=torch.tensor(3.0),
                               out_dtype=out_dtype, return_lse=True)
    assert o.dtype == out_dtype and o.shape == (b, s, hq, d) and lse.dtype == torch.float32
    want_o, want_lse = dense_attention(qv, kv, vv, pattern)
    check_within(o, lse, want_o, want_lse, vv)


# Head dim 32: the SIMT kernel; 64 on sm_89: mma.sync m16n8k32 on e4m3 (the sm_90a wgmma kernel is
# the C++ tests'; it costs the emulator more).
@pytest.mark.parametrize("device,d", [("emu:sm_90a", 32), ("emu:sm_89", 64)])
def test_fp8_in_the_emulated_kernel(monkeypatch, device, d):
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", device)
    pattern = attnjit.Pattern.load(example_specs()[0])
    q, qv = quantised((1, 64, 2, d), 0.25, 4)
    k, kv = quantised((1, 64, 2, d), 1.0, 5)
    v, vv = quantised((1, 64, 2, d), 2.0, 6)
    o, lse = attnjit.attention(q, k, v, pattern, q_descale=0.25, k_descale=1.0, v_descale=2.0, return_lse=True)
    want_o, want_lse = dense_attention(qv, kv, vv, pattern)
    check_within(o, lse, want_o, want_lse, vv)


def test_fp8_refusals():
    pattern = {"attnjit": 1, "branches": [{"segment": "full"}]}
    q, _ = quantised((1, 8, 2, 8), 1.0, 7)
    one = dict(q_descale=1.0, k_descale=1.0, v_descale=1.0)
    with pytest.raises(TypeError, match="v_descale: FP8 inputs need"):
        attnjit.attention(q, q, q, pattern, q_descale=1.0, k_descale=1.0)
    with pytest.raises(TypeError, match="out_dtype: FP8 attention writes"):
        attnjit.attention(q, q, q, pattern, out_dtype=torch.float32, **one)
    with pytest.raises(ValueError, match=r"k_descale: expected shape"):
        attnjit.attention(q, q, q, pattern, q_descale=1.0, k_descale=torch.ones(3), v_descale=1.0)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e39, 10**400):  # 1e-50 and 1e39: 0 and inf in float32
        with pytest.raises(ValueError, match="v_descale: every factor must be a positive finite float32 number"):
            attnjit.attention(q, q, q, pattern, q_descale=1.0, k_descale=1.0, v_descale=bad)
    with pytest.raises(ValueError, match=r"v_descale: every factor must be a positive finite float32 number, "
                                         r"got 1e-50 \(in float32: 0.0\)"):
        attnjit.attention(q, q, q, pattern, q_descale=1.0, k_descale=1.0, v_descale=1e-50)
    with pytest.raises(ValueError, match="q_descale: every factor must be a positive finite float32 number, got 0.0"):
        attnjit.attention(q, q, q, pattern, q_descale=torch.tensor([[1.0, 0.0]]), k_descale=1.0, v_descale=1.0)
    with pytest.raises(TypeError, match="k: FP8 attention takes torch.float8_e4m3fn"):
        attnjit.attention(q, q.to(torch.bfloat16), q, pattern, **one)
    with pytest.raises(TypeError, match="return_weights: not available for FP8"):
        attnjit.attention(q, q, q, pattern, return_weights=True, **one)
    x = torch.randn(1, 8, 2, 8)
    with pytest.raises(TypeError, match="q_descale: is for FP8 inputs"):
        attnjit.attention(x, x, x, pattern, q_descale=1.0)


def test_fp8_nan_codes_stay_nan():
    pattern = {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}
    q, _ = quantised((1, 16, 1, 8), 1.0, 8)
    k, _ = quantised((1, 16, 1, 8), 1.0, 9)
    v, _ = quantised((1, 16, 1, 8), 1.0, 10)
    q.view(torch.uint8)[0, 3, 0, 2] = 0x7F  # query row 3: NaN
    o, lse = attnjit.attention(q, k, v, pattern, q_descale=1.0, k_descale=1.0, v_descale=1.0, return_lse=True)
    rows = torch.isnan(o[0, :, 0, 0])
    assert rows.tolist() == [i == 3 for i in range(16)]
    assert torch.isnan(lse[0, 0, 3]) and torch.isfinite(lse[0, 0, :3]).all()


def check_on_the_gpu(d):
    pattern = attnjit.Pattern.load(example_specs()[0])
    q, qv = quantised((1, 256, 4, d), 0.5, 11)
    k, kv = quantised((1, 256, 4, d), 0.5, 12)
    v, vv = quantised((1, 256, 4, d), 1.0, 13)
    o, lse = attnjit.attention(q.cuda(), k.cuda(), v.cuda(), pattern, q_descale=0.5, k_descale=0.5, v_descale=1.0,
                               return_lse=True)
    want_o, want_lse = dense_attention(qv, kv, vv, pattern)
    check_within(o.cpu(), lse.cpu(), want_o, want_lse, vv, tensor_core_lse_slack(qv, kv))


def test_fp8_lse_slack_still_catches_a_wrong_descale():
    """The tensor cores' allowance on the LSE is far below what a 5% wrong k descale moves it by."""
    pattern = attnjit.Pattern.load(example_specs()[0])
    q, qv = quantised((1, 128, 2, 64), 0.5, 14)
    k, kv = quantised((1, 128, 2, 64), 0.5, 15)
    v, vv = quantised((1, 128, 2, 64), 1.0, 16)
    want_o, want_lse = dense_attention(qv, kv, vv, pattern)
    slack = tensor_core_lse_slack(qv, kv)
    o, lse = attnjit.attention(q, k, v, pattern, q_descale=0.5, k_descale=0.5, v_descale=1.0, return_lse=True)
    check_within(o, lse, want_o, want_lse, vv, slack)
    _, lse = attnjit.attention(q, k, v, pattern, q_descale=0.5, k_descale=0.525, v_descale=1.0, return_lse=True)
    with pytest.raises(AssertionError):
        check_lse(lse, want_lse, slack)


@needs_gpu
# 128, 64: FP8 tensor cores (wgmma on Hopper); 256: the mma.sync kernel (on Hopper too); 96: the SIMT kernel
@pytest.mark.parametrize("d", [128, 64, 256, 96])
def test_fp8_on_the_gpu(d):
    check_on_the_gpu(d)


@needs_gpu
def test_fp8_on_the_gpu_without_wgmma():
    """The mma.sync m16n8k32 kernel (sm_89 and newer): on Hopper with ATTNJIT_SM90A=0, read once per
    process, hence the child process; elsewhere what runs anyway."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    code = "import test_fp8; test_fp8.check_on_the_gpu(128); test_fp8.check_on_the_gpu(64); print('fp8 mma.sync ok')"
    env = dict(os.environ, ATTNJIT_SM90A="0", PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=here, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "fp8 mma.sync ok" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def outlier_inputs(seed, b=1, s=128, h=2, d=64):
    """Normal q and k with a few channels 30x larger (what activation outliers look like), v normal."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g)
    k = torch.randn(b, s, h, d, generator=g)
    for x in (q, k):
        x[..., :3] *= 30
    v = torch.randn(b, s, h, d, generator=g)
    return q * 0.2, k * 0.2, v


def test_quantize_round_trips_within_e4m3_precision():
    q, k, v = outlier_inputs(14, h=4)
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: two query heads per kv head
    x = attnjit.fp8.quantize(q, k, v)
    assert x.q.dtype == FP8 and x.q_descale.shape == (1, 2) and x.q_descale.dtype == torch.float32
    back = x.v.to(torch.float32) * x.v_descale[:, None, :, None]
    assert ((back - v).abs() <= v.abs() / 16 + x.v_descale.max() * 2.0 ** -9).all()
    assert x.k.to(torch.float32).abs().max() <= 448  # nothing saturated: the largest maps to 448
    r = attnjit.fp8.rotation(64, seed=3)
    assert torch.allclose(r @ r.T, torch.eye(64, dtype=torch.float64), atol=1e-12)


def test_quantize_keeps_factors_positive_on_subnormal_groups():
    """A group whose largest magnitude is subnormal (amax / 448 underflows to 0 in float32) keeps a
    positive factor, which attention accepts, and no code is NaN or past 448."""
    tiny = torch.full((1, 4, 2, 16), 1e-44)
    x = attnjit.fp8.quantize(tiny, tiny, tiny)
    assert (x.q_descale > 0).all() and torch.isfinite(x.q_descale).all()
    codes = x.q.to(torch.float32)
    assert torch.isfinite(codes).all() and codes.abs().max() <= 448
    o = attnjit.attention(x.q, x.k, x.v, {"attnjit": 1, "branches": [{"segment": "full"}]}, **x.descales)
    assert torch.isfinite(o).all()


def test_incoherent_processing_cuts_the_error_on_outlier_inputs():
    pattern = attnjit.Pattern.load(example_specs()[0])
    errs = {}
    for incoherent in (False, True):
        total = 0.0
        for seed in range(3):
            q, k, v = outlier_inputs(20 + seed)
            o = attnjit.fp8.attention(q, k, v, pattern, incoherent=incoherent, seed=seed)
            want, _ = dense_attention(q.double(), k.double(), v.double(), pattern)  # the unquantised inputs
            total += float((o.double() - want).norm() / want.norm())
        errs[incoherent] = total / 3
    # Reported, not hidden: both errors against the unquantised inputs, and the rotation's gain.
    print(f"relative error against unquantised inputs: plain {errs[False]:.4f}, incoherent {errs[True]:.4f}")
    assert errs[True] < 0.7 * errs[False], errs


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan")])
@pytest.mark.parametrize("incoherent", [False, True])
def test_quantize_keeps_a_non_finite_input_in_its_own_rows(which, value, incoherent):
    # The factors come from the finite values: one inf no longer makes its group's factor inf (every
    # code of the group NaN), one NaN no longer makes it NaN (the group silently at factor 1). A
    # non-finite input becomes the NaN code (e4m3fn has no infinity) where it is, so under a causal
    # mask only the rows that attend it are non-finite.
    pattern = {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}
    g = torch.Generator().manual_seed(15)
    x = {name: torch.randn(1, 16, 2, 32, generator=g) for name in "qkv"}
    clean = attnjit.fp8.quantize(x["q"], x["k"], x["v"], incoherent=incoherent)
    x[which][0, 12, 0, 5] = value
    got = attnjit.fp8.quantize(x["q"], x["k"], x["v"], incoherent=incoherent)
    for name in ("q_descale", "k_descale", "v_descale"):
        assert torch.isfinite(getattr(got, name)).all() and (getattr(got, name) <= getattr(clean, name)).all()
    codes = getattr(got, which).float()
    rows = torch.isnan(codes).any(dim=-1)[0]  # [S, H]
    want = torch.zeros(16, 2, dtype=torch.bool)
    want[12, 0] = True
    assert torch.equal(rows, want) and not torch.isinf(codes).any()
    if not incoherent:  # one code NaN, the others as they were
        assert torch.isnan(codes).sum() == 1
    o = attnjit.fp8.attention(x["q"], x["k"], x["v"], pattern, incoherent=incoherent)
    bad = (~torch.isfinite(o.float())).any(dim=-1)[0, :, 0]  # head 0
    attends = [i == 12 for i in range(16)] if which == "q" else [i >= 12 for i in range(16)]
    assert bad.tolist() == attends
    assert torch.isfinite(o[0, :, 1].float()).all()  # the other kv head's group is untouched


def test_descales_must_be_numbers():
    pattern = {"attnjit": 1, "branches": [{"segment": "full"}]}
    q, _ = quantised((1, 8, 2, 8), 1.0, 7)
    for bad in (True, "1", None, [1.0]):
        message = "FP8 inputs need" if bad is None else r"expected a number or an fp32 tensor .* got (bool|str|list)"
        with pytest.raises(TypeError, match=f"^q_descale: {message}"):
            attnjit.attention(q, q, q, pattern, q_descale=bad, k_descale=1.0, v_descale=1.0)


def test_a_zero_dimensional_array_descale_is_its_number():
    pattern = {"attnjit": 1, "branches": [{"segment": "full"}]}
    q, _ = quantised((1, 8, 2, 8), 1.0, 7)
    want = attnjit.attention(q, q, q, pattern, q_descale=0.5, k_descale=1.0, v_descale=1.0)
    got = attnjit.attention(q, q, q, pattern, q_descale=np.array(0.5), k_descale=np.float32(1.0), v_descale=1.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(TypeError, match="^q_descale: expected a number"):
        attnjit.attention(q, q, q, pattern, q_descale=np.array(True), k_descale=1.0, v_descale=1.0)
