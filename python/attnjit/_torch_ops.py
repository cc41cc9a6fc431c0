"""attnjit's PyTorch operators: attnjit::attention and attnjit::attention_backward, registered with
torch.library (fake implementations included, so torch.compile(fullgraph=True) traces them) and
differentiable in q, k and v through the backward kernels."""
import math
import operator
import os
from typing import Optional

import numpy as np
import torch

from . import _attnjit, _pattern
from ._inputs import INT32, INT64, check_shapes, cpu_device, device_table, documents_arg, host_table, int_arg, is_empty

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def op_spec(pattern, scale=None) -> str:
    """The ops' spec text for `pattern` and `scale` (as _pattern.op_spec), also while torch.compile
    traces: writing JSON and reading a file are not traceable, so the conversion runs at trace
    time and its text is a constant of the graph, guarded on the arguments (a dict's contents, a
    path's text, a Pattern's identity)."""
    if torch.compiler.is_compiling():
        # Dynamo turns a number that changed between calls into a symbol, which is no constant:
        # _constants makes each one a constant again (a guard on its value).
        return _constant_op_spec(_constants(pattern), _constants(scale))
    return _pattern.op_spec(pattern, scale)


def _constants(x):
    # A Pattern and a path as their text: older Dynamo (torch 2.11) passes only constants it can
    # read to an assume_constant_result function, and neither object is one.
    if isinstance(x, _pattern.Pattern):
        return x.op_spec
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    if isinstance(x, dict):
        return {key: _constants(value) for key, value in x.items()}
    if isinstance(x, (list, tuple)):
        return [_constants(value) for value in x]
    if isinstance(x, int) and not isinstance(x, bool):
        return operator.index(x)
    # A float symbol (a scale that changed) has no operator.index, and Dynamo reads neither its
    # text nor float() of it as a constant; its exact ratio of integers it does. A tuple stands for
    # one (lists and tuples above became lists); NaN and inf, which have no ratio, stay as they are
    # for the spec reader to name.
    if isinstance(x, float) and x == x and -math.inf < x < math.inf:
        return tuple(x.as_integer_ratio())
    return x


def _floats(x):
    """_constants' ratios as the floats they were (exactly: a float's ratio divides back to it)."""
    if isinstance(x, dict):
        return {key: _floats(value) for key, value in x.items()}
    if isinstance(x, list):
        return [_floats(value) for value in x]
    if isinstance(x, tuple):
        return x[0] / x[1]
    return x


@torch.compiler.assume_constant_result
def _constant_op_spec(pattern, scale):
    """op_spec of _constants' pattern and scale."""
    return _pattern.op_spec(_floats(pattern), _floats(scale))


def _as_index(x, dtype):
    """An integer tensor as `dtype`. Entries past int32 would wrap in the conversion and could name
    a block in range: they become -1, which the kernels skip and count as a problem, as any other
    bad block (no host round trip: the check runs on the tensor's device)."""
    if dtype == torch.int32 and (torch.iinfo(x.dtype).bits > 32 or x.dtype == torch.uint32):
        big = (x < torch.iinfo(torch.int32).min) | (x > torch.iinfo(torch.int32).max)
        x = torch.where(big, torch.full_like(x, -1), x)
    return x.to(dtype)


