"""attnjit.attention on torch tensors and numpy arrays against the dense contract; gradients
(gradcheck in float64 through the reference, the plan executor's and the emulated kernels'
against autograd of the dense contract); torch.compile; errors; the GPU subset."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import attnjit
from conftest import EXAMPLES, dense_attention, dense_weights, example_specs, needs_gpu, rel_error


def inputs(b, sq, sk, hq, hkv, d, dtype=torch.float32, seed=0, requires_grad=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    t = [torch.randn(b, s, h, d, generator=g, dtype=torch.float64).to(dtype).to(device)
         for s, h in ((sq, hq), (sk, hkv), (sk, hkv))]
    for x in t:
        x.requires_grad_(requires_grad)
    return t


@pytest.mark.parametrize("path", example_specs(), ids=lambda p: p.stem)
def test_every_example_matches_the_dense_contract(path):
    p = attnjit.Pattern.load(path)
    q, k, v = inputs(2, 200, 200, 4, 2, 32, seed=1)
    o, lse = attnjit.attention(q, k, v, p, q_offset=5, return_lse=True)
    want_o, want_lse = dense_attention(q, k, v, p, q_offset=5)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32 and o.shape == (2, 200, 4, 32)
    assert rel_error(o, want_o) <= 1e-5
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert rel_error(lse[finite], want_lse[finite]) <= 1e-5


def test_float64_runs_the_exact_reference():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 150, 150, 4, 4, 16, dtype=torch.float64)
    o, lse = attnjit.attention(q, k, v, p, return_lse=True)
    want_o, want_lse = dense_attention(q, k, v, p)
    assert o.dtype == torch.float64 and rel_error(o, want_o) <= 1e-12
    assert torch.allclose(lse, want_lse, rtol=1e-12, atol=0)


def test_numpy_arrays_and_strided_tensors():
    p = attnjit.Pattern.load(EXAMPLES / "causal_local.json")
    q, k, v = inputs(1, 130, 130, 2, 1, 16)
    want, _ = dense_attention(q, k, v, p)
    o = attnjit.attention(q.numpy(), k.numpy(), v.numpy(), p)
    assert isinstance(o, np.ndarray) and rel_error(torch.from_numpy(o), want) <= 1e-5
    # [B, H, S, D] storage seen as [B, S, H, D]: strided, last dimension contiguous.
    qt, kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qt.is_contiguous()
    assert rel_error(attnjit.attention(qt, kt, vt, p), want) <= 1e-5


def test_scale_and_pattern_forms():
    spec = {"attnjit": 1, "branches": [{"segment": 32, "dilation": 2}]}
    q, k, v = inputs(1, 64, 64, 2, 2, 16)
    p = attnjit.Pattern.from_json(spec)
    want, _ = dense_attention(q, k, v, p, scale=0.3)
    for form in (p, spec, json.dumps(spec)):
        assert rel_error(attnjit.attention(q, k, v, form, scale=0.3), want) <= 1e-5



@pytest.mark.parametrize("scale, error, message", [
    (float("nan"), ValueError, r"^scale: must be a positive finite number, got nan; leave it out for 1/sqrt\(head_dim\)"),
    (float("inf"), ValueError, r"^scale: must be a positive finite number, got inf"),
    (-float("inf"), ValueError, r"^scale: must be a positive finite number, got -inf"),
    (0, ValueError, r"^scale: must be a positive finite number, got 0.0"),
    (True, TypeError, r"^scale: expected a positive finite number, got bool True"),
    ("1", TypeError, r"^scale: expected a positive finite number, got str '1'"),
    # Read as a number: a gradient would never reach it (once only a PyTorch warning said so).
    (torch.tensor(0.5, requires_grad=True), TypeError, r"^scale: is a tensor that requires grad, but the scale is a "
                                                       r"constant of the call"),
])
def test_scale_must_be_a_positive_finite_number(scale, error, message):
    # json.dumps wrote nan and inf as no JSON parser reads them (a "parse error" in the pattern); a
    # bool was silently 1.0 and a string read as its number. Each entry point names the argument.
    spec = {"attnjit": 1, "branches": [{"segment": "full"}]}
    q, k, v = inputs(1, 8, 8, 2, 2, 8)
    from attnjit import serving
    calls = [lambda: attnjit.attention(q, k, v, spec, scale=scale),
             lambda: attnjit.attention(q.numpy(), k.numpy(), v.numpy(), spec, scale=scale),
             lambda: attnjit.Pattern.from_json(spec).with_scale(scale),
             lambda: serving.paged_attention(q[0], k[0, None], v[0, None], [[0]], [8], spec,
                                             cu_seqlens_q=[0, 8], scale=scale)]
    for call in calls:
        with pytest.raises(error, match=message):
            call()
    assert attnjit.Pattern.from_json(spec).with_scale(np.float32(0.5)) == attnjit.Pattern.from_json({**spec, "scale": 0.5})


GRAD_PATTERNS = {
    "softmax": ({"attnjit": 1, "branches": [{"segment": 8, "dilation": 1}, {"segment": 16, "dilation": 2}]}, 2, 2, 0, 0),
    "head_groups": ({"attnjit": 1, "combine": "head_groups",
                     "branches": [{"segment": 8, "dilation": 1}, {"segment": 16, "dilation": 2}]}, 4, 4, 0, 0),
    "gqa_offsets": ({"attnjit": 1, "branches": [{"segment": 12, "dilation": 3}], "causal": True}, 4, 2, 5, 2),
    "empty_rows": ({"attnjit": 1, "branches": [{"segment": "full"}], "causal": True}, 2, 1, 0, 9),
}


@pytest.mark.parametrize("name", sorted(GRAD_PATTERNS))
def test_gradcheck_in_float64(name):
    spec, hq, hkv, q_offset, k_offset = GRAD_PATTERNS[name]
    p = attnjit.Pattern.from_json(spec)
    q, k, v = inputs(1, 20, 20, hq, hkv, 4, dtype=torch.float64, seed=3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: attnjit.attention(a, b, c, p, q_offset=q_offset, k_offset=k_offset),
                                    (q, k, v), eps=1e-6, atol=1e-7)


def grads(fn, q, k, v, seed=9):
    out = fn(q, k, v)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    dout = dout.to(device=out.device, dtype=out.dtype)
    return torch.autograd.grad(out, (q, k, v), dout)


@pytest.mark.parametrize("path", example_specs(), ids=lambda p: p.stem)
def test_plan_executor_gradients_match_the_dense_contract(path):
    p = attnjit.Pattern.load(path)
    q, k, v = inputs(1, 160, 160, 4, 2, 16, seed=4, requires_grad=True)
    got = grads(lambda a, b, c: attnjit.attention(a, b, c, p, q_offset=3), q, k, v)
    want = grads(lambda a, b, c: dense_attention(a, b, c, p, q_offset=3)[0], q, k, v)
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == torch.float32, name
        assert rel_error(g, w) <= 1e-4, f"d{name}"


def test_emulated_kernels_forward_and_backward(monkeypatch):
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 150, 150, 2, 1, 64, dtype=torch.bfloat16, seed=5, requires_grad=True)
    got_o = attnjit.attention(q, k, v, p)
    want_o, _ = dense_attention(q, k, v, p)
    assert got_o.dtype == torch.bfloat16 and rel_error(got_o, want_o) <= 2e-2
    got = grads(lambda a, b, c: attnjit.attention(a, b, c, p), q, k, v)
    want = grads(lambda a, b, c: dense_attention(a, b, c, p)[0], q, k, v)
    for name, g, w in zip("qkv", got, want):
        assert rel_error(g, w) <= 3e-2, f"d{name}"


def test_emulated_hopper_kernel_forward(monkeypatch):
    # ATTNJIT_CPU_DEVICE=emu:sm_90a: the sm_90a forward (warpgroup MMA) in the emulator.
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu:sm_90a")
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 150, 150, 2, 1, 64, dtype=torch.bfloat16, seed=6)
    got_o = attnjit.attention(q, k, v, p)
    want_o, _ = dense_attention(q, k, v, p)
    assert got_o.dtype == torch.bfloat16 and rel_error(got_o, want_o) <= 2e-2
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu:sm_80a")
    with pytest.raises(attnjit.AttnjitError, match="arch-specific kernels for sm_90a only"):
        attnjit.attention(q, k, v, p)
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "gpu")
    with pytest.raises(ValueError, match="ATTNJIT_CPU_DEVICE=gpu: expected cpu, emu or emu:sm_XX"):
        attnjit.attention(q, k, v, p)
    # An arch no GPU has is named with the variable that asked for it (before: run as sm_99).
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu:sm_99")
    with pytest.raises(attnjit.AttnjitError, match="ATTNJIT_CPU_DEVICE=emu:sm_99: no GPU has this arch"):
        attnjit.attention(q, k, v, p)


@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_bitmap_and_hierarchical_layouts_on_every_cpu_device(device, monkeypatch):
    # Both are spellings of the layout algebra; this runs them through the plan executor and the
    # emulated kernels, forward and backward, against the dense contract.
    if device == "emu":
        monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    specs = [
        {"attnjit": 1, "branches": [{"segment": "full", "causal": True, "layout": {"block": 32, "hierarchical": [
            {"window": 1}, {"window": 2, "stride": 2, "block": 64}, {"stride": 3, "block": [16, 48]}]}}]},
        {"attnjit": 1, "branches": [{"segment": "full", "layout": {"block": 32, "explicit": {
            "per_head_bitmap": [["1", "011", "1001", "00011"], ["11", "", "1111"]]}}}]},
    ]
    for spec in specs:
        p = attnjit.Pattern.from_json(spec)
        dtype = torch.bfloat16 if device == "emu" else torch.float32
        q, k, v = inputs(1, 150, 150, 2, 1, 32, dtype=dtype, seed=11, requires_grad=True)
        got_o = attnjit.attention(q, k, v, p)
        want_o, _ = dense_attention(q, k, v, p)
        assert rel_error(got_o, want_o) <= (2e-2 if device == "emu" else 1e-5)
        got = grads(lambda a, b, c: attnjit.attention(a, b, c, p), q, k, v)
        want = grads(lambda a, b, c: dense_attention(a, b, c, p)[0], q, k, v)
        for name, g, w in zip("qkv", got, want):
            assert rel_error(g, w) <= (3e-2 if device == "emu" else 1e-4), f"d{name}"


WEIGHT_SPECS = [
    # Overlapping branches (keys counted twice), some heads in only some branches.
    {"attnjit": 1, "branches": [
        {"segment": "full", "causal": True, "heads": [0, 2, 3]},
        {"segment": 32, "dilation": 2, "heads": [1, 2, 3]},
        {"segment": 64, "dilation": 4, "causal": True}]},
    # head_groups: each branch is a group of heads, and O carries the "mean" factor 1/3.
    {"attnjit": 1, "combine": "head_groups", "branches": [
        {"segment": "full", "causal": True}, {"segment": 32, "dilation": 2}, {"segment": 64, "dilation": 4}]},
]


@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_attention_weights_explain_the_output(device, monkeypatch):
    # W equals the dense contract's weights and O = W V, with GQA and a chunk at an offset.
    if device == "emu":
        monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    for spec in WEIGHT_SPECS:
        p = attnjit.Pattern.from_json(spec)
        dtype = torch.bfloat16 if device == "emu" else torch.float32
        q, k, v = inputs(2, 70, 130, 4, 2, 32, dtype=dtype, seed=21)
        o, lse, w = attnjit.attention(q, k, v, p, q_offset=60, return_lse=True, return_weights=True)
        assert w.dtype == torch.float32 and w.shape == (2, 4, 70, 130) and not w.requires_grad
        want = dense_weights(q, k, p, q_offset=60)
        assert (w.to(torch.float64) - want).abs().max() <= (2e-3 if device == "emu" else 1e-5)
        wv = torch.einsum("bhij,bjhd->bihd", w.to(torch.float64), v.to(torch.float64).repeat_interleave(2, dim=2))
        assert rel_error(o, wv) <= (1e-2 if device == "emu" else 1e-5)
        # Asking for the weights changes nothing else.
        assert torch.equal(lse, attnjit.attention(q, k, v, p, q_offset=60, return_lse=True)[1])


def test_attention_weights_float64_numpy_and_bad_requests():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 40, 40, 2, 2, 16, dtype=torch.float64, seed=3)
    o, w = attnjit.attention(q, k, v, p, return_weights=True)
    assert w.dtype == torch.float64
    torch.testing.assert_close(w, dense_weights(q, k, p), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.einsum("bhij,bjhd->bihd", w, v), o, rtol=1e-12, atol=1e-12)
    qn, kn, vn = (x.to(torch.float32).numpy() for x in (q, k, v))
    on, wn = attnjit.attention(qn, kn, vn, p, return_weights=True)
    assert wn.dtype == np.float32 and wn.shape == (1, 2, 40, 40)
    np.testing.assert_allclose(wn, w.numpy(), atol=1e-5)
    # The cap is read once per process: a child process with a small cap.
    code = ("import torch, attnjit\n"
            "q = torch.zeros(1, 40, 2, 16)\n"
            "try:\n"
            "    attnjit.attention(q, q, q, {'attnjit': 1, 'branches': [{'segment': 'full'}]}, return_weights=True)\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    env = dict(os.environ, ATTNJIT_MAX_WEIGHTS="1000")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "batch * heads_q * seq_q * seq_k = 3200 elements is over the cap of 1000 (ATTNJIT_MAX_WEIGHTS)" in out


@pytest.mark.parametrize("device", ["reference", "cpu", "emu"])
def test_packed_documents_equal_each_document_alone(device, monkeypatch):
    # cu_seqlens (an empty document included): O, LSE and the gradients of the packed call are the
    # documents' own, on the float64 reference, the plan executor and the emulated kernels.
    if device == "emu":
        monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    dtype = torch.float64 if device == "reference" else torch.float32
    cu = [0, 37, 37, 101, 150]
    q, k, v = inputs(1, 150, 150, 4, 2, 16, dtype=dtype, seed=31, requires_grad=True)
    o, lse = attnjit.attention(q, k, v, p, return_lse=True, cu_seqlens=torch.tensor(cu))
    dq, dk, dv = torch.autograd.grad(o.square().sum(), (q, k, v))
    tol = 1e-12 if device == "reference" else 1e-4
    for a, b in zip(cu[:-1], cu[1:]):
        if a == b:
            continue
        qd, kd, vd = (x.detach()[:, a:b].clone().requires_grad_() for x in (q, k, v))
        od, lsed = attnjit.attention(qd, kd, vd, p, return_lse=True)
        gd = torch.autograd.grad(od.square().sum(), (qd, kd, vd))
        torch.testing.assert_close(o[:, a:b], od, rtol=tol, atol=tol)
        torch.testing.assert_close(lse[:, :, a:b], lsed, rtol=tol, atol=tol)
        for name, got, want in zip("qkv", (dq, dk, dv), gd):
            torch.testing.assert_close(got[:, a:b], want, rtol=tol, atol=tol, msg=f"d{name} of document {a}..{b}")
    # numpy arrays and a plain list take the same documents.
    if device == "cpu":
        on = attnjit.attention(*(x.detach().numpy() for x in (q, k, v)), p, cu_seqlens=cu)
        np.testing.assert_allclose(on, o.detach().numpy(), atol=1e-6)


def test_packed_documents_bad_lists_are_clear_errors():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 50, 50, 2, 2, 16)
    with pytest.raises(ValueError, match="cu_seqlens: must end at the sequence length 50, got 60"):
        attnjit.attention(q, k, v, p, cu_seqlens=torch.tensor([0, 20, 60]))
    with pytest.raises(ValueError, match="cu_seqlens: must not decrease"):
        attnjit.attention(q, k, v, p, cu_seqlens=[0, 30, 20, 50])
    with pytest.raises(ValueError, match="cu_seqlens: cannot be combined with offsets"):
        attnjit.attention(q, k, v, p, cu_seqlens=[0, 50], q_offset=4)
    with pytest.raises(TypeError, match="cu_seqlens: expected a 1-D integer tensor"):
        attnjit.attention(q, k, v, p, cu_seqlens=torch.tensor([0.0, 50.0]))
    qb, kb, vb = inputs(2, 50, 50, 2, 2, 16)
    with pytest.raises(ValueError, match="batch must be 1"):
        attnjit.attention(qb, kb, vb, p, cu_seqlens=[0, 50])


# A dynamic layout's table per head (block 16, 4 query and 4 key blocks over 64 positions), the
# explicit layout with the same blocks (the dense contract's form), and the same table as the
# kernels may get it: two problems (a repeated block, a block past the keys) they must drop.
DYN_SPEC = {"attnjit": 1, "layout": {"block": 16, "union": [{"local": 0}, {"dynamic": True}]},
            "branches": [{"segment": "full"}]}
DYN_EXPLICIT = {"attnjit": 1, "layout": {"block": 16, "union": [{"local": 0}, {"explicit": {"per_head": [
    [[0, 2], [1, 0], [1, 3], [3, 0], [3, 1]], [[0, 1], [0, 3], [2, 0], [3, 2]]]}}]}, "branches": [{"segment": "full"}]}
DYN_TABLE = {"heads": 2, "row_offsets": [0, 1, 3, 3, 5, 7, 7, 8, 9], "col_indices": [2, 0, 3, 0, 1, 1, 3, 0, 2]}
DYN_FLAWED = ([0, 1, 3, 3, 6, 8, 8, 10, 11], [2, 0, 3, 0, 1, 1, 1, 3, 0, 7, 2])


@pytest.mark.parametrize("device", ["reference", "cpu", "emu"])
def test_dynamic_tables_host_and_in_place_match_the_dense_contract(device, monkeypatch):
    # The host table and the table the kernels read in place (tensors, an "errors" counter) give the
    # explicit layout's answer and gradients; the flawed table's two problems are dropped and counted.
    if device == "emu":
        monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    dtype = torch.float64 if device == "reference" else torch.float32
    tol = 1e-12 if device == "reference" else 1e-4
    q, k, v = inputs(1, 64, 64, 2, 1, 16, dtype=dtype, seed=41, requires_grad=True)
    want_o, _ = dense_attention(q, k, v, attnjit.Pattern.from_json(DYN_EXPLICIT))
    want = torch.autograd.grad(want_o.square().sum(), (q, k, v))
    errors = torch.zeros(1, dtype=torch.int32)
    in_place = {"heads": 2, "row_offsets": torch.tensor(DYN_FLAWED[0]), "col_indices": torch.tensor(DYN_FLAWED[1]),
                "errors": errors}
    for table in (DYN_TABLE, in_place):
        o = attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout=table)
        assert rel_error(o, want_o) <= tol
        got = torch.autograd.grad(o.square().sum(), (q, k, v))
        for name, g, w in zip("qkv", got, want):
            assert rel_error(g, w) <= tol, f"d{name}"
    assert errors.item() == 2  # the forward counts; the backward reads the same table without counting
    attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout=in_place)
    assert errors.item() == 4  # added to, not overwritten
    # The weights of a table read in place: the host's copy, sanitised the same way.
    o, w = attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout=in_place, return_weights=True)
    w_want = dense_weights(q, k, attnjit.Pattern.from_json(DYN_EXPLICIT))
    assert rel_error(w, w_want) <= tol


def test_a_block_past_int32_in_a_table_read_in_place_is_a_counted_problem():
    # 2^32 + 2 would wrap to block 2 (in range) in the int32 conversion: it is dropped and counted.
    q, k, v = inputs(1, 64, 64, 2, 1, 16, seed=42)
    cols = torch.tensor(DYN_TABLE["col_indices"], dtype=torch.int64)
    cols[0] = 2**32 + 2
    errors = torch.zeros(1, dtype=torch.int32)
    table = {"heads": 2, "row_offsets": torch.tensor(DYN_TABLE["row_offsets"]), "col_indices": cols, "errors": errors}
    o = attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout=table)
    assert errors.item() == 1
    without = {"heads": 2, "row_offsets": [0, 0, 2, 2, 4, 6, 6, 7, 8], "col_indices": DYN_TABLE["col_indices"][1:]}
    assert rel_error(o, attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout=without)) <= 1e-6


def test_dynamic_table_bad_arguments_are_clear_errors():
    q, k, v = inputs(1, 64, 64, 2, 1, 16)
    rows, cols = torch.tensor(DYN_FLAWED[0]), torch.tensor(DYN_FLAWED[1])
    errors = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(TypeError, match="needs torch tensors q, k, v; pass lists or arrays with numpy inputs"):
        attnjit.attention(q.numpy(), k.numpy(), v.numpy(), DYN_SPEC,
                          dynamic_layout={"heads": 2, "row_offsets": rows, "col_indices": cols, "errors": errors})
    with pytest.raises(TypeError, match=r'dynamic_layout\["col_indices"\]: a table the kernels read in place needs a 1-D '
                                        r"integer torch tensor, got a torch.float32"):
        attnjit.attention(q, k, v, DYN_SPEC,
                          dynamic_layout={"heads": 2, "row_offsets": rows, "col_indices": cols.float(), "errors": errors})
    with pytest.raises(TypeError, match=r'dynamic_layout\["errors"\]: expected an int32 torch tensor with one element'):
        attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout={"heads": 2, "row_offsets": rows, "col_indices": cols,
                                                             "errors": torch.zeros(1, dtype=torch.int64)})
    with pytest.raises(TypeError, match=r"dynamic_layout: unknown key\(s\) \['head'\]"):
        attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout={"head": 2, "row_offsets": rows, "col_indices": cols})
    with pytest.raises(ValueError, match=r"device_dynamic_layout.rows: is 8; the table needs heads \* query blocks = 1 \* 4"):
        attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout={"row_offsets": rows, "col_indices": cols, "errors": errors})
    with pytest.raises(ValueError, match="device_dynamic_layout.heads: is 3; give 1"):
        attnjit.attention(q, k, v, DYN_SPEC,
                          dynamic_layout={"heads": 3, "row_offsets": rows, "col_indices": cols, "errors": errors})
    assert errors.item() == 0


def test_torch_compile_traces_without_graph_breaks():
    p = attnjit.Pattern.load(EXAMPLES / "sliding_window.json")
    q, k, v = inputs(1, 96, 96, 2, 2, 16, seed=6, requires_grad=True)

    def f(a, b, c):
        return (attnjit.attention(a, b, c, p) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    loss.backward()
    want = f(*(x.detach().requires_grad_() for x in (q, k, v)))
    assert torch.allclose(loss, want)
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_torch_compile_traces_a_table_read_in_place():
    p = attnjit.Pattern.from_json(DYN_SPEC)
    q, k, v = inputs(1, 64, 64, 2, 1, 16, seed=43, requires_grad=True)
    rows, cols = torch.tensor(DYN_FLAWED[0]), torch.tensor(DYN_FLAWED[1])
    errors = torch.zeros(1, dtype=torch.int32)

    def f(a, b, c):
        return attnjit.attention(a, b, c, p, dynamic_layout={"heads": 2, "row_offsets": rows, "col_indices": cols,
                                                            "errors": errors}).square().sum()

    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    loss.backward()
    assert errors.item() == 2
    assert torch.allclose(loss, f(*(x.detach() for x in (q, k, v))))
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("form", ["lists", "tensors"])
def test_torch_compile_traces_a_host_table(form):
    # A host table's numpy conversion is not traceable: under fullgraph it failed; the op now takes
    # it as tensors and the runtime checks it when the op runs.
    table = dict(DYN_TABLE) if form == "lists" else {
        "heads": 2, "row_offsets": torch.tensor(DYN_TABLE["row_offsets"]), "col_indices": torch.tensor(DYN_TABLE["col_indices"])}
    q, k, v = inputs(1, 64, 64, 2, 1, 16, seed=44)
    f = torch.compile(lambda a, b, c: attnjit.attention(a, b, c, DYN_SPEC, dynamic_layout=table), fullgraph=True,
                      backend="eager")
    assert torch.equal(f(q, k, v), attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout=DYN_TABLE))


@pytest.mark.parametrize("form", ["pattern", "dict", "path", "pathlib"])
def test_torch_compile_traces_every_pattern_form(form):
    # A dict and a path become the ops' spec outside the traced region (with a scale too); a dict
    # changed after the first call is seen (traced again), not served from the first graph.
    path = EXAMPLES / "sliding_window.json"
    pattern = {"pattern": attnjit.Pattern.load(path), "dict": json.loads(path.read_text()), "path": str(path),
               "pathlib": path}[form]
    q, k, v = inputs(1, 96, 96, 2, 2, 16, seed=8, requires_grad=True)

    def f(a, b, c):
        return (attnjit.attention(a, b, c, pattern, scale=0.2) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    loss.backward()
    want_q = q.detach().requires_grad_()
    want = f(want_q, k.detach(), v.detach())
    want.backward()
    assert torch.allclose(loss, want)
    assert torch.allclose(q.grad, want_q.grad)
    if form == "dict":
        pattern["window"] = [8, 0]
        assert torch.allclose(compiled(q, k, v), f(q, k, v))
        assert not torch.allclose(compiled(q, k, v), loss)


def test_torch_compile_traces_a_scale_that_changes():
    # A float that changed between calls is a symbol to Dynamo, which could not pass it to the
    # spec's constant (it failed on the second call); each value is now its own graph, guarded.
    spec = {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}
    q, k, v = inputs(1, 32, 32, 2, 2, 16, seed=9)
    by_argument = torch.compile(lambda a, b, c, s: attnjit.attention(a, b, c, spec, scale=s), fullgraph=True,
                                backend="eager")
    in_the_dict = torch.compile(lambda a, b, c, s: attnjit.attention(a, b, c, dict(spec, scale=s)), fullgraph=True,
                                backend="eager")
    for s in (0.3, 0.5, 0.3, 1 / 3):
        want = attnjit.attention(q, k, v, spec, scale=s)
        assert torch.equal(by_argument(q, k, v, s), want), s
        assert torch.equal(in_the_dict(q, k, v, s), want), s
    assert not torch.equal(by_argument(q, k, v, 0.5), by_argument(q, k, v, 0.3))


@pytest.mark.parametrize("form", ["tensor", "list"])
def test_torch_compile_traces_packed_documents(form):
    # cu_seqlens under torch.compile: once its numpy conversion ran while tracing and failed; now
    # it reaches the op as a tensor and the runtime checks it when the op runs.
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 32, 32, 2, 1, 16, seed=10, requires_grad=True)
    docs = [0, 5, 20, 32]
    if form == "tensor":
        f = torch.compile(lambda a, b, c, cu: attnjit.attention(a, b, c, p, cu_seqlens=cu), fullgraph=True, backend="eager")
        call = lambda a, b, c, d=docs: f(a, b, c, torch.tensor(d))  # noqa: E731
    else:
        f = torch.compile(lambda a, b, c: attnjit.attention(a, b, c, p, cu_seqlens=[0, 5, 20, 32]), fullgraph=True,
                          backend="eager")
        call = lambda a, b, c: f(a, b, c)  # noqa: E731
    got = call(q, k, v)
    got.square().sum().backward()
    want_in = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    want = attnjit.attention(*want_in, p, cu_seqlens=docs)
    want.square().sum().backward()
    assert torch.equal(got, want)
    for a, b in zip((q, k, v), want_in):
        assert torch.equal(a.grad, b.grad)
    if form == "tensor":  # another list is another call, not the first one's answer
        assert torch.equal(call(q, k, v, [0, 16, 32]), attnjit.attention(q, k, v, p, cu_seqlens=[0, 16, 32]))
        with pytest.raises(attnjit.AttnjitError, match="cu_seqlens: must not decrease"):
            call(q, k, v, [0, 20, 5, 32])


def test_offsets_and_indices_must_be_integers():
    p = attnjit.Pattern.load(EXAMPLES / "causal_local.json")
    q, k, v = inputs(1, 64, 64, 2, 1, 16)
    for args in ((q, k, v), (q.numpy(), k.numpy(), v.numpy())):
        with pytest.raises(TypeError, match="^q_offset: expected an integer, got float 1.5"):
            attnjit.attention(*args, p, q_offset=1.5)
        with pytest.raises(TypeError, match="^k_offset: expected an integer, got float 2.0"):
            attnjit.attention(*args, p, k_offset=2.0)
        with pytest.raises(TypeError, match="^q_offset: expected an integer, got True"):
            attnjit.attention(*args, p, q_offset=True)
        with pytest.raises(TypeError, match=r'^dynamic_layout\["col_indices"\]: expected integers, got float64 values'):
            attnjit.attention(*args, DYN_SPEC, dynamic_layout={"heads": 1, "row_offsets": [0, 2, 2, 2, 2],
                                                               "col_indices": [0.0, 1.7]})
        with pytest.raises(TypeError, match=r'^dynamic_layout\["row_offsets"\]: expected integers, got a torch.float32'):
            attnjit.attention(*args, DYN_SPEC, dynamic_layout={"row_offsets": torch.tensor([0.0, 1, 1, 1, 1]),
                                                               "col_indices": [0]})
        with pytest.raises(TypeError, match=r'^dynamic_layout\["heads"\]: expected an integer, got float 1.5'):
            attnjit.attention(*args, DYN_SPEC, dynamic_layout={"heads": 1.5, "row_offsets": [0, 1, 1, 1, 1],
                                                               "col_indices": [0]})
    # numpy and one-element torch integers are integers.
    want = attnjit.attention(q, k, v, p, q_offset=3)
    assert torch.equal(attnjit.attention(q, k, v, p, q_offset=np.int32(3)), want)
    assert torch.equal(attnjit.attention(q, k, v, p, q_offset=torch.tensor(3)), want)


def test_out_of_range_integers_name_the_argument_the_value_and_the_limit():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 64, 64, 2, 1, 16)
    with pytest.raises(ValueError, match="^q_offset: 18446744073709551616 is out of range; must be <= 9223372036854775807"):
        attnjit.attention(q, k, v, p, q_offset=2**64)
    with pytest.raises(ValueError, match="^k_offset: -1 is out of range; must be >= 0"):
        attnjit.attention(q.numpy(), k.numpy(), v.numpy(), p, k_offset=-1)
    with pytest.raises(ValueError, match="^cu_seqlens: 9223372036854775813 at index 1 is out of range; "
                                         "must be <= 9223372036854775807"):
        attnjit.attention(q, k, v, p, cu_seqlens=np.array([0, 2**63 + 5, 64], dtype=np.uint64))
    with pytest.raises(ValueError, match="^cu_seqlens: 18446744073709551616 at index 1 is out of range"):
        attnjit.attention(q, k, v, p, cu_seqlens=[0, 2**64, 64])
    with pytest.raises(ValueError, match=r'^dynamic_layout\["col_indices"\]: 1099511627776 at index 0 is out of range; '
                                         "must be <= 2147483647"):
        attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout={"row_offsets": [0, 1, 1, 1, 1], "col_indices": [2**40]})
    with pytest.raises(ValueError, match=r'^dynamic_layout\["row_offsets"\]: 36893488147419103232 at index 4 is out of '
                                         "range; must be <= 9223372036854775807"):
        attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout={"row_offsets": [0, 1, 1, 1, 2**65], "col_indices": [0]})


EMPTY_SHAPES = {"batch": (0, 32, 32, 2, 1), "queries": (1, 0, 32, 2, 1), "keys": (1, 32, 0, 2, 1),
                "heads": (1, 32, 32, 0, 0), "sequence": (2, 0, 0, 2, 2)}


@pytest.mark.parametrize("device", ["reference", "cpu", "emu"])
@pytest.mark.parametrize("shape", sorted(EMPTY_SHAPES))
def test_empty_problems_give_empty_outputs_and_gradients(shape, device, monkeypatch):
    # As SDPA: empty in, empty out, and empty (or zero) gradients; query rows with no keys attend
    # nothing (O = 0, LSE = -inf, as every row that attends nothing).
    if device == "emu":
        monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    dtype = torch.float64 if device == "reference" else torch.float32
    b, sq, sk, hq, hkv = EMPTY_SHAPES[shape]
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(b, sq, sk, hq, hkv, 16, dtype=dtype, requires_grad=True)
    o, lse, w = attnjit.attention(q, k, v, p, return_lse=True, return_weights=True)
    assert o.shape == (b, sq, hq, 16) and o.dtype == dtype and not o.any()
    assert lse.shape == (b, hq, sq) and bool((lse == float("-inf")).all())
    assert w.shape == (b, hq, sq, sk) and not w.any()
    dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v))
    for g, x in zip((dq, dk, dv), (q, k, v)):
        assert g.shape == x.shape and g.dtype == dtype and not g.any()
    # Not compared with SDPA: torch 2.11's CPU SDPA dies of SIGFPE (an integer division by zero)
    # on zero heads, which takes the whole test session with it.
    on, lsen, wn = attnjit.attention(*(x.detach().numpy() for x in (q, k, v)), p, return_lse=True, return_weights=True)
    assert on.shape == o.shape and lsen.shape == lse.shape and wn.shape == w.shape and not on.any()


def test_bad_inputs_name_the_argument():
    p = attnjit.Pattern.load(EXAMPLES / "causal_local.json")
    q, k, v = inputs(1, 64, 64, 2, 2, 16)
    with pytest.raises(ValueError, match=r"^q: expected a \[batch, seq, heads, head_dim\] tensor"):
        attnjit.attention(q[0], k, v, p)
    with pytest.raises(TypeError, match="q, k, v: dtypes differ"):
        attnjit.attention(q, k.half(), v, p)
    with pytest.raises(ValueError, match="k: the last dimension must be contiguous"):
        attnjit.attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, p)
    with pytest.raises(TypeError, match="numpy and torch inputs cannot be mixed"):
        attnjit.attention(q.numpy(), k, v, p)
    with pytest.raises(ValueError, match="query heads \\(2\\) must be a multiple of key/value heads \\(3\\)"):
        attnjit.attention(q, *inputs(1, 64, 64, 3, 3, 16)[1:], p)
    with pytest.raises(TypeError, match="dtype torch.int32 is not supported"):
        attnjit.attention(q.int(), k.int(), v.int(), p)
    with pytest.raises(attnjit.PatternError, match="/branches/0/segment"):
        attnjit.attention(q, k, v, {"attnjit": 1, "branches": [{"segment": -4}]})
    with pytest.raises(TypeError, match="pattern: expected an attnjit.Pattern, a dict or a path"):
        attnjit.attention(q, k, v, 42)


def test_cpu_backward_needs_no_workspace():
    from attnjit import _attnjit
    from attnjit._inputs import cpu_device
    from attnjit._torch_ops import _DTYPES, _desc
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 64, 64, 2, 2, 16)
    assert _attnjit.backward_workspace_bytes(p.op_spec, cpu_device(), 0, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v)) == 0


LSE_GRAD_PATTERNS = {  # every row attends a key (a row that attends none has lse -inf: no finite difference)
    "softmax": GRAD_PATTERNS["softmax"],
    "causal_gqa_offsets": ({"attnjit": 1, "branches": [{"segment": 12, "dilation": 1}, {"segment": 24, "dilation": 2}],
                            "causal": True}, 4, 2, 2, 0),
}


@pytest.mark.parametrize("name", sorted(LSE_GRAD_PATTERNS))
def test_the_lse_gradient_passes_gradcheck_in_float64(name):
    # A loss of O and lse (merging partial attentions by their LSEs): d lse / d S = P.
    spec, hq, hkv, q_offset, k_offset = LSE_GRAD_PATTERNS[name]
    p = attnjit.Pattern.from_json(spec)
    q, k, v = inputs(1, 20, 20, hq, hkv, 4, dtype=torch.float64, seed=5, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: attnjit.attention(a, b, c, p, q_offset=q_offset, k_offset=k_offset, return_lse=True), (q, k, v),
        eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_the_lse_gradient_of_the_float32_paths_matches_float64(device, monkeypatch):
    # The plan executor (cpu) and the generated kernels in the emulator (emu: the tensor-core
    # single pass), rows that attend nothing included (k_offset 9: their dlse must reach nothing).
    if device == "emu":
        monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    causal = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": 64}], "causal": True})
    dtype, tol = (torch.float32, 1e-4) if device == "cpu" else (torch.bfloat16, 3e-2)
    for pattern, k_offset in ((p, 0), (causal, 9)):
        q, k, v = inputs(1, 130, 130, 2, 1, 64, dtype=torch.float64, seed=8)
        dl = torch.randn(1, 2, 130, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        do = torch.randn(1, 130, 2, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

        def run(x, y, z):
            x, y, z = (t.clone().requires_grad_() for t in (x, y, z))
            o, lse = attnjit.attention(x, y, z, pattern, k_offset=k_offset, return_lse=True)
            # rows that attend nothing have lse -inf: their part of the loss is left out, their dlse is NaN
            torch.autograd.backward((o, lse), (do.to(o.dtype), torch.where(torch.isinf(lse), float("nan"), dl.to(lse.dtype))))
            return [t.grad.double() for t in (x, y, z)]

        want = run(q, k, v)
        got = run(*(t.to(dtype) for t in (q, k, v)))
        for name, g, w in zip("qkv", got, want):
            assert torch.isfinite(g).all(), f"d{name}"
            assert rel_error(g, w) <= tol, f"d{name}"


@needs_gpu
def test_gpu_examples_forward_and_backward():
    for path in example_specs():
        p = attnjit.Pattern.load(path)
        q, k, v = inputs(1, 1000, 1000, 4, 2, 128, dtype=torch.bfloat16, seed=7, device="cuda", requires_grad=True)
        o = attnjit.attention(q, k, v, p)
        want, _ = dense_attention(q.cpu(), k.cpu(), v.cpu(), p)
        assert rel_error(o.cpu(), want) <= 2e-2, path.stem
        got = grads(lambda a, b, c: attnjit.attention(a, b, c, p), q, k, v)
        qc, kc, vc = (x.detach().cpu().requires_grad_() for x in (q, k, v))
        want_g = grads(lambda a, b, c: dense_attention(a, b, c, p)[0], qc, kc, vc)
        for name, g, w in zip("qkv", got, want_g):
            assert rel_error(g.cpu(), w) <= 3e-2, f"{path.stem} d{name}"


@needs_gpu
def test_gpu_attention_weights_on_a_side_stream():
    # The weights wait for the forward on PyTorch's current stream (here a side stream) and land in a
    # CUDA tensor.
    p = attnjit.Pattern.from_json(WEIGHT_SPECS[0])
    q, k, v = inputs(2, 300, 300, 4, 2, 64, dtype=torch.bfloat16, seed=4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o, w = attnjit.attention(q, k, v, p, return_weights=True)
    torch.cuda.current_stream().wait_stream(side)
    assert w.device.type == "cuda" and w.dtype == torch.float32
    want = dense_weights(q.cpu(), k.cpu(), p)
    assert (w.cpu().to(torch.float64) - want).abs().max() <= 2e-3
    wv = torch.einsum("bhij,bjhd->bihd", w.to(torch.float64), v.to(torch.float64).repeat_interleave(2, dim=2))
    assert rel_error(o, wv) <= 1e-2


@needs_gpu
def test_gpu_side_stream_and_cuda_graph_give_the_eager_answer():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(2, 777, 777, 4, 2, 64, dtype=torch.bfloat16, seed=3, device="cuda")
    want = attnjit.attention(q, k, v, p)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the work goes on PyTorch's current stream: the side stream
        got = attnjit.attention(q, k, v, p)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attnjit.attention(q, k, v, p)
    for _ in range(2):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, want)
    q2 = torch.randn_like(q)
    q.copy_(q2)  # the graph reads q's memory: new contents, the eager answer for them
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, attnjit.attention(q2, k, v, p))


@needs_gpu
def test_gpu_first_call_captured_in_a_cuda_graph():
    # A shape never run before, first seen inside the capture: the kernel is prepared and loaded,
    # the plan made and its tables copied there (nothing attnjit does synchronises). The replays
    # give the dense contract's answer and the bits of the eager call after them.
    p = attnjit.Pattern.load(EXAMPLES / "seed_dilated.json")
    q, k, v = inputs(1, 1234, 1234, 4, 2, 64, dtype=torch.bfloat16, seed=5, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attnjit.attention(q, k, v, p)
    for _ in range(2):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want, _ = dense_attention(q.cpu(), k.cpu(), v.cpu(), p)
        assert rel_error(captured.cpu(), want) <= 2e-2
    assert torch.equal(captured, attnjit.attention(q, k, v, p))


@needs_gpu
def test_gpu_backward_workspace_comes_from_the_caching_allocator():
    # The backward's scratch (D and the fp32 dK/dV accumulators) is a PyTorch allocation: the peak
    # PyTorch sees during backward covers it on top of the three gradients, and a captured
    # backward replays to the eager gradients.
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    q, k, v = inputs(1, 2048, 2048, 4, 2, 64, dtype=torch.bfloat16, seed=9, device="cuda", requires_grad=True)
    o = attnjit.attention(q, k, v, p)
    do = torch.randn_like(o)
    from attnjit import _attnjit
    from attnjit._torch_ops import _DTYPES, _desc
    need = _attnjit.backward_workspace_bytes(p.op_spec, "cuda", 0, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v))
    assert need >= 2 * 2048 * 2 * 64 * 4  # fp32 dK and dV at least
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    want = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    grads_bytes = sum(g.numel() * g.element_size() for g in want)
    assert torch.cuda.max_memory_allocated() - before >= need + grads_bytes


@needs_gpu
def test_gpu_torch_compile_fullgraph_with_inductor():
    p = attnjit.Pattern.load(EXAMPLES / "bigbird.json")
    q, k, v = inputs(1, 512, 512, 2, 2, 64, dtype=torch.bfloat16, seed=5, device="cuda")

    def f(a, b, c):
        return attnjit.attention(a * 1.0, b, c, p) * 2.0

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(got, f(q, k, v))


@needs_gpu
def test_gpu_dynamic_table_in_device_memory():
    # A table in GPU memory, recomputed "every step": no host copy, the host table's answer, problems counted.
    q, k, v = inputs(1, 64, 64, 2, 1, 16, dtype=torch.bfloat16, seed=42, device="cuda", requires_grad=True)
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    table = {"heads": 2, "row_offsets": torch.tensor(DYN_FLAWED[0], device="cuda"),
             "col_indices": torch.tensor(DYN_FLAWED[1], device="cuda"), "errors": errors}
    o = attnjit.attention(q, k, v, DYN_SPEC, dynamic_layout=table)
    got = torch.autograd.grad(o.float().square().sum(), (q, k, v))
    qc, kc, vc = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    want_o, _ = dense_attention(qc, kc, vc, attnjit.Pattern.from_json(DYN_EXPLICIT))
    want = torch.autograd.grad(want_o.square().sum(), (qc, kc, vc))
    assert rel_error(o.cpu(), want_o) <= 1e-2
    for name, g, w in zip("qkv", got, want):
        assert rel_error(g.cpu(), w) <= 3e-2, f"d{name}"
    assert errors.item() == 2


@needs_gpu
def test_gpu_packed_documents_equal_each_document_alone():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    cu = torch.tensor([0, 300, 300, 777, 1000], device="cuda")
    q, k, v = inputs(1, 1000, 1000, 4, 2, 64, dtype=torch.bfloat16, seed=12, device="cuda", requires_grad=True)
    o = attnjit.attention(q, k, v, p, cu_seqlens=cu)
    got = torch.autograd.grad(o.float().square().sum(), (q, k, v))
    for a, b in ((0, 300), (300, 777), (777, 1000)):
        qd, kd, vd = (x.detach()[:, a:b].clone().requires_grad_() for x in (q, k, v))
        od = attnjit.attention(qd, kd, vd, p)
        want = torch.autograd.grad(od.float().square().sum(), (qd, kd, vd))
        assert rel_error(o[:, a:b].cpu(), od.cpu()) <= 1e-2
        for name, g, w in zip("qkv", got, want):
            assert rel_error(g[:, a:b].cpu(), w.cpu()) <= 3e-2, f"d{name} of document {a}..{b}"


def test_the_lazy_submodules_are_the_ones_named():
    # attnjit.nn, attnjit.distributed and attnjit.serving are imported on first use, each as itself.
    import subprocess
    import sys
    code = ("import attnjit; assert attnjit.distributed.__name__ == 'attnjit.distributed', attnjit.distributed.__name__; "
            "assert attnjit.nn.__name__ == 'attnjit.nn'; assert hasattr(attnjit.distributed, 'ring_attention'); "
            "assert attnjit.serving.__name__ == 'attnjit.serving'; assert hasattr(attnjit.serving, 'paged_attention')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
