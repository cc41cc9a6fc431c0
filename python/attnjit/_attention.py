"""attnjit.attention: one call, numpy arrays or torch tensors in, the same kind out."""
import numpy as np

from . import _attnjit
from ._inputs import (OFFSET, check_shapes, cpu_device, device_table, documents_arg, dynamic_arg, host_table, int_arg,
                      is_empty)
from ._pattern import op_spec

_NUMPY_DTYPES = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16"}


def attention(q, k, v, pattern, *, scale=None, q_offset=0, k_offset=0, return_lse=False, return_weights=False,
              dynamic_layout=None, cu_seqlens=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    """Attention of `pattern` over q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv].

    Returns o [B, Sq, Hq, Dv] in the inputs' dtype, or (o, lse) with lse fp32 [B, Hq, Sq] (the
    natural log of each row's softmax denominator; -inf for rows that attend nothing).
    `return_weights=True` appends the attention weights, for inspection: fp32 [B, Hq, Sq, Sk]
    (float64 for float64 inputs) with o = W v, a key two branches attend appearing once with its
    summed weight, the head_groups "mean" factor included, rows that attend nothing all zero. They
    are computed on the host from q, k and this call's lse (CUDA tensors are copied over after the
    current stream finishes), carry no gradient, and are refused above ATTNJIT_MAX_WEIGHTS
    elements (default 2^28) with a ValueError naming the knob.

    `pattern`: an attnjit.Pattern, a dict or a path (under torch.compile a dict or a path is read
    when traced: its spec is a constant of the graph). `scale` replaces the softmax scale.
    `q_offset`/`k_offset`: global positions of row 0. Offsets and the tables' entries are
    integers: a float or a bool is a TypeError, a value out of range a ValueError.
    `dynamic_layout`: the CSR table of a pattern with a `dynamic` layout, a dict {"row_offsets",
    "col_indices", "heads"} (lists, arrays or CPU tensors: checked, planned and uploaded per
    distinct table). A table recomputed every step stays where the kernels read it: torch tensors
    on q's GPU (row_offsets int64 [rows + 1], col_indices int32; other integer dtypes are
    converted there) make no host round trip and no new plan; the kernel skips what is wrong
    (offsets out of order, blocks out of range or not increasing in their row) and, given
    "errors" (an int32 tensor with one element on q's device; with CPU tensors it selects this
    path too), adds the number of problems to it.
    `cu_seqlens`: packed documents (FlashAttention's varlen), int64 [n_docs + 1] (a tensor, array
    or list) = 0, e_1, ..., S, non-decreasing (empty documents allowed); batch 1, Sq == Sk, no
    offsets. Each document attends only itself, with positions restarting at 0 at its start.

    torch tensors (fp32, fp16, bf16; any strides with a contiguous last dimension): CUDA tensors
    run the generated kernels on PyTorch's current stream; CPU tensors the plan executor
    (ATTNJIT_CPU_DEVICE=emu runs the generated kernels in the CPU emulator instead, emu:sm_90a the
    Hopper ones); float64 CPU
    tensors the float64 reference (for gradcheck). Differentiable in q, k and v.
    FP8 inputs: torch.float8_e4m3fn q, k and v with `q_descale`, `k_descale`, `v_descale` (each a
    number, or an fp32 tensor on q's device of shape [] / [1] or [B, Hkv]: the input a code stands
    for is its value times the factor, as FlashAttention-3's descales; positive and finite, which is
    checked where the factors are on the host) and `out_dtype`
    (torch.bfloat16, the default, or torch.float16). Forward only (no gradients, no weights); P is
    rounded to e4m3 for the P V product as the FP8 tensor cores take it, so O is within 2^-4 max|v|
    of exact attention on the quantised inputs (docs/spec.md, "FP8 inputs"). CPU tensors run the
    same arithmetic in the plan executor.
    numpy arrays (fp32, fp16; CPU, no autograd) are accepted too. Empty inputs (batch, sequence
    or heads 0) give empty outputs and gradients; query rows with no keys attend nothing.
    """
    q_offset = int_arg("q_offset", q_offset, OFFSET)
    k_offset = int_arg("k_offset", k_offset, OFFSET)
    dyn = dynamic_arg(dynamic_layout)
    descales = (q_descale, k_descale, v_descale)
    if str(getattr(q, "dtype", "")) == "torch.float8_e4m3fn":
        from . import _torch_ops

        if return_weights:
            raise TypeError("return_weights: not available for FP8 inputs (FP8 attention is forward only)")
        o, lse = _torch_ops.fp8_attention(q, k, v, _torch_ops.op_spec(pattern, scale), q_offset, k_offset, dyn,
                                          documents_arg(cu_seqlens), descales, out_dtype)
        return (o, lse) if return_lse else o
    for name, d in zip(("q_descale", "k_descale", "v_descale", "out_dtype"), descales + (out_dtype,)):
        if d is not None:
            raise TypeError(f"{name}: is for FP8 inputs (torch.float8_e4m3fn q, k, v) only; q is {getattr(q, 'dtype', type(q))}")
    if isinstance(q, np.ndarray) or isinstance(k, np.ndarray) or isinstance(v, np.ndarray):
        spec = op_spec(pattern, scale)
        if device_table(dyn):
            raise TypeError('dynamic_layout: a table the kernels read in place (torch tensors on a GPU, or "errors" '
                            'given) needs torch tensors q, k, v; pass lists or arrays with numpy inputs')
        dyn = host_table(dyn)
        if return_weights and q.ndim == 4 and k.ndim == 4:  # refused before the forward runs
            _attnjit.check_weights_size(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        docs = documents_arg(cu_seqlens)
        o, lse = _numpy_attention(q, k, v, spec, q_offset, k_offset, dyn, docs)
        w = _numpy_weights(q, k, v, lse, spec, q_offset, k_offset, dyn, docs) if return_weights else None
    else:
        from . import _torch_ops

        spec = _torch_ops.op_spec(pattern, scale)  # a constant of the graph under torch.compile
        if return_weights:
            _torch_ops.check_weights_size(q, k)
        o, lse = _torch_ops.attention(q, k, v, spec, q_offset, k_offset, dyn, cu_seqlens)
        w = (_torch_ops.weights(q, k, v, lse, spec, q_offset, k_offset, dyn, documents_arg(cu_seqlens)) if return_weights
             else None)
    out = (o,) + ((lse,) if return_lse else ()) + ((w,) if return_weights else ())
    return out if len(out) > 1 else o


def _numpy_weights(q, k, v, lse, spec, q_offset, k_offset, dyn, docs):
    b, sq, hq, _ = q.shape
    if is_empty(q.shape, k.shape):
        return np.zeros((b, hq, sq, k.shape[1]), dtype=np.float64 if q.dtype == np.float64 else np.float32)
    if q.dtype == np.float64:
        dims = [b, sq, k.shape[1], hq, k.shape[2], q.shape[3], v.shape[3]]
        q, k = np.ascontiguousarray(q), np.ascontiguousarray(k)
        return _attnjit.reference_weights(spec, q.ctypes.data, k.ctypes.data, dims, q_offset, k_offset, dyn, docs)
    w = np.empty((b, hq, sq, k.shape[1]), dtype=np.float32)

    def desc(x):
        return (x.ctypes.data, list(x.shape), [s // x.itemsize for s in x.strides])

    _attnjit.weights(spec, cpu_device(), 0, _NUMPY_DTYPES[q.dtype], desc(q), desc(k), desc(v), desc(lse), desc(w),
                     q_offset, k_offset, 0, dyn, docs)
    return w


def _numpy_attention(q, k, v, spec, q_offset, k_offset, dyn, docs):
    arrays = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: numpy and torch inputs cannot be mixed; got {type(x).__name__}")
        arrays.append(x)
    q, k, v = arrays
    check_shapes(q.shape, k.shape, v.shape)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    b, sq, hq, _ = q.shape
    dv = v.shape[3]
    if q.dtype not in _NUMPY_DTYPES and q.dtype != np.float64:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16 or float64")
    if is_empty(q.shape, k.shape):  # as SDPA: empty outputs; rows with no keys attend nothing
        lse_dtype = np.float64 if q.dtype == np.float64 else np.float32
        return np.zeros((b, sq, hq, dv), dtype=q.dtype), np.full((b, hq, sq), -np.inf, dtype=lse_dtype)
    if q.dtype == np.float64:
        dims = [b, sq, k.shape[1], hq, k.shape[2], q.shape[3], dv]
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
        return _attnjit.reference_forward(spec, q.ctypes.data, k.ctypes.data, v.ctypes.data, dims, q_offset, k_offset, dyn,
                                          docs)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.strides[3] != x.itemsize:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    o = np.empty((b, sq, hq, dv), dtype=q.dtype)
    lse = np.empty((b, hq, sq), dtype=np.float32)

    def desc(x):
        return (x.ctypes.data, list(x.shape), [s // x.itemsize for s in x.strides])

    _attnjit.forward(spec, cpu_device(), 0, _NUMPY_DTYPES[q.dtype], desc(q), desc(k), desc(v), desc(o), desc(lse),
                     q_offset, k_offset, 0, dyn, docs, None, False)
    return o, lse