def _traced_ints(name, x, dtype):
    """A list of integers or a 1-D integer tensor as a `dtype` tensor, while torch.compile traces:
    numpy is not traceable there and a tensor's values are not known, so they are checked when the
    op runs (by the runtime, as for every call)."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1 or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name}: expected a 1-D integer tensor, got {x.dtype} of shape {tuple(x.shape)}")
        return _as_index(x, dtype)
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name}: under torch.compile pass a tensor or a list of integers, got {type(x).__name__}")
    limits = INT64 if dtype == torch.int64 else INT32
    return torch.tensor([int_arg(f"{name}[{i}]", e, limits) for i, e in enumerate(x)], dtype=dtype)


def documents_tensor(cu_seqlens):
    """The op's cu_seqlens argument: None, or int64 [n_docs + 1], checked here (documents_arg) but
    while torch.compile traces (_traced_ints)."""
    if cu_seqlens is None:
        return None
    if torch.compiler.is_compiling():
        return _traced_ints("cu_seqlens", cu_seqlens, torch.int64)
    return torch.tensor(documents_arg(cu_seqlens), dtype=torch.int64)


def attention(q, k, v, spec: str, q_offset: int, k_offset: int, dyn, cu_seqlens=None):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor (or numpy arrays for all three), got {type(x).__name__}")
    check_shapes(q.shape, k.shape, v.shape)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.dtype not in _DTYPES and q.dtype != torch.float64:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16, bfloat16 (or float64 on the CPU)")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v: devices differ ({q.device}, {k.device}, {v.device})")
    if q.dtype == torch.float64 and q.device.type != "cpu":
        raise TypeError("q: float64 runs the CPU reference only; use float32, float16 or bfloat16 on a GPU")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() == 4 and x.stride(3) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1); call .contiguous()")
    heads, rows, cols, on_device, errors = _table_tensors(dyn, q.device)
    cu = documents_tensor(cu_seqlens)
    o, lse, problems = torch.ops.attnjit.attention(q, k, v, spec, q_offset, k_offset, heads, rows, cols, on_device, cu)
    if errors is not None:
        errors.view(1).add_(problems)
    return o, lse


_FP8_OUT = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def fp8_attention(q, k, v, spec: str, q_offset: int, k_offset: int, dyn, docs, descales, out_dtype):
    """FP8 inputs (torch.float8_e4m3fn q, k, v): the forward only (no autograd), O in `out_dtype`
    (bfloat16 by default, or float16), lse fp32. `descales`: (q_descale, k_descale, v_descale), each
    a Python number or an fp32 tensor on q's device of shape [] / [1] (one factor) or [B, Hkv], each
    factor positive and finite (checked for numbers and CPU tensors; a GPU tensor's are not read)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float8_e4m3fn:
            what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{name}: FP8 attention takes torch.float8_e4m3fn q, k and v; got {what}")
    check_shapes(q.shape, k.shape, v.shape)
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v: devices differ ({q.device}, {k.device}, {v.device})")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() == 4 and x.stride(3) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1); call .contiguous()")
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in _FP8_OUT:
        raise TypeError(f"out_dtype: FP8 attention writes torch.bfloat16 or torch.float16, got {out_dtype}")
    if device_table(dyn):
        raise TypeError("dynamic_layout: FP8 inputs take host tables (lists, arrays or CPU tensors) so far")
    b, hkv = q.shape[0], k.shape[2]
    views = []
    for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
        if d is None:
            raise TypeError(f"{name}: FP8 inputs need q_descale, k_descale and v_descale (a number, or an fp32 tensor "
                            "[] / [1] / [batch, heads_kv]; 1.0 where the codes are the values)")
        if isinstance(d, np.ndarray) and d.ndim == 0:
            d = d[()]  # a 0-d array: its number
        number = not isinstance(d, torch.Tensor)
        if number:
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, float, np.integer, np.floating)):
                raise TypeError(f"{name}: expected a number or an fp32 tensor [] / [1] / [batch, heads_kv], got "
                                f"{type(d).__name__} {d!r}")
            try:
                given = float(d)
            except OverflowError:  # an int past a double's range
                given = math.inf
            d = torch.tensor(given, dtype=torch.float32)  # what the kernels read: 1e-50 is 0 there, 1e39 inf
        if d.dtype != torch.float32:
            raise TypeError(f"{name}: expected an fp32 tensor, got {d.dtype}")
        # Factors on the host are checked, numbers included (a GPU tensor's values are not: reading
        # them would wait for the GPU).
        if d.device.type == "cpu":
            ok = torch.isfinite(d) & (d > 0)
            if not bool(ok.all()):
                bad = d[~ok].flatten()[0].item()
                got = f"{given} (in float32: {bad})" if number and str(given) != str(bad) else str(bad)
                raise ValueError(f"{name}: every factor must be a positive finite float32 number, got {got} (a code "
                                 "stands for code x descale; 1.0 where the codes are the values)")
        if number:
            d = d.to(q.device)
        if d.device != q.device:
            raise ValueError(f"{name}: is on {d.device} but q is on {q.device}")
        if d.numel() == 1 and d.dim() <= 1:
            d = d.reshape(1, 1).expand(b, hkv)
        elif tuple(d.shape) != (b, hkv):
            raise ValueError(f"{name}: expected shape [] or [1] (one factor) or [batch, heads_kv] = [{b}, {hkv}], got "
                             f"{tuple(d.shape)}")
        views.append(d)
    o_shape, lse_shape = _out_shapes(q, v)
    if is_empty(q.shape, k.shape):
        return (torch.zeros(o_shape, dtype=out_dtype, device=q.device),
                torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device))
    o = torch.empty(o_shape, dtype=out_dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    device, index, stream = _device(q)
    _attnjit.forward_fp8(spec, device, index, _FP8_OUT[out_dtype], _desc(q), _desc(k), _desc(v), _desc(o), _desc(lse),
                         q_offset, k_offset, stream, host_table(dyn), docs, *(_desc(d) for d in views))
    return o, lse


def _table_tensors(d, device):
    """The op's table arguments for the dynamic_layout dict `d`: (heads, row_offsets, col_indices,
    whether the kernels read them in place, the caller's errors counter or None)."""
    if d is None:
        return 0, None, None, False, None
    if not device_table(d):
        if torch.compiler.is_compiling():
            return (int_arg('dynamic_layout["heads"]', d.get("heads", 1), INT64),
                    _traced_ints('dynamic_layout["row_offsets"]', d["row_offsets"], torch.int64),
                    _traced_ints('dynamic_layout["col_indices"]', d["col_indices"], torch.int32), False, None)
        heads, rows, cols = host_table(d)
        return heads, torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int32), False, None
    tensors = []
    for name, dtype in (("row_offsets", torch.int64), ("col_indices", torch.int32)):
        x = d[name]
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            what = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f'dynamic_layout["{name}"]: a table the kernels read in place needs a 1-D integer torch '
                            f"tensor, got a {what}")
        if x.device != device:
            raise ValueError(f'dynamic_layout["{name}"]: is on {x.device} but q is on {device}; keep the table on q\'s device')
        tensors.append(_as_index(x, dtype).contiguous())
    errors = d.get("errors")
    if errors is not None:
        if not isinstance(errors, torch.Tensor) or errors.dtype != torch.int32 or errors.numel() != 1:
            raise TypeError('dynamic_layout["errors"]: expected an int32 torch tensor with one element (the number of '
                            "problems found in the table is added to it)")
        if errors.device != device:
            raise ValueError(f'dynamic_layout["errors"]: is on {errors.device} but q is on {device}')
    return int_arg('dynamic_layout["heads"]', d.get("heads", 1), INT64), tensors[0], tensors[1], True, errors


