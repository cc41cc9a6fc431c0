"""attnjit.attention: one call, numpy arrays or torch tensors in, the same kind out."""
import os

import numpy as np

from . import _attnjit
from ._pattern import as_pattern

_NUMPY_DTYPES = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16"}


def attention(q, k, v, pattern, *, scale=None, q_offset=0, k_offset=0, return_lse=False, return_weights=False,
              dynamic_layout=None, cu_seqlens=None):
    """Attention of `pattern` over q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv].

    Returns o [B, Sq, Hq, Dv] in the inputs' dtype, or (o, lse) with lse fp32 [B, Hq, Sq] (the
    natural log of each row's softmax denominator; -inf for rows that attend nothing).
    `return_weights=True` appends the attention weights, for inspection: fp32 [B, Hq, Sq, Sk]
    (float64 for float64 inputs) with o = W v, a key two branches attend appearing once with its
    summed weight, the head_groups "mean" factor included, rows that attend nothing all zero. They
    are computed on the host from q, k and this call's lse (CUDA tensors are copied over after the
    current stream finishes), carry no gradient, and are refused above ATTNJIT_MAX_WEIGHTS
    elements (default 2^28) with a ValueError naming the knob.

    `pattern`: an attnjit.Pattern, a dict or a path. `scale` replaces the softmax scale.
    `q_offset`/`k_offset`: global positions of row 0. `dynamic_layout`: the CSR table of a
    pattern with a `dynamic` layout, a dict {"row_offsets", "col_indices", "heads"} (lists,
    arrays or CPU tensors: checked, planned and uploaded per distinct table). A table recomputed
    every step stays where the kernels read it: torch tensors on q's GPU (row_offsets int64 [rows
    + 1], col_indices int32; other integer dtypes are converted there) make no host round trip
    and no new plan; the kernel skips what is wrong (offsets out of order, blocks out of range or
    not increasing in their row) and, given "errors" (an int32 tensor with one element on q's
    device; with CPU tensors it selects this path too), adds the number of problems to it.
    `cu_seqlens`: packed documents (FlashAttention's varlen), int64 [n_docs + 1] (a tensor, array
    or list) = 0, e_1, ..., S, non-decreasing (empty documents allowed); batch 1, Sq == Sk, no
    offsets. Each document attends only itself, with positions restarting at 0 at its start.

    torch tensors (fp32, fp16, bf16; any strides with a contiguous last dimension): CUDA tensors
    run the generated kernels on PyTorch's current stream; CPU tensors the plan executor
    (ATTNJIT_CPU_DEVICE=emu runs the generated kernels in the CPU emulator instead, emu:sm_90a the
    Hopper ones); float64 CPU
    tensors the float64 reference (for gradcheck). Differentiable in q, k and v.
    numpy arrays (fp32, fp16; CPU, no autograd) are accepted too.
    """
    p = as_pattern(pattern)
    if scale is not None:
        p = p.with_scale(scale)
    dyn = _dynamic_arg(dynamic_layout)
    docs = _documents_arg(cu_seqlens)
    if isinstance(q, np.ndarray) or isinstance(k, np.ndarray) or isinstance(v, np.ndarray):
        if device_table(dyn):
            raise TypeError('dynamic_layout: a table the kernels read in place (torch tensors on a GPU, or "errors" '
                            'given) needs torch tensors q, k, v; pass lists or arrays with numpy inputs')
        dyn = host_table(dyn)
        if return_weights and q.ndim == 4 and k.ndim == 4:  # refused before the forward runs
            _attnjit.check_weights_size(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        o, lse = _numpy_attention(q, k, v, p.op_spec, int(q_offset), int(k_offset), dyn, docs)
        w = _numpy_weights(q, k, v, lse, p.op_spec, int(q_offset), int(k_offset), dyn, docs) if return_weights else None
    else:
        from . import _torch_ops

        if return_weights:
            _torch_ops.check_weights_size(q, k)
        o, lse = _torch_ops.attention(q, k, v, p.op_spec, int(q_offset), int(k_offset), dyn, docs)
        w = _torch_ops.weights(q, k, v, lse, p.op_spec, int(q_offset), int(k_offset), dyn, docs) if return_weights else None
    out = (o,) + ((lse,) if return_lse else ()) + ((w,) if return_weights else ())
    return out if len(out) > 1 else o


def _numpy_weights(q, k, v, lse, spec, q_offset, k_offset, dyn, docs):
    b, sq, hq, _ = q.shape
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


_TABLE_KEYS = {"row_offsets", "col_indices", "heads", "errors"}


def _dynamic_arg(d):
    if d is None:
        return None
    if not isinstance(d, dict) or not {"row_offsets", "col_indices"} <= set(d):
        raise TypeError('dynamic_layout: expected a dict {"row_offsets": [...], "col_indices": [...], "heads": H}')
    if set(d) - _TABLE_KEYS:
        raise TypeError(f"dynamic_layout: unknown key(s) {sorted(set(d) - _TABLE_KEYS)}; expected {sorted(_TABLE_KEYS)}")
    return d


def device_table(d):
    """Whether the kernels read the table `d` in place: tensors on a GPU, or an "errors" counter given."""
    return d is not None and (d.get("errors") is not None or
                              any(getattr(d[n], "is_cuda", False) for n in ("row_offsets", "col_indices")))


def host_table(d):
    """A host table (heads, row_offsets, col_indices) as the extension takes it, or None."""
    if d is None:
        return None

    def ints(x):
        if hasattr(x, "detach"):  # a torch tensor
            x = x.detach().cpu().numpy()
        return [int(e) for e in np.asarray(x).ravel()]

    return int(d.get("heads", 1)), ints(d["row_offsets"]), ints(d["col_indices"])


def _documents_arg(cu):
    if cu is None:
        return None
    if hasattr(cu, "detach"):  # a torch tensor, on any device
        cu = cu.detach().cpu().numpy()
    a = np.asarray(cu)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"cu_seqlens: expected a 1-D integer tensor [n_docs + 1], got {a.dtype} of shape {a.shape}")
    return [int(x) for x in a]