def check_weights_size(q, k):
    """ValueError naming ATTNJIT_MAX_WEIGHTS if the weights of q, k would be over the cap."""
    if q.dim() == 4 and k.dim() == 4:
        _attnjit.check_weights_size(q.shape[0], q.shape[2], q.shape[1], k.shape[1])


def weights(q, k, v, lse, spec: str, q_offset: int, k_offset: int, dyn, docs=None):
    """The attention weights of attention(q, k, v) given its lse: fp32 [B, Hq, Sq, Sk] on q's device
    (float64 from the reference for float64 inputs). No gradient: for inspection. A table the
    kernels read in place is copied to the host here, with what they drop dropped."""
    b, sq, hq, _ = q.shape
    if is_empty(q.shape, k.shape):
        return torch.zeros((b, hq, sq, k.shape[1]), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32,
                           device=q.device)
    if device_table(dyn):
        heads, rows, cols, _, _ = _table_tensors(dyn, q.device)
        dyn = (heads,) + _sanitized(spec, q, k, q_offset, k_offset, rows.cpu(), cols.cpu())[:2]
    else:
        dyn = host_table(dyn)
    q, k, v, lse = q.detach(), k.detach(), v.detach(), lse.detach()
    if q.dtype == torch.float64:
        dims = [b, sq, k.shape[1], hq, k.shape[2], q.shape[3], v.shape[3]]
        qc, kc = q.contiguous(), k.contiguous()
        return torch.from_numpy(_attnjit.reference_weights(spec, qc.data_ptr(), kc.data_ptr(), dims, q_offset, k_offset, dyn,
                                                           docs))
    w = torch.empty((b, hq, sq, k.shape[1]), dtype=torch.float32, device=q.device)
    device, index, stream = _device(q)
    _attnjit.weights(spec, device, index, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v), _desc(lse), _desc(w), q_offset,
                     k_offset, stream, dyn, docs)
    return w


def _desc(x):
    return (x.data_ptr(), list(x.shape), list(x.stride()))


def _device(x):
    if x.device.type == "cuda":
        return "cuda", x.device.index or 0, torch.cuda.current_stream(x.device).cuda_stream
    if x.device.type == "cpu":
        return cpu_device(), 0, 0
    raise ValueError(f"q: device {x.device} is not supported; use a CPU or CUDA tensor")


def _dims(q, k, v):
    return [q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]]


def _sanitized(spec, q, k, q_offset, k_offset, rows, cols):
    """(row_offsets, col_indices, problems) of a table in host memory with what the kernels drop dropped."""
    return _attnjit.sanitize_dynamic(spec, _dims(q, k, k), q_offset, k_offset, rows.data_ptr(), cols.data_ptr(),
                                     rows.numel() - 1, cols.numel())


def _tables(spec, q, k, q_offset, k_offset, heads, rows, cols, on_device, errors):
    """The extension's (host table, table read in place) arguments of one call. The float64 reference
    reads host tables only: a table meant for the kernels is sanitised as they would, its problems
    added to `errors`."""
    if rows is None:
        return None, None
    if not on_device:
        return (heads, rows.tolist(), cols.tolist()), None
    if q.dtype == torch.float64:
        r, c, n = _sanitized(spec, q, k, q_offset, k_offset, rows, cols)
        if errors is not None and errors.numel():
            errors += n
        return (heads, r, c), None
    err = errors.data_ptr() if errors is not None and errors.numel() else 0
    return None, (rows.data_ptr(), cols.data_ptr(), rows.numel() - 1, cols.numel(), heads, err)


def _docs(cu_seqlens):
    return None if cu_seqlens is None else cu_seqlens.tolist()


def _out_shapes(q, v):
    b, sq, hq, _ = q.shape
    return (b, sq, hq, v.shape[3]), (b, hq, sq)


# The third output counts the problems the kernels found in a table they read in place (int32 [1];
# [0] without one): the caller adds it to its own counter, so the op mutates none of its inputs.
@torch.library.custom_op("attnjit::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: str, q_offset: int, k_offset: int,
               dyn_heads: int, dyn_rows: Optional[torch.Tensor], dyn_cols: Optional[torch.Tensor], dyn_on_device: bool,
               cu_seqlens: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    o_shape, lse_shape = _out_shapes(q, v)
    problems = torch.zeros(1 if dyn_on_device else 0, dtype=torch.int32, device=q.device)
    if is_empty(q.shape, k.shape):  # as SDPA: empty outputs; rows with no keys attend nothing
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return q.new_zeros(o_shape), q.new_full(lse_shape, float("-inf"), dtype=lse_dtype), problems
    dyn, device_dyn = _tables(spec, q, k, q_offset, k_offset, dyn_heads, dyn_rows, dyn_cols, dyn_on_device, problems)
    docs = _docs(cu_seqlens)
    if q.dtype == torch.float64:  # the float64 reference (exact; for gradcheck)
        qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
        o, lse = _attnjit.reference_forward(spec, qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), _dims(q, k, v), q_offset,
                                            k_offset, dyn, docs)
        return torch.from_numpy(o), torch.from_numpy(lse), problems
    o = torch.empty(o_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    device, index, stream = _device(q)
    _attnjit.forward(spec, device, index, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v), _desc(o), _desc(lse), q_offset,
                     k_offset, stream, dyn, docs, device_dyn, False)
    return o, lse, problems


def forward_rows_with_work(q, k, v, o, lse, spec: str, q_offset: int, k_offset: int):
    """The forward into `o` [B, Sq, Hq, Dv] (q's dtype) and `lse` fp32 [B, Hq, Sq], the caller's,
    writing only the rows that attend a key (_attnjit.call_rows' query rows): the others keep what
    they held. No autograd, no dynamic layouts or documents: one step of attnjit.distributed, which
    merges just those rows, so a step costs its rows with work rather than the whole chunk."""
    if is_empty(q.shape, k.shape):
        return
    device, index, stream = _device(q)
    _attnjit.forward(spec, device, index, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v), _desc(o), _desc(lse), q_offset,
                     k_offset, stream, None, None, None, True)