def cpu_device():
    """The device CPU tensors run on: the plan executor, or the emulator (ATTNJIT_CPU_DEVICE=emu, the
    sm_80 kernels; emu:sm_90a the Hopper ones, emu:sm_75 the SIMT path for fp16, ...)."""
    d = os.environ.get("ATTNJIT_CPU_DEVICE", "cpu")
    if d not in ("cpu", "emu") and not d.startswith("emu:sm_"):
        raise ValueError(f"ATTNJIT_CPU_DEVICE={d}: expected cpu, emu or emu:sm_XX (emu:sm_90a for the Hopper kernels)")
    return d


def check_shapes(q_shape, k_shape, v_shape):
    """ValueError naming the argument when q, k, v are not [B, S, H, D] tensors that fit together."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 4:
            raise ValueError(f"{name}: expected a [batch, seq, heads, head_dim] tensor, got shape {tuple(s)}")
    if q_shape[0] != k_shape[0] or k_shape[0] != v_shape[0]:
        raise ValueError(f"q, k, v: batch sizes differ ({q_shape[0]}, {k_shape[0]}, {v_shape[0]})")
    if tuple(k_shape[:3]) != tuple(v_shape[:3]):
        raise ValueError(f"k, v: [batch, seq, heads] differ ({tuple(k_shape[:3])} and {tuple(v_shape[:3])})")
    if q_shape[3] != k_shape[3]:
        raise ValueError(f"q, k: head dims differ ({q_shape[3]} and {k_shape[3]})")
    if k_shape[2] == 0 or q_shape[2] % k_shape[2]:
        raise ValueError(f"q, k: query heads ({q_shape[2]}) must be a multiple of key/value heads ({k_shape[2]})")


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
    if q.dtype == np.float64:
        dims = [b, sq, k.shape[1], hq, k.shape[2], q.shape[3], dv]
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
        return _attnjit.reference_forward(spec, q.ctypes.data, k.ctypes.data, v.ctypes.data, dims, q_offset, k_offset, dyn,
                                          docs)
    if q.dtype not in _NUMPY_DTYPES:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16 or float64")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.strides[3] != x.itemsize:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    o = np.empty((b, sq, hq, dv), dtype=q.dtype)
    lse = np.empty((b, hq, sq), dtype=np.float32)

    def desc(x):
        return (x.ctypes.data, list(x.shape), [s // x.itemsize for s in x.strides])

    _attnjit.forward(spec, cpu_device(), 0, _NUMPY_DTYPES[q.dtype], desc(q), desc(k), desc(v), desc(o), desc(lse),
                     q_offset, k_offset, 0, dyn, docs, None)
    return o, lse