def backward_add(q, k, v, lse, dout, delta, dq_acc, dk_acc, dv_acc, spec: str, q_offset: int, k_offset: int,
                 deterministic: bool = False):
    """The gradients added into the caller's fp32 accumulators `dq_acc`, `dk_acc`, `dv_acc`
    (contiguous, q's, k's and v's shapes), with D = rowsum(dO * O) - dlse given as `delta` fp32
    [B, Hq, Sq] (contiguous): only the tiles with work are touched, nothing is zeroed or converted
    (Attention::backward_add). No autograd, no dynamic layouts or documents: one step of
    attnjit.distributed's backward, which sums every step's gradients in fp32 and rounds once."""
    if is_empty(q.shape, k.shape):
        return
    device, index, stream = _device(q)
    _attnjit.backward_add(spec, device, index, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v), _desc(lse), _desc(dout),
                          _desc(delta), _desc(dq_acc), _desc(dk_acc), _desc(dv_acc), q_offset, k_offset, stream,
                          deterministic)


@_attention.register_fake
def _(q, k, v, spec, q_offset, k_offset, dyn_heads, dyn_rows, dyn_cols, dyn_on_device, cu_seqlens):
    o_shape, lse_shape = _out_shapes(q, v)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return (q.new_empty(o_shape), q.new_empty(lse_shape, dtype=lse_dtype),
            q.new_empty(1 if dyn_on_device else 0, dtype=torch.int32))


@torch.library.custom_op("attnjit::attention_backward", mutates_args=())
def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                        dout: torch.Tensor, dlse: Optional[torch.Tensor], spec: str, q_offset: int, k_offset: int, dyn_heads: int,
                        dyn_rows: Optional[torch.Tensor], dyn_cols: Optional[torch.Tensor], dyn_on_device: bool,
                        cu_seqlens: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if is_empty(q.shape, k.shape):
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    dyn, device_dyn = _tables(spec, q, k, q_offset, k_offset, dyn_heads, dyn_rows, dyn_cols, dyn_on_device, None)
    docs = _docs(cu_seqlens)
    if q.dtype == torch.float64:
        qc, kc, vc, dc = q.contiguous(), k.contiguous(), v.contiguous(), dout.contiguous()
        dl = None if dlse is None else dlse.to(torch.float64).contiguous()
        dq, dk, dv = _attnjit.reference_backward(spec, qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), dc.data_ptr(),
                                                 _dims(q, k, v), q_offset, k_offset, dyn, docs,
                                                 0 if dl is None else dl.data_ptr())
        return torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv)
    if dout.stride(3) != 1:
        dout = dout.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    device, index, stream = _device(q)
    # CUDA: the backward's scratch (D and the fp32 dK/dV accumulators) comes from PyTorch's caching
    # allocator on the current stream, like any other op's, so CUDA graphs and memory stats see it.
    ws_bytes = _attnjit.backward_workspace_bytes(spec, device, index, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v))
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=q.device) if ws_bytes else None
    if dlse is not None and (dlse.dtype != torch.float32 or dlse.stride(2) != 1):
        dlse = dlse.to(torch.float32).contiguous()
    _attnjit.backward(spec, device, index, _DTYPES[q.dtype], _desc(q), _desc(k), _desc(v), _desc(o), _desc(lse),
                      _desc(dout), _desc(dq), _desc(dk), _desc(dv), q_offset, k_offset, stream, False, dyn,
                      ws.data_ptr() if ws is not None else 0, ws_bytes, docs, device_dyn,
                      None if dlse is None else _desc(dlse))
    return dq, dk, dv


@_attention_backward.register_fake
def _(q, k, v, o, lse, dout, dlse, spec, q_offset, k_offset, dyn_heads, dyn_rows, dyn_cols, dyn_on_device, cu_seqlens):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, spec, q_offset, k_offset, dyn_heads, dyn_rows, dyn_cols, dyn_on_device, cu_seqlens = inputs
    o, lse, _ = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (spec, q_offset, k_offset, dyn_heads, dyn_rows, dyn_cols, dyn_on_device, cu_seqlens)
    ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None


def _backward(ctx, dout, dlse, _dproblems):
    # dlse, the gradient through the lse output (a loss that merges partial attentions by their
    # LSEs), joins each row's D: dS = P (dP - D + dlse).
    q, k, v, o, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(o)
    dq, dk, dv = _attention_backward(q, k, v, o, lse, dout, dlse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None


_attention.register_autograd(_backward, setup_context=_setup_context)
